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

// Each thread rounds kVec consecutive elements of a row; the grid strides over the matrix.
template <typename T, int kThreads, int kVec, bool kAccumulate>
__global__ void __launch_bounds__(kThreads)
    linear_cross_entropy_store(const LinearCrossEntropyStoreParams p) {
  wait_for_previous_kernel();
  const long long vectors_per_row = p.cols / kVec;
  const long long vectors = p.rows * vectors_per_row;
  T* out = static_cast<T*>(p.out);
  for (long long i = blockIdx.x * static_cast<long long>(kThreads) + threadIdx.x; i < vectors;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    const long long row = i / vectors_per_row, col = (i - row * vectors_per_row) * kVec;
    const Vec<float, kVec> a = load_vec<float, kVec>(p.acc + row * p.cols, col);
    T* dst = out + row * p.out_stride;
    Vec<T, kVec> o;
    if (kAccumulate) o = load_vec<T, kVec>(dst, col);
    float x[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) x[j] = a.v[j] + (kAccumulate ? to_float(o.v[j]) : 0.0f);
    from_floats(x, o.v);
    store_vec<T, kVec>(dst, col, o);
  }
}

}  // namespace kjit
