// kjit-bench-sharded: bandwidth per GPU of the vocab-parallel cross-entropy against the unsharded
// op on one GPU, as JSON. For each split (default 2 and 4 ways of vocab 128256, rows 16384, bf16)
// it times one rank's work for shard 0 (its own contiguous [rows, vocab / ways] logits, gradient
// in place): ComputeStats, the device combine of all the split's shards (standing in for the two
// NCCL all-reduces, which one GPU cannot time) and Finish. The unsharded op's fused
// forward+backward is timed the same way. Every timing: autotune::GpuTimer (warm-up, L2 flushed,
// logits restored untimed before each repeat, median); bandwidth as a ratio to a device-to-device
// copy timed in the same run. Results are checked against the fp64 reference on sampled rows first.
//
// Bytes: the sharded op must read its shard twice (the reduction sits between the passes) and
// write the gradient once, 3 * rows * width * 2 bytes ("bytes"); "min_bytes" is the 2x a fused
// single-pass op would move, for comparison with the unsharded op's 2 * rows * vocab * 2.
//
//   kjit-bench-sharded [--vocab 128256] [--rows 16384] [--ways 2,4] [--repeats 30] [--output F]
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "jit/file_io.h"
#include "jit/status_helpers.h"
#include "kjit/host_convert.h"
#include "ops/common/tuning/random_values.h"
#include "ops/cross_entropy/tuning/reference.h"
#include "tools/bench.h"

