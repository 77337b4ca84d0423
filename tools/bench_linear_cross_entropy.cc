// `kjit bench --op linear_cross_entropy`: the fused lm_head + loss against, in the same run, the
// three GEMMs alone (cuBLASLt's first choices, the floor the op is held to), the unfused path
// (the whole logits materialized, kjit's cross-entropy in place, the two gradient GEMMs) and the
// loss kernel alone on the whole logits (its share of the time). Each fused config is checked
// against the unfused path's loss, d_hidden and sampled rows of d_weight before it is timed.
// Memory: the op's workspace, split into the fp32 weight-gradient accumulator and the rest, and the
// device memory a launch takes beyond it (cuMemGetInfo around the first launch).
#include "tools/bench_linear_cross_entropy.h"

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ops/common/tuning/compare.h"
#include "ops/common/tuning/trial.h"
#include "ops/gemm/hopper_gemm.h"
#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/tuning/unfused.h"
#include "runtime/runtime_state.h"
#include "tools/bench.h"

namespace kjit::tools {

namespace {

using autotune::GpuTimer;
using autotune::Timing;

struct Problem {
  int64_t vocab, hidden, rows;
  DType dtype;
  DeviceBuffer h, w, targets, loss, d_hidden, d_weight;
  TensorView H() const { return TensorView::Matrix(h.data(), dtype, rows, hidden); }
  TensorView W() const { return TensorView::Matrix(w.data(), dtype, vocab, hidden); }
  IndexView T() const { return IndexView::Of(targets.data(), IndexType::kInt64, rows); }
  TensorView Loss() const { return TensorView::Vector(loss.data(), DType::kF32, 1); }
  TensorView DHidden() const { return TensorView::Matrix(d_hidden.data(), dtype, rows, hidden); }
  TensorView DWeight() const { return TensorView::Matrix(d_weight.data(), dtype, vocab, hidden); }
  double Flops() const { return 6.0 * rows * vocab * hidden; }
  // The fewest bytes: the inputs read, the gradients written.
  double Bytes() const {
    return static_cast<double>(SizeOf(dtype)) * (2.0 * rows * hidden + 2.0 * vocab * hidden);
  }
};

absl::StatusOr<Problem> MakeProblem(const Runtime& rt, int64_t vocab, int64_t hidden, int64_t rows,
                                    DType dtype) {
  const size_t e = SizeOf(dtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer h, DeviceBuffer::Create(rt, rows * hidden * e));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer w, DeviceBuffer::Create(rt, vocab * hidden * e));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer t, DeviceBuffer::Create(rt, rows * 8));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer loss, DeviceBuffer::Create(rt, 4));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dh, DeviceBuffer::Create(rt, rows * hidden * e));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dw, DeviceBuffer::Create(rt, vocab * hidden * e));
  // Logits of deviation about 2: uniform h in [-2, 2), W in +-1.5 / sqrt(hidden).
  const float w_range = 1.5f / std::sqrt(static_cast<float>(hidden));
  KJIT_RETURN_IF_ERROR(ops::RandomFill(rt, h.data(), dtype, rows, hidden, hidden, 1, -2, 2));
  KJIT_RETURN_IF_ERROR(
      ops::RandomFill(rt, w.data(), dtype, vocab, hidden, hidden, 2, -w_range, w_range));
  KJIT_RETURN_IF_ERROR(ops::RandomTargets(rt, t.data(), IndexType::kInt64, rows, 3, vocab));
  return Problem{vocab,         hidden,       rows,         dtype,
                 std::move(h),  std::move(w), std::move(t), std::move(loss),
                 std::move(dh), std::move(dw)};
}

// What the unfused path computed, for the fused configs' check.
struct Expected {
  double loss = 0;
  std::vector<double> d_hidden;
  std::vector<int64_t> d_weight_rows;  // sampled
  std::vector<double> d_weight;        // those rows
};

