#include "kjit/sharded_cross_entropy.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "jit/dtype.h"
#include "jit/instantiation.h"
#include "ops/common/loss_options.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/launch_args.h"
#include "ops/cross_entropy/nccl.h"
#include "ops/cross_entropy/program.h"
#include "runtime/op_kernels.h"
#include "runtime/runtime_state.h"
#include "runtime/tensor_checks.h"
#include "templates/cross_entropy_sharded_params.h"

namespace kjit {

namespace {

// Count, reduce, rescale and combine are small: targets, per-row losses and statistics.
constexpr int kCountThreads = 1024;
constexpr int kReduceThreads = 1024;
constexpr int kStatsThreads = 256;
constexpr int64_t kCountersBytes = kCrossEntropyRowLossOffset;
constexpr int64_t kStatsOffset = kCountersBytes;
static_assert(ShardedCrossEntropy::kMaxCombinedShards == kMaxCombinedShards);

// The program's kernels, in the order RenderShardedCrossEntropy names them.
enum Kernel { kCount, kStats, kRescale, kCombine, kFinishForward, kFinishGradient, kReduce };

// The template arguments both phases start with: types, vocab, shard width and launch shape.
jit::TemplateArgs ShapeArgs(const ShardedCrossEntropySpec& s, const CrossEntropyConfig& c) {
  return {s.dtype, s.loss.target_type, s.vocab, s.width(), c.threads, c.vec, c.unroll};
}

CrossEntropySpec UnshardedSpec(const ShardedCrossEntropySpec& s) {
  return {.vocab = s.vocab, .dtype = s.dtype, .loss = s.loss, .config = s.config};
}

int64_t RowLossBytes(const ShardedCrossEntropySpec& s, int64_t rows) {
  return s.loss.reduction == Reduction::kNone ? 0 : rows * static_cast<int64_t>(sizeof(float));
}
int64_t StatsBytes(int64_t rows) {
  return kShardStatCount * rows * static_cast<int64_t>(sizeof(float));
}
float* StatsIn(void* workspace) {
  return reinterpret_cast<float*>(static_cast<char*>(workspace) + kStatsOffset);
}

}  // namespace

CrossEntropyConfig ops::DefaultShardedCrossEntropyConfig(int64_t width, int vec) {
  // Arch 0 has no clusters, so for a wide shard the heuristic picks its streaming config; a narrow
  // shard gets the resident one's threads, a thread each 8 vectors, which stream as well.
  CrossEntropyConfig c = ops::DefaultCrossEntropyConfig(width, vec, /*arch=*/0,
                                                        /*elem_bytes=*/16 / vec);
  c.cluster = 0;
  return c;
}

absl::Status ValidateShardedCrossEntropySpec(const ShardedCrossEntropySpec& spec) {
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(UnshardedSpec(spec)));
  // Each needs a cross-rank reduction of its own (ShardedCrossEntropy's header says what to do).
  if (spec.loss.argmax || spec.loss.entropy) {
    return absl::InvalidArgumentError(
        fmt::format("{}: not supported in sharded mode", spec.loss.argmax ? "argmax" : "entropy"));
  }
  if (spec.shard_start < 0 || spec.shard_start >= spec.vocab) {
    return absl::InvalidArgumentError(
        fmt::format("shard_start: {} is outside the vocab, expected 0 to {}", spec.shard_start,
                    spec.vocab - 1));
  }
  if (spec.shard_end <= spec.shard_start || spec.shard_end > spec.vocab) {
    return absl::InvalidArgumentError(fmt::format(
        "shard_end: {} must be above shard_start {} (a shard is not empty) and at most vocab {}",
        spec.shard_end, spec.shard_start, spec.vocab));
  }
  if (spec.config && spec.config->cluster != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "config.cluster: {}, but the sharded op streams its row (the reduction across shards "
        "sits between the passes): use cluster=0",
        spec.config->cluster));
  }
  return absl::OkStatus();
}

