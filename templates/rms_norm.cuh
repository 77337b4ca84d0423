// RMSNorm forward and backward, specialized for one hidden size, dtype pair and launch shape.
//
// y = x * rstd * (offset + w), rstd = 1 / sqrt(mean(x^2) + eps), all in fp32. Casting modes
// (kCasting, RmsNormCasting's values; include/kjit/rms_norm.h states each exactly): llama (0) rounds
// x * rstd to the input dtype before multiplying by the weight (as Hugging Face's LlamaRMSNorm
// does); gemma (1) keeps everything in fp32 until the final store; none (2) rounds every
// intermediate to the dtype where eager PyTorch in that dtype would (x^2, the mean, + eps, rsqrt,
// x * rstd, offset + w, the product), the mean accumulated in fp32. Optionally the residual add is
// fused: h = x + residual is rounded to the dtype, written to residual_out and normalized.
//
// Each row is handled by kThreads consecutive threads (a sub-warp, a warp or a whole block); each
// thread owns the same columns in every row, kVec adjacent elements per access, so loads are 16-byte
// vectors and the weight gradient can be summed per thread without atomics. The backward writes one
// fp32 partial dw row per row group; rms_norm_dw_reduce sums them in a fixed order (deterministic).
//
//   kjit::rms_norm_forward<kjit::bf16, kjit::bf16, 4096, 128, 1, 8, 0, false>
#pragma once

#include "common.cuh"
#include "rms_norm_params.h"

namespace kjit {

template <int kHidden, int kThreads, int kVec>
struct RowLayout {
  static constexpr int kPerPass = kThreads * kVec;
  static constexpr int kIters = (kHidden + kPerPass - 1) / kPerPass;
  static_assert(kHidden % kVec == 0, "the host picks kVec dividing the hidden size");
  // Column of this thread's it-th vector; valid when < kHidden.
  static __device__ __forceinline__ int col(int lane, int it) { return (it * kThreads + lane) * kVec; }
};

// Rows too wide to keep in registers are read a second time (from L2) instead of spilling.
template <typename T, int kIters, int kVec>
constexpr bool kKeepRowInRegisters = kIters * kVec * sizeof(T) <= 128;

// An enum, not constexpr variables: those would be emitted as internal symbols whose names carry a
// per-compile hash, and the CUBIN would differ from one compile to the next.
enum RmsNormCast : int { kCastLlama = 0, kCastGemma = 1, kCastNone = 2 };

template <typename T, typename W, int kHidden, int kThreads, int kRowsPerBlock, int kVec,
          int kCasting, bool kResidual>
__global__ void __launch_bounds__(kThreads * kRowsPerBlock)
rms_norm_forward(const RmsNormForwardParams p) {
  static_assert(kCasting == kCastLlama || kCasting == kCastGemma || kCasting == kCastNone,
                "casting: llama, gemma or none");
  using L = RowLayout<kHidden, kThreads, kVec>;
  constexpr bool kKeep = kKeepRowInRegisters<T, L::kIters, kVec>;
  static_assert(kThreads <= 32 || kRowsPerBlock == 1, "block-wide rows need one row per block");
  __shared__ float smem[32];

  const int lane = threadIdx.x % kThreads;
  const long long row = static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads;
  // Rows past the end still take part in the shuffles with zeros; they only skip memory.
  const bool live = row < p.rows;

  const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
  const T* res = static_cast<const T*>(p.residual) + row * p.residual_stride;
  T* res_out = static_cast<T*>(p.residual_out) + row * p.residual_out_stride;
  const W* w = static_cast<const W*>(p.weight);
  T* y = static_cast<T*>(p.y) + row * p.y_stride;

  Vec<T, kVec> cached[kKeep ? L::kIters : 1];
  float sumsq = 0.0f;
#pragma unroll
  for (int it = 0; it < L::kIters; ++it) {
    const int c = L::col(lane, it);
    Vec<T, kVec> v;
    if (live && c < kHidden) {
      v = load_vec<T, kVec>(x, c);
      if constexpr (kResidual) {
        const Vec<T, kVec> r = load_vec<T, kVec>(res, c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v.v[k] = from_float<T>(to_float(v.v[k]) + to_float(r.v[k]));
        store_vec<T, kVec>(res_out, c, v);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float sq = to_float(v.v[k]) * to_float(v.v[k]);
        sumsq += kCasting == kCastNone ? round_to<T>(sq) : sq;
      }
    }
    if constexpr (kKeep) cached[it] = v;
  }
  const float mean = row_sum<kThreads>(sumsq, smem) / kHidden;
  const float rstd = kCasting == kCastNone
                         ? round_to<T>(rsqrtf(round_to<T>(round_to<T>(mean) + p.eps)))
                         : rsqrtf(mean + p.eps);
  if (!live) return;
  if (lane == 0 && p.rstd != nullptr) p.rstd[row] = rstd;

  const T* again = kResidual ? static_cast<const T*>(res_out) : x;
#pragma unroll
  for (int it = 0; it < L::kIters; ++it) {
    const int c = L::col(lane, it);
    if (c >= kHidden) continue;
    Vec<T, kVec> v;
    if constexpr (kKeep) v = cached[it]; else v = load_vec<T, kVec>(again, c);
    const Vec<W, kVec> wv = load_vec<W, kVec>(w, c);
    Vec<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float n = to_float(v.v[k]) * rstd;
      if constexpr (kCasting != kCastGemma) n = round_to<T>(n);
      float scale = p.weight_offset + to_float(wv.v[k]);
      if constexpr (kCasting == kCastNone) scale = round_to<T>(scale);
      out.v[k] = from_float<T>(n * scale);
    }
    store_vec<T, kVec>(y, c, out);
  }
}

// A thread's kVec sums of dw for columns c.. of its group's partial row, stored as the widest
// aligned float vectors the row allows (the workspace is 16-byte aligned): 4-byte stores fill an
// eighth of a 32-byte sector each, and ncu measured that 8x store traffic (32 MB for 4 MB of
// partials) as most of the backward's 14 us at 256 rows.
template <int kHidden, int kVec>
__device__ __forceinline__ void store_dw_partial(float* dw_row, int c, const float* sums) {
  constexpr int kWidth = kVec % 4 == 0 && kHidden % 4 == 0 ? 4
                         : kVec % 2 == 0 && kHidden % 2 == 0 ? 2
                                                             : 1;
#pragma unroll
  for (int k = 0; k < kVec; k += kWidth) {
    Vec<float, kWidth> v;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) v.v[j] = sums[k + j];
    store_vec<float, kWidth>(dw_row, c + k, v);
  }
}

