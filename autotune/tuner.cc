#include "autotune/tuner.h"

#include <algorithm>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "autotune/worker_pool.h"
#include "jit/json_text.h"
#include "jit/status_helpers.h"
#include "ops/registry.h"
#include "runtime/runtime_state.h"
#include "runtime/tuning_db.h"

namespace kjit::autotune {

namespace {

using internal::TuningDb;
using internal::TuningKey;
using internal::TuningRecord;
using kjit::Name;
using nlohmann::json;
using ops::Name;
using ops::OpDType;

std::string Utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string Describe(const OpSpec& op) {
  return fmt::format("{} {}", ops::TuningOp(op), ops::TuningShape(op));
}

// One (op, pass, row bucket) the GPU tunes, and what was measured for it: one per TunedPass of the
// op (cross-entropy's fused forward+backward and its streaming launches are tuned apart, since a
// row-resident cluster config would slow the latter down).
struct Problem {
  size_t op = 0;  // index into plan.ops
  int64_t rows = 0;
  Pass pass = Pass::kForwardBackward;
  TuningKey key;
  std::string heuristic;
  std::optional<TuningRecord> existing;  // from the database: not tuned again
  // config -> pass -> timing, for the configs that ran
  std::map<std::string, std::map<Pass, Timing>> timed;
  double bytes = 0;  // the pass's fewest bytes
  int failed = 0;
  std::optional<TuningRecord> result;
};

// A batch of worker tasks with what each is for.
struct Batch {
  std::vector<std::string> tasks;
  std::vector<std::function<void(const TaskOutcome&)>> on_done;
  std::vector<std::string> labels;
  void Add(const TuneTask& t, std::string label, std::function<void(const TaskOutcome&)> done) {
    tasks.push_back(t.ToJson());
    labels.push_back(std::move(label));
    on_done.push_back(std::move(done));
  }
};

// One call of Tune(): the plan's problems through the stages (compile, check, time, choose, store)
// and the report they add to.
class TuneRun {
 public:
  TuneRun(const TunePlan& plan, const TuneProgress& progress) : p_(plan), progress_(progress) {}

  json Run() {
    report_ = {{"ok", true},
               {"timed", p_.gpu != nullptr},
               {"kernels", json::array()},
               {"pruned", json::array()},
               {"failures", json::array()}};
    if (p_.gpu) PlanProblems();
    CompileCandidates();
    CheckStored();
    if (p_.gpu && Untuned() > 0) {
      TimeCandidates();
      CombinePasses();
      ChooseWinners();
      WriteDatabase();
    }
    ReportTuned();
    // Paths and errors in it are any bytes; whoever prints the report uses a plain dump().
    return jit::WithValidUtf8(report_);
  }

 private:
  size_t Untuned() const {
    return std::count_if(problems_.begin(), problems_.end(),
                         [](const Problem& q) { return !q.existing; });
  }

  void Fail(json entry) {
    report_["ok"] = false;
    report_["failures"].push_back(std::move(entry));
  }

  // The heuristic kernels that compiled but are not in the cache (a read-only cache, a failed
  // write). Without a GPU, prebuilding them into the cache is the whole point of the run, so that
  // is a failure, not "ready"; with one the tuning still counts and the kernels say stored: false.
  void CheckStored() {
    size_t missing = 0;
    for (const json& k : report_["kernels"]) missing += !k.value("stored", true);
    report_["stored"] = missing == 0;
    if (missing == 0 || p_.gpu != nullptr) return;
    const size_t total = report_["kernels"].size();
    std::string why = "a write to it failed; the workers' warnings say why";
    std::string dir;
    if (const jit::DiskCache* cache =
            p_.targets.empty() ? nullptr : internal::StateOf(*p_.targets[0]).jit->disk_cache()) {
      dir = " " + cache->dir();
      if (cache->read_only()) why = cache->warning();
    }
    const std::string what =
        missing == total ? "nothing was" : fmt::format("{} of {} kernels were not", missing, total);
    Fail({{"phase", "store"},
          {"error", fmt::format("{} stored in the kernel cache{}: compiled but kept in memory "
                                "only, so later runs compile {} again ({})",
                                what, dir, missing == 1 ? "it" : "them", why)}});
  }

