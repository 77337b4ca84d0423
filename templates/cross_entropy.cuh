// Fused cross-entropy over a large vocabulary: loss, lse, argmax and the gradient without any
// [rows x vocab] temporary, specialized for one vocab size, dtype, launch shape and option set.
//
// One block per row. Pass 1 streams the row once: an online softmax in fp32 (each thread keeps a
// running max m and sum s = sum 2^(x*log2e - m); the max is raised before s is rescaled), plus the
// sum of logits (label smoothing) and the argmax when asked; the per-thread states are combined in a
// fixed tree, lse = (m + log2 s) * ln2. The target logit is one direct load. Pass 2 (the fused
// backward) reads the row again, usually from L2, and writes
//   grad = scale * (p * (1 + 2 z lse) - eps/V - (1 - eps) * onehot) [* (1 - tanh^2(x / cap))]
// in fp32 with a single rounding to the logits' dtype, so p - 1 near p = 1 does not cancel in bf16.
// The backward kernel does pass 2 alone from a saved lse. Ignored rows (target == ignore_index, or
// out of [0, vocab), which the count kernel also counts) get loss 0 and a zero gradient and are not
// read unless lse or argmax is wanted. The count kernel runs first and stores the number of valid
// rows, which the mean divides by; the reduce kernel sums the per-row losses in a fixed order.
//
//   kjit::cross_entropy_forward<kjit::bf16, long long, 128256, 512, 8, 4, kjit::kCeMean,
//                               false, false, false, false, true>   // loss and gradient
#pragma once

#include "common.cuh"
#include "cross_entropy_params.h"

namespace kjit {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// A target that is neither ignore_index nor outside the vocab selects a class; anything else makes
// the row ignored, and is never used as an index.
template <int kVocab>
__device__ __forceinline__ bool target_is_valid(long long t, long long ignore_index) {
  return t != ignore_index && t >= 0 && t < kVocab;
}

// How a row is split: kBody vectors of kVec elements dealt round-robin to the threads (coalesced),
// then kTail < kVec scalars, one each for the first threads.
template <int kVocabSize, int kThreadCount, int kVecWidth, int kUnrollDepth>
struct CeLayout {
  // Blocks that must fit an SM together: 1024 threads' worth, which caps registers at 64.
  static constexpr int kMinBlocks = kThreadCount >= 1024 ? 1 : 1024 / kThreadCount;
  static constexpr int kVocab = kVocabSize, kThreads = kThreadCount, kVec = kVecWidth;
  static constexpr int kUnroll = kUnrollDepth;
  static constexpr int kBody = kVocab / kVec;
  static constexpr int kTail = kVocab % kVec;
  static constexpr int kIters = (kBody + kThreads - 1) / kThreads;  // vectors per thread, at most
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one block per row");
  static_assert(kTail < kThreads, "one tail element per thread");
};

// Values handed to a row visitor: N consecutive elements starting at a column.
template <int N>
struct Floats {
  float v[N];
};

// Calls f(col, Floats<n>) for this thread's share of the row. kUnroll vector loads are issued
// before any is used, so each thread keeps several 16-byte requests in flight.
template <typename L, typename T, typename F>
__device__ __forceinline__ void visit_row(const T* row, F&& f) {
  constexpr int kThreads = L::kThreads, kVec = L::kVec, kUnroll = L::kUnroll;
  const int tid = threadIdx.x;
#pragma unroll 1
  for (int it0 = 0; it0 < L::kIters; it0 += kUnroll) {
    Vec<T, kVec> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = (it0 + u) * kThreads + tid;
      if (i < L::kBody) v[u] = load_vec<T, kVec>(row, static_cast<long long>(i) * kVec);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = (it0 + u) * kThreads + tid;
      if (i < L::kBody) {
        Floats<kVec> x;
#pragma unroll
        for (int k = 0; k < kVec; ++k) x.v[k] = to_float(v[u].v[k]);
        f(i * kVec, x);
      }
    }
  }
  if (L::kTail > 0 && tid < L::kTail) {
    Floats<1> x{{to_float(row[L::kBody * kVec + tid])}};
    f(L::kBody * kVec + tid, x);
  }
}