// A thread's sums of dy * xhat over its row group's rows, for its own columns, as both backward
// kernels keep them: in registers (Sums) when they fit, else in the group's partial row itself (its
// own columns only, so no other thread touches them). The kernel owns the Sums array (a local, so
// it stays in registers): zero before the first row, add each element, flush after the last row.
template <int kHidden, int kThreads, int kVec>
struct DwPartial {
  using L = RowLayout<kHidden, kThreads, kVec>;
  static constexpr bool kInRegisters = L::kIters * kVec <= 32;
  using Sums = float[kInRegisters ? L::kIters * kVec : 1];

  static __device__ __forceinline__ void zero(Sums& sums, float* dw_row, int lane) {
    if constexpr (kInRegisters) {
#pragma unroll
      for (int i = 0; i < L::kIters * kVec; ++i) sums[i] = 0.0f;
    } else {
#pragma unroll
      for (int it = 0; it < L::kIters; ++it) {
        const int c = L::col(lane, it);
        if (c < kHidden) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) dw_row[c + k] = 0.0f;
        }
      }
    }
  }
  // Adds v to element k of the thread's it-th vector, column c + k.
  static __device__ __forceinline__ void add(Sums& sums, float* dw_row, int it, int c, int k,
                                             float v) {
    if constexpr (kInRegisters) {
      sums[it * kVec + k] += v;
    } else {
      dw_row[c + k] += v;
    }
  }
  static __device__ __forceinline__ void flush(const Sums& sums, float* dw_row, int lane) {
    if constexpr (kInRegisters) {
#pragma unroll
      for (int it = 0; it < L::kIters; ++it) {
        const int c = L::col(lane, it);
        if (c < kHidden) {
          store_dw_partial<kHidden, kVec>(dw_row, c, &sums[it * kVec]);
        }
      }
    }
  }
};

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * (offset + w), xhat = x * rstd, plus the
// residual gradient when given; dw_partial[group] = sum over the group's rows of dy * xhat.
// The grid strides over rows so that each row group accumulates many rows.
template <typename T, typename W, int kHidden, int kThreads, int kRowsPerBlock, int kVec>
__global__ void __launch_bounds__(kThreads * kRowsPerBlock)
rms_norm_backward(const RmsNormBackwardParams p) {
  using L = RowLayout<kHidden, kThreads, kVec>;
  using Dw = DwPartial<kHidden, kThreads, kVec>;
  constexpr bool kKeep = kKeepRowInRegisters<T, 2 * L::kIters, kVec>;
  static_assert(kThreads <= 32 || kRowsPerBlock == 1, "block-wide rows need one row per block");
  __shared__ float smem[32];

  const int lane = threadIdx.x % kThreads;
  const long long group = static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads;
  const long long groups = static_cast<long long>(gridDim.x) * kRowsPerBlock;
  const W* w = static_cast<const W*>(p.weight);
  float* dw_row = p.dw_partial + group * kHidden;

  typename Dw::Sums dw_acc;
  Dw::zero(dw_acc, dw_row, lane);

  using V = Vec<T, kVec>;
  // Rows that fit in registers are double-buffered: the next row's loads are issued before this
  // row's reduction, so memory latency overlaps the barrier instead of following it.
  constexpr int kSlots = kKeep ? L::kIters : 1;
  V dy_cur[kSlots], x_cur[kSlots], dy_next[kSlots], x_next[kSlots];
  float rstd_cur = 0.0f, rstd_next = 0.0f;
  auto load_row = [&](long long row, V (&dyv)[kSlots], V (&xv)[kSlots], float& rstd) {
    if (row >= p.rows) return;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    rstd = p.rstd[row];
#pragma unroll
    for (int it = 0; it < kSlots; ++it) {
      const int c = L::col(lane, it);
      if (c < kHidden) {
        dyv[it] = load_vec<T, kVec>(dy, c);
        xv[it] = load_vec<T, kVec>(x, c);
      }
    }
  };
  if constexpr (kKeep) load_row(group, dy_cur, x_cur, rstd_cur);

  // Every row group runs the same number of iterations so that block-wide reductions line up.
  const long long iterations = (p.rows + groups - 1) / groups;
  for (long long i = 0; i < iterations; ++i) {
    const long long row = group + i * groups;
    const bool live = row < p.rows;
    if constexpr (kKeep) load_row(row + groups, dy_next, x_next, rstd_next);
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    const float rstd = kKeep ? rstd_cur : (live ? p.rstd[row] : 0.0f);

    float dot = 0.0f;
#pragma unroll
    for (int it = 0; it < L::kIters; ++it) {
      const int c = L::col(lane, it);
      if (live && c < kHidden) {
        const V dyv = kKeep ? dy_cur[kKeep ? it : 0] : load_vec<T, kVec>(dy, c);
        const V xv = kKeep ? x_cur[kKeep ? it : 0] : load_vec<T, kVec>(x, c);
        const Vec<W, kVec> wv = load_vec<W, kVec>(w, c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float g = to_float(dyv.v[k]) * (p.weight_offset + to_float(wv.v[k]));
          dot += g * to_float(xv.v[k]) * rstd;
        }
      }
    }
    const float mean_dot = row_sum<kThreads>(dot, smem) / kHidden;

    if (live) {
      T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
      const T* dres = static_cast<const T*>(p.dresidual) + row * p.dresidual_stride;
#pragma unroll
      for (int it = 0; it < L::kIters; ++it) {
        const int c = L::col(lane, it);
        if (c >= kHidden) continue;
        // Without registers to spare, re-read; dy is read before dx overwrites it even in place.
        const V dyv = kKeep ? dy_cur[kKeep ? it : 0] : load_vec<T, kVec>(dy, c);
        const V xv = kKeep ? x_cur[kKeep ? it : 0] : load_vec<T, kVec>(x, c);
        const Vec<W, kVec> wv = load_vec<W, kVec>(w, c);
        V dres_v;
        if (p.dresidual != nullptr) dres_v = load_vec<T, kVec>(dres, c);
        V out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float d = to_float(dyv.v[k]);
          const float xhat = to_float(xv.v[k]) * rstd;
          float g = rstd * (d * (p.weight_offset + to_float(wv.v[k])) - xhat * mean_dot);
          if (p.dresidual != nullptr) g += to_float(dres_v.v[k]);
          out.v[k] = from_float<T>(g);
          Dw::add(dw_acc, dw_row, it, c, k, d * xhat);
        }
        store_vec<T, kVec>(dx, c, out);
      }
    }
    if constexpr (kKeep) {
#pragma unroll
      for (int it = 0; it < kSlots; ++it) {
        dy_cur[it] = dy_next[it];
        x_cur[it] = x_next[it];
      }
      rstd_cur = rstd_next;
    }
  }
  let_next_kernel_start();
  Dw::flush(dw_acc, dw_row, lane);
}

