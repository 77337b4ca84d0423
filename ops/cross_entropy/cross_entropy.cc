#include "kjit/cross_entropy.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "jit/dtype.h"
#include "jit/instantiation.h"
#include "ops/common/loss_options.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/launch_args.h"
#include "ops/cross_entropy/program.h"
#include "ops/cross_entropy/tuning_key.h"
#include "runtime/op_kernels.h"
#include "runtime/runtime_state.h"
#include "runtime/tensor_checks.h"
#include "runtime/tuned_configs.h"
#include "templates/cross_entropy_params.h"

namespace kjit {

namespace {

constexpr int64_t kMinVocab = 2;
constexpr int64_t kMaxVocab = int64_t{1} << 20;
// The count and reduce kernels are one block each: targets and per-row losses are small.
constexpr int kCountThreads = 1024;
constexpr int kReduceThreads = 1024;
// The gradient rescale streams whole 16-byte vectors at most, four loads in flight per thread.
constexpr int kRescaleThreads = 256;
constexpr int kRescaleUnroll = 4;
// Blocks a rescale launch aims at in all (while rows allow): two waves of full SMs.
constexpr int kRescaleWaves = 2;
constexpr int kThreadsPerSm = 2048;
constexpr int64_t kCountersBytes = kCrossEntropyRowLossOffset;
static_assert(sizeof(CrossEntropyCounters) <= kCountersBytes);

// The template arguments the forward and backward kernels share, in their order.
jit::TemplateArgs RowArgs(const CrossEntropySpec& s, const CrossEntropyConfig& c) {
  return {s.dtype,
          s.loss.target_type,
          s.vocab,
          c.threads,
          c.vec,
          c.unroll,
          ops::ReductionArg(s.loss.reduction),
          ops::LossTermsArg(s.loss)};
}
std::string ForwardExpr(const CrossEntropySpec& s, const CrossEntropyConfig& c, bool gradient) {
  return jit::Instantiate("kjit::cross_entropy_forward", RowArgs(s, c), s.loss.argmax,
                          s.loss.entropy, gradient, ops::ClassWeightArg(s.loss.class_weight_dtype));
}
// The fused op's kernels that hold the row in a cluster: cross_entropy_resident or _staged.
std::string ClusterExpr(const char* kernel, const CrossEntropySpec& s,
                        const CrossEntropyConfig& c) {
  return jit::Instantiate(kernel, s.dtype, s.loss.target_type, s.vocab, c.threads, c.vec, c.cluster,
                          ops::ReductionArg(s.loss.reduction), ops::LossTermsArg(s.loss),
                          s.loss.argmax, s.loss.entropy,
                          ops::ClassWeightArg(s.loss.class_weight_dtype));
}
std::string FusedExpr(const CrossEntropySpec& s, const CrossEntropyConfig& c) {
  if (c.staged) return ClusterExpr("kjit::cross_entropy_staged", s, c);
  return c.cluster > 0 ? ClusterExpr("kjit::cross_entropy_resident", s, c)
                       : ForwardExpr(s, c, true);
}
std::string BackwardExpr(const CrossEntropySpec& s, const CrossEntropyConfig& c) {
  return jit::Instantiate("kjit::cross_entropy_backward", RowArgs(s, c),
                          ops::ClassWeightArg(s.loss.class_weight_dtype));
}
}  // namespace

jit::TemplateArg ops::ReductionArg(Reduction r) {
  switch (r) {
    case Reduction::kNone: return jit::TemplateArg::Name("kjit::kCeNone");
    case Reduction::kSum: return jit::TemplateArg::Name("kjit::kCeSum");
    case Reduction::kMean: return jit::TemplateArg::Name("kjit::kCeMean");
  }
  return jit::TemplateArg::Name("?");
}

jit::TemplateArg ops::LossTermsArg(const LossOptions& loss) {
  return jit::TemplateArg::Name(jit::Instantiate("kjit::CeLossTerms", loss.label_smoothing > 0,
                                                 loss.z_loss > 0, loss.softcap > 0));
}

jit::TemplateArg ops::ClassWeightArg(const std::optional<DType>& class_weight_dtype) {
  if (class_weight_dtype) return *class_weight_dtype;
  return jit::TemplateArg::Name("kjit::NoClassWeight");
}

std::string ops::CrossEntropyCountExpr(const CrossEntropySpec& s, int threads) {
  return jit::Instantiate("kjit::cross_entropy_count", s.loss.target_type, s.vocab, threads,
                          ClassWeightArg(s.loss.class_weight_dtype), s.loss.label_smoothing > 0);
}

std::string ops::CrossEntropyReduceExpr(Reduction reduction, int threads) {
  return jit::Instantiate("kjit::cross_entropy_loss_reduce", threads, ReductionArg(reduction));
}

namespace {
std::string CountExpr(const CrossEntropySpec& s) {
  return ops::CrossEntropyCountExpr(s, kCountThreads);
}
// The rescale's vectors are the program's (no wider than the views the config was picked for).
std::string RescaleExpr(const CrossEntropySpec& s, const CrossEntropyConfig& c) {
  return jit::Instantiate("kjit::cross_entropy_rescale_gradient", s.dtype, s.vocab, kRescaleThreads,
                          c.vec, kRescaleUnroll);
}
std::string ReduceExpr(const CrossEntropySpec& s) {
  return ops::CrossEntropyReduceExpr(s.loss.reduction, kReduceThreads);
}

}  // namespace

// A runtime checks again with its target's arch.
absl::Status ops::ValidateCrossEntropyConfig(const CrossEntropySpec& spec,
                                             const CrossEntropyConfig& c, int arch) {
  if (c.vec < 1 || (c.vec & (c.vec - 1)) != 0 ||
      c.vec * static_cast<int64_t>(SizeOf(spec.dtype)) > 16) {
    return absl::InvalidArgumentError(fmt::format(
        "config.vec: {} must be a power of two with at most 16 bytes per access", c.vec));
  }
  if (c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0) {
    return absl::InvalidArgumentError(
        fmt::format("config.threads: {} must be a multiple of 32 from 32 to 1024", c.threads));
  }
  if (c.unroll != 1 && c.unroll != 2 && c.unroll != 4 && c.unroll != 8) {
    return absl::InvalidArgumentError(
        fmt::format("config.unroll: {} must be 1, 2, 4 or 8", c.unroll));
  }
  if (c.cluster < 0 || c.cluster > 8) {
    return absl::InvalidArgumentError(fmt::format(
        "config.cluster: {} must be 0 (stream the row) or 1 to 8 blocks holding it", c.cluster));
  }
  const int elem_bytes = static_cast<int>(SizeOf(spec.dtype));
  if (c.staged != 0 && c.staged != 1) {
    return absl::InvalidArgumentError(fmt::format(
        "config.staged: {} must be 0 (the row in registers) or 1 (in shared memory)", c.staged));
  }
  if (c.staged) {
    const std::string unfit = StagedUnfit(c, spec.vocab, elem_bytes, arch == 0 ? 90 : arch);
    if (!unfit.empty()) return absl::InvalidArgumentError("config.staged: " + unfit);
    return absl::OkStatus();
  }
  if (!ResidentFits(c, spec.vocab, elem_bytes)) {
    return absl::InvalidArgumentError(fmt::format(
        "config.cluster: {} blocks of {} threads would hold {} vectors of a {}-entry row each, "
        "more than an SM's registers take; use more blocks or fewer threads, or cluster=0",
        c.cluster, c.threads, ResidentVectors(c, spec.vocab), spec.vocab));
  }
  return absl::OkStatus();
}

absl::Status ValidateCrossEntropySpec(const CrossEntropySpec& spec) {
  if (spec.vocab < kMinVocab || spec.vocab > kMaxVocab) {
    return absl::InvalidArgumentError(fmt::format("vocab: {} is out of range, expected {} to {}",
                                                  spec.vocab, kMinVocab, kMaxVocab));
  }
  KJIT_RETURN_IF_ERROR(ValidateLossOptions(spec.loss, spec.dtype));
  if (spec.config) KJIT_RETURN_IF_ERROR(ops::ValidateCrossEntropyConfig(spec, *spec.config, 0));
  return absl::OkStatus();
}

const char* ops::CrossEntropyProgramName(CrossEntropyProgram program) {
  switch (program) {
    case CrossEntropyProgram::kCountReduce: return "count_reduce";
    case CrossEntropyProgram::kForward: return "forward";
    case CrossEntropyProgram::kForwardBackward: return "forward_backward";
    case CrossEntropyProgram::kBackward: return "backward";
    case CrossEntropyProgram::kRescaleGradient: return "rescale_gradient";
  }
  return "?";
}

std::vector<ops::CrossEntropyProgram> ops::CrossEntropyLaunchPrograms(CrossEntropyLaunch launch) {
  using P = CrossEntropyProgram;
  switch (launch) {
    case CrossEntropyLaunch::kForward: return {P::kForward, P::kCountReduce};
    case CrossEntropyLaunch::kForwardBackward: return {P::kForwardBackward, P::kCountReduce};
    case CrossEntropyLaunch::kBackward: return {P::kBackward, P::kCountReduce};
    case CrossEntropyLaunch::kRescaleGradient: return {P::kRescaleGradient};
  }
  return {};
}

std::map<std::string, std::string> ops::CrossEntropyProgramParams(const CrossEntropySpec& spec) {
  // The kernels take label smoothing, z-loss and softcap on or off as template arguments and their
  // values as launch arguments (RowParams), so the params say only on or off: one program and one
  // cache entry serve every value. Off is "0", as the value was, so entries without them keep
  // their keys.
  auto on_off = [](float value) { return value > 0 ? "on" : "0"; };
  std::map<std::string, std::string> params = {
      {"op", "cross_entropy"},
      {"vocab", std::to_string(spec.vocab)},
      {"dtype", Name(spec.dtype)},
      {"target_type", Name(spec.loss.target_type)},
      {"reduction", Name(spec.loss.reduction)},
      {"label_smoothing", on_off(spec.loss.label_smoothing)},
      {"z_loss", on_off(spec.loss.z_loss)},
      {"softcap", on_off(spec.loss.softcap)},
      {"argmax", spec.loss.argmax ? "true" : "false"},
  };
  if (spec.loss.entropy)
    params["entropy"] = "true";  // absent when off: old cache metadata unchanged
  if (spec.loss.class_weight_dtype)
    params["class_weight_dtype"] = Name(*spec.loss.class_weight_dtype);
  return params;
}

std::map<std::string, std::string> ops::CrossEntropyParams(const CrossEntropySpec& spec) {
  std::map<std::string, std::string> params = CrossEntropyProgramParams(spec);
  params["label_smoothing"] = LossValueText(spec.loss.label_smoothing);
  params["z_loss"] = LossValueText(spec.loss.z_loss);
  params["softcap"] = LossValueText(spec.loss.softcap);
  return params;
}

absl::StatusOr<jit::Source> ops::RenderCrossEntropy(const CrossEntropySpec& spec,
                                                    const CrossEntropyConfig& config,
                                                    CrossEntropyProgram program) {
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(spec));
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropyConfig(spec, config, /*arch=*/0));
  std::map<std::string, std::string> params = CrossEntropyProgramParams(spec);
  // The config's fields the kernels' template arguments take, and only those: they go into the
  // program's text (so its cache key), and the configs that share a kernel (kjit-tune compiles
  // dozens) share its program and cache entry.
  std::vector<std::pair<const char*, int>> fields;
  std::vector<std::string> kernels;
  switch (program) {
    case CrossEntropyProgram::kCountReduce:
      kernels.push_back(CountExpr(spec));
      if (spec.loss.reduction != Reduction::kNone) kernels.push_back(ReduceExpr(spec));
      break;
    case CrossEntropyProgram::kForward:
    case CrossEntropyProgram::kBackward:
      kernels.push_back(program == CrossEntropyProgram::kForward ? ForwardExpr(spec, config, false)
                                                                 : BackwardExpr(spec, config));
      fields = {{"vec", config.vec}, {"threads", config.threads}, {"unroll", config.unroll}};
      break;
    case CrossEntropyProgram::kForwardBackward:
      kernels.push_back(FusedExpr(spec, config));
      fields = {{"vec", config.vec}, {"threads", config.threads}, {"cluster", config.cluster}};
      // A row held in a cluster is read once, with no unrolled loop; a streamed one unrolls.
      fields.emplace_back(config.cluster > 0 ? "staged" : "unroll",
                          config.cluster > 0 ? config.staged : config.unroll);
      break;
    case CrossEntropyProgram::kRescaleGradient:
      kernels.push_back(RescaleExpr(spec, config));
      fields = {{"vec", config.vec}};
      break;
  }
  for (const auto& [name, value] : fields) params[name] = std::to_string(value);
  return jit::RenderSource(fmt::format("cross_entropy.{}", CrossEntropyProgramName(program)),
                           {"common.cuh", "cross_entropy_params.h", "cross_entropy.cuh"},
                           std::move(kernels), std::move(params));
}