absl::Status CheckAgainst(const Expected& want, const Problem& p, const std::string& what) {
  KJIT_ASSIGN_OR_RETURN(std::vector<double> loss, DownloadValues(p.loss, DType::kF32));
  if (!(std::fabs(loss[0] - want.loss) <= 1e-3 * std::fabs(want.loss))) {
    return absl::InternalError(
        fmt::format("{}: loss {} against the unfused path's {}", what, loss[0], want.loss));
  }
  KJIT_ASSIGN_OR_RETURN(std::vector<double> dh, DownloadValues(p.d_hidden, p.dtype));
  const ops::CompareResult r = ops::CompareGemmResult(dh, want.d_hidden, p.dtype);
  if (!r.ok) return absl::InternalError(fmt::format("{}: {}", what, r.Describe("d_hidden")));
  KJIT_ASSIGN_OR_RETURN(std::vector<double> dw,
                        ops::SampledRows(p.d_weight, p.dtype, p.hidden, want.d_weight_rows));
  const ops::CompareResult rw = ops::CompareGemmResult(dw, want.d_weight, p.dtype);
  if (!rw.ok) return absl::InternalError(fmt::format("{}: {}", what, rw.Describe("d_weight")));
  return absl::OkStatus();
}

// The device memory in use (all processes), for what a launch takes beyond its workspace.
absl::StatusOr<int64_t> UsedBytes(const Runtime& rt) {
  const jit::Driver& cu = *internal::StateOf(rt).driver;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize"));
  size_t free = 0, total = 0;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuMemGetInfo(&free, &total), "cuMemGetInfo"));
  return static_cast<int64_t>(total - free);
}

// The unfused path's GEMMs, as the report names them.
constexpr std::pair<const char*, ops::UnfusedLinearCrossEntropy::Gemm> kGemms[] = {
    {"gemm_logits", ops::UnfusedLinearCrossEntropy::kLogits},
    {"gemm_d_hidden", ops::UnfusedLinearCrossEntropy::kDHidden},
    {"gemm_d_weight", ops::UnfusedLinearCrossEntropy::kDWeight}};

class Bench {
 public:
  Bench(const Runtime& rt, GpuTimer& timer, int repeats, double copy_gbps, Problem& p)
      : rt_(rt), timer_(timer), repeats_(repeats), copy_gbps_(copy_gbps), p_(p) {}

  absl::Status Baselines();
  absl::Status Fused(const std::optional<LinearCrossEntropyConfig>& config,
                     WeightGradAccumulation accumulation);
  // Configs around the default: chunk sizes and streams, then each GEMM's algorithms.
  absl::StatusOr<std::vector<LinearCrossEntropyConfig>> Sweep();
  // Each GEMM of the unfused path with every algorithm cuBLASLt offers for its shape, then the
  // three with their fastest together: the GEMM floor with algorithms tuned for the shape. Where
  // the heuristic takes the rows whole its GEMMs have these shapes, so the same indices apply:
  // returns the heuristic with them, else nothing.
  absl::StatusOr<std::optional<LinearCrossEntropyConfig>> FastestGemmAlgorithms();
  nlohmann::json entries() const { return entries_; }

 private:
  std::string Shape() const {
    return fmt::format("vocab={} hidden={} rows={}", p_.vocab, p_.hidden, p_.rows);
  }
  // `flops`: the GEMM work the entry did (one GEMM is a third of the op's; negative: none).
  void Add(const std::string& impl, const std::string& config, const Timing& t,
           nlohmann::json extra, double flops = 0) {
    extra["impl"] = impl;
    extra["vocab"] = p_.vocab;
    extra["hidden"] = p_.hidden;
    extra["rows"] = p_.rows;
    if (flops >= 0) extra["tflops"] = (flops > 0 ? flops : p_.Flops()) / (t.median_us * 1e6);
    if (gemms_us_ > 0) extra["ratio_to_gemms"] = t.median_us / gemms_us_;
    entries_.push_back(BenchEntry({.op = "linear_cross_entropy",
                                   .pass = "forward_backward",
                                   .shape = Shape(),
                                   .config = config,
                                   .dtype = p_.dtype,
                                   .heuristic = config == "heuristic",
                                   .bytes = p_.Bytes(),
                                   .extra = std::move(extra)},
                                  t, copy_gbps_));
  }

