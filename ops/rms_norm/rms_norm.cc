#include "kjit/rms_norm.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "jit/dtype.h"
#include "jit/instantiation.h"
#include "ops/common/ceil_div.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/program.h"
#include "ops/rms_norm/tuning_key.h"
#include "runtime/op_kernels.h"
#include "runtime/runtime_state.h"
#include "runtime/tensor_checks.h"
#include "runtime/tuned_configs.h"
#include "templates/rms_norm_params.h"

namespace kjit {

namespace {

constexpr int64_t kMaxHidden = 65536;
// The dw reduce kernel's block: 1024 threads, kReduceColumns(hidden) columns x the rest as row
// stripes, so that each thread sums few partials.
constexpr int kReduceThreads = 1024;
// 32 columns (a 128-byte line of each partial row) unless that leaves fewer blocks than an H200
// has SMs: at hidden 1024 the backward's 2112 partial rows (8.6 MB) went through 32 blocks on 32
// SMs; 8 columns (a 32-byte sector) on 128 blocks took 0.6 us off the backward at 16384 rows.
int ReduceColumns(int64_t hidden) {
  int columns = 32;
  while (columns > 8 && hidden / columns < 128) columns /= 2;
  return columns;
}

DType WeightDType(const RmsNormSpec& spec) { return spec.weight_dtype.value_or(spec.dtype); }

std::string ForwardExpr(const RmsNormSpec& s, const RmsNormConfig& c) {
  return jit::Instantiate("kjit::rms_norm_forward", s.dtype, WeightDType(s), s.hidden,
                          c.forward.threads_per_row, c.forward.rows_per_block, c.vec, s.casting,
                          s.fused_residual);
}
std::string BackwardExpr(const RmsNormSpec& s, const RmsNormConfig& c) {
  const jit::TemplateArgs shape = {
      s.dtype, WeightDType(s), s.hidden, c.backward.threads_per_row, c.backward.rows_per_block,
      c.vec};
  if (c.backward.ring > 0) {
    return jit::Instantiate("kjit::rms_norm_backward_ring", shape, c.backward.ring);
  }
  return jit::Instantiate("kjit::rms_norm_backward", shape);
}
std::string ReduceExpr(const RmsNormSpec& s) {
  const int columns = ReduceColumns(s.hidden);
  return jit::Instantiate("kjit::rms_norm_dw_reduce", WeightDType(s), s.hidden, columns,
                          kReduceThreads / columns);
}

// The most threads an SM holds on any GPU kjit targets: the bound on resident blocks that
// BackwardWorkspaceBytes uses without loading the kernel to ask the occupancy calculator.
constexpr int kMaxThreadsPerSm = 2048;

// Row groups the backward runs with: as many blocks as are resident at once, so the GPU is filled
// exactly once and each block walks its rows without a tail wave.
int64_t BackwardGroups(const RmsNormConfig& c, int64_t rows, int sm_count, int blocks_per_sm) {
  const int64_t blocks = std::min<int64_t>(ops::CeilDiv(rows, c.backward.rows_per_block),
                                           int64_t{sm_count} * std::max(1, blocks_per_sm));
  return blocks * c.backward.rows_per_block;
}

absl::Status CheckRowShape(const char* which, const RowShape& s) {
  if (s.ring != 0 && (std::string_view(which) != "backward" || s.ring < 2 || s.ring > 4)) {
    return absl::InvalidArgumentError(fmt::format(
        "config.{}: ring {} is not valid (0, or 2 to 4 in the backward)", which, s.ring));
  }
  const int t = s.threads_per_row;
  const bool pow2_warp = t >= 1 && t <= 32 && (t & (t - 1)) == 0;
  const bool block_row = t > 32 && t <= 1024 && t % 32 == 0 && s.rows_per_block == 1;
  if (!(pow2_warp || block_row) || s.rows_per_block < 1 || s.block_threads() > 1024 ||
      s.block_threads() % 32 != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "config.{}: {} threads per row x {} rows per block is not a valid shape (threads per row a "
        "power of two up to 32, or a multiple of 32 up to 1024 with one row per block; the block a "
        "multiple of 32 threads)",
        which, t, s.rows_per_block));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ops::ValidateRmsNormConfig(const RmsNormSpec& spec, const RmsNormConfig& c) {
  if (c.vec < 1 || c.vec > 16 || (c.vec & (c.vec - 1)) != 0 || spec.hidden % c.vec != 0 ||
      c.vec * static_cast<int>(std::max(SizeOf(spec.dtype), SizeOf(WeightDType(spec)))) > 16) {
    return absl::InvalidArgumentError(fmt::format(
        "config.vec: {} must be a power of two dividing hidden ({}) with at most 16 bytes per "
        "access",
        c.vec, spec.hidden));
  }
  KJIT_RETURN_IF_ERROR(CheckRowShape("forward", c.forward));
  KJIT_RETURN_IF_ERROR(CheckRowShape("backward", c.backward));
  if (c.backward.ring > 0 &&
      !ops::RowFitsRing(spec.hidden, c.vec, static_cast<int>(SizeOf(spec.dtype)), c.backward)) {
    return absl::InvalidArgumentError(fmt::format(
        "config.backward: a ring needs each thread's share of a row of dy and x in 128 bytes of "
        "registers; {} threads x {} elements of a {}-wide row take more",
        c.backward.threads_per_row, c.vec, spec.hidden));
  }
  return absl::OkStatus();
}

absl::Status ValidateRmsNormSpec(const RmsNormSpec& spec) {
  if (spec.hidden < 1 || spec.hidden > kMaxHidden) {
    return absl::InvalidArgumentError(
        fmt::format("hidden: {} is out of range, expected 1 to {}", spec.hidden, kMaxHidden));
  }
  if (!std::isfinite(spec.eps) || spec.eps < 0) {
    return absl::InvalidArgumentError(
        fmt::format("eps: {} must be finite and not negative", spec.eps));
  }
  if (!std::isfinite(spec.weight_offset)) {
    return absl::InvalidArgumentError(
        fmt::format("weight_offset: {} must be finite", spec.weight_offset));
  }
  switch (spec.casting) {
    case RmsNormCasting::kLlama:
    case RmsNormCasting::kGemma: break;
    case RmsNormCasting::kNone:
      if (WeightDType(spec) != spec.dtype) {
        return absl::InvalidArgumentError(
            fmt::format("weight_dtype: {} must be the dtype ({}) with casting none, which computes "
                        "in the dtype",
                        Name(WeightDType(spec)), Name(spec.dtype)));
      }
      break;
    default:
      return absl::InvalidArgumentError(fmt::format(
          "casting: {} is out of range (llama, gemma, none)", static_cast<int>(spec.casting)));
  }
  if (spec.config) KJIT_RETURN_IF_ERROR(ops::ValidateRmsNormConfig(spec, *spec.config));
  return absl::OkStatus();
}

absl::StatusOr<jit::Source> ops::RenderRmsNorm(const RmsNormSpec& spec,
                                               const RmsNormConfig& config) {
  KJIT_RETURN_IF_ERROR(ValidateRmsNormSpec(spec));
  KJIT_RETURN_IF_ERROR(ValidateRmsNormConfig(spec, config));
  std::map<std::string, std::string> params = {
      {"op", "rms_norm"},
      {"hidden", std::to_string(spec.hidden)},
      {"dtype", Name(spec.dtype)},
      {"weight_dtype", Name(WeightDType(spec))},
      {"casting", Name(spec.casting)},
      {"fused_residual", spec.fused_residual ? "true" : "false"},
      {"config", config.ToString()},
  };
  return jit::RenderSource(
      "rms_norm", {"common.cuh", "rms_norm_params.h", "rms_norm.cuh"},
      {ForwardExpr(spec, config), BackwardExpr(spec, config), ReduceExpr(spec)}, std::move(params));
}

namespace internal {

struct RmsNormKernels {
  RmsNormConfig config;
  LoadedProgram program;           // forward, backward, dw reduce
  int backward_blocks_per_sm = 1;  // from the occupancy calculator: registers decide it
  CUfunction forward() const { return program.functions[0]; }
  CUfunction backward() const { return program.functions[1]; }
  CUfunction reduce() const { return program.functions[2]; }
};

struct RmsNormState {
  RmsNormSpec spec;
  RmsNormConfig config;  // the spec's or the heuristic's, for the widest vector
  std::optional<TunedConfigs<RmsNormConfig>> tuned;  // unless the spec has a config
  OpKernels<RmsNormConfig, RmsNormKernels> kernels;