absl::StatusOr<std::vector<jit::Source>> ops::RenderCrossEntropyPrograms(
    const CrossEntropySpec& spec, const CrossEntropyConfig& config) {
  using P = CrossEntropyProgram;
  std::vector<jit::Source> sources;
  for (P program :
       {P::kForwardBackward, P::kCountReduce, P::kForward, P::kBackward, P::kRescaleGradient}) {
    KJIT_ASSIGN_OR_RETURN(jit::Source src, RenderCrossEntropy(spec, config, program));
    sources.push_back(std::move(src));
  }
  return sources;
}

namespace internal {

// What a launch's kernels are loaded for: the config and the launch sequence.
struct CrossEntropyLaunchConfig {
  CrossEntropyConfig config;
  ops::CrossEntropyLaunch launch = ops::CrossEntropyLaunch::kForwardBackward;
  std::string ToString() const {
    return fmt::format("{} launch={}", config.ToString(), static_cast<int>(launch));
  }
};

// The kernels of one launch sequence, from the programs it loads (ops/cross_entropy/program.h).
struct CrossEntropyKernels {
  CrossEntropyConfig config;
  std::vector<LoadedProgram> programs;  // in CrossEntropyLaunchPrograms' order
  CUfunction count = nullptr;           // every launch but the rescale's
  CUfunction row = nullptr;     // the launch's own: forward, forward+backward, backward or rescale
  CUfunction reduce = nullptr;  // sum and mean: the forward launches'
  int shared_bytes = 0;         // the dynamic shared memory forward_backward asks for (staged)
};

struct CrossEntropyState {
  CrossEntropySpec spec;
  int arch = 0;               // the compute capability compiled for
  CrossEntropyConfig config;  // the spec's or the heuristic's, for the widest vector
  // Unless the spec has a config: the fused forward+backward's, and the streaming launches'
  // (forward only, backward from lse), tuned apart.
  std::optional<TunedConfigs<CrossEntropyConfig>> tuned, tuned_streaming;
  OpKernels<CrossEntropyLaunchConfig, CrossEntropyKernels> kernels;