  void PlanProblems() {
    auto db = TuningDb::Load(p_.db_path);
    if (!db.ok()) {
      report_["database_warning"] = fmt::format("{} (it is rebuilt when the results are written)",
                                                ToStd(db.status().message()));
    }
    for (size_t i = 0; i < p_.ops.size(); ++i) {
      auto heuristic = ops::HeuristicConfig(*p_.gpu, p_.ops[i]);
      if (!heuristic.ok()) continue;  // reported by the compile phase
      std::set<int64_t> buckets;
      for (int64_t rows : p_.tokens) {
        if (!buckets.insert(internal::RowsBucket(rows)).second) continue;
        // Adjacent, so that the GPU worker makes the inputs of an op's passes once.
        for (const ops::TunedPass& tuned : ops::TunedPasses(p_.ops[i])) {
          Problem q{.op = i,
                    .rows = internal::RowsBucket(rows),
                    .pass = tuned.pass,
                    .heuristic = *heuristic};
          q.key = ops::TuningKeyFor(*p_.gpu, p_.ops[i], q.rows, tuned.record_op);
          if (db.ok() && !p_.retune) q.existing = db->Find(q.key);
          problems_.push_back(std::move(q));
        }
      }
    }
  }

  // Runs a batch in workers, reporting progress; `jobs` workers of `batch` tasks each.
  void RunBatch(const std::string& phase, Batch& b, int jobs, int batch) {
    if (b.tasks.empty()) return;
    if (progress_.phase) progress_.phase(phase, b.tasks.size());
    WorkerPoolOptions options;
    options.command = p_.worker_command;
    options.jobs = jobs;
    options.batch = batch;
    options.task_timeout = p_.task_timeout;
    options.on_done = [&](size_t i, const TaskOutcome& o) {
      b.on_done[i](o);
      const auto answer = Answer(o);
      if (progress_.step) progress_.step(b.labels[i], !answer.ok() || !answer->error.empty());
    };
    RunInWorkers(b.tasks, options);
  }

  static absl::StatusOr<TuneAnswer> Answer(const TaskOutcome& o) {
    if (!o.answered) return absl::AbortedError(o.failure);
    return TuneAnswer::FromJson(o.result);
  }
  // The failure of a task, or "" when it worked.
  static std::string FailureOf(const TaskOutcome& o, std::string* log) {
    auto a = Answer(o);
    if (!a.ok()) {
      *log = o.log;
      return std::string(ToStd(a.status().message()));
    }
    return a->error;
  }