// Writes this thread's share of an output row: out[col..] = f(col, in[col..]) (or f(col, zeros)
// without an input). With in == out (in place) each element is read before it is written by the
// same thread.
template <typename L, bool kRead, typename T, typename F>
__device__ __forceinline__ void map_row(const T* in, T* out, F&& f) {
  constexpr int kThreads = L::kThreads, kVec = L::kVec, kUnroll = L::kUnroll;
  const int tid = threadIdx.x;
#pragma unroll 1
  for (int it0 = 0; it0 < L::kIters; it0 += kUnroll) {
    Vec<T, kVec> v[kUnroll];
    if constexpr (kRead) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = (it0 + u) * kThreads + tid;
        if (i < L::kBody) v[u] = load_vec<T, kVec>(in, static_cast<long long>(i) * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = (it0 + u) * kThreads + tid;
      if (i < L::kBody) {
        Floats<kVec> x;
#pragma unroll
        for (int k = 0; k < kVec; ++k) x.v[k] = kRead ? to_float(v[u].v[k]) : 0.0f;
        Vec<T, kVec> o;
#pragma unroll
        for (int k = 0; k < kVec; ++k) o.v[k] = from_float<T>(f(i * kVec + k, x.v[k]));
        store_vec<T, kVec>(out, static_cast<long long>(i) * kVec, o);
      }
    }
  }
  if (L::kTail > 0 && tid < L::kTail) {
    const int c = L::kBody * kVec + tid;
    out[c] = from_float<T>(f(c, kRead ? to_float(in[c]) : 0.0f));
  }
}

// Pass 1 state of one thread, or of the whole row once combined. m is in log2 units and never NaN
// (fmaxf drops NaN); a NaN logit reaches s instead, and so the row's lse.
template <bool kSmoothing, bool kArgmax>
struct CeStats {
  float m;         // max of x * log2e seen
  float s;         // sum of 2^(x * log2e - m)
  float sum_x;     // sum of x (after the softcap), for label smoothing
  float best;      // largest raw logit; NaN counts as largest (torch.argmax)
  int best_col;    // its first column

  static __device__ __forceinline__ CeStats identity() {
    return {neg_inf(), 0.0f, 0.0f, neg_inf(), 0x7fffffff};
  }

  // Adds n logits (x, already soft-capped) at columns col..; raw holds them before the cap.
  template <int N>
  __device__ __forceinline__ void add(int col, const Floats<N>& x, const Floats<N>& raw) {
    float vmax = neg_inf();
#pragma unroll
    for (int k = 0; k < N; ++k) vmax = fmaxf(vmax, x.v[k] * kLog2e);
    if (vmax > m) {
      s *= exp2f(m - vmax);  // m = -inf: 2^-inf = 0, and s is 0 anyway
      m = vmax;
    }
    // While the max is -inf (a row masked so far), 2^(x - 0) keeps -inf at 0 instead of NaN.
    const float base = m == neg_inf() ? 0.0f : m;
#pragma unroll
    for (int k = 0; k < N; ++k) s += exp2f(x.v[k] * kLog2e - base);
    if constexpr (kSmoothing) {
#pragma unroll
      for (int k = 0; k < N; ++k) sum_x += x.v[k];
    }
    if constexpr (kArgmax) {
#pragma unroll
      for (int k = 0; k < N; ++k) take_if_better(raw.v[k], col + k);
    }
  }

  __device__ __forceinline__ void take_if_better(float v, int c) {
    const bool v_nan = v != v, best_nan = best != best;
    if ((v_nan && (!best_nan || c < best_col)) ||
        (!v_nan && !best_nan && (v > best || (v == best && c < best_col)))) {
      best = v;
      best_col = c;
    }
  }

  // Commutative bit for bit, so every lane of a butterfly ends with the same state: __fmul_rn
  // keeps the compiler from fusing one of the two products into an FMA with the sum.
  __device__ __forceinline__ void combine(const CeStats& o) {
    const float nm = fmaxf(m, o.m);
    const float a = m == nm ? 1.0f : exp2f(m - nm);  // equal (even both -inf): no rescale
    const float b = o.m == nm ? 1.0f : exp2f(o.m - nm);
    s = __fmul_rn(s, a) + __fmul_rn(o.s, b);
    m = nm;
    if constexpr (kSmoothing) sum_x += o.sum_x;
    if constexpr (kArgmax) take_if_better(o.best, o.best_col);
  }

  __device__ __forceinline__ CeStats xor_lane(int offset) const {
    CeStats o = *this;
    o.m = __shfl_xor_sync(0xffffffffu, m, offset);
    o.s = __shfl_xor_sync(0xffffffffu, s, offset);
    if constexpr (kSmoothing) o.sum_x = __shfl_xor_sync(0xffffffffu, sum_x, offset);
    if constexpr (kArgmax) {
      o.best = __shfl_xor_sync(0xffffffffu, best, offset);
      o.best_col = __shfl_xor_sync(0xffffffffu, best_col, offset);
    }
    return o;
  }
};

// Combines a state over the block: butterflies within warps, then across the warps' results in
// shared memory. A fixed tree, so the result is the same every run; every thread gets it.
template <int kThreads, typename S>
__device__ __forceinline__ S block_combine(S v, S* smem) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v.combine(v.xor_lane(offset));
  if constexpr (kThreads > 32) {
    constexpr int kWarps = kThreads / 32;
    const int lane = threadIdx.x % 32;
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    v = lane < kWarps ? smem[lane] : S::identity();
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v.combine(v.xor_lane(offset));
  }
  return v;
}