  const Runtime& rt_;
  GpuTimer& timer_;
  int repeats_;
  double copy_gbps_;
  Problem& p_;
  Expected expected_;
  double gemms_us_ = 0;
  std::unique_ptr<ops::UnfusedLinearCrossEntropy> unfused_;
  std::vector<int> algo_counts_ = {1, 1, 1};  // logits, d_hidden, d_weight at the default chunk
  nlohmann::json entries_ = nlohmann::json::array();
};

absl::Status Bench::Baselines() {
  using U = ops::UnfusedLinearCrossEntropy;
  KJIT_ASSIGN_OR_RETURN(const int64_t used_before, UsedBytes(rt_));
  KJIT_ASSIGN_OR_RETURN(unfused_, U::Create(rt_, {.vocab = p_.vocab, .dtype = p_.dtype},
                                            {.hidden = p_.H(),
                                             .weight = p_.W(),
                                             .targets = p_.T(),
                                             .loss = p_.Loss(),
                                             .d_hidden = p_.DHidden(),
                                             .d_weight = p_.DWeight()}));
  KJIT_ASSIGN_OR_RETURN(const int64_t used_after, UsedBytes(rt_));
  KJIT_RETURN_IF_ERROR(unfused_->Run(nullptr));
  KJIT_ASSIGN_OR_RETURN(std::vector<double> l, DownloadValues(p_.loss, DType::kF32));
  expected_.loss = l[0];
  KJIT_ASSIGN_OR_RETURN(expected_.d_hidden, DownloadValues(p_.d_hidden, p_.dtype));
  expected_.d_weight_rows = ops::SampleRows(p_.vocab);
  KJIT_ASSIGN_OR_RETURN(expected_.d_weight, ops::SampledRows(p_.d_weight, p_.dtype, p_.hidden,
                                                             expected_.d_weight_rows));

  KJIT_ASSIGN_OR_RETURN(Timing gemms, timer_.Time(repeats_, [&]() -> absl::Status {
    for (U::Gemm g : {U::kLogits, U::kDHidden, U::kDWeight})
      KJIT_RETURN_IF_ERROR(unfused_->RunGemm(g, nullptr));
    return absl::OkStatus();
  }));
  gemms_us_ = gemms.median_us;
  Add("gemms", "cuBLASLt heuristic", gemms, {});
  for (const auto& [name, g] : kGemms) {
    const U::Gemm one = g;  // a lambda may not capture a structured binding (clang)
    KJIT_ASSIGN_OR_RETURN(Timing t,
                          timer_.Time(repeats_, [&] { return unfused_->RunGemm(one, nullptr); }));
    Add(name, "cuBLASLt heuristic", t, {}, p_.Flops() / 3);
  }
  KJIT_ASSIGN_OR_RETURN(Timing t_loss, timer_.Time(
                                           repeats_, [&] { return unfused_->Loss(nullptr); },
                                           [&] { return unfused_->RunGemm(U::kLogits, nullptr); }));
  Add("loss_kernel", unfused_->cross_entropy().ConfigFor(unfused_->logits()).ToString(), t_loss, {},
      /*flops=*/-1);
  KJIT_ASSIGN_OR_RETURN(Timing t_unfused,
                        timer_.Time(repeats_, [&] { return unfused_->Run(nullptr); }));
  // The logits, the loss's workspace and cuBLASLt's, as the driver saw them allocated.
  Add("unfused", "cuBLASLt heuristic + kjit cross_entropy", t_unfused,
      {{"extra_device_bytes", used_after - used_before}});

  // The GEMMs' algorithm counts at the heuristic's chunk (all the rows when it takes them whole:
  // then d_weight is written directly, else summed into the fp32 accumulator), for the sweep.
  const LinearCrossEntropySpec spec{.vocab = p_.vocab, .hidden = p_.hidden, .dtype = p_.dtype};
  const LinearCrossEntropyConfig heuristic = ops::DefaultLinearCrossEntropyConfig(spec);
  const bool whole = p_.rows <= heuristic.whole_rows;
  const int64_t chunk = whole ? p_.rows : std::min(heuristic.chunk_rows, p_.rows);
  void* logits = unfused_->logits().data;
  const TensorView c = TensorView::Matrix(logits, p_.dtype, chunk, p_.vocab,
                                          ops::ChunkRowStride(p_.vocab, p_.dtype));
  const TensorView h_c = TensorView::Matrix(p_.h.data(), p_.dtype, chunk, p_.hidden);
  const TensorView dh_c = TensorView::Matrix(p_.d_hidden.data(), p_.dtype, chunk, p_.hidden);
  const TensorView acc = TensorView::Matrix(logits, DType::kF32, p_.vocab, p_.hidden);
  int i = 0;
  for (const ops::GemmArgs& g :
       {ops::GemmArgs{.a = h_c, .b = p_.W(), .transpose_b = true, .out = c},
        ops::GemmArgs{.a = c, .b = p_.W(), .out = dh_c},
        ops::GemmArgs{.a = c,
        .transpose_a = true,
        .b = h_c,
        .out = whole ? p_.DWeight() : acc,
        .beta = whole ? 0.0f : 1.0f}}) {
    KJIT_ASSIGN_OR_RETURN(algo_counts_[i++], unfused_->lt_gemm().AlgoCount(g));
  }
  return absl::OkStatus();
}