  // Under the kernels' lock.
  RmsNormConfig ConfigFor(int64_t rows, int vec, bool may_tune) {
    RmsNormConfig c = config;
    if (tuned) c = tuned->For(rows, may_tune).value_or(config);
    if (vec >= c.vec) return c;
    return ops::DefaultRmsNormConfig(spec.hidden, vec);
  }
};

}  // namespace internal

namespace {

absl::StatusOr<internal::RmsNormKernels> Load(const internal::RuntimeState& rt,
                                              const RmsNormSpec& spec,
                                              const RmsNormConfig& config) {
  internal::RmsNormKernels k{.config = config};
  KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderRmsNorm(spec, config));
  KJIT_ASSIGN_OR_RETURN(k.program, internal::LoadProgram(rt, src));
  KJIT_RETURN_IF_ERROR(rt.driver->Check(
      rt.driver->cuOccupancyMaxActiveBlocksPerMultiprocessor(
          &k.backward_blocks_per_sm, k.backward(), config.backward.block_threads(), 0),
      "cuOccupancyMaxActiveBlocksPerMultiprocessor"));
  return k;
}

// The kernels for `rows` (the tuned bucket's config) with vectors of at most `vec` elements;
// may_tune lets KJIT_AUTOTUNE tune a new bucket first.
absl::StatusOr<const internal::RmsNormKernels*> KernelsFor(const internal::RuntimeState& rt,
                                                           internal::RmsNormState& op, int64_t rows,
                                                           int vec, bool may_tune) {
  return op.kernels.Get([&] { return op.ConfigFor(rows, vec, may_tune); },
                        [&](const RmsNormConfig& c) { return Load(rt, op.spec, c); });
}

}  // namespace

const RmsNormSpec& RmsNorm::spec() const { return op_->spec; }
const RmsNormConfig& RmsNorm::config() const { return op_->config; }

RmsNormConfig RmsNorm::ConfigFor(int64_t rows) const {
  return op_->kernels.Locked(
      [&] { return op_->ConfigFor(rows, op_->config.vec, /*may_tune=*/false); });
}

absl::StatusOr<BuildInfo> RmsNorm::Build() const {
  KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderRmsNorm(op_->spec, op_->config));
  KJIT_ASSIGN_OR_RETURN(jit::Jit::Built built, rt_->jit->Build(src, rt_->target));
  return internal::ToBuildInfo(built);
}