absl::StatusOr<jit::Source> ops::RenderShardedCrossEntropy(const ShardedCrossEntropySpec& spec,
                                                           const CrossEntropyConfig& config) {
  ShardedCrossEntropySpec checked = spec;
  checked.config = config;
  KJIT_RETURN_IF_ERROR(ValidateShardedCrossEntropySpec(checked));
  // The unsharded op's description of the problem (the config was checked with the spec above),
  // the options on or off: their values are launch arguments.
  std::map<std::string, std::string> params = CrossEntropyProgramParams(UnshardedSpec(checked));
  params["config"] = config.ToString();
  params["op"] = "sharded_cross_entropy";
  params["width"] = std::to_string(spec.width());
  params.erase("argmax");
  const jit::TemplateArgs shape = ShapeArgs(spec, config);
  const jit::TemplateArg loss_terms = LossTermsArg(spec.loss);
  const jit::TemplateArg class_weight = ClassWeightArg(spec.loss.class_weight_dtype);
  auto finish = [&](bool gradient) {
    return jit::Instantiate("kjit::sharded_cross_entropy_finish", shape,
                            ReductionArg(spec.loss.reduction), loss_terms, gradient, class_weight);
  };
  // Order matters: the Kernel enum reads them back by position.
  std::vector<std::string> kernels = {
      CrossEntropyCountExpr(UnshardedSpec(checked), kCountThreads),
      jit::Instantiate("kjit::sharded_cross_entropy_stats", shape, loss_terms, class_weight),
      jit::Instantiate("kjit::sharded_cross_entropy_rescale", kStatsThreads),
      jit::Instantiate("kjit::sharded_cross_entropy_combine", kStatsThreads),
      finish(false),
      finish(true)};
  if (spec.loss.reduction != Reduction::kNone) {
    kernels.push_back(CrossEntropyReduceExpr(spec.loss.reduction, kReduceThreads));
  }
  // The shard's start is a kernel argument, not a template one (nor a param): the ranks of an even
  // split share one program and one cache entry.
  return jit::RenderSource("sharded_cross_entropy",
                           {"common.cuh", "cross_entropy_params.h", "cross_entropy.cuh",
                            "cross_entropy_sharded_params.h", "cross_entropy_sharded.cuh"},
                           std::move(kernels), std::move(params));
}

namespace internal {

struct ShardedCrossEntropyKernels {
  CrossEntropyConfig config;
  LoadedProgram program;  // by Kernel
  CUfunction operator[](int k) const { return program.functions[k]; }
};

struct ShardedCrossEntropyState {
  ShardedCrossEntropySpec spec;
  CrossEntropyConfig config;                                          // for the widest vector
  OpKernels<CrossEntropyConfig, ShardedCrossEntropyKernels> kernels;  // narrower for misaligned

  CrossEntropyConfig ConfigForVec(int vec) const {
    if (vec == config.vec) return config;
    return ops::DefaultShardedCrossEntropyConfig(spec.width(), vec);
  }
};

}  // namespace internal

namespace {

absl::StatusOr<const internal::ShardedCrossEntropyKernels*> KernelsFor(
    const internal::RuntimeState& rt, internal::ShardedCrossEntropyState& op, int vec) {
  return op.kernels.Get(
      [&] { return op.ConfigForVec(vec); },
      [&](const CrossEntropyConfig& c) -> absl::StatusOr<internal::ShardedCrossEntropyKernels> {
        internal::ShardedCrossEntropyKernels k{.config = c};
        KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderShardedCrossEntropy(op.spec, c));
        KJIT_ASSIGN_OR_RETURN(k.program, internal::LoadProgram(rt, src));
        return k;
      });
}

// The statistics launches know only the pointers (the caller's all-reduce sits between).
absl::Status CheckWorkspacePointer(const std::string& name, void* workspace) {
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} is not 16-byte aligned device memory of WorkspaceBytes(rows) bytes",
                    name, workspace));
  }
  return absl::OkStatus();
}

absl::Status CheckStatsRows(int64_t rows) {
  if (rows < 1 || rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        fmt::format("rows: {} must be from 1 to {} (one block per row)", rows, INT32_MAX));
  }
  return absl::OkStatus();
}

}  // namespace

const ShardedCrossEntropySpec& ShardedCrossEntropy::spec() const { return op_->spec; }
const CrossEntropyConfig& ShardedCrossEntropy::config() const { return op_->config; }

int64_t ShardedCrossEntropy::WorkspaceBytes(int64_t rows) const {
  // Launches check rows after this (a wild one overflowed it).
  rows = std::clamp<int64_t>(rows, 1, INT32_MAX);
  return (kStatsOffset + StatsBytes(rows) + RowLossBytes(op_->spec, rows) + 15) / 16 * 16;
}