// What the options do to one logit and its gradient.
template <bool kSmoothing, bool kZLoss, bool kSoftcap>
struct CeMath {
  float cap = 0, inv_cap = 0;
  float eps = 0;                 // label smoothing
  float z = 0;                   // z-loss coefficient

  __device__ __forceinline__ float capped(float x) const {
    if constexpr (kSoftcap) return cap * tanhf(x * inv_cap); else return x;
  }
  // d capped / dx = 1 - tanh^2(x / cap) = 4e / (1 + e)^2 with e = exp(-2|x / cap|): no
  // cancellation where tanh is near 1, unlike 1 - t*t.
  __device__ __forceinline__ float cap_slope(float x) const {
    const float e = exp2f(-2.0f * kLog2e * fabsf(x * inv_cap));
    return 4.0f * e / ((1.0f + e) * (1.0f + e));
  }

  // Loss of a valid row: (1 - eps)(lse - x_t) + eps (lse - mean x) + z lse^2.
  __device__ __forceinline__ float loss(float lse, float x_t, float sum_x, int vocab) const {
    float l = kSmoothing ? lse - (1.0f - eps) * x_t - eps * (sum_x / vocab) : lse - x_t;
    if constexpr (kZLoss) l += z * lse * lse;
    return l;
  }
};

// Pass 1's row visitor: soft-caps a thread's logits and adds them to its statistics. (A functor,
// not a generic lambda: NVRTC treats an unannotated lambda template as host code.)
template <typename Stats, typename Math>
struct AddToStats {
  Stats& st;
  const Math& mt;
  template <int N>
  __device__ __forceinline__ void operator()(int col, const Floats<N>& raw) const {
    Floats<N> xc;
#pragma unroll
    for (int k = 0; k < N; ++k) xc.v[k] = mt.capped(raw.v[k]);
    st.add(col, xc, raw);
  }
};

// Writes the gradient of one valid row; lse2 is lse in log2 units.
template <typename L, bool kSmoothing, bool kZLoss, bool kSoftcap, typename T>
__device__ __forceinline__ void write_gradient(const T* x, T* g, int target, float lse, float lse2,
                                               float scale,
                                               const CeMath<kSmoothing, kZLoss, kSoftcap>& mt) {
  const float c1 = kZLoss ? 1.0f + 2.0f * mt.z * lse : 1.0f;  // d(z lse^2)/dx_j = 2 z lse p_j
  const float c0 = kSmoothing ? mt.eps / L::kVocab : 0.0f;
  const float hit = kSmoothing ? 1.0f - mt.eps : 1.0f;
  map_row<L, true>(x, g, [&](int col, float raw) {
    const float xc = mt.capped(raw);
    const float p = exp2f(xc * kLog2e - lse2);
    float d = p * c1 - c0;
    if (col == target) d -= hit;  // in fp32, before the single rounding
    d *= scale;
    if constexpr (kSoftcap) d *= mt.cap_slope(raw);
    return d;
  });
}

// The factor every gradient entry of a valid row is multiplied by: the upstream gradient, over the
// number of valid rows for the mean (a valid row makes it at least 1).
template <CrossEntropyReduction kReduction>
__device__ __forceinline__ float gradient_scale(const CrossEntropyRowParams& p, long long row) {
  float scale = 1.0f;
  if (p.grad_output != nullptr) scale = p.grad_output[kReduction == kCeNone ? row : 0];
  if constexpr (kReduction == kCeMean) scale /= static_cast<float>(p.counters->valid_rows);
  return scale;
}

template <typename T, typename I, int kVocab, int kThreads, int kVec, int kUnroll,
          CrossEntropyReduction kReduction, bool kSmoothing, bool kZLoss, bool kSoftcap,
          bool kArgmax, bool kGradient>