// A vector of kVec elements of T held as 32-bit words where it fills them (bf16/fp16 pairs), so
// that a register ring of them is not split into one register per 16-bit element.
template <typename T, int kVec, bool kWords = (kVec * sizeof(T)) % 4 == 0>
struct PackedVec {
  Vec<unsigned, kVec * sizeof(T) / 4> w;
  static __device__ __forceinline__ PackedVec load(const T* base, long long index) {
    return {*reinterpret_cast<const Vec<unsigned, kVec * sizeof(T) / 4>*>(base + index)};
  }
  __device__ __forceinline__ float get(int k) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w.v[k]);
    } else {
      const unsigned word = w.v[k / 2];
      T e;
      e.bits = static_cast<unsigned short>(k % 2 ? word >> 16 : word & 0xffffu);
      return to_float(e);
    }
  }
};
template <typename T, int kVec>
struct PackedVec<T, kVec, false> {
  Vec<T, kVec> w;
  static __device__ __forceinline__ PackedVec load(const T* base, long long index) {
    return {load_vec<T, kVec>(base, index)};
  }
  __device__ __forceinline__ float get(int k) const { return to_float(w.v[k]); }
};

// Sum over the kThreads threads of a row, as row_sum, with one block barrier instead of two: the
// caller alternates between two 32-float buffers from one row to the next. The barrier of the row
// after this one orders every read of `buf` here before the write two rows later.
template <int kThreads>
__device__ __forceinline__ float ring_row_sum(float v, float* buf) {
  if constexpr (kThreads <= 32) {
    return group_sum<kThreads>(v);
  } else {
    constexpr int kWarps = kThreads / 32;
    v = group_sum<32>(v);
    const int lane = threadIdx.x % 32;
    if (lane == 0) buf[threadIdx.x / 32] = v;
    __syncthreads();
    return group_sum<32>(lane < kWarps ? buf[lane] : 0.0f);
  }
}