absl::Status Bench::Fused(const std::optional<LinearCrossEntropyConfig>& config,
                          WeightGradAccumulation accumulation) {
  LinearCrossEntropySpec spec{.vocab = p_.vocab,
                              .hidden = p_.hidden,
                              .dtype = p_.dtype,
                              .weight_grad_accumulation = accumulation,
                              .config = config};
  KJIT_ASSIGN_OR_RETURN(LinearCrossEntropy op, rt_.LinearCrossEntropy(spec));
  const int64_t ws_bytes = op.WorkspaceBytes(p_.rows);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Create(rt_, ws_bytes));
  const LinearCrossEntropyArgs args{.hidden_states = p_.H(),
                                    .weight = p_.W(),
                                    .targets = p_.T(),
                                    .loss = p_.Loss(),
                                    .d_hidden = p_.DHidden(),
                                    .d_weight = p_.DWeight(),
                                    .workspace = ws.data(),
                                    .workspace_bytes = ws_bytes};
  KJIT_RETURN_IF_ERROR(p_.loss.Fill(0xFF));
  KJIT_RETURN_IF_ERROR(p_.d_hidden.Fill(0xFF));
  KJIT_RETURN_IF_ERROR(p_.d_weight.Fill(0xFF));
  KJIT_ASSIGN_OR_RETURN(const int64_t used_before, UsedBytes(rt_));
  KJIT_RETURN_IF_ERROR(op.ForwardBackward(nullptr, args));
  KJIT_ASSIGN_OR_RETURN(const int64_t used_after, UsedBytes(rt_));
  const std::string name = op.ConfigFor(p_.rows).ToString();
  KJIT_RETURN_IF_ERROR(CheckAgainst(expected_, p_, name));
  KJIT_ASSIGN_OR_RETURN(Timing t,
                        timer_.Time(repeats_, [&] { return op.ForwardBackward(nullptr, args); }));
  Add(accumulation == WeightGradAccumulation::kFloat32 ? "fused" : "fused_output_dtype",
      config ? name : "heuristic", t,
      {{"config_used", name},
       {"weight_grad_accumulation", Name(accumulation)},
       {"workspace_bytes", ws_bytes},
       {"accumulator_bytes", op.AccumulatorBytes(p_.rows)},
       {"workspace_beyond_accumulator", ws_bytes - op.AccumulatorBytes(p_.rows)},
       {"launch_device_bytes", used_after - used_before}});
  return absl::OkStatus();
}