  // Under the kernels' lock.
  CrossEntropyConfig ConfigFor(int64_t rows, int vec, bool may_tune, bool fused) {
    CrossEntropyConfig c = config;
    if (tuned) c = (fused ? tuned : tuned_streaming)->For(rows, may_tune).value_or(config);
    if (vec >= c.vec) return c;
    return ops::DefaultCrossEntropyConfig(spec.vocab, vec, arch,
                                          static_cast<int>(SizeOf(spec.dtype)));
  }
};

}  // namespace internal

namespace {

using ops::CrossEntropyLaunch;
using ops::CrossEntropyProgram;

// Only the programs `launch` loads: those not cached yet compile in parallel.
absl::StatusOr<internal::CrossEntropyKernels> Load(const internal::RuntimeState& rt,
                                                   const CrossEntropySpec& spec,
                                                   const internal::CrossEntropyLaunchConfig& lc) {
  const CrossEntropyConfig& config = lc.config;
  internal::CrossEntropyKernels k{.config = config};
  const std::vector<CrossEntropyProgram> programs = ops::CrossEntropyLaunchPrograms(lc.launch);
  std::vector<jit::Source> sources;
  for (CrossEntropyProgram program : programs) {
    KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderCrossEntropy(spec, config, program));
    sources.push_back(std::move(src));
  }
  KJIT_ASSIGN_OR_RETURN(k.programs, internal::LoadPrograms(rt, sources));
  for (size_t i = 0; i < programs.size(); ++i) {
    const std::vector<CUfunction>& f = k.programs[i].functions;
    if (programs[i] == CrossEntropyProgram::kCountReduce) {
      k.count = f.at(0);
      if (spec.loss.reduction != Reduction::kNone) k.reduce = f.at(1);
    } else {
      k.row = f.at(0);
    }
  }
  if (lc.launch == CrossEntropyLaunch::kForwardBackward && config.staged) {
    k.shared_bytes = static_cast<int>(
        ops::StagedSharedBytes(config, spec.vocab, static_cast<int>(SizeOf(spec.dtype))));
    KJIT_RETURN_IF_ERROR(rt.AllowSharedBytes(k.row, k.shared_bytes));
  }
  return k;
}

