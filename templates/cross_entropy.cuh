// Fused cross-entropy over a large vocabulary: loss, lse, argmax and the gradient without any
// [rows x vocab] temporary, specialized for one vocab size, dtype, launch shape and option set.
//
// Pass 1 reads the row once: a softmax in fp32 (each thread keeps a max m and a sum
// s = sum 2^(x*log2e - m): online, raising the max before rescaling s, where the row streams past;
// max first where the thread holds its share), plus the sum of logits (label smoothing) and the
// argmax when asked; the per-thread states are combined in a fixed tree, lse = (m + log2 s) * ln2.
// The target logit is one direct load. Pass 2 writes
//   grad = scale * (p * (1 + 2 z lse) - eps/V - (1 - eps) * onehot) [* (1 - tanh^2(x / cap))]
// in fp32 with a single rounding to the logits' dtype, so p - 1 near p = 1 does not cancel in bf16.
//
// cross_entropy_forward streams the row with one block (and, fused, reads it again for pass 2);
// cross_entropy_resident keeps the row in the registers of one block or of a cluster of blocks, so
// that the fused op reads each logit once; cross_entropy_staged keeps it in the shared memory of
// a cluster instead, copied in and out by bulk copies, so that an SM holds several rows' blocks at
// once; cross_entropy_backward is pass 2 alone from a saved lse; cross_entropy_rescale_gradient
// turns a gradient computed for one upstream gradient into the gradient for another.
// Ignored rows (target == ignore_index, or out of [0, vocab), which the count kernel also counts)
// get loss 0 and a zero gradient and are not read unless lse or argmax is wanted. The count kernel
// runs first and stores the number of valid rows (with class weights, their weights summed), which
// the mean divides by; the reduce kernel
// sums the per-row losses in a fixed order.
//
//   kjit::cross_entropy_staged<kjit::bf16, long long, 128256, 256, 8, /*cluster=*/4,
//                              kjit::kCeMean, false, false, false, /*argmax=*/false,
//                              /*entropy=*/false, kjit::NoClassWeight>  // loss and gradient
#pragma once

#include "common.cuh"
#include "cross_entropy_params.h"

namespace kjit {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// What a sum of 2^(v - m) is multiplied by when its max m rises to new_m: equal maxima (even both
// -inf, an all-masked part of a row) need no rescale and must not make 2^(-inf + inf) = NaN.
__device__ __forceinline__ float rescale_factor(float m, float new_m) {
  return m == new_m ? 1.0f : exp2f(m - new_m);
}

// A target that is neither ignore_index nor outside the vocab selects a class; anything else makes
// the row ignored, and is never used as an index.
template <int kVocab>
__device__ __forceinline__ bool target_is_valid(long long t, long long ignore_index) {
  return t != ignore_index && t >= 0 && t < kVocab;
}

// The class-weight type (the row kernels' last template argument) of an op without class
// weights: every class then weighs 1, and the mean divides by the number of valid rows.
struct NoClassWeight {};
template <typename W>
constexpr bool kHasClassWeights = true;
template <>
constexpr bool kHasClassWeights<NoClassWeight> = false;

// Class c's weight (1 without class weights).
template <typename W>
__device__ __forceinline__ float class_weight_at(const W* w, long long c) {
  if constexpr (kHasClassWeights<W>) return to_float(w[c]); else return 1.0f;
}

// A compensated fp32 sum, added to in a fixed order.
struct KahanSum {
  float sum = 0.0f, carry = 0.0f;
  __device__ __forceinline__ void add(float v) {
    const float y = v - carry;
    const float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
};

// How a row is split over the kRowThreads threads that share it (one block, or every block of a
// cluster). Its vectors of kVec elements start at the row's first kVec-element boundary in memory:
// `head` scalars (0 to kVec - 1) before them, then `body` whole vectors dealt round-robin
// (coalesced), kIters per thread at most, then the tail's scalars. So a row of any vocab at any
// element address streams by whole vectors (GPT-2's 50257 too); an aligned row (the vocab a
// multiple of kVec) has no head. The head and tail scalars, fewer than 2 kVec, go one to each of
// the first threads. Every pointer a kernel vectorizes with a layout must share the row's
// misalignment (the host checks: CrossEntropy's vector width).
template <int kVocabSize, int kRowThreads, int kVecWidth>
struct CeLayout {
  static constexpr int kVocab = kVocabSize, kThreads = kRowThreads, kVec = kVecWidth;
  static constexpr int kMaxBody = kVocab / kVec;  // the body of an aligned row; others lose one
  static constexpr int kIters = (kMaxBody + kThreads - 1) / kThreads;
  static constexpr int kSlots = kIters > 0 ? kIters : 1;  // an array size for kIters vectors
  static_assert(2 * (kVec - 1) < kThreads, "one head or tail element per thread");
  int head;  // scalars before the first vector
  int body;  // whole vectors

  template <typename T>
  __device__ __forceinline__ explicit CeLayout(const T* row)
      : head(min(kVocab, head_of(row))), body((kVocab - head) / kVec) {}

  // Elements before the first kVec-aligned one.
  template <typename T>
  static __device__ __forceinline__ int head_of(const T* row) {
    const int misaligned =
        static_cast<int>(reinterpret_cast<unsigned long long>(row) / sizeof(T) % kVec);
    return misaligned == 0 ? 0 : kVec - misaligned;
  }

  __device__ __forceinline__ int vector_col(int i) const { return head + i * kVec; }
  __device__ __forceinline__ int scalars() const { return kVocab - body * kVec; }
  // Scalar k: the head's columns first, then the tail's.
  __device__ __forceinline__ int scalar_col(int k) const { return k < head ? k : body * kVec + k; }
  __device__ __forceinline__ bool owns_scalar(int tid) const { return tid < scalars(); }
};

// Blocks of kThreads that must fit an SM together: 1024 threads' worth, which caps registers at 64.
template <int kThreads>
constexpr int kStreamingMinBlocks = kThreads >= 1024 ? 1 : 1024 / kThreads;

// Values handed to a row visitor: N consecutive elements starting at a column.
template <int N>
struct Floats {
  float v[N];
};

template <typename T, int N>
__device__ __forceinline__ Floats<N> floats_of(const Vec<T, N>& v) {
  Floats<N> x;
#pragma unroll
  for (int k = 0; k < N; ++k) x.v[k] = to_float(v.v[k]);
  return x;
}

// Vectors it0 .. it0+N-1 of thread tid's share (vector i of the row is (it0 + u) * kThreads + tid);
// those past the body are left as they are.
template <typename L, int N, typename T>
__device__ __forceinline__ void load_share(const L& l, const T* row, int tid, int it0,
                                           Vec<T, L::kVec> (&v)[N]) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int i = (it0 + u) * L::kThreads + tid;
    if (i < l.body) v[u] = load_vec<T, L::kVec>(row, l.vector_col(i));
  }
}

