// ShardedCrossEntropy: vocab-parallel cross-entropy for tensor-parallel training, where the
// lm_head is split over the vocab and each rank holds the logits of its classes
// [shard_start, shard_end) only. The loss and each shard's gradient equal the unsharded op's
// (kjit/cross_entropy.h); the row's max, sum of exponentials, sum of logits and target logit are
// reduced across the ranks in between, as Megatron's and TransformerEngine's do.
//
// One op per rank, three steps on one stream, no host synchronization, no allocation:
//   1. ComputeStats: per row, the shard's statistics into the workspace (and the valid-row count).
//   2. the reduction across shards, one of
//        AllReduceStats   NCCL over a communicator the caller made (ncclAllReduce max, a rescale,
//                         ncclAllReduce sum of 3 floats a row), through libnccl, opened with
//                         dlopen;
//        your own         all-reduce StatsOf(ws).max with max, RescaleStats, all-reduce .sums with
//        sum; CombineStats     the shards of one process (one GPU, shards in turn): a device kernel
//        that
//                         does what the two all-reduces do.
//   3. Finish: lse, loss (the same on every rank) and, when args.grad is given, the shard's
//   gradient.
// Run() does 1 to 3 with NCCL.
//
// Options as CrossEntropySpec: ignore_index, every reduction, label smoothing (over the whole
// vocab), z-loss, softcap (elementwise) and class weights (every rank passes the whole [vocab]
// vector) all work; lse is written on request; grad_output scales
// the gradient. Not in sharded mode (loss.argmax and loss.entropy are refused): argmax (it would
// need a cross-rank (max, index) reduction: take it from a separate top-1), the entropy, the fused
// resident kernel (the reduction sits between the passes, so both phases stream the shard's row,
// which is read twice) and Backward from a saved lse. Targets index the whole vocab; every rank
// passes the same targets.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::ShardedCrossEntropy ce, rt.ShardedCrossEntropy({
//       .vocab = 128256, .shard_start = rank * 32064, .shard_end = (rank + 1) * 32064}));
//   KJIT_RETURN_IF_ERROR(ce.Run(stream, {.logits = shard_logits, .targets = targets,
//       .loss = loss, .grad = shard_logits, .workspace = ws,
//       .workspace_bytes = ce.WorkspaceBytes(rows)}, comm));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kjit/cross_entropy.h"
#include "kjit/runtime.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"

struct ncclComm;  // NCCL's communicator, opaque

namespace kjit {

// NCCL's ncclComm_t: a communicator made by the caller's NCCL (or PyTorch's) passes straight in.
using NcclComm = ::ncclComm*;

struct ShardedCrossEntropySpec {
  int64_t vocab = 0;        // the whole vocabulary, 2 .. 1,048,576
  int64_t shard_start = 0;  // this rank's classes: [shard_start, shard_end), not empty
  int64_t shard_end = 0;
  DType dtype = DType::kBF16;
  LossOptions loss;  // as CrossEntropySpec's, but argmax and entropy must be off
  // Overrides the heuristic; cluster must be 0 (both phases stream the row).
  std::optional<CrossEntropyConfig> config;

  int64_t width() const { return shard_end - shard_start; }
};

struct ShardedCrossEntropyArgs {
  TensorView logits;       // [rows, width]: the shard's columns, any row_stride >= width
  IndexView targets;       // [rows], classes of the whole vocab
  TensorView loss;         // fp32 [rows] (none) or [1]: the whole row's loss
  TensorView lse;          // optional fp32 [rows]: the whole row's lse
  TensorView grad;         // optional [rows, width]: the shard's gradient; may be logits (in place)
  TensorView grad_output;  // optional fp32 upstream gradient: [1] (sum, mean) or [rows] (none)
  TensorView class_weight;    // [vocab] (the whole vocab's) iff spec.loss.class_weight_dtype is set
  void* workspace = nullptr;  // device memory, 16-byte aligned; one per shard; holds the stats
  int64_t workspace_bytes = 0;  // >= WorkspaceBytes(rows)
};

// The statistics in a workspace, for a caller's own all-reduce (both in place, fp32).
struct ShardStatsView {
  float* max = nullptr;   // [rows]: all-reduce with max, then RescaleStats
  float* sums = nullptr;  // [3 * rows]: then all-reduce with sum
  int64_t rows = 0;
};

// Checks a spec without a GPU; InvalidArgument names the bad field.
absl::Status ValidateShardedCrossEntropySpec(const ShardedCrossEntropySpec& spec);

namespace internal {
struct RuntimeState;
struct ShardedCrossEntropyState;
}  // namespace internal

class ShardedCrossEntropy {
 public:
  const ShardedCrossEntropySpec& spec() const;
  const CrossEntropyConfig& config() const;

  // The counters (16 bytes), the statistics (5 floats a row), then for sum and mean one fp32
  // loss per row. O(rows); rows outside 1 .. 2^31 - 1 (what a launch takes) count as the nearer.
  int64_t WorkspaceBytes(int64_t rows) const;
  ShardStatsView StatsOf(void* workspace, int64_t rows) const;

  absl::Status ComputeStats(CUstream stream, const ShardedCrossEntropyArgs& args) const;
  // libnccl is opened on first use ($KJIT_NCCL_LIBRARY, else libnccl.so.2, then libnccl.so).
  absl::Status AllReduceStats(CUstream stream, void* workspace, int64_t rows, NcclComm comm) const;
  absl::Status RescaleStats(CUstream stream, void* workspace, int64_t rows) const;
  absl::Status Finish(CUstream stream, const ShardedCrossEntropyArgs& args) const;
  // ComputeStats, AllReduceStats and Finish.
  absl::Status Run(CUstream stream, const ShardedCrossEntropyArgs& args, NcclComm comm) const;

  // One shard of a split held by this process, after its ComputeStats.
  struct Shard {
    const ShardedCrossEntropy* op = nullptr;
    void* workspace = nullptr;
  };
  // The reduction for shards that tile [0, vocab) in order (at most 32), of one problem (specs
  // alike but for the shard), one runtime and workspaces of their own: afterwards each shard's
  // Finish gives what it would after the all-reduces. Launched with shards[0]'s program.
  static absl::Status CombineStats(CUstream stream, const std::vector<Shard>& shards, int64_t rows);
  static constexpr int kMaxCombinedShards = 32;

  // Compiles (or finds in the caches) the program for the widest config; works compile-only.
  absl::StatusOr<BuildInfo> Build() const;

 private:
  friend class Runtime;
  ShardedCrossEntropy(std::shared_ptr<internal::RuntimeState> rt,
                      std::shared_ptr<internal::ShardedCrossEntropyState> op)
      : rt_(std::move(rt)), op_(std::move(op)) {}
  absl::Status CheckArgs(const ShardedCrossEntropyArgs& args) const;
  std::shared_ptr<internal::RuntimeState> rt_;
  std::shared_ptr<internal::ShardedCrossEntropyState> op_;
};

}  // namespace kjit