absl::StatusOr<std::optional<LinearCrossEntropyConfig>> Bench::FastestGemmAlgorithms() {
  using U = ops::UnfusedLinearCrossEntropy;
  int fastest[3] = {0, 0, 0};
  for (const auto& [name, g] : kGemms) {
    const U::Gemm gemm = g;  // a lambda may not capture a structured binding (clang)
    KJIT_ASSIGN_OR_RETURN(const int algos,
                          unfused_->lt_gemm().AlgoCount(unfused_->gemm_args(gemm)));
    double best_us = 0;
    for (int algo = 0; algo < algos; ++algo) {
      KJIT_ASSIGN_OR_RETURN(
          Timing t, timer_.Time(repeats_, [&] { return unfused_->RunGemm(gemm, nullptr, algo); }));
      Add(name, fmt::format("cuBLASLt algorithm {}", algo), t, {{"algo", algo}}, p_.Flops() / 3);
      if (algo == 0 || t.median_us < best_us) {
        best_us = t.median_us;
        fastest[gemm] = algo;
      }
    }
    // kjit's own GEMM beside them, where it applies (its output is checked through the fused op's
    // sweep entry that runs all three on it).
    const ops::GemmArgs& args = unfused_->gemm_args(gemm);
    if (ops::HopperGemm::Supports(args, internal::StateOf(rt_).target).ok()) {
      KJIT_ASSIGN_OR_RETURN(const ops::GemmShape shape, ops::ShapeOf(args));
      KJIT_ASSIGN_OR_RETURN(Timing t, timer_.Time(repeats_, [&] {
        return unfused_->RunGemm(gemm, nullptr, ops::kOwnGemm);
      }));
      Add(name, "kjit sm_90a GEMM " + ops::DefaultGemmConfig(shape.m, shape.n, shape.k).ToString(),
          t, {{"algo", "kjit"}}, p_.Flops() / 3);
    }
  }
  const std::string algos = fmt::format("logits_algo={} d_hidden_algo={} d_weight_algo={}",
                                        fastest[0], fastest[1], fastest[2]);
  // The three timed as one run, as the `gemms` entry times cuBLASLt's first choices (there too
  // the gradient GEMMs read the logits the first one wrote: the same bytes for every algorithm).
  KJIT_ASSIGN_OR_RETURN(Timing t, timer_.Time(repeats_, [&]() -> absl::Status {
    for (U::Gemm g : {U::kLogits, U::kDHidden, U::kDWeight})
      KJIT_RETURN_IF_ERROR(unfused_->RunGemm(g, nullptr, fastest[g]));
    return absl::OkStatus();
  }));
  Add("gemms_fastest_algorithms", algos, t, {});
  const LinearCrossEntropySpec spec{.vocab = p_.vocab, .hidden = p_.hidden, .dtype = p_.dtype};
  LinearCrossEntropyConfig c = ops::DefaultLinearCrossEntropyConfig(spec);
  if (p_.rows > c.whole_rows) return std::nullopt;
  c.logits_algo = fastest[0];
  c.d_hidden_algo = fastest[1];
  c.d_weight_algo = fastest[2];
  return c;
}