// The backward as rms_norm_backward computes it (same arithmetic, same order, so the same bits),
// pipelined deeper: each thread keeps kSlots rows of dy and x in registers, a ring indexed at
// compile time (the loop body is unrolled kSlots times, so no register is copied from one row to
// the next and no copy waits on a load). While a row is reduced and stored, the loads of the next
// kSlots - 1 rows of the group are in flight. The weight stays in registers when small, the row
// sum takes one barrier, and the blocks let the dw reduce launch before they write their partials.
// Registers are capped at 64 (1024 threads per SM) by the launch bounds.
template <typename T, typename W, int kHidden, int kThreads, int kRowsPerBlock, int kVec,
          int kSlots>
__global__ void __launch_bounds__(kThreads * kRowsPerBlock,
                                  kThreads * kRowsPerBlock >= 1024
                                      ? 1
                                      : 1024 / (kThreads * kRowsPerBlock))
rms_norm_backward_ring(const RmsNormBackwardParams p) {
  using L = RowLayout<kHidden, kThreads, kVec>;
  using V = Vec<T, kVec>;
  using WV = Vec<W, kVec>;
  static_assert(kKeepRowInRegisters<T, 2 * L::kIters, kVec>, "the ring holds whole rows");
  static_assert(kSlots >= 2 && kSlots <= 4, "a ring of 2 to 4 rows");
  static_assert(kThreads <= 32 || kRowsPerBlock == 1, "block-wide rows need one row per block");
  using Dw = DwPartial<kHidden, kThreads, kVec>;
  constexpr bool kWeightInRegisters = L::kIters * kVec * sizeof(W) <= 32;
  __shared__ float smem[2][32];

  const int lane = threadIdx.x % kThreads;
  const long long group = static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kThreads;
  const long long groups = static_cast<long long>(gridDim.x) * kRowsPerBlock;
  const W* w = static_cast<const W*>(p.weight);
  float* dw_row = p.dw_partial + group * kHidden;

  WV w_keep[kWeightInRegisters ? L::kIters : 1];
  if constexpr (kWeightInRegisters) {
#pragma unroll
    for (int it = 0; it < L::kIters; ++it) {
      const int c = L::col(lane, it);
      if (c < kHidden) w_keep[it] = load_vec<W, kVec>(w, c);
    }
  }
  auto weight = [&](int it, int c) {
    if constexpr (kWeightInRegisters) {
      return w_keep[kWeightInRegisters ? it : 0];
    } else {
      return load_vec<W, kVec>(w, c);
    }
  };

  typename Dw::Sums dw_acc;
  Dw::zero(dw_acc, dw_row, lane);

  using P = PackedVec<T, kVec>;
  P dy_ring[kSlots][L::kIters], x_ring[kSlots][L::kIters];
  float rstd_ring[kSlots];
  // Called with compile-time slots only (unrolled loops), so the ring stays in registers.
  auto load_row = [&](long long row, int slot) {
    if (row >= p.rows) return;
    const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
    rstd_ring[slot] = p.rstd[row];
#pragma unroll
    for (int it = 0; it < L::kIters; ++it) {
      const int c = L::col(lane, it);
      if (c < kHidden) {
        dy_ring[slot][it] = P::load(dy, c);
        x_ring[slot][it] = P::load(x, c);
      }
    }
  };
  auto row_step = [&](long long i, int slot) {
    const long long row = group + i * groups;
    const bool live = row < p.rows;
    const float rstd = rstd_ring[slot];
    float dot = 0.0f;
#pragma unroll
    for (int it = 0; it < L::kIters; ++it) {
      const int c = L::col(lane, it);
      if (live && c < kHidden) {
        const WV wv = weight(it, c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float g = dy_ring[slot][it].get(k) * (p.weight_offset + to_float(wv.v[k]));
          dot += g * x_ring[slot][it].get(k) * rstd;
        }
      }
    }
    const float mean_dot = ring_row_sum<kThreads>(dot, smem[i & 1]) / kHidden;
    if (!live) return;
    T* dx = static_cast<T*>(p.dx) + row * p.dx_stride;
    const T* dres = static_cast<const T*>(p.dresidual) + row * p.dresidual_stride;
#pragma unroll
    for (int it = 0; it < L::kIters; ++it) {
      const int c = L::col(lane, it);
      if (c >= kHidden) continue;
      const WV wv = weight(it, c);
      V dres_v;
      if (p.dresidual != nullptr) dres_v = load_vec<T, kVec>(dres, c);
      V out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float d = dy_ring[slot][it].get(k);
        const float xhat = x_ring[slot][it].get(k) * rstd;
        float g = rstd * (d * (p.weight_offset + to_float(wv.v[k])) - xhat * mean_dot);
        if (p.dresidual != nullptr) g += to_float(dres_v.v[k]);
        out.v[k] = from_float<T>(g);
        Dw::add(dw_acc, dw_row, it, c, k, d * xhat);
      }
      store_vec<T, kVec>(dx, c, out);
    }
  };

  // Every row group runs the same number of steps so that block-wide reductions line up.
  const long long iterations = (p.rows + groups - 1) / groups;