int64_t RmsNorm::BackwardWorkspaceBytes(int64_t rows) const {
  // A pure query: the config a launch of `rows` would use (never tuning) and, instead of the
  // occupancy calculator's answer, which needs the loaded kernel, the most blocks an SM could
  // hold. A launch given more than it needs uses what it needs.
  const RmsNormConfig config = ConfigFor(rows);
  const int sm_count = rt_->compile_only ? 1 : rt_->device.sm_count;
  const int blocks_per_sm =
      rt_->compile_only ? 1 : std::max(1, kMaxThreadsPerSm / config.backward.block_threads());
  // Lower vector widths (misaligned views) may pack more rows per block: leave room for a full one.
  const int64_t groups = std::max<int64_t>(
      BackwardGroups(config, std::max<int64_t>(rows, 1), sm_count, blocks_per_sm), 128);
  return groups * op_->spec.hidden * static_cast<int64_t>(sizeof(float));
}

absl::Status RmsNorm::Forward(CUstream stream, const RmsNormForwardArgs& a) const {
  const RmsNormSpec& s = op_->spec;
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("x", a.x, s.dtype, internal::kAnyRows, s.hidden));
  const int64_t rows = a.x.rows;
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("weight", a.weight, WeightDType(s), 1, s.hidden));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("y", a.y, s.dtype, rows, s.hidden));
  if (!a.rstd.empty())
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("rstd", a.rstd, DType::kF32, 1, rows));
  if (s.fused_residual) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("residual", a.residual, s.dtype, rows, s.hidden));
    KJIT_RETURN_IF_ERROR(
        internal::CheckMatrix("residual_out", a.residual_out, s.dtype, rows, s.hidden));
  } else if (!a.residual.empty() || !a.residual_out.empty()) {
    return absl::InvalidArgumentError(
        "residual: given, but the op was created without fused_residual");
  }
  KJIT_RETURN_IF_ERROR(
      internal::CheckDisjoint({{"residual_out", a.residual_out}, {"y", a.y}, {"rstd", a.rstd}},
                              {{"x", a.x}, {"weight", a.weight}, {"residual", a.residual}},
                              /*in_place=*/{{"y", "x"}, {"residual_out", "residual"}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());

  const int vec = internal::WidestAlignedVec(op_->config.vec,
                                             {&a.x, &a.y, &a.weight, &a.residual, &a.residual_out});
  KJIT_ASSIGN_OR_RETURN(const internal::RmsNormKernels* k,
                        KernelsFor(*rt_, *op_, rows, vec, !rt_->Capturing(stream)));
  RmsNormForwardParams p{};
  p.x = a.x.data;
  p.x_stride = a.x.row_stride;
  p.residual = a.residual.data;
  p.residual_stride = a.residual.row_stride;
  p.residual_out = a.residual_out.data;
  p.residual_out_stride = a.residual_out.row_stride;
  p.weight = a.weight.data;
  p.y = a.y.data;
  p.y_stride = a.y.row_stride;
  p.rstd = static_cast<float*>(a.rstd.data);
  p.rows = rows;
  p.eps = s.eps;
  p.weight_offset = s.weight_offset;
  return rt_->Launch(k->forward(), ops::CeilDiv(rows, k->config.forward.rows_per_block),
                     k->config.forward.block_threads(), stream, &p);
}

absl::Status RmsNorm::Backward(CUstream stream, const RmsNormBackwardArgs& a) const {
  const RmsNormSpec& s = op_->spec;
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("dy", a.dy, s.dtype, internal::kAnyRows, s.hidden));
  const int64_t rows = a.dy.rows;
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("x", a.x, s.dtype, rows, s.hidden));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("weight", a.weight, WeightDType(s), 1, s.hidden));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("rstd", a.rstd, DType::kF32, 1, rows));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("dx", a.dx, s.dtype, rows, s.hidden));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("dw", a.dw, WeightDType(s), 1, s.hidden));
  if (!a.dresidual.empty()) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("dresidual", a.dresidual, s.dtype, rows, s.hidden));
  }
  // A workspace smaller than BackwardWorkspaceBytes still works (fewer, longer row groups): its
  // size is checked below against one row group, and only the part written must be disjoint.
  const int64_t needed = BackwardWorkspaceBytes(rows);
  KJIT_RETURN_IF_ERROR(internal::CheckWorkspace(a.workspace, std::max(a.workspace_bytes, needed),
                                                needed, "BackwardWorkspaceBytes(rows)"));
  KJIT_RETURN_IF_ERROR(internal::CheckDisjoint(
      {{"dx", a.dx},
       {"dw", a.dw},
       {"workspace",
        internal::BytesOf(a.workspace, std::max<int64_t>(0, std::min(a.workspace_bytes, needed)))}},
      {{"dy", a.dy},
       {"x", a.x},
       {"weight", a.weight},
       {"rstd", a.rstd},
       {"dresidual", a.dresidual}},
      /*in_place=*/{{"dx", "dy"}, {"dx", "dresidual"}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());

  const int vec =
      internal::WidestAlignedVec(op_->config.vec, {&a.dy, &a.x, &a.weight, &a.dx, &a.dresidual});
  KJIT_ASSIGN_OR_RETURN(const internal::RmsNormKernels* k,
                        KernelsFor(*rt_, *op_, rows, vec, !rt_->Capturing(stream)));
  const int rpb = k->config.backward.rows_per_block;
  const int64_t per_group = s.hidden * static_cast<int64_t>(sizeof(float));
  // A smaller workspace than asked for still works, with fewer (longer) row groups.
  const int64_t blocks = std::min(
      BackwardGroups(k->config, rows, rt_->device.sm_count, k->backward_blocks_per_sm) / rpb,
      a.workspace_bytes / per_group / rpb);
  if (blocks < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "workspace_bytes: {} is too small, need at least {} (BackwardWorkspaceBytes(rows) = {})",
        a.workspace_bytes, per_group * rpb, needed));
  }
  RmsNormBackwardParams p{};
  p.dy = a.dy.data;
  p.dy_stride = a.dy.row_stride;
  p.x = a.x.data;
  p.x_stride = a.x.row_stride;
  p.weight = a.weight.data;
  p.rstd = static_cast<const float*>(a.rstd.data);
  p.dresidual = a.dresidual.data;
  p.dresidual_stride = a.dresidual.row_stride;
  p.dx = a.dx.data;
  p.dx_stride = a.dx.row_stride;
  p.dw_partial = static_cast<float*>(a.workspace);
  p.rows = rows;
  p.weight_offset = s.weight_offset;
  KJIT_RETURN_IF_ERROR(
      rt_->Launch(k->backward(), blocks, k->config.backward.block_threads(), stream, &p));
  RmsNormDwReduceParams r{};
  r.dw_partial = p.dw_partial;
  r.partial_rows = blocks * rpb;
  r.dw = a.dw.data;
  // Overlapping the backward's end (sm_90+): the reduce waits for its partials on the device.
  return rt_->Launch(k->reduce(), ops::CeilDiv(s.hidden, ReduceColumns(s.hidden)), kReduceThreads,
                     stream, &r, /*cluster=*/1, /*shared_bytes=*/0, /*overlap_previous=*/true);
}