  // Compile phase: the heuristic config of every op for every target, and on the GPU's target the
  // whole search space of ops with keys to tune (or everywhere with all_candidates).
  void CompileCandidates() {
    Batch b;
    for (const Runtime* rt : p_.targets) {
      const std::string target = rt->target();
      for (size_t i = 0; i < p_.ops.size(); ++i) {
        const OpSpec& op = p_.ops[i];
        auto heuristic = ops::HeuristicConfig(*rt, op);
        if (!heuristic.ok()) {
          Fail({{"op", ops::TuningOp(op)},
                {"shape", ops::TuningShape(op)},
                {"target", target},
                {"error", std::string(ToStd(heuristic.status().message()))}});
          continue;
        }
        const bool search =
            p_.all_candidates ||
            (rt == p_.gpu && std::any_of(problems_.begin(), problems_.end(), [&](const Problem& q) {
               return q.op == i && !q.existing;
             }));
        std::vector<std::string> configs = {*heuristic};
        if (search) {
          for (const auto& [config, pruned] : ops::SearchSpace(op, *heuristic, rt->arch())) {
            if (!pruned.empty()) {
              report_["pruned"].push_back({{"op", ops::TuningOp(op)},
                                           {"shape", ops::TuningShape(op)},
                                           {"target", target},
                                           {"config", config},
                                           {"reason", pruned}});
            } else if (config != *heuristic) {
              configs.push_back(config);
            }
          }
        }
        if (rt == p_.gpu) {
          for (const Problem& q : problems_) {
            if (q.op == i && q.existing && q.existing->config != *heuristic) {
              configs.push_back(q.existing->config);  // make sure the tuned kernel is cached
            }
          }
        }
        std::set<std::string> added;  // several buckets and passes may share a tuned config
        for (const std::string& config : configs) {
          if (!added.insert(config).second) continue;
          const bool is_heuristic = config == *heuristic;
          b.Add({.mode = TuneTask::Mode::kCompile, .op = op, .config = config, .target = target},
                fmt::format("compile {} {} [{}]{}", Describe(op), target, config,
                            is_heuristic ? " (heuristic)" : ""),
                [this, op, config, target, is_heuristic, rt](const TaskOutcome& o) {
                  std::string log;
                  const std::string failure = FailureOf(o, &log);
                  if (!failure.empty()) {
                    json f = {{"op", ops::TuningOp(op)}, {"shape", ops::TuningShape(op)},
                              {"target", target},        {"config", config},
                              {"phase", "compile"},      {"error", failure}};
                    if (!log.empty()) f["log"] = log;
                    if (is_heuristic) {
                      Fail(std::move(f));
                    } else {
                      report_["failures"].push_back(std::move(f));
                    }
                    return;
                  }
                  if (rt == p_.gpu)
                    compiled_.insert({ops::TuningOp(op) + " " + ops::TuningShape(op), config});
                  if (!is_heuristic) return;
                  const TuneAnswer a = *Answer(o);
                  report_["kernels"].push_back({{"op", ops::TuningOp(op)},
                                                {"shape", ops::TuningShape(op)},
                                                {"dtype", Name(OpDType(op))},
                                                {"target", target},
                                                {"config", config},
                                                {"heuristic", true},
                                                {"tuned", false},
                                                {"key", a.key},
                                                {"origin", a.origin},
                                                {"path", a.path},
                                                {"stored", !a.path.empty()},
                                                {"build_ms", a.compile_ms}});
                });
        }
      }
    }
    RunBatch("compile", b, p_.jobs, 1);
  }

  bool Compiled(const OpSpec& op, const std::string& config) const {
    return compiled_.count({ops::TuningOp(op) + " " + ops::TuningShape(op), config}) > 0;
  }

  void AddTimeTask(Batch& b, Problem& q, const std::string& config, Pass pass) {
    const OpSpec& op = p_.ops[q.op];
    b.Add({.mode = TuneTask::Mode::kTime,
           .op = op,
           .config = config,
           .rows = q.rows,
           .pass = pass,
           .repeats = p_.repeats},
          fmt::format("time {} rows={} [{}] {}", Describe(op), q.rows, config, Name(pass)),
          [this, &q, config, pass](const TaskOutcome& o) {
            std::string log;
            const std::string failure = FailureOf(o, &log);
            if (!failure.empty()) {
              ++q.failed;
              json f = {{"op", q.key.op},   {"shape", q.key.shape}, {"rows", q.rows},
                        {"config", config}, {"pass", Name(pass)},   {"phase", "time"},
                        {"error", failure}};
              if (!log.empty()) f["log"] = log;
              report_["failures"].push_back(std::move(f));
              return;
            }
            const TuneAnswer a = *Answer(o);
            q.timed[config][pass] = a.timing;
            if (pass == q.pass) q.bytes = a.bytes;
          });
  }