// Calls f(col, Floats<kVec>) for each loaded vector of the share.
template <typename L, int N, typename T, typename F>
__device__ __forceinline__ void visit_share(const L& l, int tid, int it0,
                                            const Vec<T, L::kVec> (&v)[N], F&& f) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int i = (it0 + u) * L::kThreads + tid;
    if (i < l.body) {
      Floats<L::kVec> x = floats_of(v[u]);
      f(l.vector_col(i), x);
    }
  }
}

// out[col..] = f(col, x[col..]) for each vector of the share, x taken from v: f rewrites a
// Floats<kVec> of logits into the values to store.
template <typename L, int N, typename T, typename F>
__device__ __forceinline__ void store_share(const L& l, T* out, int tid, int it0,
                                            const Vec<T, L::kVec> (&v)[N], F&& f) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int i = (it0 + u) * L::kThreads + tid;
    if (i < l.body) {
      Floats<L::kVec> x = floats_of(v[u]);
      f(l.vector_col(i), x);
      Vec<T, L::kVec> o;
      from_floats(x.v, o.v);
      store_vec<T, L::kVec>(out, l.vector_col(i), o);
    }
  }
}

// Calls f(col, Floats<n>) for thread tid's share of the row, kUnroll vector loads issued before
// any is used, so that each thread keeps several 16-byte requests in flight.
template <typename L, int kUnroll, typename T, typename F>
__device__ __forceinline__ void visit_row(const T* row, int tid, F&& f) {
  const L l(row);
#pragma unroll 1
  for (int it0 = 0; it0 < L::kIters; it0 += kUnroll) {
    Vec<T, L::kVec> v[kUnroll];
    load_share(l, row, tid, it0, v);
    visit_share(l, tid, it0, v, f);
  }
  if (l.owns_scalar(tid)) {
    const int c = l.scalar_col(tid);
    Floats<1> x{{to_float(row[c])}};
    f(c, x);
  }
}

// Writes thread tid's share of an output row: f rewrites the logits in[col..] (zeros without an
// input) into out[col..]. The layout is in's (out shares its misalignment). In place (in == out),
// each element is read before it is written by the same thread.
template <typename L, int kUnroll, bool kRead, typename T, typename F>
__device__ __forceinline__ void map_row(const T* in, T* out, int tid, F&& f) {
  const L l(in);
#pragma unroll 1
  for (int it0 = 0; it0 < L::kIters; it0 += kUnroll) {
    Vec<T, L::kVec> v[kUnroll] = {};  // zero bits are 0.0 in every dtype
    if constexpr (kRead) load_share(l, in, tid, it0, v);
    store_share(l, out, tid, it0, v, f);
  }
  if (l.owns_scalar(tid)) {
    const int c = l.scalar_col(tid);
    Floats<1> x{{kRead ? to_float(in[c]) : 0.0f}};
    f(c, x);
    out[c] = from_float<T>(x.v[0]);
  }
}

// A row visitor that zeroes what it is given: the gradient of an ignored row.
struct Zeros {
  template <int N>
  __device__ __forceinline__ void operator()(int, Floats<N>& x) const {
#pragma unroll
    for (int k = 0; k < N; ++k) x.v[k] = 0.0f;
  }
};

// The entropy accumulator sy = sum_j 2^y_j y_j (y_j = x_j log2e - m) after the max rises from m to
// nm: each y_j falls by nm - m, so sy becomes 2^(m - nm) (sy - (nm - m) s). Equal maxima (both -inf
// too) change nothing, and an empty sum stays 0 (no inf * 0). Rounded step by step (__fmul_rn), so
// that CeStats::combine stays commutative bit for bit.
__device__ __forceinline__ float shift_entropy_sum(float sy, float s, float m, float nm) {
  if (m == nm) return sy;
  if (s == 0.0f) return 0.0f;
  return __fmul_rn(exp2f(m - nm), __fsub_rn(sy, __fmul_rn(nm - m, s)));
}

// 2^y y for one exponent y and its 2^y = e: 0 where e is 0 (a masked class, y = -inf, would give
// 0 * -inf = NaN).
__device__ __forceinline__ float entropy_term(float e, float y) { return e != 0.0f ? e * y : 0.0f; }

// Pass 1 state of one thread, or of the whole row once combined. m is in log2 units and never NaN
// (fmaxf drops NaN); a NaN logit reaches s instead, and so the row's lse. The visitor that adds
// logits (AddToStats) adds to sum_x itself, as it knows the class weights. With kEntropy, sy sums
// 2^y y over the same exponents y = x log2e - m as s sums 2^y, so that the softmax's entropy is
//   H = -sum_j p_j ln p_j = (log2 s - sy / s) ln2
// with no cancellation against the size of the logits (entropy_of).
template <bool kSmoothing, bool kArgmax, bool kEntropy = false>
struct CeStats {
  static constexpr bool kWantsArgmax = kArgmax, kWantsSum = kSmoothing, kWantsEntropy = kEntropy;
  float m;         // max of x * log2e seen
  float s;         // sum of 2^(x * log2e - m)
  float sum_x;     // sum of w_j x_j (after the softcap; w_j = 1 without class weights), smoothing
  float best;      // largest raw logit; NaN counts as largest (torch.argmax)
  int best_col;    // its first column
  float sy;        // sum of 2^y y, y = x * log2e - m (entropy)

