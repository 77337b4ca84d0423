// Kernel arguments of the vocab-parallel (sharded) cross-entropy kernels and the layout of the
// per-row statistics the shards reduce, shared verbatim by the host
// (ops/cross_entropy/sharded.cc) and the device (cross_entropy_sharded.cuh). Plain C++ both
// compilers read.
//
//   kjit::ShardedCrossEntropyParams p{.row = {...}, .shard_start = 64128, .stats = stats};
//   // row r's global max, after the reduction: p.stats[kShardMax * rows + r] (log2 units)
#pragma once

#include "cross_entropy_params.h"

namespace kjit {

// The statistics are kShardStatCount arrays of `rows` floats, in this order. Phase 1 writes all of
// them from the shard alone (kShardMax equal to kShardLocalMax). The reduction across shards makes
// max, sum_exp, sum_x and target_logit those of the whole row: an all-reduce with max over
// kShardMax, each shard's sum_exp rescaled from its local max to that max, then an all-reduce with
// sum over the three arrays from kShardSumExp on (3 * rows contiguous floats). Phase 2 reads them.
enum ShardStat {
  kShardLocalMax = 0,     // max of x * log2e over the shard's columns; kept for the rescale
  kShardMax = 1,          // the same, then over the whole row
  kShardSumExp = 2,       // sum of 2^(x * log2e - max)
  kShardSumX = 3,         // sum of w_j x_j (after the softcap; w_j = 1 without class weights)
  kShardTargetLogit = 4,  // the target's raw logit in the shard that holds it, 0 in the others
  kShardStatCount = 5,
};

struct ShardedCrossEntropyParams {
  // logits and grad are the shard's [rows, width] columns; targets index the whole vocab.
  CrossEntropyRowParams row;
  long long shard_start;  // the class of the shard's first column
  float* stats;           // [kShardStatCount * rows]
};

// The rescale (one shard, before the sum all-reduce) and the device-side combine of the shards of
// one process, which does what the two all-reduces do.
constexpr int kMaxCombinedShards = 32;
struct ShardStatsParams {
  float* stats[kMaxCombinedShards];  // each shard's statistics, in shard order
  int shards;
  long long rows;
};

}  // namespace kjit
