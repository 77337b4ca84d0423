// Reinforcement-learning heads over a large vocabulary: per row, the target's log-probability
// under softmax(z / T) and that distribution's entropy, and the gradient of both with respect to
// the logits z for per-row upstream gradients, without any [rows x vocab] temporary and without a
// scaled copy of the logits: 1 / T multiplies each logit as it is read.
//
// With x = z / T (fp32 product with the fp32 1 / T), lse = log sum_j exp(x_j), p = softmax(x):
//   logprob = x_t - lse,   entropy H = -sum_j p_j ln p_j,   both 0 for an ignored row;
//   d z_j = (g_lp (1[j = t] - p_j) - g_H p_j (ln p_j + H)) / T,   zeros for an ignored row,
// where g_lp and g_H are the row's upstream gradients of the two outputs (either absent: 0, and
// its term is not computed). The forward (log_probs_forward) streams the row once with
// cross-entropy's online softmax (CeStats: max, sum of exps, entropy accumulator, combined in a
// fixed tree); the backward (log_probs_backward) streams it once more from the forward's lse and
// entropy and writes the gradient, in place over the logits or into another buffer. Both reuse
// cross_entropy.cuh's row layout (vectors from the row's first 16-byte boundary, so any vocab and
// address) and its statistics; this file adds only what the temperature and the entropy's
// gradient change, so that cross-entropy's own programs are untouched.
//
//   kjit::log_probs_forward<kjit::bf16, long long, 151936, 256, 8, 4, /*entropy=*/true>
//   kjit::log_probs_backward<kjit::bf16, long long, 151936, 256, 8, 4>
#pragma once

#include "cross_entropy.cuh"
#include "log_probs_params.h"

namespace kjit {

// Pass 1's row visitor: the logits scaled by 1 / T, added to a thread's statistics.
template <typename Stats>
struct AddScaledToStats {
  Stats& st;
  float inv_t;
  template <int N>
  __device__ __forceinline__ void operator()(int col, const Floats<N>& raw) const {
    Floats<N> x;
#pragma unroll
    for (int k = 0; k < N; ++k) x.v[k] = raw.v[k] * inv_t;
    st.add(col, x, x);
  }
};

// The gradient of one entry of a valid row from its raw logit z: with y = log2 p_j,
//   d = -p_j (c_lp + c_h (ln p_j + H)) + c_lp 1[j = t],   c_lp = g_lp / T, c_h = g_H / T,
// in fp32 before the single rounding. A class of probability 0 (masked, -inf) gets exactly 0 (its
// ln p is -inf: the product would be NaN).
struct LogProbsGradient {
  float inv_t, lse2;  // 1 / T; the lse in log2 units
  float c_lp, c_h, h;
  int target;

  template <int N>
  __device__ __forceinline__ void operator()(int col, Floats<N>& z) const {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float y = fmaf(z.v[k] * inv_t, kLog2e, -lse2);
      const float p = fast_exp2(y);
      float d = p == 0.0f ? 0.0f : -p * fmaf(c_h, fmaf(y, kLn2, h), c_lp);
      if (col + k == target) d += c_lp;
      z.v[k] = d;
    }
  }
};

// A block's row (blockIdx.x): its logits and target.
template <typename T, typename I, int kVocab>
struct LpRow {
  long long index;
  const T* x;
  long long target;
  bool valid;
  __device__ __forceinline__ explicit LpRow(const LogProbsParams& p)
      : index(blockIdx.x),
        x(static_cast<const T*>(p.logits) + index * p.logits_stride),
        target(static_cast<const I*>(p.targets)[index]),
        valid(target_is_valid<kVocab>(target, p.ignore_index)) {}
};

// The row's log-probability, entropy and lse. An ignored row is read only when its lse is asked
// for.
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kUnroll, bool kEntropy>
__global__ void __launch_bounds__(kThreads, kStreamingMinBlocks<kThreads>)
log_probs_forward(const LogProbsParams p) {
  using Stats = CeStats<false, false, kEntropy>;
  __shared__ Stats smem[32];
  const LpRow<T, I, kVocab> r(p);
  float x_t = 0.0f;  // issued first so that its latency hides behind the row
  if (r.valid && threadIdx.x == 0) x_t = to_float(r.x[r.target]) * p.inv_temperature;
  Stats st = Stats::identity();
  if (r.valid || p.lse != nullptr) {
    visit_row<CeLayout<kVocab, kThreads, kVec>, kUnroll>(
        r.x, threadIdx.x, AddScaledToStats<Stats>{st, p.inv_temperature});
    st = block_combine<kThreads>(st, smem);
  }
  if (threadIdx.x == 0) {
    const float lse = (st.m + log2f(st.s)) * kLn2;  // all -inf: -inf; any NaN or +inf: NaN
    if (p.lse != nullptr) p.lse[r.index] = lse;
    p.logprob[r.index] = r.valid ? x_t - lse : 0.0f;
    if constexpr (kEntropy) p.entropy[r.index] = r.valid ? st.entropy_of() : 0.0f;
  }
}

// The gradient of a row from the forward's lse (and entropy): zeros for an ignored row. Each
// element is read and written by one thread, so in place needs no barrier.
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kUnroll>
__global__ void __launch_bounds__(kThreads, kStreamingMinBlocks<kThreads>)
log_probs_backward(const LogProbsParams p) {
  using L = CeLayout<kVocab, kThreads, kVec>;
  const LpRow<T, I, kVocab> r(p);
  T* g = static_cast<T*>(p.grad) + r.index * p.grad_stride;
  if (!r.valid) {
    map_row<L, kUnroll, false>(r.x, g, threadIdx.x, Zeros{});
    return;
  }
  const float g_lp = p.grad_logprob != nullptr ? p.grad_logprob[r.index] : 0.0f;
  const float g_h = p.grad_entropy != nullptr ? p.grad_entropy[r.index] : 0.0f;
  const float h = p.grad_entropy != nullptr ? p.entropy_in[r.index] : 0.0f;
  map_row<L, kUnroll, true>(r.x, g, threadIdx.x,
                            LogProbsGradient{p.inv_temperature, p.lse_in[r.index] * kLog2e,
                                             g_lp * p.inv_temperature, g_h * p.inv_temperature, h,
                                             static_cast<int>(r.target)});
}

}  // namespace kjit