  // Check-then-time phase, in one GPU worker at a time: first the copy bandwidth, then every
  // compiled candidate of every problem to tune, grouped so that a problem's inputs are made once.
  void TimeCandidates() {
    Batch b;
    b.Add({.mode = TuneTask::Mode::kCopy, .repeats = p_.repeats}, "time device copy",
          [this](const TaskOutcome& o) {
            if (auto a = Answer(o); a.ok() && a->error.empty()) {
              copy_gbps_ = a->bytes / (a->timing.median_us * 1e3);
            }
          });
    for (Problem& q : problems_) {
      if (q.existing) continue;
      const OpSpec& op = p_.ops[q.op];
      std::vector<std::string> configs = {q.heuristic};
      for (const auto& [config, pruned] : ops::SearchSpace(op, q.heuristic, p_.gpu->arch())) {
        if (pruned.empty() && config != q.heuristic) configs.push_back(config);
      }
      for (const std::string& config : configs) {
        if (!Compiled(op, config)) continue;
        for (Pass pass : ops::PassesToTime(op, config, q.heuristic, q.pass)) {
          AddTimeTask(b, q, config, pass);
        }
      }
    }
    RunBatch("time", b, 1, static_cast<int>(b.tasks.size()));
    if (copy_gbps_ > 0) report_["copy_gbps"] = copy_gbps_;
  }

  // The fastest config by one pass's median, and the runner-up.
  static std::pair<std::string, std::string> Fastest(const Problem& q, Pass pass) {
    std::vector<std::pair<double, std::string>> by_time;
    for (const auto& [config, passes] : q.timed) {
      if (auto it = passes.find(pass); it != passes.end())
        by_time.emplace_back(it->second.median_us, config);
    }
    std::sort(by_time.begin(), by_time.end());
    return {by_time.empty() ? "" : by_time[0].second, by_time.size() < 2 ? "" : by_time[1].second};
  }

  // Ops whose forward and backward are searched apart (OpTrait::Combine): the fastest of each make
  // one config, compiled and then timed forward+backward next to the heuristic's.
  void CombinePasses() {
    Batch compile, time;
    for (Problem& q : problems_) {
      const OpSpec& op = p_.ops[q.op];
      if (q.existing) continue;
      const std::string f = Fastest(q, Pass::kForward).first, b = Fastest(q, Pass::kBackward).first;
      if (f.empty() || b.empty()) continue;
      const std::optional<std::string> best = ops::Combine(op, q.heuristic, f, b);
      if (!best) continue;
      const std::string combined = *best;
      pass_margins_[&q] = {{"forward", Margin(q, Pass::kForward)},
                           {"backward", Margin(q, Pass::kBackward)}};
      if (!Compiled(op, combined)) {
        compile.Add(
            {.mode = TuneTask::Mode::kCompile,
             .op = op,
             .config = combined,
             .target = p_.gpu->target()},
            fmt::format("compile {} [{}]", Describe(op), combined),
            [this, op, combined](const TaskOutcome& o) {
              std::string log;
              if (FailureOf(o, &log).empty())
                compiled_.insert({ops::TuningOp(op) + " " + ops::TuningShape(op), combined});
            });
      }
      combined_[&q] = combined;
    }
    RunBatch("compile", compile, p_.jobs, 1);
    for (auto& [q, combined] : combined_) {
      AddTimeTask(time, *q, q->heuristic, Pass::kForwardBackward);
      if (combined != q->heuristic && Compiled(p_.ops[q->op], combined)) {
        AddTimeTask(time, *q, combined, Pass::kForwardBackward);
      }
    }
    RunBatch("time", time, 1, static_cast<int>(time.tasks.size()));
  }

  json Margin(const Problem& q, Pass pass) const {
    const auto [best, second] = Fastest(q, pass);
    if (best.empty()) return nullptr;
    json m = {{"config", best}, {"median_us", q.timed.at(best).at(pass).median_us}};
    if (!second.empty()) {
      m["runner_up"] = second;
      m["runner_up_us"] = q.timed.at(second).at(pass).median_us;
      m["margin"] = m["runner_up_us"].get<double>() / m["median_us"].get<double>() - 1;
    }
    return m;
  }

