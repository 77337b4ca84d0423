// Many ranks, one cache: N processes (the ranks of one training job) start at the same instant on
// an empty shared KJIT_CACHE_DIR and each builds the same kernels: the vocab-parallel
// cross-entropy for its shard of an even split (one program for every rank: the shard's start is a
// kernel argument) and an RMSNorm. The per-key disk lock must make exactly one rank compile each
// program while the others wait and load it from disk. Reports, in JSON, each rank's wall time
// from the common start to ready (compile-only) or to its first launch completed (GPU), rank 0's
// and the slowest; fails when a program was compiled more than once or the cache holds another
// count of entries.
//
//   kjit_shared_cache_ranks --ranks 8 --target sm_90          # CPU: compile-only (ctest)
//   kjit_shared_cache_ranks --ranks 8 --gpus 1 --json out.json  # all ranks on GPU 0
//   kjit_shared_cache_ranks --ranks 8 --gpus 8                 # rank r on GPU r
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "kjit/kjit.h"
#include "runtime/runtime_state.h"

namespace kjit {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 128256;
constexpr int64_t kHidden = 4096;
constexpr int64_t kRows = 8;  // the first launch's size: small, it only proves the kernel runs

struct Options {
  int ranks = 8;
  int rank = -1;  // >= 0: this process is that rank
  int gpus = 0;   // 0: compile-only for `target`; else rank r uses GPU r % gpus
  std::string target = "sm_90";
  std::string dir;    // the shared cache (created empty by the launcher)
  std::string json;   // where the launcher writes its report ("": stdout only)
  int start_fd = -1;  // a rank blocks reading it until the launcher closes the other end
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A rank's first launch: its shard's statistics, the (one-rank) rescale and phase 2, on zeros.
absl::Status FirstLaunch(const Runtime& rt, const ShardedCrossEntropy& ce) {
  const int64_t width = ce.spec().width();
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::Create(rt, kRows * width * 2));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer targets, DeviceBuffer::Create(rt, kRows * 8));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer loss, DeviceBuffer::Create(rt, 16));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Create(rt, ce.WorkspaceBytes(kRows)));
  KJIT_RETURN_IF_ERROR(logits.Fill(0));
  KJIT_RETURN_IF_ERROR(targets.Fill(0));
  const ShardedCrossEntropyArgs args{
      .logits = TensorView::Matrix(logits.data(), DType::kBF16, kRows, width),
      .targets = IndexView::Of(targets.data(), IndexType::kInt64, kRows),
      .loss = TensorView::Vector(loss.data(), DType::kF32, 1),
      .grad = TensorView::Matrix(logits.data(), DType::kBF16, kRows, width),
      .workspace = ws.data(),
      .workspace_bytes = ce.WorkspaceBytes(kRows)};
  KJIT_RETURN_IF_ERROR(ce.ComputeStats(nullptr, args));
  KJIT_RETURN_IF_ERROR(ce.RescaleStats(nullptr, ws.data(), kRows));
  KJIT_RETURN_IF_ERROR(ce.Finish(nullptr, args));
  return kjit::internal::StateOf(rt).driver->Check(
      kjit::internal::StateOf(rt).driver->cuCtxSynchronize(), "cuCtxSynchronize");
}

// One rank: waits for the start, builds (and with a GPU loads and launches), prints one JSON line.
absl::StatusOr<nlohmann::json> RunRank(const Options& o) {
  char go;
  if (read(o.start_fd, &go, 1) < 0) return absl::InternalError("reading the start pipe failed");
  const int64_t start = NowNs();
  RuntimeOptions ro;
  if (o.gpus > 0) {
    ro.device = o.rank % o.gpus;
  } else {
    ro.target = o.target;
    ro.compile_only = true;
  }
  KJIT_ASSIGN_OR_RETURN(Runtime rt, Runtime::Create(ro));
  const int64_t width = kVocab / o.ranks;
  KJIT_ASSIGN_OR_RETURN(
      ShardedCrossEntropy ce,
      rt.ShardedCrossEntropy(
          {.vocab = kVocab, .shard_start = o.rank * width, .shard_end = (o.rank + 1) * width}));
  KJIT_ASSIGN_OR_RETURN(RmsNorm norm, rt.RmsNorm({.hidden = kHidden}));
  // With a GPU the ops built and loaded their programs when created; Build() then only names them.
  KJIT_ASSIGN_OR_RETURN(BuildInfo a, ce.Build());
  KJIT_ASSIGN_OR_RETURN(BuildInfo b, norm.Build());
  if (o.gpus > 0) KJIT_RETURN_IF_ERROR(FirstLaunch(rt, ce));
  const int64_t ready = NowNs();
  return nlohmann::json{{"rank", o.rank},
                        {"device", o.gpus > 0 ? ro.device : -1},
                        {"start_ns", start},
                        {"ready_ns", ready},
                        {"compiles", kjit::internal::StateOf(rt).jit->compile_count()},
                        {"keys", {a.key, b.key}},
                        {"origins", {a.origin, b.origin}}};
}