absl::StatusOr<kjit::RmsNorm> Runtime::RmsNorm(const RmsNormSpec& spec) const {
  KJIT_RETURN_IF_ERROR(ValidateRmsNormSpec(spec));
  KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(
      state_->target, {{"dtype", spec.dtype}, {"weight_dtype", spec.weight_dtype}}));
  auto op = std::make_shared<internal::RmsNormState>();
  op->spec = spec;
  const int max_vec = ops::MaxVecForHidden(
      spec.hidden, static_cast<int>(std::max(SizeOf(spec.dtype), SizeOf(WeightDType(spec)))));
  op->config = spec.config.value_or(ops::DefaultRmsNormConfig(spec.hidden, max_vec));
  if (!spec.config) {
    op->tuned.emplace(
        *state_, ops::RmsNormTuningOp(spec), ops::RmsNormTuningShape(spec), spec.dtype,
        ops::RmsNormToJson(spec).dump(), ParseRmsNormConfig,
        [spec](const RmsNormConfig& c) { return ops::ValidateRmsNormConfig(spec, c); });
  }
  kjit::RmsNorm norm(state_, op);
  if (!state_->compile_only) {
    // Build and load the common case now so that errors surface here, not in the first launch.
    KJIT_RETURN_IF_ERROR(op->kernels
                             .Get([&] { return op->config; },
                                  [&](const RmsNormConfig& c) { return Load(*state_, spec, c); })
                             .status());
  }
  return norm;
}

}  // namespace kjit