absl::StatusOr<std::vector<LinearCrossEntropyConfig>> Bench::Sweep() {
  const LinearCrossEntropySpec spec{.vocab = p_.vocab, .hidden = p_.hidden, .dtype = p_.dtype};
  const LinearCrossEntropyConfig base = ops::DefaultLinearCrossEntropyConfig(spec);
  std::vector<LinearCrossEntropyConfig> out;
  // Chunked throughout (no whole_rows), so that they differ from the heuristic where it takes
  // every row as one chunk.
  for (int64_t chunk :
       {base.chunk_rows / 2, base.chunk_rows, base.chunk_rows * 2, base.chunk_rows * 4}) {
    if (chunk < 128 || chunk > p_.rows) continue;
    for (int streams : {1, 2}) {
      LinearCrossEntropyConfig c = base;
      c.chunk_rows = chunk;
      c.whole_rows = 0;
      c.streams = streams;
      if (!(c == base)) out.push_back(c);
    }
  }
  for (int gemm = 0; gemm < 3; ++gemm) {
    for (int algo = 1; algo < algo_counts_[gemm]; ++algo) {
      LinearCrossEntropyConfig c = base;
      (gemm == 0 ? c.logits_algo : gemm == 1 ? c.d_hidden_algo : c.d_weight_algo) = algo;
      out.push_back(c);
    }
  }
  // kjit's own GEMM for all three (cuBLASLt, with a warning, for any it does not apply to).
  LinearCrossEntropyConfig own = base;
  own.logits_algo = own.d_hidden_algo = own.d_weight_algo = LinearCrossEntropyConfig::kOwnGemm;
  out.push_back(own);
  return out;
}

}  // namespace

std::vector<LinearCrossEntropyBenchShape> LinearCrossEntropyBenchShapes() {
  // LLaMA 3 8B's lm_head at three token counts, Gemma 2 9B's and Qwen 2 7B's at 8192.
  return {{128256, 4096, 4096},
          {128256, 4096, 8192},
          {128256, 4096, 16384},
          {256000, 3584, 8192},
          {151936, 3584, 8192}};
}

absl::StatusOr<nlohmann::json> BenchLinearCrossEntropy(const Runtime& rt, GpuTimer& timer,
                                                       const LinearCrossEntropyBenchShape& shape,
                                                       DType dtype, int repeats, double copy_gbps,
                                                       bool sweep,
                                                       const std::vector<std::string>& configs) {
  KJIT_ASSIGN_OR_RETURN(Problem p, MakeProblem(rt, shape.vocab, shape.hidden, shape.rows, dtype));
  Bench bench(rt, timer, repeats, copy_gbps, p);
  KJIT_RETURN_IF_ERROR(bench.Baselines());
  if (configs.empty()) {
    KJIT_RETURN_IF_ERROR(bench.Fused(std::nullopt, WeightGradAccumulation::kFloat32));
    KJIT_RETURN_IF_ERROR(bench.Fused(std::nullopt, WeightGradAccumulation::kOutputDtype));
    // Where the heuristic takes the rows whole, its chunked schedule too: the one that keeps the
    // workspace beside the fp32 accumulator under 0.5 GiB.
    LinearCrossEntropyConfig chunked = ops::DefaultLinearCrossEntropyConfig(
        {.vocab = shape.vocab, .hidden = shape.hidden, .dtype = dtype});
    if (shape.rows <= chunked.whole_rows && shape.rows > chunked.chunk_rows) {
      chunked.whole_rows = 0;
      KJIT_RETURN_IF_ERROR(bench.Fused(chunked, WeightGradAccumulation::kFloat32));
    }
  }
  std::vector<LinearCrossEntropyConfig> timed;
  for (const std::string& text : configs) {
    KJIT_ASSIGN_OR_RETURN(LinearCrossEntropyConfig c, ParseLinearCrossEntropyConfig(text));
    timed.push_back(c);
  }
  if (sweep) {
    KJIT_ASSIGN_OR_RETURN(timed, bench.Sweep());
    KJIT_ASSIGN_OR_RETURN(std::optional<LinearCrossEntropyConfig> fastest,
                          bench.FastestGemmAlgorithms());
    if (fastest) timed.push_back(*fastest);
  }
  for (const LinearCrossEntropyConfig& c : timed) {
    KJIT_RETURN_IF_ERROR(bench.Fused(c, WeightGradAccumulation::kFloat32));
  }
  return bench.entries();
}

}  // namespace kjit::tools