#pragma unroll
  for (int s = 0; s + 1 < kSlots; ++s) load_row(group + s * groups, s);
  for (long long base = 0; base < iterations; base += kSlots) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const long long i = base + s;
      if (i >= iterations) break;  // the same for every thread of the block
      // The slot of the row before this one is free: refill it kSlots - 1 rows ahead.
      load_row(group + (i + kSlots - 1) * groups, (s + kSlots - 1) % kSlots);
      row_step(i, s);
    }
  }
  let_next_kernel_start();
  Dw::flush(dw_acc, dw_row, lane);
}

// dw[c] = sum over partial rows of dw_partial[r][c], in a fixed order: each of the kSlices
// threads of a column sums a fixed stripe of rows, then the stripes are added in slice order.
template <typename W, int kHidden, int kColumns, int kSlices>
__global__ void __launch_bounds__(kColumns * kSlices)
rms_norm_dw_reduce(const RmsNormDwReduceParams p) {
  __shared__ float stripe[kSlices][kColumns];
  const int tx = threadIdx.x % kColumns;
  const int slice = threadIdx.x / kColumns;
  const int c = blockIdx.x * kColumns + tx;
  wait_for_previous_kernel();  // launched to overlap the backward's end: its partials first
  float s = 0.0f;
  if (c < kHidden) {
#pragma unroll 4
    for (long long r = slice; r < p.partial_rows; r += kSlices) s += p.dw_partial[r * kHidden + c];
  }
  stripe[slice][tx] = s;
  __syncthreads();
  if (slice == 0 && c < kHidden) {
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlices; ++i) total += stripe[i][tx];
    static_cast<W*>(p.dw)[c] = from_float<W>(total);
  }
}

}  // namespace kjit