namespace kjit::tools {
namespace {

constexpr int64_t kDistinctRows = 256;  // the host draws these; the device rows repeat them
constexpr int64_t kCheckedRows = 16;
constexpr DType kDtype = DType::kBF16;

struct Problem {
  int64_t vocab, rows;
  std::vector<double> logits;    // [kDistinctRows, vocab]
  std::vector<int64_t> targets;  // [rows]
};

// A [rows, end - start] device buffer of columns [start, end) of the problem's logits.
absl::StatusOr<DeviceBuffer> UploadColumns(const Runtime& rt, const Problem& p, int64_t start,
                                           int64_t end) {
  const int64_t width = end - start, row_bytes = width * 2;
  std::vector<double> cols(kDistinctRows * width);
  for (int64_t r = 0; r < kDistinctRows; ++r) {
    std::copy_n(&p.logits[r * p.vocab + start], width, &cols[r * width]);
  }
  const std::vector<unsigned char> block = Encode(cols, kDtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, p.rows * row_bytes));
  for (int64_t r = 0; r < p.rows; r += kDistinctRows) {
    const int64_t n = std::min(kDistinctRows, p.rows - r);
    KJIT_RETURN_IF_ERROR(b.Upload(block.data(), n * row_bytes, r * row_bytes));
  }
  return b;
}

// The first kCheckedRows rows of a gradient (the columns [start, end)) against the reference.
absl::Status CheckRows(const Problem& p,
                       const std::vector<std::pair<const DeviceBuffer*, int64_t>>& parts,
                       const char* what) {
  std::vector<double> grad(kCheckedRows * p.vocab);
  int64_t start = 0;
  for (const auto& [buf, width] : parts) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> g,
                          DownloadValues(*buf, kDtype, 0, kCheckedRows * width * 2));
    for (int64_t r = 0; r < kCheckedRows; ++r) {
      std::copy_n(&g[r * width], width, &grad[r * p.vocab + start]);
    }
    start += width;
  }
  const ops::CrossEntropyMath math{
      .vocab = p.vocab, .dtype = kDtype, .loss = {.reduction = Reduction::kNone}};
  const std::vector<double> scale(kCheckedRows, 1.0 / p.rows);  // mean over all-valid rows
  const std::vector<double> logits(p.logits.begin(), p.logits.begin() + kCheckedRows * p.vocab);
  const std::vector<int64_t> targets(p.targets.begin(), p.targets.begin() + kCheckedRows);
  const auto ref = ops::CrossEntropyReference(math, kCheckedRows, logits, targets, &scale, true);
  for (const auto& [name, r] : ops::CheckCrossEntropy(math, {.grad = &grad}, ref)) {
    if (!r.ok)
      return absl::InternalError(fmt::format("{}: wrong gradient: {}", what, r.Describe(name)));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> Run(int64_t vocab, int64_t rows, const std::vector<int>& ways,
                                   int repeats) {
  KJIT_ASSIGN_OR_RETURN(Runtime rt, Runtime::Create());
  KJIT_ASSIGN_OR_RETURN(auto timer, autotune::GpuTimer::Create(rt));
  Problem p{vocab, rows, {}, {}};
  std::mt19937_64 gen(0x5eed);
  p.logits = ops::RandomValues(gen, kDistinctRows * vocab, 3.0, 0, kDtype);
  for (int64_t r = 0; r < rows; ++r) p.targets.push_back(static_cast<int64_t>(gen() % vocab));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_targets, DeviceBuffer::Create(rt, rows * 8));
  KJIT_RETURN_IF_ERROR(d_targets.Upload(p.targets.data(), rows * 8));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, 16));
  const IndexView targets = IndexView::Of(d_targets.data(), IndexType::kInt64, rows);
  const TensorView loss = TensorView::Vector(d_loss.data(), DType::kF32, 1);

  const std::string shape = fmt::format("vocab={} rows={}", vocab, rows);
  nlohmann::json entries = nlohmann::json::array();
  double copy_gbps = 0;
  autotune::Timing t_full;
  {  // The copy ceiling and the unsharded op; their buffers are freed for the shards'.
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer pristine, UploadColumns(rt, p, 0, vocab));
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer work, DeviceBuffer::Create(rt, pristine.size()));
    KJIT_ASSIGN_OR_RETURN(autotune::Timing t_copy,
                          timer->Time(repeats, [&] { return work.CopyFrom(pristine); }));
    copy_gbps = 2.0 * pristine.size() / (t_copy.median_us * 1e3);
    KJIT_ASSIGN_OR_RETURN(CrossEntropy ce, rt.CrossEntropy({.vocab = vocab, .dtype = kDtype}));
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Create(rt, ce.WorkspaceBytes(rows)));
    const TensorView all = TensorView::Matrix(work.data(), kDtype, rows, vocab);
    const CrossEntropyArgs full{.logits = all,
                                .targets = targets,
                                .loss = loss,
                                .grad = all,
                                .workspace = ws.data(),
                                .workspace_bytes = ce.WorkspaceBytes(rows)};
    KJIT_RETURN_IF_ERROR(work.CopyFrom(pristine));
    KJIT_RETURN_IF_ERROR(ce.ForwardBackward(nullptr, full));
    KJIT_RETURN_IF_ERROR(CheckRows(p, {{&work, vocab}}, "unsharded"));
    KJIT_ASSIGN_OR_RETURN(t_full, timer->Time(
                                      repeats, [&] { return ce.ForwardBackward(nullptr, full); },
                                      [&] { return work.CopyFrom(pristine); }));
    entries.push_back(BenchEntry({.op = "cross_entropy",
                                  .pass = "forward_backward",
                                  .shape = shape,
                                  .config = ce.config().ToString(),
                                  .dtype = kDtype,
                                  .bytes = 2.0 * rows * vocab * 2,
                                  .extra = {{"vocab", vocab}, {"rows", rows}, {"ways", 1}}},
                                 t_full, copy_gbps));
  }

  for (int n : ways) {
    std::vector<ShardedCrossEntropy> ops;
    std::vector<DeviceBuffer> logits, workspaces;
    std::vector<ShardedCrossEntropyArgs> args;
    std::vector<std::pair<const DeviceBuffer*, int64_t>> parts;
    for (int i = 0; i < n; ++i) {
      const int64_t start = vocab * i / n, end = vocab * (i + 1) / n;
      KJIT_ASSIGN_OR_RETURN(
          ShardedCrossEntropy op,
          rt.ShardedCrossEntropy(
              {.vocab = vocab, .shard_start = start, .shard_end = end, .dtype = kDtype}));
      KJIT_ASSIGN_OR_RETURN(DeviceBuffer l, UploadColumns(rt, p, start, end));
      KJIT_ASSIGN_OR_RETURN(DeviceBuffer w, DeviceBuffer::Create(rt, op.WorkspaceBytes(rows)));
      const TensorView x = TensorView::Matrix(l.data(), kDtype, rows, end - start);
      args.push_back({.logits = x,
                      .targets = targets,
                      .loss = loss,
                      .grad = x,
                      .workspace = w.data(),
                      .workspace_bytes = op.WorkspaceBytes(rows)});
      ops.push_back(std::move(op));
      logits.push_back(std::move(l));
      workspaces.push_back(std::move(w));
    }
    std::vector<ShardedCrossEntropy::Shard> shards;
    for (int i = 0; i < n; ++i) {
      shards.push_back({&ops[i], workspaces[i].data()});
      parts.push_back({&logits[i], ops[i].spec().width()});
    }
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer shard0, DeviceBuffer::Create(rt, logits[0].size()));
    KJIT_RETURN_IF_ERROR(shard0.CopyFrom(logits[0]));  // shard 0's pristine logits
    for (int i = 0; i < n; ++i) KJIT_RETURN_IF_ERROR(ops[i].ComputeStats(nullptr, args[i]));
    KJIT_RETURN_IF_ERROR(ShardedCrossEntropy::CombineStats(nullptr, shards, rows));
    for (int i = 0; i < n; ++i) KJIT_RETURN_IF_ERROR(ops[i].Finish(nullptr, args[i]));
    KJIT_RETURN_IF_ERROR(CheckRows(p, parts, "sharded"));
    // The timed repeats: one rank's steps for shard 0. The combine reads the other shards'
    // statistics as the previous repeat left them: the same work, other values.
    KJIT_ASSIGN_OR_RETURN(
        autotune::Timing t,
        timer->Time(
            repeats,
            [&]() -> absl::Status {
              KJIT_RETURN_IF_ERROR(ops[0].ComputeStats(nullptr, args[0]));
              KJIT_RETURN_IF_ERROR(ShardedCrossEntropy::CombineStats(nullptr, shards, rows));
              return ops[0].Finish(nullptr, args[0]);
            },
            [&] { return logits[0].CopyFrom(shard0); }));
    const int64_t width = ops[0].spec().width();
    nlohmann::json e = BenchEntry(
        {.op = "sharded_cross_entropy",
         .pass = "forward_backward",
         .shape = shape,
         .config = ops[0].config().ToString(),
         .dtype = kDtype,
         .bytes = 3.0 * rows * width * 2,
         .extra = {{"vocab", vocab},
                   {"rows", rows},
                   {"ways", n},
                   {"shard_width", width},
                   {"reduction_timed", "device combine of the split's shards (NCCL not timed)"}}},
        t, copy_gbps);
    e["min_bytes"] = 2.0 * rows * width * 2;
    e["ratio_to_copy_of_min_bytes"] =
        e["min_bytes"].get<double>() / (t.median_us * 1e3) / copy_gbps;
    e["speedup_vs_unsharded"] = t_full.median_us / t.median_us;
    e["ideal_speedup"] = n;
    entries.push_back(e);
  }
  return nlohmann::json{
      {"device", rt.device().name}, {"copy_gbps", copy_gbps}, {"entries", entries}};
}

}  // namespace
}  // namespace kjit::tools