// The kernels of `launch` for `rows` (the tuned bucket's config) with vectors of at most `vec`
// elements; may_tune lets KJIT_AUTOTUNE tune a new bucket first. The fused forward+backward and
// the rescale of its gradient use the fused config, the other launches the streaming one.
absl::StatusOr<const internal::CrossEntropyKernels*> KernelsFor(const internal::RuntimeState& rt,
                                                                internal::CrossEntropyState& op,
                                                                int64_t rows, int vec,
                                                                bool may_tune,
                                                                CrossEntropyLaunch launch) {
  const bool fused = launch == CrossEntropyLaunch::kForwardBackward ||
                     launch == CrossEntropyLaunch::kRescaleGradient;
  return op.kernels.Get(
      [&] {
        return internal::CrossEntropyLaunchConfig{op.ConfigFor(rows, vec, may_tune, fused), launch};
      },
      [&](const internal::CrossEntropyLaunchConfig& lc) { return Load(rt, op.spec, lc); });
}

// One block per row: the grid's x dimension bounds the rows, and the counters are 32-bit.
absl::Status CheckRows(int64_t rows) {
  if (rows > INT_MAX) {
    return absl::InvalidArgumentError(
        fmt::format("logits: {} rows exceed the {} a launch handles", rows, INT_MAX));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// What every mode does once its arguments are checked: picks the kernels for the widest vector
// the views allow and launches the count kernel, which fills the workspace's counters.
absl::StatusOr<const internal::CrossEntropyKernels*> StartLaunches(
    const internal::RuntimeState& rt, internal::CrossEntropyState& op, CUstream stream,
    const TensorView& logits, const IndexView& targets, const TensorView& grad,
    const TensorView& class_weight, void* workspace, CrossEntropyLaunch launch) {
  const int vec = internal::WidestVecAlignedAlike(op.config.vec, logits, {&grad});
  KJIT_ASSIGN_OR_RETURN(const internal::CrossEntropyKernels* k,
                        KernelsFor(rt, op, logits.rows, vec, !rt.Capturing(stream), launch));
  CrossEntropyCountParams c{targets.data, logits.rows, op.spec.loss.ignore_index, class_weight.data,
                            static_cast<CrossEntropyCounters*>(workspace)};
  KJIT_RETURN_IF_ERROR(rt.Launch(k->count, 1, kCountThreads, stream, &c));
  return k;
}

// RescaleGradient's grad_output: fp32, one value for every row or one per row.
absl::Status CheckRescaleFactors(const TensorView& v, int64_t rows) {
  if (v.data != nullptr && v.cols != 1 && v.cols != rows) {
    return absl::InvalidArgumentError(fmt::format(
        "grad_output: cols is {}, expected 1 (one value for every row) or {} (one per row of grad)",
        v.cols, rows));
  }
  return internal::CheckMatrix("grad_output", v, DType::kF32, 1, v.cols);
}

// How RescaleGradient splits rows of `vec`-element vectors over blocks: whole rows once there are
// enough of them for kRescaleWaves waves of the GPU's `sm_count` SMs, else each row over several
// blocks, down to one pass of the block's loads each.
CrossEntropyRescaleParams RescaleParams(const CrossEntropyRescaleArgs& a, int64_t vocab, int vec,
                                        int sm_count) {
  const int64_t body = vocab / vec;
  const int64_t pass = int64_t{kRescaleThreads} * kRescaleUnroll;
  const int64_t target =
      int64_t{kRescaleWaves} * std::max(sm_count, 1) * (kThreadsPerSm / kRescaleThreads);
  const int64_t most = std::max<int64_t>(1, (body + pass - 1) / pass);
  const int64_t wanted = std::clamp<int64_t>((target + a.grad.rows - 1) / a.grad.rows, 1, most);
  // Whole warps of vectors per tile, so that every tile starts on a coalesced boundary.
  const int64_t per_tile = std::max<int64_t>((body + wanted - 1) / wanted, 1);
  const int64_t tile_vectors = (per_tile + kRescaleThreads - 1) / kRescaleThreads * kRescaleThreads;
  CrossEntropyRescaleParams p{};
  p.grad = a.grad.data;
  p.grad_stride = a.grad.row_stride;
  p.grad_output = static_cast<const float*>(a.grad_output.data);
  p.applied = static_cast<const float*>(a.applied.data);
  p.per_row = a.grad_output.cols == 1 ? 0 : 1;
  p.tiles = static_cast<int>(std::max<int64_t>(1, (body + tile_vectors - 1) / tile_vectors));
  p.tile_vectors = static_cast<int>(tile_vectors);
  return p;
}

}  // namespace

const CrossEntropySpec& CrossEntropy::spec() const { return op_->spec; }
const CrossEntropyConfig& CrossEntropy::config() const { return op_->config; }

CrossEntropyConfig CrossEntropy::ConfigFor(const TensorView& logits, bool fused) const {
  const int vec = op_->config.vec;
  return op_->kernels.Locked(
      [&] { return op_->ConfigFor(logits.rows, vec, /*may_tune=*/false, fused); });
}

CrossEntropyConfig CrossEntropy::ConfigFor(int64_t rows, bool fused) const {
  return op_->kernels.Locked(
      [&] { return op_->ConfigFor(rows, op_->config.vec, /*may_tune=*/false, fused); });
}

absl::StatusOr<BuildInfo> CrossEntropy::Build() const {
  KJIT_ASSIGN_OR_RETURN(std::vector<jit::Source> sources,
                        ops::RenderCrossEntropyPrograms(op_->spec, op_->config));
  KJIT_ASSIGN_OR_RETURN(std::vector<jit::Jit::Built> built,
                        rt_->jit->BuildAll(sources, rt_->target));
  BuildInfo info = internal::ToBuildInfo(built);
  // The op's parameters and whole config; each program lists the fields of the config it takes.
  info.params = ops::CrossEntropyParams(op_->spec);
  info.params["config"] = op_->config.ToString();
  return info;
}

int64_t CrossEntropy::WorkspaceBytes(int64_t rows) const {
  // Launches check rows after this (a wild one overflowed it).
  const int64_t losses =
      op_->spec.loss.reduction == Reduction::kNone ? 0 : std::clamp<int64_t>(rows, 1, INT32_MAX);
  return (kCountersBytes + losses * static_cast<int64_t>(sizeof(float)) + 15) / 16 * 16;
}

absl::Status CrossEntropy::Forward(CUstream stream, const CrossEntropyArgs& args) const {
  return Run(stream, args, /*gradient=*/false);
}

absl::Status CrossEntropy::ForwardBackward(CUstream stream, const CrossEntropyArgs& args) const {
  return Run(stream, args, /*gradient=*/true);
}

absl::Status CrossEntropy::Run(CUstream stream, const CrossEntropyArgs& a, bool gradient) const {
  const CrossEntropySpec& s = op_->spec;
  const int64_t rows = a.logits.rows;
  if (!gradient && (!a.grad.empty() || !a.grad_output.empty())) {
    return absl::InvalidArgumentError(
        fmt::format("{}: given to Forward, which computes no gradient; use ForwardBackward",
                    a.grad.empty() ? "grad_output" : "grad"));
  }
  // ForwardBackward writes the gradient, so grad is not optional there (CheckMatrix words a
  // missing one as every op does).
  if (gradient && a.grad.empty()) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("grad", a.grad, s.dtype, rows, s.vocab));
  }
  KJIT_RETURN_IF_ERROR(ops::CheckLossArgs(s, s.vocab, a, WorkspaceBytes(rows)));
  KJIT_RETURN_IF_ERROR(CheckRows(rows));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());

  KJIT_ASSIGN_OR_RETURN(
      const internal::CrossEntropyKernels* k,
      StartLaunches(
          *rt_, *op_, stream, a.logits, a.targets, a.grad, a.class_weight, a.workspace,
          gradient ? CrossEntropyLaunch::kForwardBackward : CrossEntropyLaunch::kForward));
  float* row_loss =
      s.loss.reduction == Reduction::kNone
          ? static_cast<float*>(a.loss.data)
          : reinterpret_cast<float*>(static_cast<char*>(a.workspace) + kCountersBytes);
  CrossEntropyRowParams p =
      ops::RowParams(s, a.logits, a.targets, a.grad, a.grad_output, a.class_weight, a.workspace);
  p.row_loss = row_loss;
  p.lse = static_cast<float*>(a.lse.data);
  p.argmax = a.argmax.data;
  p.entropy = static_cast<float*>(a.entropy.data);
  p.target_logprob = static_cast<float*>(a.target_logprob.data);
  // The row kernel starts while the count kernel runs, and the reduce kernel's launch overlaps
  // the row kernel's end; each waits before it reads what the kernel before wrote.
  const int blocks_per_row = gradient ? std::max(1, k->config.cluster) : 1;
  KJIT_RETURN_IF_ERROR(rt_->Launch(k->row, rows * blocks_per_row, k->config.threads, stream, &p,
                                   blocks_per_row, k->shared_bytes, /*overlap_previous=*/true));
  if (s.loss.reduction == Reduction::kNone) return absl::OkStatus();
  CrossEntropyReduceParams r{row_loss, rows, p.counters, static_cast<float*>(a.loss.data)};
  return rt_->Launch(k->reduce, 1, kReduceThreads, stream, &r, 1, 0, /*overlap_previous=*/true);
}