ShardStatsView ShardedCrossEntropy::StatsOf(void* workspace, int64_t rows) const {
  float* stats = StatsIn(workspace);
  return {stats + kShardMax * rows, stats + kShardSumExp * rows, rows};
}

absl::StatusOr<BuildInfo> ShardedCrossEntropy::Build() const {
  KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderShardedCrossEntropy(op_->spec, op_->config));
  KJIT_ASSIGN_OR_RETURN(jit::Jit::Built built, rt_->jit->Build(src, rt_->target));
  return internal::ToBuildInfo(built);
}

absl::Status ShardedCrossEntropy::CheckArgs(const ShardedCrossEntropyArgs& a) const {
  const ShardedCrossEntropySpec& s = op_->spec;
  KJIT_RETURN_IF_ERROR(
      ops::CheckLossArgs(UnshardedSpec(s), s.width(), a, WorkspaceBytes(a.logits.rows)));
  return rt_->NeedsDevice();
}

namespace {

// The params both phases take (the statistics phase without grad and grad_output); the outputs
// are left null.
ShardedCrossEntropyParams PhaseParams(const ShardedCrossEntropySpec& s,
                                      const ShardedCrossEntropyArgs& a, const TensorView& grad,
                                      const TensorView& grad_output) {
  ShardedCrossEntropyParams p{};
  p.row = ops::RowParams(UnshardedSpec(s), a.logits, a.targets, grad, grad_output, a.class_weight,
                         a.workspace);
  p.row.lse = static_cast<float*>(a.lse.data);
  p.row.class_weight_offset = s.shard_start;
  p.shard_start = s.shard_start;
  p.stats = StatsIn(a.workspace);
  return p;
}

}  // namespace

absl::Status ShardedCrossEntropy::ComputeStats(CUstream stream,
                                               const ShardedCrossEntropyArgs& a) const {
  KJIT_RETURN_IF_ERROR(CheckArgs(a));
  const int vec = internal::WidestVecAlignedAlike(op_->config.vec, a.logits, {&a.grad});
  KJIT_ASSIGN_OR_RETURN(const internal::ShardedCrossEntropyKernels* k, KernelsFor(*rt_, *op_, vec));
  CrossEntropyCountParams c{a.targets.data, a.logits.rows, op_->spec.loss.ignore_index,
                            a.class_weight.data, static_cast<CrossEntropyCounters*>(a.workspace)};
  KJIT_RETURN_IF_ERROR(rt_->Launch((*k)[kCount], 1, kCountThreads, stream, &c));
  ShardedCrossEntropyParams p = PhaseParams(op_->spec, a, {}, {});
  return rt_->Launch((*k)[kStats], a.logits.rows, k->config.threads, stream, &p);
}

absl::Status ShardedCrossEntropy::Finish(CUstream stream, const ShardedCrossEntropyArgs& a) const {
  KJIT_RETURN_IF_ERROR(CheckArgs(a));
  const ShardedCrossEntropySpec& s = op_->spec;
  const int vec = internal::WidestVecAlignedAlike(op_->config.vec, a.logits, {&a.grad});
  KJIT_ASSIGN_OR_RETURN(const internal::ShardedCrossEntropyKernels* k, KernelsFor(*rt_, *op_, vec));
  const int64_t rows = a.logits.rows;
  float* row_loss = s.loss.reduction == Reduction::kNone
                        ? static_cast<float*>(a.loss.data)
                        : StatsIn(a.workspace) + kShardStatCount * rows;
  ShardedCrossEntropyParams p = PhaseParams(s, a, a.grad, a.grad_output);
  p.row.row_loss = row_loss;
  KJIT_RETURN_IF_ERROR(rt_->Launch((*k)[a.grad.empty() ? kFinishForward : kFinishGradient], rows,
                                   k->config.threads, stream, &p));
  if (s.loss.reduction == Reduction::kNone) return absl::OkStatus();
  CrossEntropyReduceParams r{row_loss, rows, p.row.counters, static_cast<float*>(a.loss.data)};
  return rt_->Launch((*k)[kReduce], 1, kReduceThreads, stream, &r);
}

