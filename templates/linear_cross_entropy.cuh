// The fused linear + cross-entropy op's own kernels; the GEMMs are cuBLASLt's and each chunk's
// loss and gradient are cross_entropy.cuh's.
#pragma once

#include "common.cuh"
#include "cross_entropy.cuh"
#include "linear_cross_entropy_params.h"

namespace kjit {

template <bool kMean>
__global__ void linear_cross_entropy_scale(const LinearCrossEntropyScaleParams p) {
  wait_for_previous_kernel();  // the count kernel
  if (threadIdx.x != 0) return;
  float scale = p.grad_output != nullptr ? p.grad_output[0] : 1.0f;
  if (kMean) scale /= p.counters->mean_divisor;
  *p.scale = scale;
}

// f(row, col) for each kVec-wide vector of a [rows, cols] matrix (cols a multiple of kVec), the
// grid striding over them: each thread takes kVec consecutive elements of a row at a time.
template <int kThreads, int kVec, typename F>
__device__ __forceinline__ void for_each_row_vector(long long rows, long long cols, F&& f) {
  const long long per_row = cols / kVec, vectors = rows * per_row;
  for (long long i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i < vectors;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    const long long row = i / per_row;
    f(row, (i - row * per_row) * kVec);
  }
}

// out = round(acc (+ out when accumulating)), kVec elements of a row per thread at a time.
template <typename T, int kThreads, int kVec, bool kAccumulate>
__global__ void __launch_bounds__(kThreads)
    linear_cross_entropy_store(const LinearCrossEntropyStoreParams p) {
  wait_for_previous_kernel();
  T* out = static_cast<T*>(p.out);
  for_each_row_vector<kThreads, kVec>(p.rows, p.cols, [&](long long row, long long col) {
    const Vec<float, kVec> a = load_vec<float, kVec>(p.acc + row * p.cols, col);
    T* dst = out + row * p.out_stride;
    Vec<T, kVec> o;
    if (kAccumulate) o = load_vec<T, kVec>(dst, col);
    float x[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) x[j] = a.v[j] + (kAccumulate ? to_float(o.v[j]) : 0.0f);
    from_floats(x, o.v);
    store_vec<T, kVec>(dst, col, o);
  });
}

// A gradient computed for upstream gradient a becomes the gradient for g: one IEEE division g / a,
// one fp32 multiply per element, one rounding to T, as cross_entropy_rescale_gradient does. When
// g == a every block returns before touching memory, so the usual case (the upstream gradient the
// forward was told) costs a launch of empty blocks.
template <typename T, int kThreads, int kVec>
__global__ void __launch_bounds__(kThreads)
    linear_cross_entropy_rescale(const LinearCrossEntropyRescaleParams p) {
  const float g = p.grad_output[0];
  const float a = p.applied != nullptr ? p.applied[0] : 1.0f;
  if (g == a) return;
  const float factor = __fdiv_rn(g, a);
  T* x = static_cast<T*>(p.x);
  for_each_row_vector<kThreads, kVec>(p.rows, p.cols, [&](long long row, long long col) {
    T* at = x + row * p.stride;
    Vec<T, kVec> v = load_vec<T, kVec>(at, col);
    float y[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = __fmul_rn(to_float(v.v[j]), factor);
    from_floats(y, v.v);
    store_vec<T, kVec>(at, col, v);
  });
}

}  // namespace kjit