int main(int argc, char** argv) {
  int64_t vocab = 128256, rows = 16384;
  int repeats = 30;
  std::vector<int> ways = {2, 4};
  std::string output;
  CLI::App app{
      "kjit-bench-sharded: bandwidth per GPU of the vocab-parallel cross-entropy (one "
      "shard's work, checked first) against the unsharded op, as JSON",
      "kjit-bench-sharded"};
  app.add_option("--vocab", vocab, "The whole vocab")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--rows", rows, "Rows (tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31))
      ->capture_default_str();
  app.add_option("--ways", ways, "Splits to time")
      ->delimiter(',')
      ->check(CLI::Range(2, 32))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Timed repeats")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  app.add_option("--output", output, "Also write the report to this file")->type_name("FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto report = kjit::tools::Run(vocab, rows, ways, repeats);
  if (!report.ok()) {
    fmt::print(stderr, "kjit-bench-sharded: {}\n", kjit::ToStd(report.status().message()));
    return 1;
  }
  const std::string text = report->dump(2);
  fmt::print("{}\n", text);
  if (absl::Status s =
          output.empty() ? absl::OkStatus() : kjit::jit::WriteFileInPlace(output, text + "\n");
      !s.ok()) {
    fmt::print(stderr, "kjit-bench-sharded: --output: {}\n", kjit::ToStd(s.message()));
    return 1;
  }
  return 0;
}