__global__ void __launch_bounds__(kThreads, (CeLayout<kVocab, kThreads, kVec, kUnroll>::kMinBlocks))
cross_entropy_forward(const CrossEntropyRowParams p) {
  using L = CeLayout<kVocab, kThreads, kVec, kUnroll>;
  using Stats = CeStats<kSmoothing, kArgmax>;
  __shared__ Stats smem[32];
  const long long row = blockIdx.x;
  const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride;
  const long long target = static_cast<const I*>(p.targets)[row];
  const bool valid = target_is_valid<kVocab>(target, p.ignore_index);
  const CeMath<kSmoothing, kZLoss, kSoftcap> mt{p.softcap, kSoftcap ? 1.0f / p.softcap : 0.0f,
                                                p.label_smoothing, p.lse_square_scale};

  // Issued first so that its latency hides behind pass 1.
  float x_t = 0.0f;
  if (valid && threadIdx.x == 0) x_t = to_float(x[target]);

  // An ignored row is read only for the statistics of it that were asked for.
  Stats st = Stats::identity();
  if (valid || p.lse != nullptr || kArgmax) {
    visit_row<L>(x, AddToStats<Stats, CeMath<kSmoothing, kZLoss, kSoftcap>>{st, mt});
    st = block_combine<kThreads>(st, smem);
  }
  const float lse2 = st.m + log2f(st.s);  // all -inf: -inf; any NaN or +inf: NaN
  const float lse = lse2 * kLn2;
  if (threadIdx.x == 0) {
    if (p.lse != nullptr) p.lse[row] = lse;
    if constexpr (kArgmax) static_cast<I*>(p.argmax)[row] = static_cast<I>(st.best_col);
    p.row_loss[row] = valid ? mt.loss(lse, mt.capped(x_t), st.sum_x, kVocab) : 0.0f;
  }
  if constexpr (kGradient) {
    T* g = static_cast<T*>(p.grad) + row * p.grad_stride;
    if (valid) {
      write_gradient<L>(
          x, g, static_cast<int>(target), lse, lse2, gradient_scale<kReduction>(p, row), mt);
    } else {
      map_row<L, false>(x, g, [](int, float) { return 0.0f; });
    }
  }
}

// The gradient alone, from the lse a forward saved.
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kUnroll,
          CrossEntropyReduction kReduction, bool kSmoothing, bool kZLoss, bool kSoftcap>
__global__ void __launch_bounds__(kThreads, (CeLayout<kVocab, kThreads, kVec, kUnroll>::kMinBlocks))
cross_entropy_backward(const CrossEntropyRowParams p) {
  using L = CeLayout<kVocab, kThreads, kVec, kUnroll>;
  const long long row = blockIdx.x;
  const T* x = static_cast<const T*>(p.logits) + row * p.logits_stride;
  T* g = static_cast<T*>(p.grad) + row * p.grad_stride;
  const long long target = static_cast<const I*>(p.targets)[row];
  if (!target_is_valid<kVocab>(target, p.ignore_index)) {
    map_row<L, false>(x, g, [](int, float) { return 0.0f; });
    return;
  }
  const CeMath<kSmoothing, kZLoss, kSoftcap> mt{p.softcap, kSoftcap ? 1.0f / p.softcap : 0.0f,
                                                p.label_smoothing, p.lse_square_scale};
  const float lse = p.lse_in[row];
  write_gradient<L>(x, g, static_cast<int>(target), lse,
                                                     lse * kLog2e, gradient_scale<kReduction>(p, row),
                                                     mt);
}

// Counts valid and out-of-range targets into the workspace's counters. One block; integer sums, so
// the order of the shared-memory atomics does not matter.
template <typename I, int kVocab, int kThreads>
__global__ void __launch_bounds__(kThreads) cross_entropy_count(const CrossEntropyCountParams p) {
  __shared__ unsigned int counts[2];
  if (threadIdx.x == 0) counts[0] = counts[1] = 0;
  __syncthreads();
  unsigned int valid = 0, bad = 0;
  const I* t = static_cast<const I*>(p.targets);
  for (long long r = threadIdx.x; r < p.rows; r += kThreads) {
    const long long v = t[r];
    if (v == p.ignore_index) continue;
    if (target_is_valid<kVocab>(v, p.ignore_index)) ++valid; else ++bad;
  }
  if (valid) atomicAdd(&counts[0], valid);
  if (bad) atomicAdd(&counts[1], bad);
  __syncthreads();
  if (threadIdx.x == 0) {
    p.counters->valid_rows = counts[0];
    p.counters->out_of_range_rows = counts[1];
  }
}

// loss = sum of the per-row losses (over the valid rows for the mean: 0/0 = NaN when there are
// none, as PyTorch gives). Each thread sums a fixed stripe with compensation, then a fixed tree.
template <int kThreads, CrossEntropyReduction kReduction>
__global__ void __launch_bounds__(kThreads) cross_entropy_loss_reduce(const CrossEntropyReduceParams p) {
  __shared__ float smem[32];
  float sum = 0.0f, carry = 0.0f;
  for (long long r = threadIdx.x; r < p.rows; r += kThreads) {
    const float y = p.row_loss[r] - carry;
    const float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
  sum = row_sum<kThreads>(sum, smem);
  if (threadIdx.x == 0) {
    *p.loss = kReduction == kCeMean ? sum / static_cast<float>(p.counters->valid_rows) : sum;
  }
}

}  // namespace kjit