namespace {

using StatsKernels = internal::ShardedCrossEntropyKernels;

// Everything a step on the statistics checks, and its kernels loaded, before anything is
// launched or reduced: a rank that fails after its first all-reduce never joins the second, and
// its peers wait for it for ever.
absl::StatusOr<const StatsKernels*> PrepareStats(
    const internal::RuntimeState& rt, internal::ShardedCrossEntropyState& op,
    const std::vector<std::pair<std::string, void*>>& workspaces, int64_t rows) {
  KJIT_RETURN_IF_ERROR(CheckStatsRows(rows));
  for (const auto& [name, workspace] : workspaces) {
    KJIT_RETURN_IF_ERROR(CheckWorkspacePointer(name, workspace));
  }
  KJIT_RETURN_IF_ERROR(rt.NeedsDevice());
  return KernelsFor(rt, op, op.config.vec);
}

absl::Status LaunchOnStats(const internal::RuntimeState& rt, const StatsKernels& k, int which,
                           CUstream stream, const std::vector<void*>& workspaces, int64_t rows) {
  ShardStatsParams p{};
  for (size_t i = 0; i < workspaces.size(); ++i) p.stats[i] = StatsIn(workspaces[i]);
  p.shards = static_cast<int>(workspaces.size());
  p.rows = rows;
  return rt.Launch(k[which], (rows + kStatsThreads - 1) / kStatsThreads, kStatsThreads, stream, &p);
}

// The fields of the problem every shard of one split must share, by name, as text.
std::vector<std::pair<const char*, std::string>> ProblemFields(const ShardedCrossEntropySpec& s) {
  const LossOptions& l = s.loss;
  return {{"vocab", std::to_string(s.vocab)},
          {"dtype", Name(s.dtype)},
          {"loss.target_type", Name(l.target_type)},
          {"loss.ignore_index", std::to_string(l.ignore_index)},
          {"loss.reduction", Name(l.reduction)},
          {"loss.label_smoothing", ops::LossValueText(l.label_smoothing)},
          {"loss.z_loss", ops::LossValueText(l.z_loss)},
          {"loss.softcap", ops::LossValueText(l.softcap)},
          {"loss.class_weight_dtype", l.class_weight_dtype ? Name(*l.class_weight_dtype) : "none"}};
}

// Shard i of a CombineStats: of shards[0]'s problem, next in the vocab, its workspace its own.
absl::Status CheckCombinedShard(const std::vector<ShardedCrossEntropy::Shard>& shards, size_t i,
                                int64_t next, int64_t workspace_bytes) {
  const ShardedCrossEntropySpec& s = shards[i].op->spec();
  const auto first = ProblemFields(shards[0].op->spec()), fields = ProblemFields(s);
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].second != first[f].second) {
      return absl::InvalidArgumentError(fmt::format(
          "shards[{}]: {}: {}, but shards[0]'s is {} (the shards of one split share a problem)", i,
          fields[f].first, fields[f].second, first[f].second));
    }
  }
  if (s.shard_start != next) {
    return absl::InvalidArgumentError(fmt::format(
        "shards[{}]: classes [{}, {}) of vocab {}, expected the next shard from {} (the shards "
        "must tile the vocab in order)",
        i, s.shard_start, s.shard_end, s.vocab, next));
  }
  KJIT_RETURN_IF_ERROR(
      CheckWorkspacePointer(fmt::format("shards[{}].workspace", i), shards[i].workspace));
  const auto mine = reinterpret_cast<uintptr_t>(shards[i].workspace);
  for (size_t j = 0; j < i; ++j) {
    const auto other = reinterpret_cast<uintptr_t>(shards[j].workspace);
    if (mine < other + workspace_bytes && other < mine + workspace_bytes) {
      return absl::InvalidArgumentError(fmt::format(
          "shards[{}].workspace: overlaps shards[{}]'s ({} and {}, {} bytes each): each shard "
          "needs a workspace of its own",
          i, j, shards[i].workspace, shards[j].workspace, workspace_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardedCrossEntropy::RescaleStats(CUstream stream, void* workspace,
                                               int64_t rows) const {
  KJIT_ASSIGN_OR_RETURN(const StatsKernels* k,
                        PrepareStats(*rt_, *op_, {{"workspace", workspace}}, rows));
  return LaunchOnStats(*rt_, *k, kRescale, stream, {workspace}, rows);
}

absl::Status ShardedCrossEntropy::AllReduceStats(CUstream stream, void* workspace, int64_t rows,
                                                 NcclComm comm) const {
  KJIT_ASSIGN_OR_RETURN(const StatsKernels* k,
                        PrepareStats(*rt_, *op_, {{"workspace", workspace}}, rows));
  if (comm == nullptr) return absl::InvalidArgumentError("comm: null NCCL communicator");
  KJIT_ASSIGN_OR_RETURN(const Nccl* nccl, Nccl::Get());
  const ShardStatsView v = StatsOf(workspace, rows);
  KJIT_RETURN_IF_ERROR(nccl->AllReduce(v.max, rows, NcclOp::kMax, comm, stream));
  KJIT_RETURN_IF_ERROR(LaunchOnStats(*rt_, *k, kRescale, stream, {workspace}, rows));
  return nccl->AllReduce(v.sums, 3 * rows, NcclOp::kSum, comm, stream);
}

absl::Status ShardedCrossEntropy::Run(CUstream stream, const ShardedCrossEntropyArgs& args,
                                      NcclComm comm) const {
  KJIT_RETURN_IF_ERROR(ComputeStats(stream, args));
  KJIT_RETURN_IF_ERROR(AllReduceStats(stream, args.workspace, args.logits.rows, comm));
  return Finish(stream, args);
}

absl::Status ShardedCrossEntropy::CombineStats(CUstream stream, const std::vector<Shard>& shards,
                                               int64_t rows) {
  if (shards.empty() || shards.size() > kMaxCombinedShards) {
    return absl::InvalidArgumentError(
        fmt::format("shards: {} given, expected 1 to {}", shards.size(), kMaxCombinedShards));
  }
  KJIT_RETURN_IF_ERROR(CheckStatsRows(rows));
  int64_t next = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].op == nullptr) {
      return absl::InvalidArgumentError(fmt::format("shards[{}].op: null", i));
    }
    if (shards[i].op->rt_ != shards[0].op->rt_) {
      return absl::InvalidArgumentError(fmt::format(
          "shards[{}].op: made by another runtime than shards[0].op (one CombineStats launches "
          "on one runtime's GPU)",
          i));
    }
    const int64_t bytes = shards[0].op->WorkspaceBytes(rows);
    KJIT_RETURN_IF_ERROR(CheckCombinedShard(shards, i, next, bytes));
    next = shards[i].op->spec().shard_end;
  }
  const ShardedCrossEntropy& first = *shards[0].op;
  if (next != first.spec().vocab) {
    return absl::InvalidArgumentError(
        fmt::format("shards: cover classes [0, {}) of {}; the last shard must end at the vocab",
                    next, first.spec().vocab));
  }
  // The workspaces were checked with their shards.
  KJIT_ASSIGN_OR_RETURN(const StatsKernels* k, PrepareStats(*first.rt_, *first.op_, {}, rows));
  std::vector<void*> workspaces;
  for (const Shard& shard : shards) workspaces.push_back(shard.workspace);
  return LaunchOnStats(*first.rt_, *k, kCombine, stream, workspaces, rows);
}

absl::StatusOr<kjit::ShardedCrossEntropy> Runtime::ShardedCrossEntropy(
    const ShardedCrossEntropySpec& spec) const {
  KJIT_RETURN_IF_ERROR(ValidateShardedCrossEntropySpec(spec));
  KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(
      state_->target,
      {{"dtype", spec.dtype}, {"class_weight_dtype", spec.loss.class_weight_dtype}}));
  auto op = std::make_shared<internal::ShardedCrossEntropyState>();
  op->spec = spec;
  const int max_vec = ops::MaxVecForCrossEntropy(static_cast<int>(SizeOf(spec.dtype)));
  op->config = spec.config.value_or(ops::DefaultShardedCrossEntropyConfig(spec.width(), max_vec));
  kjit::ShardedCrossEntropy ce(state_, op);
  if (!state_->compile_only) {
    // Build and load the common case now so that errors surface here, not in the first launch.
    KJIT_RETURN_IF_ERROR(KernelsFor(*state_, *op, op->config.vec).status());
  }
  return ce;
}

}  // namespace kjit