absl::Status CrossEntropy::Backward(CUstream stream, const CrossEntropyBackwardArgs& a) const {
  const CrossEntropySpec& s = op_->spec;
  KJIT_RETURN_IF_ERROR(
      internal::CheckMatrix("logits", a.logits, s.dtype, internal::kAnyRows, s.vocab));
  const int64_t rows = a.logits.rows;
  KJIT_RETURN_IF_ERROR(CheckRows(rows));
  KJIT_RETURN_IF_ERROR(internal::CheckIndexVector("targets", a.targets, s.loss.target_type, rows));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("lse", a.lse, DType::kF32, 1, rows));
  if (!a.grad_output.empty()) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("grad_output", a.grad_output, DType::kF32, 1,
                                               ops::PerRowOrOne(s, rows)));
  }
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("grad", a.grad, s.dtype, rows, s.vocab));
  KJIT_RETURN_IF_ERROR(ops::CheckGradAgainstLogits(a.grad, a.logits));
  KJIT_RETURN_IF_ERROR(ops::CheckClassWeight(a.class_weight, s.loss.class_weight_dtype, s.vocab));
  const int64_t ws_bytes = WorkspaceBytes(rows);
  KJIT_RETURN_IF_ERROR(
      internal::CheckWorkspace(a.workspace, a.workspace_bytes, ws_bytes, "WorkspaceBytes(rows)"));
  KJIT_RETURN_IF_ERROR(internal::CheckDisjoint(
      {{"grad", a.grad}, {"workspace", internal::BytesOf(a.workspace, ws_bytes)}},
      {{"logits", a.logits},
       {"targets", internal::BytesOf(a.targets)},
       {"lse", a.lse},
       {"grad_output", a.grad_output},
       {"class_weight", a.class_weight}},
      /*in_place=*/{{"grad", "logits"}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());

  KJIT_ASSIGN_OR_RETURN(const internal::CrossEntropyKernels* k,
                        StartLaunches(*rt_, *op_, stream, a.logits, a.targets, a.grad,
                                      a.class_weight, a.workspace, CrossEntropyLaunch::kBackward));
  CrossEntropyRowParams p =
      ops::RowParams(s, a.logits, a.targets, a.grad, a.grad_output, a.class_weight, a.workspace);
  p.lse_in = static_cast<const float*>(a.lse.data);
  return rt_->Launch(k->row, rows, k->config.threads, stream, &p);
}

absl::Status CrossEntropy::RescaleGradient(CUstream stream,
                                           const CrossEntropyRescaleArgs& a) const {
  const CrossEntropySpec& s = op_->spec;
  // An empty batch has nothing to rescale, and its views may be null (empty framework tensors).
  if (a.grad.rows == 0) return absl::OkStatus();
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("grad", a.grad, s.dtype, internal::kAnyRows, s.vocab));
  const int64_t rows = a.grad.rows;
  KJIT_RETURN_IF_ERROR(CheckRescaleFactors(a.grad_output, rows));
  if (!a.applied.empty()) {
    KJIT_RETURN_IF_ERROR(
        internal::CheckMatrix("applied", a.applied, DType::kF32, 1, a.grad_output.cols));
  }
  // grad_output and applied are both read only: they may be the same vector.
  KJIT_RETURN_IF_ERROR(internal::CheckDisjoint(
      {{"grad", a.grad}}, {{"grad_output", a.grad_output}, {"applied", a.applied}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());

  // The config of the fused launch for these rows (any grad row splits into whole vectors after
  // its head: CeLayout); never tunes (a rescale is not worth a tuning run).
  const int vec = op_->config.vec;
  KJIT_ASSIGN_OR_RETURN(
      const internal::CrossEntropyKernels* k,
      KernelsFor(*rt_, *op_, rows, vec, /*may_tune=*/false, CrossEntropyLaunch::kRescaleGradient));
  CrossEntropyRescaleParams p = RescaleParams(a, s.vocab, k->config.vec, rt_->device.sm_count);
  return rt_->Launch(k->row, rows * p.tiles, kRescaleThreads, stream, &p);
}

absl::StatusOr<kjit::CrossEntropy> Runtime::CrossEntropy(const CrossEntropySpec& spec) const {
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(spec));
  KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(
      state_->target,
      {{"dtype", spec.dtype}, {"class_weight_dtype", spec.loss.class_weight_dtype}}));
  auto op = std::make_shared<internal::CrossEntropyState>();
  op->spec = spec;
  op->arch = state_->target.arch;
  if (spec.config && spec.config->cluster > 1 && op->arch < ops::kMinClusterArch) {
    return absl::InvalidArgumentError(fmt::format(
        "config.cluster: {} blocks per row need thread-block clusters (sm_{} or newer), the "
        "target is {}",
        spec.config->cluster, ops::kMinClusterArch, state_->target.ToString()));
  }
  if (spec.config)
    KJIT_RETURN_IF_ERROR(ops::ValidateCrossEntropyConfig(spec, *spec.config, op->arch));
  const int max_vec = ops::MaxVecForCrossEntropy(static_cast<int>(SizeOf(spec.dtype)));
  op->config = spec.config.value_or(ops::DefaultCrossEntropyConfig(
      spec.vocab, max_vec, op->arch, static_cast<int>(SizeOf(spec.dtype))));
  if (!spec.config) {
    auto validate = [spec, arch = op->arch](const CrossEntropyConfig& c) {
      return ops::ValidateCrossEntropyConfig(spec, c, arch);
    };
    const std::string shape = ops::CrossEntropyTuningShape(spec),
                      json = ops::CrossEntropyToJson(spec).dump();
    op->tuned.emplace(*state_, ops::CrossEntropyTuningOp(spec), shape, spec.dtype, json,
                      ParseCrossEntropyConfig, validate);
    op->tuned_streaming.emplace(*state_, ops::CrossEntropyStreamingTuningOp(spec), shape,
                                spec.dtype, json, ParseCrossEntropyConfig, validate);
  }
  kjit::CrossEntropy ce(state_, op);
  if (!state_->compile_only) {
    // Build and load the common case, the fused forward+backward's kernels, now so that errors
    // surface here, not in the first launch. The other launches' compile on their first use.
    const internal::CrossEntropyLaunchConfig fused{op->config,
                                                   CrossEntropyLaunch::kForwardBackward};
    KJIT_RETURN_IF_ERROR(op->kernels
                             .Get([&] { return fused; },
                                  [&](const internal::CrossEntropyLaunchConfig& lc) {
                                    return Load(*state_, spec, lc);
                                  })
                             .status());
  }
  return ce;
}

}  // namespace kjit