// Starts the ranks, releases them together, checks and reports.
int Launch(Options o) {
  char tmpl[] = "/tmp/kjit-ranks-XXXXXX";
  if (o.dir.empty()) {
    if (mkdtemp(tmpl) == nullptr) return 2;
    o.dir = tmpl;
  }
  const std::string cache = o.dir + "/cache";
  std::error_code ec;
  fs::remove_all(cache, ec);
  setenv("KJIT_CACHE_DIR", cache.c_str(), 1);
  int start[2];
  if (pipe(start) != 0) return 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(start[1]);
      const std::string out = fmt::format("{}/rank-{}.json", o.dir, r);
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, STDOUT_FILENO);
      const std::vector<std::string> args = {"/proc/self/exe",
                                             "--rank",
                                             std::to_string(r),
                                             "--ranks",
                                             std::to_string(o.ranks),
                                             "--gpus",
                                             std::to_string(o.gpus),
                                             "--target",
                                             o.target,
                                             "--start-fd",
                                             std::to_string(start[0])};
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  close(start[0]);
  usleep(300 * 1000);  // every rank is blocked on the pipe by now (they only exec and read)
  const int64_t t0 = NowNs();
  close(start[1]);  // EOF: all ranks start
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  nlohmann::json report = {{"ranks", o.ranks},
                           {"gpus", o.gpus},
                           {"mode", o.gpus > 0 ? "load_and_launch" : "compile_only"},
                           {"target", o.gpus > 0 ? "device" : o.target},
                           {"per_rank", nlohmann::json::array()}};
  int total_compiles = 0;
  double slowest_ms = 0, rank0_ms = -1;
  std::set<std::string> keys;
  for (int r = 0; r < o.ranks; ++r) {
    std::ifstream in(fmt::format("{}/rank-{}.json", o.dir, r));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("ready_ns")) {
      fmt::print(stderr, "rank {} reported nothing usable (see {}/rank-{}.json)\n", r, o.dir, r);
      ok = false;
      continue;
    }
    const double ms = (j["ready_ns"].get<int64_t>() - t0) / 1e6;
    j["ms_to_ready"] = ms;
    if (r == 0) rank0_ms = ms;
    slowest_ms = std::max(slowest_ms, ms);
    total_compiles += j["compiles"].get<int>();
    for (const auto& k : j["keys"]) keys.insert(k.get<std::string>());
    report["per_rank"].push_back(j);
  }
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(cache, ec))
    entries += e.path().extension() == ".kjit";
  report["distinct_programs"] = keys.size();
  report["nvrtc_compiles_all_ranks"] = total_compiles;
  report["cache_entries"] = entries;
  report["rank0_ms_to_ready"] = rank0_ms;
  report["slowest_ms_to_ready"] = slowest_ms;
  report["ready_means"] = o.gpus > 0 ? "first launch completed" : "programs built";
  const bool once = keys.size() == 2 && total_compiles == static_cast<int>(keys.size());
  report["each_program_compiled_once"] = once;
  ok &= once;
  const std::string text = report.dump(2);
  fmt::print("{}\n", text);
  if (!o.json.empty()) std::ofstream(o.json) << text << "\n";
  if (!once) {
    fmt::print(stderr,
               "FAIL: {} NVRTC compiles over all ranks for {} programs (expected one each)\n",
               total_compiles, keys.size());
  }
  if (o.dir == tmpl) fs::remove_all(o.dir, ec);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kjit

int main(int argc, char** argv) {
  kjit::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--ranks")
      o.ranks = std::atoi(value.c_str());
    else if (flag == "--rank")
      o.rank = std::atoi(value.c_str());
    else if (flag == "--gpus")
      o.gpus = std::atoi(value.c_str());
    else if (flag == "--target")
      o.target = value;
    else if (flag == "--dir")
      o.dir = value;
    else if (flag == "--json")
      o.json = value;
    else if (flag == "--start-fd")
      o.start_fd = std::atoi(value.c_str());
    else {
      fmt::print(stderr,
                 "unknown flag {}\nusage: {} [--ranks N] [--target sm_XY | --gpus K] "
                 "[--dir DIR] [--json FILE]\n",
                 flag, argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || o.ranks < 1 || o.ranks > 128) {
    fmt::print(stderr,
               "usage: {} [--ranks 1..128] [--target sm_XY | --gpus K] [--dir DIR] "
               "[--json FILE]\n",
               argv[0]);
    return 2;
  }
  if (o.rank < 0) return kjit::Launch(o);
  auto result = kjit::RunRank(o);
  if (!result.ok()) {
    fmt::print(stderr, "rank {}: {}\n", o.rank, kjit::ToStd(result.status().message()));
    return 1;
  }
  fmt::print("{}\n", result->dump());
  return 0;
}
