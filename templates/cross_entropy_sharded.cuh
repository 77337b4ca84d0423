// Vocab-parallel cross-entropy: each rank holds the logits of a shard [start, start + kWidth) of a
// kVocab-class vocabulary, as a tensor-parallel lm_head leaves them (Megatron's and
// TransformerEngine's vocab-parallel cross-entropy). The math is cross_entropy.cuh's; only where
// the row's statistics come from differs.
//
//   phase 1  sharded_cross_entropy_stats: per row, the shard's max and sum of exponentials, its sum
//            of logits and the target logit when the shard holds the target (ShardStat layout).
//   reduce   across ranks: all-reduce max, sharded_cross_entropy_rescale, all-reduce sum (NCCL,
//            on the host side); or, for the shards of one process, sharded_cross_entropy_combine.
//   phase 2  sharded_cross_entropy_finish: lse, loss and the shard's gradient from the reduced
//            statistics, then cross_entropy_loss_reduce as for the whole row.
//
// Both phases stream the shard's row with one block (the reduction sits between them, so the row
// cannot stay resident). The count kernel runs with the whole vocab, so every rank counts the same
// valid rows and computes the same loss.
//
//   kjit::sharded_cross_entropy_stats<kjit::bf16, long long, 128256, 64128, 256, 8, 4,
//                                     false, false, false, kjit::NoClassWeight>
#pragma once

#include "cross_entropy.cuh"
#include "cross_entropy_sharded_params.h"

namespace kjit {

// Phase 1. Ignored rows are read only when the lse is wanted, as in cross_entropy_forward.
template <typename T, typename I, int kVocab, int kWidth, int kThreads, int kVec, int kUnroll,
          typename Loss, typename W>
__global__ void __launch_bounds__(kThreads, kStreamingMinBlocks<kThreads>)
sharded_cross_entropy_stats(const ShardedCrossEntropyParams p) {
  using L = CeLayout<kWidth, kThreads, kVec>;
  using Stats = CeStats<Loss::kSmoothing, false>;
  __shared__ Stats smem[32];
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const CeRow<T, I, kVocab, Loss, W> r(p.row, row);

  const long long col_t = r.target - p.shard_start;
  float x_t = 0.0f;  // 0 where another shard holds the target: the sum over shards is exact
  if (r.valid && col_t >= 0 && col_t < kWidth && tid == 0) x_t = to_float(r.x[col_t]);

  const Stats st = stream_row_stats<L, kUnroll>(r, tid, r.valid || p.row.lse != nullptr, smem);
  if (tid == 0) {
    float* s = p.stats + row;
    const long long n = p.row.rows;
    s[kShardLocalMax * n] = st.m;
    s[kShardMax * n] = st.m;
    s[kShardSumExp * n] = st.s;
    s[kShardSumX * n] = st.sum_x;
    s[kShardTargetLogit * n] = x_t;
  }
}

// One shard's sum of exponentials, moved from its local max to the row's max.
__device__ __forceinline__ float rescaled_sum_exp(const float* s, long long n, float max) {
  return __fmul_rn(s[kShardSumExp * n], rescale_factor(s[kShardLocalMax * n], max));
}

// Between the max and the sum all-reduce, on each rank's own statistics (p.stats[0]). One thread
// per row.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) sharded_cross_entropy_rescale(const ShardStatsParams p) {
  const long long row = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= p.rows) return;
  float* s = p.stats[0] + row;
  s[kShardSumExp * p.rows] = rescaled_sum_exp(s, p.rows, s[kShardMax * p.rows]);
}

// The two all-reduces for the p.shards shards of one process: the max over the shards, then each
// shard's rescaled sum added in shard order, written back to every shard. One thread per row; a
// row is read entirely before it is written. Run once per phase 1.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) sharded_cross_entropy_combine(const ShardStatsParams p) {
  const long long row = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= p.rows) return;
  const long long n = p.rows;
  float max = neg_inf();
  for (int i = 0; i < p.shards; ++i) max = fmaxf(max, p.stats[i][kShardLocalMax * n + row]);
  float sum_exp = 0.0f, sum_x = 0.0f, x_t = 0.0f;
  for (int i = 0; i < p.shards; ++i) {
    const float* s = p.stats[i] + row;
    sum_exp += rescaled_sum_exp(s, n, max);
    sum_x += s[kShardSumX * n];
    x_t += s[kShardTargetLogit * n];
  }
  for (int i = 0; i < p.shards; ++i) {
    float* s = p.stats[i] + row;
    s[kShardMax * n] = max;
    s[kShardSumExp * n] = sum_exp;
    s[kShardSumX * n] = sum_x;
    s[kShardTargetLogit * n] = x_t;
  }
}

// Phase 2: the row's lse and loss (identical on every rank) and, with kGradient, the shard's
// columns of the gradient, whose target column is the target minus the shard's start.
template <typename T, typename I, int kVocab, int kWidth, int kThreads, int kVec, int kUnroll,
          CrossEntropyReduction kReduction, typename Loss,
          bool kGradient, typename W>
__global__ void __launch_bounds__(kThreads, kStreamingMinBlocks<kThreads>)
sharded_cross_entropy_finish(const ShardedCrossEntropyParams p) {
  using L = CeLayout<kWidth, kThreads, kVec>;
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const CeRow<T, I, kVocab, Loss, W> r(p.row, row);
  const float* s = p.stats + row;
  const long long n = p.row.rows;
  CeStats<Loss::kSmoothing, false> st = CeStats<Loss::kSmoothing, false>::identity();
  st.m = s[kShardMax * n];
  st.s = s[kShardSumExp * n];
  st.sum_x = s[kShardSumX * n];
  const float lse2 = finish_row<I, kVocab>(p.row, row, r, st, s[kShardTargetLogit * n], tid == 0);
  if constexpr (kGradient) {
    write_row_gradient<L, kUnroll, kReduction>(p.row, row, r, tid, lse2, p.shard_start);
  }
}

}  // namespace kjit