  void ChooseWinners() {
    const std::string now = Utc();
    for (Problem& q : problems_) {
      if (q.existing) continue;
      const auto [best, second] = Fastest(q, q.pass);
      if (best.empty()) {
        Fail({{"op", q.key.op},
              {"shape", q.key.shape},
              {"rows", q.rows},
              {"phase", "time"},
              {"error", "no candidate passed the check and timing"}});
        continue;
      }
      const Timing& t = q.timed.at(best).at(q.pass);
      TuningRecord r{.key = q.key,
                     .config = best,
                     .median_us = t.median_us,
                     .p10_us = t.p10_us,
                     .p90_us = t.p90_us,
                     .tuned_at = now};
      if (auto h = q.timed.find(q.heuristic); h != q.timed.end() && h->second.count(q.pass)) {
        r.heuristic_us = h->second.at(q.pass).median_us;
      }
      if (!second.empty()) {
        r.runner_up = second;
        r.runner_up_us = q.timed.at(second).at(q.pass).median_us;
      }
      r.candidates = static_cast<int>(q.timed.size());
      r.failed = q.failed;
      q.result = r;
    }
  }

  void WriteDatabase() {
    std::vector<TuningRecord> records;
    for (const Problem& q : problems_) {
      if (q.result) records.push_back(*q.result);
    }
    if (records.empty()) return;
    auto written = TuningDb::Upsert(p_.db_path, records);
    if (!written.ok()) {
      Fail({{"phase", "database"},
            {"path", p_.db_path},
            {"error", std::string(ToStd(written.status().message()))}});
      return;
    }
    report_["database"] = {{"path", p_.db_path}, {"written", written->written}};
    if (!written->warning.empty()) report_["database"]["warning"] = written->warning;
  }

  void ReportTuned() {
    for (const Problem& q : problems_) {
      const std::optional<TuningRecord>& r = q.existing ? q.existing : q.result;
      if (!r) continue;
      json e = {{"op", q.key.op},
                {"shape", q.key.shape},
                {"dtype", q.key.dtype},
                {"target", p_.gpu->target()},
                {"rows", q.rows},
                {"config", r->config},
                {"heuristic", r->config == q.heuristic},
                {"tuned", true},
                {"from_database", q.existing.has_value()},
                {"median_us", r->median_us},
                {"p10_us", r->p10_us},
                {"p90_us", r->p90_us},
                {"heuristic_config", q.heuristic},
                {"heuristic_us", r->heuristic_us},
                {"runner_up", r->runner_up},
                {"runner_up_us", r->runner_up_us},
                {"candidates", r->candidates},
                {"failed", r->failed},
                {"tuned_at", r->tuned_at}};
      if (r->heuristic_us > 0) e["speedup_over_heuristic"] = r->heuristic_us / r->median_us;
      if (r->runner_up_us > 0) e["margin_over_runner_up"] = r->runner_up_us / r->median_us - 1;
      e["pass"] = Name(q.pass);
      if (q.bytes > 0 && copy_gbps_ > 0) {
        e["gbps"] = q.bytes / (r->median_us * 1e3);
        e["ratio_to_copy"] = e["gbps"].get<double>() / copy_gbps_;
      }
      if (auto m = pass_margins_.find(&q); m != pass_margins_.end()) e["passes"] = m->second;
      report_["kernels"].push_back(std::move(e));
      if (!q.existing && !q.result) report_["ok"] = false;
    }
  }

  const TunePlan& p_;
  const TuneProgress& progress_;
  json report_;
  std::vector<Problem> problems_;
  std::set<std::pair<std::string, std::string>>
      compiled_;  // (op and shape, config) on the GPU target
  std::map<Problem*, std::string> combined_;
  std::map<const Problem*, json> pass_margins_;
  double copy_gbps_ = 0;
};

}  // namespace

json Tune(const TunePlan& plan, const TuneProgress& progress) {
  return TuneRun(plan, progress).Run();
}

}  // namespace kjit::autotune