  static __device__ __forceinline__ CeStats identity() {
    return {neg_inf(), 0.0f, 0.0f, neg_inf(), 0x7fffffff, 0.0f};
  }

  // The entropy of the row's softmax (natural units), once combined: NaN for a row all -inf.
  __device__ __forceinline__ float entropy_of() const { return (log2f(s) - sy / s) * kLn2; }

  // Adds n logits (x, already soft-capped) at columns col..; raw holds them before the cap.
  template <int N>
  __device__ __forceinline__ void add(int col, const Floats<N>& x, const Floats<N>& raw) {
    // The max of x, scaled once: rounding is monotonic, so this is the max of the scaled values.
    float xmax = neg_inf();
#pragma unroll
    for (int k = 0; k < N; ++k) xmax = fmaxf(xmax, x.v[k]);
    const float vmax = xmax * kLog2e;
    if (vmax > m) {
      if constexpr (kEntropy) sy = shift_entropy_sum(sy, s, m, vmax);
      s *= exp2f(m - vmax);  // m = -inf: 2^-inf = 0, and s is 0 anyway
      m = vmax;
    }
    // While the max is -inf (a row masked so far), 2^(x - 0) keeps -inf at 0 instead of NaN.
    const float base = m == neg_inf() ? 0.0f : m;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float y = fmaf(x.v[k], kLog2e, -base);
      const float e = fast_exp2(y);
      s += e;
      if constexpr (kEntropy) sy += entropy_term(e, y);
    }
    add_argmax(col, raw);
  }

  // Adds n logits like add() when m already is the max (log2 units) of every logit this state
  // will see: no rescale, and the exps summed as a tree, so that they do not wait on each other.
  template <int N>
  __device__ __forceinline__ void add_below_max(int col, const Floats<N>& x, const Floats<N>& raw) {
    const float base = m == neg_inf() ? 0.0f : m;
    float e[N], ey[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float y = fmaf(x.v[k], kLog2e, -base);
      e[k] = fast_exp2(y);
      if constexpr (kEntropy) ey[k] = entropy_term(e[k], y);
    }
#pragma unroll
    for (int width = 1; width < N; width *= 2) {
#pragma unroll
      for (int k = 0; k + width < N; k += 2 * width) {
        e[k] += e[k + width];
        if constexpr (kEntropy) ey[k] += ey[k + width];
      }
    }
    s += e[0];
    if constexpr (kEntropy) sy += ey[0];
    add_argmax(col, raw);
  }

  template <int N>
  __device__ __forceinline__ void add_argmax(int col, const Floats<N>& raw) {
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
    const float a = rescale_factor(m, nm);
    const float b = rescale_factor(o.m, nm);
    if constexpr (kEntropy) {
      sy = __fadd_rn(shift_entropy_sum(sy, s, m, nm), shift_entropy_sum(o.sy, o.s, o.m, nm));
    }
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
    if constexpr (kEntropy) o.sy = __shfl_xor_sync(0xffffffffu, sy, offset);
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
  // Also orders each thread's reads of the row before any thread's gradient writes (in place).
  if constexpr (kThreads == 32) __syncwarp();
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

// The loss terms a kernel is compiled with, each on or off, and what they do to one logit and its
// gradient. The kernels take it as one template argument (the host renders
// kjit::CeLossTerms<label_smoothing, z_loss, softcap>); the terms' values arrive at launch
// (CrossEntropyRowParams), so one program serves every value.
template <bool kSmoothingOn, bool kZLossOn, bool kSoftcapOn>
struct CeLossTerms {
  static constexpr bool kSmoothing = kSmoothingOn, kZLoss = kZLossOn, kSoftcap = kSoftcapOn;
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

// Pass 1's row visitor: soft-caps a thread's logits of row r and adds them to its statistics,
// online or, with kBelowMax, to a state whose max is already final (CeStats::add_below_max), and
// their sum weighted by their classes' weights for label smoothing. (A functor, not a generic
// lambda: NVRTC treats an unannotated lambda template as host code.)
template <typename Stats, typename Row, bool kBelowMax = false>
struct AddToStats {
  Stats& st;
  const Row& r;
  template <int N>
  __device__ __forceinline__ void operator()(int col, const Floats<N>& raw) const {
    Floats<N> xc;
#pragma unroll
    for (int k = 0; k < N; ++k) xc.v[k] = r.mt.capped(raw.v[k]);
    if constexpr (kBelowMax) st.add_below_max(col, xc, raw); else st.add(col, xc, raw);
    if constexpr (Stats::kWantsSum) {
#pragma unroll
      for (int k = 0; k < N; ++k) st.sum_x += r.class_weight(col + k) * xc.v[k];
    }
  }
};

// The gradient of one entry of a valid row, from its raw logit; lse2 is lse in log2 units. With
// class weights w (row weight w_t, all weights summed W):
//   grad_j = scale * (p_j (A + 2 z w_t lse) - eps w_j / V - (1 - eps) w_t onehot_j)
// with A = (1 - eps) w_t + eps W / V (w_t without smoothing); without them w = 1 and A = 1.
template <int kVocab, typename Loss, typename W>
struct Gradient {
  Loss mt;
  const W* w;  // the class weights of the row's columns
  int target;
  float lse2;
  float c1, c0, hit;  // p's factor, the smoothing term (w_j's factor) and the target's, times scale

  __device__ __forceinline__ Gradient(const Loss& m, const W* cw,
                                      int t, float l2, float scale, float w_t, float w_total)
      : mt(m), w(cw), target(t), lse2(l2),
        c1(scale * p_factor(m, l2, w_t, w_total)),
        c0(scale * (Loss::kSmoothing ? m.eps / kVocab : 0.0f)),
        hit(scale * (Loss::kSmoothing ? 1.0f - m.eps : 1.0f) * w_t) {}

  // A + 2 z w_t lse: d(z w_t lse^2)/dx_j = 2 z w_t lse p_j.
  static __device__ __forceinline__ float p_factor(const Loss& m,
                                                   float l2, float w_t, float w_total) {
    if constexpr (!kHasClassWeights<W>) {
      return Loss::kZLoss ? 1.0f + 2.0f * m.z * (l2 * kLn2) : 1.0f;
    } else {
      const float a = Loss::kSmoothing ? (1.0f - m.eps) * w_t + m.eps * w_total / kVocab : w_t;
      return Loss::kZLoss ? a + 2.0f * m.z * w_t * (l2 * kLn2) : a;
    }
  }

  // Rewrites N raw logits at columns col.. into their gradient, in fp32 before the single rounding.
  template <int N>
  __device__ __forceinline__ void operator()(int col, Floats<N>& x) const {
    float d[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      d[k] = fast_exp2(fmaf(mt.capped(x.v[k]), kLog2e, -lse2)) * c1;
      // (c0 = scale * 0 otherwise: NaN for scale = inf)
      if constexpr (Loss::kSmoothing) {
        d[k] -= kHasClassWeights<W> ? c0 * class_weight_at(w, col + k) : c0;
      }
    }
    if (static_cast<unsigned>(target - col) < static_cast<unsigned>(N)) {  // one vector per row
#pragma unroll
      for (int k = 0; k < N; ++k) d[k] -= col + k == target ? hit : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) x.v[k] = Loss::kSoftcap ? d[k] * mt.cap_slope(x.v[k]) : d[k];
  }
};

// The factor every gradient entry of a valid row is multiplied by: the upstream gradient, over the
// number of valid rows (or their weights summed) for the mean.
// Row kernels overlap the count kernel (programmatic dependent launch): the counters are read
// only after it has finished.
template <CrossEntropyReduction kReduction>
__device__ __forceinline__ float gradient_scale(const CrossEntropyRowParams& p, long long row) {
  wait_for_previous_kernel();
  float scale = 1.0f;
  if (p.grad_output != nullptr) scale = p.grad_output[kReduction == kCeNone ? row : 0];
  if constexpr (kReduction == kCeMean) scale /= p.counters->mean_divisor;
  return scale;
}

// What every kernel knows of its row before reading it. W: the class weights' type, or
// NoClassWeight.
template <typename T, typename I, int kVocab, typename Loss, typename W>
struct CeRow {
  const T* x;
  T* g;
  long long target;
  bool valid;
  Loss mt;
  const W* w;  // the class weights of the row's columns (a shard's first class at w[0])
  float w_t;   // the target's class weight: 1 without class weights, 0 for an ignored row

  __device__ __forceinline__ CeRow(const CrossEntropyRowParams& p, long long row)
      : x(static_cast<const T*>(p.logits) + row * p.logits_stride),
        g(static_cast<T*>(p.grad) + row * p.grad_stride),
        target(static_cast<const I*>(p.targets)[row]),
        valid(target_is_valid<kVocab>(target, p.ignore_index)),
        mt{p.softcap, Loss::kSoftcap ? 1.0f / p.softcap : 0.0f, p.label_smoothing, p.z_loss},
        w(static_cast<const W*>(p.class_weight) + p.class_weight_offset),
        w_t(valid ? class_weight_at(static_cast<const W*>(p.class_weight), target) : 0.0f) {}

  // The weight of the row's column col.
  __device__ __forceinline__ float class_weight(int col) const { return class_weight_at(w, col); }

  // All vocab weights summed (label smoothing with class weights): the count kernel's, so read
  // only after wait_for_previous_kernel.
  __device__ __forceinline__ float class_weight_total(const CrossEntropyRowParams& p) const {
    if constexpr (kHasClassWeights<W> && Loss::kSmoothing) return p.counters->class_weight_total;
    return 0.0f;
  }

  // The loss of a valid row from its lse, capped target logit x_t and sum_x (CeStats):
  //   w_t ((1 - eps)(lse - x_t) + z lse^2) + eps / V * sum_j w_j (lse - x_j)
  // (torch.nn.functional.cross_entropy with `weight`, plus the z-loss weighted by the row's
  // weight); without class weights CeLossTerms::loss, the same with w = 1.
  __device__ __forceinline__ float loss(const CrossEntropyRowParams& p, float lse, float x_t,
                                        float sum_x) const {
    if constexpr (!kHasClassWeights<W>) {
      return mt.loss(lse, x_t, sum_x, kVocab);
    } else {
      float l = Loss::kSmoothing ? (1.0f - mt.eps) * w_t * (lse - x_t) +
                                 mt.eps / kVocab * (class_weight_total(p) * lse - sum_x)
                           : w_t * (lse - x_t);
      if constexpr (Loss::kZLoss) l += mt.z * w_t * lse * lse;
      return l;
    }
  }

  // first_col: the class of the row's first column (a vocab shard's start; 0 for the whole row).
  __device__ __forceinline__ Gradient<kVocab, Loss, W> gradient(
      const CrossEntropyRowParams& p, float lse2, float scale, long long first_col = 0) const {
    return {mt, w, static_cast<int>(target - first_col), lse2, scale, w_t, class_weight_total(p)};
  }
};

// Pass 1 streaming the row: thread tid's share read kUnroll vectors at a time, soft-capped and
// added up, then combined over the block. Every thread of the block calls it with the same `read`;
// a row not read gets the identity.
template <typename L, int kUnroll, typename Stats, typename Row>
__device__ __forceinline__ Stats stream_row_stats(const Row& r, int tid, bool read, Stats* smem) {
  Stats st = Stats::identity();
  if (read) {
    visit_row<L, kUnroll>(r.x, tid, AddToStats<Stats, Row>{st, r});
    st = block_combine<L::kThreads>(st, smem);
  }
  return st;
}

// Pass 2 streaming the row: thread tid's share of the gradient of a valid row from its lse (log2
// units), zeros for an ignored one. first_col as for CeRow::gradient.
template <typename L, int kUnroll, CrossEntropyReduction kReduction, typename Row>
__device__ __forceinline__ void write_row_gradient(const CrossEntropyRowParams& p, long long row,
                                                   const Row& r, int tid, float lse2,
                                                   long long first_col = 0) {
  if (r.valid) {
    map_row<L, kUnroll, true>(r.x, r.g, tid,
                              r.gradient(p, lse2, gradient_scale<kReduction>(p, row), first_col));
  } else {
    map_row<L, kUnroll, false>(r.x, r.g, tid, Zeros{});
  }
}

// Turns a row's combined statistics into its lse (returned, in log2 units) and, from the one
// `writer` thread, its lse, argmax, entropy, target log-probability and loss outputs. x_t is the
// target logit, read by the writer. The target's log-probability is x_t - lse (capped) for a valid
// row and 0 for an ignored one.
template <typename I, int kVocab, typename Row, typename Stats>
__device__ __forceinline__ float finish_row(const CrossEntropyRowParams& p, long long row,
                                            const Row& r, const Stats& st, float x_t, bool writer) {
  // Every block of a row kernel waits for the count kernel it overlaps, even one that never reads
  // the counters: then the row kernel's end is the count kernel's too, for the reduce kernel.
  wait_for_previous_kernel();
  const float lse2 = st.m + log2f(st.s);  // all -inf: -inf; any NaN or +inf: NaN
  if (writer) {
    const float lse = lse2 * kLn2;
    if (p.lse != nullptr) p.lse[row] = lse;
    if constexpr (Stats::kWantsArgmax) static_cast<I*>(p.argmax)[row] = static_cast<I>(st.best_col);
    if constexpr (Stats::kWantsEntropy) p.entropy[row] = st.entropy_of();
    if (p.target_logprob != nullptr) p.target_logprob[row] = r.valid ? r.mt.capped(x_t) - lse : 0.0f;
    p.row_loss[row] = r.valid ? r.loss(p, lse, r.mt.capped(x_t), st.sum_x) : 0.0f;
  }
  return lse2;
}

// Forward, and with kGradient the fused backward, streaming the row: one block per row, the row
// read twice for the gradient (the second time mostly from L2 when rows are short).
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kUnroll,
          CrossEntropyReduction kReduction, typename Loss,
          bool kArgmax, bool kEntropy, bool kGradient, typename W>
__global__ void __launch_bounds__(kThreads, kStreamingMinBlocks<kThreads>)
cross_entropy_forward(const CrossEntropyRowParams p) {
  using L = CeLayout<kVocab, kThreads, kVec>;
  using Stats = CeStats<Loss::kSmoothing, kArgmax, kEntropy>;
  __shared__ Stats smem[32];
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const CeRow<T, I, kVocab, Loss, W> r(p, row);

  // Issued first so that its latency hides behind pass 1.
  float x_t = 0.0f;
  if (r.valid && tid == 0) x_t = to_float(r.x[r.target]);

  // An ignored row is read only for the statistics of it that were asked for.
  const Stats st =
      stream_row_stats<L, kUnroll>(r, tid, r.valid || p.lse != nullptr || kArgmax || kEntropy, smem);
  const float lse2 = finish_row<I, kVocab>(p, row, r, st, x_t, tid == 0);
  if constexpr (kGradient) write_row_gradient<L, kUnroll, kReduction>(p, row, r, tid, lse2);
}

// Blocks of the resident kernel that fit an SM: its share of the row (kRowBytes per thread) plus
// kCeOtherRegisters per thread (the host refuses configs where none fits).
template <int kThreads, int kRowBytes>
constexpr int kResidentBlocksPerSm =
    kCeRegistersPerSm / (kThreads * ((kRowBytes + 3) / 4 + kCeOtherRegisters));
template <int kThreads, int kRowBytes>
constexpr int kResidentMinBlocks =
    kResidentBlocksPerSm<kThreads, kRowBytes> > 0 ? kResidentBlocksPerSm<kThreads, kRowBytes> : 1;

// The fused forward and backward reading each logit once: the row stays in registers, shared by
// the kCluster blocks of a cluster (kThreads * kCluster threads, kIters vectors each), which push
// their statistics to each other (ClusterMailbox). Every block combines the kCluster partial
// states in rank order, so all of them get the same lse, bit for bit.
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kCluster,
          CrossEntropyReduction kReduction, typename Loss,
          bool kArgmax, bool kEntropy, typename W>
__global__ void __launch_bounds__(
    kThreads, (kResidentMinBlocks<kThreads, CeLayout<kVocab, kThreads * kCluster, kVec>::kIters *
                                                kVec * static_cast<int>(sizeof(T))>))
cross_entropy_resident(const CrossEntropyRowParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(kCluster == 1, "a row shared by a cluster of blocks needs sm_90 or newer");
#endif
  static_assert(kCluster >= 1 && kCluster <= 8, "a portable cluster has 1 to 8 blocks");
  using L = CeLayout<kVocab, kThreads * kCluster, kVec>;
  using Stats = CeStats<Loss::kSmoothing, kArgmax, kEntropy>;
  __shared__ Stats smem[32];
  __shared__ ClusterMailbox<Stats, kCluster> parts;
  const unsigned rank = kCluster > 1 ? cluster_rank() : 0;
  const long long row = blockIdx.x / kCluster;
  const int tid = static_cast<int>(rank) * kThreads + threadIdx.x;
  const bool writer = rank == 0 && threadIdx.x == 0;
  const CeRow<T, I, kVocab, Loss, W> r(p, row);
  if constexpr (kCluster > 1) {
    if (threadIdx.x == 0) parts.init();
    cluster_arrive();  // publishes parts' mbarrier
  }

  float x_t = 0.0f;
  if (r.valid && writer) x_t = to_float(r.x[r.target]);

  const L l(r.x);
  Vec<T, kVec> v[L::kSlots];
  float scalar = 0.0f;  // the thread's head or tail element, if it has one
  Stats st = Stats::identity();
  if (r.valid || p.lse != nullptr || kArgmax || kEntropy) {  // the same in every block of the row
    load_share(l, r.x, tid, 0, v);
    float raw_max = neg_inf();
    if (l.owns_scalar(tid)) {
      scalar = to_float(r.x[l.scalar_col(tid)]);
      raw_max = fmaxf(raw_max, scalar);  // NaN is dropped: m is never NaN
    }
    // The thread's max first, from its registers, so that the sum needs no rescale; the cap is
    // monotonic, so the max of the capped logits is the capped max.
#pragma unroll
    for (int u = 0; u < L::kSlots; ++u) {
      if (u * L::kThreads + tid < l.body) raw_max = fmaxf(raw_max, vec_max(v[u]));
    }
    st.m = r.mt.capped(raw_max) * kLog2e;
    const AddToStats<Stats, decltype(r), true> add{st, r};
    visit_share(l, tid, 0, v, add);
    if (l.owns_scalar(tid)) add(l.scalar_col(tid), Floats<1>{{scalar}});
    st = block_combine<kThreads>(st, smem);
  }
  if constexpr (kCluster > 1) {
    parts.exchange(st, rank);
    st = parts.slot[0];
    for (int b = 1; b < kCluster; ++b) st.combine(parts.slot[b]);
  }
  const float lse2 = finish_row<I, kVocab>(p, row, r, st, x_t, writer);
  if (r.valid) {
    const auto grad = r.gradient(p, lse2, gradient_scale<kReduction>(p, row));
    store_share(l, r.g, tid, 0, v, grad);
    if (l.owns_scalar(tid)) {
      Floats<1> xs{{scalar}};
      grad(l.scalar_col(tid), xs);
      r.g[l.scalar_col(tid)] = from_float<T>(xs.v[0]);
    }
  } else {
    map_row<L, L::kSlots, false>(r.x, r.g, tid, Zeros{});
  }
}

// How the staged kernel splits a row over the kCluster blocks of a cluster. The row's whole
// vectors (from its first kVec-element boundary in memory, as CeLayout's) are dealt in chunks of
// kChunk columns: block b stages columns [begin, begin + length) in shared memory by bulk copy,
// begin = head + b * kChunk. Its scalars move by ordinary loads and stores, one per thread: the
// head's (block 0) and the last block's length % kVec columns. Every block gets a whole vector
// whatever the head (the host checks the same: StagedUnfit).
template <int kVocab, int kVec, int kCluster>
struct CeStageLayout {
  static constexpr int kChunkVectors = ((kVocab + kVec - 1) / kVec + kCluster - 1) / kCluster;
  static constexpr int kChunk = kChunkVectors * kVec;
  static_assert(kVocab - (kVec - 1) - (kCluster - 1) * kChunk >= kVec,
                "every block stages a whole vector");
  int head;        // the row's scalars before its first vector
  int begin;       // the block's first staged column
  int length;      // its columns, vectors and tail
  int body;        // its whole vectors
  int head_taken;  // the head's scalars that this block takes: all of them in block 0

  template <typename T>
  __device__ __forceinline__ CeStageLayout(const T* row, unsigned b)
      : head(CeLayout<kVocab, 2 * kVec, kVec>::head_of(row)),
        begin(head + static_cast<int>(b) * kChunk),
        length(min(kChunk, kVocab - begin)),
        body(length / kVec),
        head_taken(b == 0 ? head : 0) {}

  __device__ __forceinline__ int scalars() const { return head_taken + length % kVec; }
  __device__ __forceinline__ bool owns_scalar(int tid) const { return tid < scalars(); }
  __device__ __forceinline__ int scalar_col(int k) const {
    return k < head_taken ? k : begin + body * kVec + (k - head_taken);
  }
  // The block that holds column c.
  __device__ __forceinline__ int owner(long long c) const {
    return c < head ? 0 : static_cast<int>((c - head) / kChunk);
  }
  // Row r's target logit, from this block's staged share where that holds it, else from the row.
  template <typename Row, typename V>
  __device__ __forceinline__ float target_logit(const Row& r, const V* buf) const {
    const long long t = r.target - begin;
    return t >= 0 && t < body * kVec ? to_float(buf[t / kVec].v[t % kVec])
                                     : to_float(r.x[r.target]);
  }
};

// How far ahead of its own row each staged block prefetches its share of a later row into L2.
// A block's bulk load waits a full DRAM round trip before the block can start, and blocks that are
// computing have nothing in flight; rows this far ahead are about to be started by other
// clusters, so their loads find the data in L2. Measured on the H200 (16384 rows of 128256 bf16):
// 16 to 32 rows are within 0.5% of each other and 5 points of copy bandwidth above none; 92 and
// more evict rows from L2 before they are used.
constexpr int kStagedPrefetchRows = 24;

// The fused forward and backward reading each logit from memory once, like the resident kernel,
// but holding the row in shared memory instead of registers: a cluster of kCluster blocks per row,
// each block's share (CeStageLayout) copied in by one bulk copy, reduced and turned into its
// gradient in place there, and copied out by one bulk store. With the row out of the registers an
// SM holds several such blocks (the host passes kChunk * sizeof(T) bytes of dynamic shared memory),
// each in its own phase, so that one block's copies overlap another's arithmetic, and each block
// prefetches a later row's share (kStagedPrefetchRows). Throughput is the rows resident over a
// block's life, so the blocks of a row push their statistics to each other (ClusterMailbox) rather
// than read them: no block then waits at its end for the others' reads. On the H200 (16384 rows of
// 128256 bf16) that took the kernel from 90.1% to 92.8% of copy bandwidth; giving each warp a
// contiguous range that it stores as soon as it is done did not help (92.6%). Every block combines
// the statistics in rank order, so all get the same lse, bit for bit. Each grad row must share its
// logits row's misalignment (CeStageLayout).
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kCluster,
          CrossEntropyReduction kReduction, typename Loss,
          bool kArgmax, bool kEntropy, typename W>
__global__ void __launch_bounds__(kThreads) cross_entropy_staged(const CrossEntropyRowParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(kCluster == 0, "bulk copies and clusters need sm_90 or newer");
#endif
  static_assert(kCluster >= 1 && kCluster <= 8, "a portable cluster has 1 to 8 blocks");
  static_assert(kVec * sizeof(T) == 16, "bulk copies move whole 16-byte vectors");
  using S = CeStageLayout<kVocab, kVec, kCluster>;
  using Stats = CeStats<Loss::kSmoothing, kArgmax, kEntropy>;
  using V = Vec<T, kVec>;
  struct BlockPart {
    Stats stats;
    float target_logit;  // from the block holding the target column; 0 from the others
  };
  extern __shared__ __align__(128) unsigned char staged_row[];  // kChunk elements
  __shared__ unsigned long long loaded;  // mbarrier: the share has arrived
  __shared__ Stats smem[32];
  __shared__ ClusterMailbox<BlockPart, kCluster> parts;
  const unsigned rank = kCluster > 1 ? cluster_rank() : 0;
  const long long row = blockIdx.x / kCluster;
  const int tid = threadIdx.x;
  const bool writer = rank == 0 && tid == 0;
  V* buf = reinterpret_cast<V*>(staged_row);
  const CeRow<T, I, kVocab, Loss, W> r(p, row);
  const S l(r.x, rank);
  const int begin = l.begin, body = l.body;
  const bool lse_or_argmax = p.lse != nullptr || kArgmax || kEntropy;  // read for every row
  const bool read = r.valid || lse_or_argmax;  // the same in every block of the row

  if (tid == 0) {
    mbarrier_init(&loaded, 1);
    mbarrier_init_fence();
    if (read) bulk_load(buf, r.x + begin, static_cast<unsigned>(body) * 16u, &loaded);
  }
  if (kCluster > 1 && tid == 32 % kThreads) parts.init();  // not the load's warp: it goes first
  // The last thread, so that with more than one warp its wait for the target does not hold up
  // the warp that issued the load.
  if (tid == kThreads - 1 && row + kStagedPrefetchRows < p.rows) {
    const long long ahead = row + kStagedPrefetchRows;
    const I t = static_cast<const I*>(p.targets)[ahead];
    if (lse_or_argmax || target_is_valid<kVocab>(t, p.ignore_index)) {
      const T* ahead_row = static_cast<const T*>(p.logits) + ahead * p.logits_stride;
      const S a(ahead_row, rank);
      bulk_prefetch_l2(ahead_row + a.begin, static_cast<unsigned>(a.body) * 16u);
    }
  }
  // Loaded while the row is on its way rather than after the cluster has met, but after the copies
  // are issued: it waits for the count kernel.
  const float scale = gradient_scale<kReduction>(p, row);
  if constexpr (kCluster > 1) cluster_arrive();  // publishes parts' mbarrier
  __syncthreads();  // the mbarrier is initialized before anyone waits on it

  Stats st = Stats::identity();
  float x_t = 0.0f;  // the target logit, if this block holds it
  if (read) {
    const float scalar = l.owns_scalar(tid) ? to_float(r.x[l.scalar_col(tid)]) : neg_inf();
    mbarrier_wait(&loaded, 0);
    // The thread's max first (a second read of shared memory is cheap), so that the sum needs no
    // rescale; the cap is monotonic, so the max of the capped logits is the capped max.
    float raw_max = fmaxf(neg_inf(), scalar);  // NaN is dropped: m is never NaN
#pragma unroll 4
    for (int i = tid; i < body; i += kThreads) raw_max = fmaxf(raw_max, vec_max(buf[i]));
    st.m = r.mt.capped(raw_max) * kLog2e;
    const AddToStats<Stats, decltype(r), true> add{st, r};
#pragma unroll 2
    for (int i = tid; i < body; i += kThreads) {
      Floats<kVec> x = floats_of(buf[i]);
      add(begin + i * kVec, x);
    }
    if (l.owns_scalar(tid)) add(l.scalar_col(tid), Floats<1>{{scalar}});
    // The target logit, read before the gradient overwrites it in place (in shared memory or, for
    // a scalar column, in the row). With one block a row nothing else would order the read before
    // the other threads' writes (racecheck found the gradient read as the target logit), so it
    // comes before block_combine, whose barriers do. With a cluster the exchange orders it, and it
    // stays after the combine, spelled out as it was: that is the machine code that was measured
    // (reading it earlier cost the fused kernel 6% of its bandwidth on an H100; even a call of
    // target_logit here instead compiles to another register allocation).
    if constexpr (kCluster == 1) {
      if (r.valid && tid == 0) x_t = l.target_logit(r, buf);
    }
    st = block_combine<kThreads>(st, smem);
    if constexpr (kCluster > 1) {
      const long long t = r.target - begin;
      if (r.valid && l.owner(r.target) == static_cast<int>(rank) && tid < kCluster) {
        x_t = t >= 0 && t < body * kVec ? to_float(buf[t / kVec].v[t % kVec])
                                        : to_float(r.x[r.target]);
      }
    }
  }
  if constexpr (kCluster > 1) {
    parts.exchange({st, x_t}, rank);
    st = parts.slot[0].stats;
    for (int b = 1; b < kCluster; ++b) st.combine(parts.slot[b].stats);
    if (writer && r.valid) x_t = parts.slot[l.owner(r.target)].target_logit;
  }
  const float lse2 = finish_row<I, kVocab>(p, row, r, st, x_t, writer);

  if (r.valid) {
    const auto grad = r.gradient(p, lse2, scale);
#pragma unroll 2
    for (int i = tid; i < body; i += kThreads) {
      Floats<kVec> x = floats_of(buf[i]);
      grad(begin + i * kVec, x);
      V o;
      from_floats(x.v, o.v);
      buf[i] = o;
    }
    if (l.owns_scalar(tid)) {
      const int c = l.scalar_col(tid);
      Floats<1> x{{to_float(r.x[c])}};
      grad(c, x);
      r.g[c] = from_float<T>(x.v[0]);
    }
  } else {
    for (int i = tid; i < body; i += kThreads) buf[i] = V{};  // zero bits: 0.0 in every dtype
    if (l.owns_scalar(tid)) r.g[l.scalar_col(tid)] = from_float<T>(0.0f);
  }
  async_proxy_fence();  // the bulk store reads what this thread wrote
  __syncthreads();
  if (tid == 0) {
    bulk_store(r.g + begin, buf, static_cast<unsigned>(body) * 16u);
    bulk_stores_read();  // shared memory must outlive the store's reads
  }
}

// The gradient alone, from the lse a forward saved.
template <typename T, typename I, int kVocab, int kThreads, int kVec, int kUnroll,
          CrossEntropyReduction kReduction, typename Loss, typename W>
__global__ void __launch_bounds__(kThreads, kStreamingMinBlocks<kThreads>)
cross_entropy_backward(const CrossEntropyRowParams p) {
  using L = CeLayout<kVocab, kThreads, kVec>;
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const CeRow<T, I, kVocab, Loss, W> r(p, row);
  // lse_in is read for valid rows only, as the gradient is.
  write_row_gradient<L, kUnroll, kReduction>(p, row, r, tid, r.valid ? p.lse_in[row] * kLog2e : 0.0f);
}

// CrossEntropy::RescaleGradient: the gradient a fused launch wrote for the upstream gradient a
// (`applied`; 1 without it) becomes the gradient for g (`grad_output`), row by row:
//   grad[r][j] = round_T(float(grad[r][j]) * (g / a))
// with g = grad_output[r] and a = applied[r] for [rows] (index 0 for [1]), g / a one IEEE fp32
// division rounded to nearest (once per row), the product one fp32 multiply rounded to nearest,
// and a single rounding to T (to nearest even; NaN stays NaN). A row whose g == a (compared as
// floats) is neither read nor written: its block returns first, so that the usual case (both 1,
// or both the same loss scale) costs one launch of empty blocks. A NaN g or a makes g != a and the
// row NaN; a = 0 with g != 0 makes it Inf or NaN (the gradient for a = 0 is lost).
// CrossEntropyRescaleParams says which part of which row a block takes: whole vectors of kVec
// elements, kUnroll loads per thread in flight before they are rescaled and stored, then the
// scalars (CeLayout). Each element is read and written by one thread only, so no barrier is needed.
template <typename T, int kVocab, int kThreads, int kVec, int kUnroll>
__global__ void __launch_bounds__(kThreads)
cross_entropy_rescale_gradient(const CrossEntropyRescaleParams p) {
  const unsigned tiles = static_cast<unsigned>(p.tiles);
  const long long row = blockIdx.x / tiles;
  const int tile = static_cast<int>(blockIdx.x % tiles);
  const long long at = p.per_row ? row : 0;
  const float g = p.grad_output[at];
  const float a = p.applied != nullptr ? p.applied[at] : 1.0f;
  if (g == a) return;  // the whole block: g and a are the same for every thread
  const float factor = __fdiv_rn(g, a);
  T* x = static_cast<T*>(p.grad) + row * p.grad_stride;
  const CeLayout<kVocab, kThreads, kVec> l(x);
  const int end = min((tile + 1) * p.tile_vectors, l.body);
#pragma unroll 1
  for (int i0 = tile * p.tile_vectors + static_cast<int>(threadIdx.x); i0 < end;
       i0 += kThreads * kUnroll) {
    Vec<T, kVec> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      if (i < end) v[u] = load_vec<T, kVec>(x, l.vector_col(i));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      if (i < end) {
        float y[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) y[k] = __fmul_rn(to_float(v[u].v[k]), factor);
        Vec<T, kVec> o;
        from_floats(y, o.v);
        store_vec<T, kVec>(x, l.vector_col(i), o);
      }
    }
  }
  if (tile == p.tiles - 1 && l.owns_scalar(static_cast<int>(threadIdx.x))) {
    const int c = l.scalar_col(static_cast<int>(threadIdx.x));
    x[c] = from_float<T>(__fmul_rn(to_float(x[c]), factor));
  }
}

// Counts valid and out-of-range targets into the workspace's counters, and with class weights W
// sums the valid rows' target weights (the mean's divisor) and, for label smoothing, all vocab
// weights. One block; the counts are integer sums, so the order of the shared-memory atomics does
// not matter; the weights are summed compensated in a fixed order, then in a fixed tree.
template <typename I, int kVocab, int kThreads, typename W, bool kSmoothing>
__global__ void __launch_bounds__(kThreads) cross_entropy_count(const CrossEntropyCountParams p) {
  let_next_kernel_start();  // the row kernel: it waits before reading the counters
  __shared__ unsigned int counts[2];
  __shared__ float smem[32];
  if (threadIdx.x == 0) counts[0] = counts[1] = 0;
  __syncthreads();
  unsigned int valid = 0, bad = 0;
  KahanSum row_weights, class_weights;
  const I* t = static_cast<const I*>(p.targets);
  const W* w = static_cast<const W*>(p.class_weight);
  for (long long r = threadIdx.x; r < p.rows; r += kThreads) {
    const long long v = t[r];
    if (v == p.ignore_index) continue;
    if (target_is_valid<kVocab>(v, p.ignore_index)) {
      ++valid;
      if constexpr (kHasClassWeights<W>) row_weights.add(class_weight_at(w, v));
    } else {
      ++bad;
    }
  }
  if (valid) atomicAdd(&counts[0], valid);
  if (bad) atomicAdd(&counts[1], bad);
  float weight_sum = 0.0f, total = 0.0f;
  if constexpr (kHasClassWeights<W>) {
    weight_sum = row_sum<kThreads>(row_weights.sum, smem);
    if constexpr (kSmoothing) {
      for (int c = threadIdx.x; c < kVocab; c += kThreads) class_weights.add(class_weight_at(w, c));
      total = row_sum<kThreads>(class_weights.sum, smem);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.counters->valid_rows = counts[0];
    p.counters->out_of_range_rows = counts[1];
    p.counters->mean_divisor = kHasClassWeights<W> ? weight_sum : static_cast<float>(counts[0]);
    p.counters->class_weight_total = total;
  }
}

// loss = sum of the per-row losses (for the mean over the count kernel's divisor, the valid rows
// or their weights: 0/0 = NaN when there are none, as PyTorch gives). Each thread sums a fixed
// stripe with compensation, then a fixed tree.
template <int kThreads, CrossEntropyReduction kReduction>
__global__ void __launch_bounds__(kThreads) cross_entropy_loss_reduce(const CrossEntropyReduceParams p) {
  wait_for_previous_kernel();  // the row kernel, whose end is also the count kernel's
  __shared__ float smem[32];
  KahanSum stripe;
  for (long long r = threadIdx.x; r < p.rows; r += kThreads) stripe.add(p.row_loss[r]);
  const float sum = row_sum<kThreads>(stripe.sum, smem);
  if (threadIdx.x == 0) *p.loss = kReduction == kCeMean ? sum / p.counters->mean_divisor : sum;
}

}  // namespace kjit
