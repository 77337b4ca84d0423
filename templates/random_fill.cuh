// Fills a [rows x cols] matrix with uniform values in [lo, hi), rounded to T, on the device.
//
// Benchmarks and the autotuner need gigabytes of random logits (16384 rows of a 128256-entry vocab
// are 4 GB in bf16); generating them on the host and uploading takes longer than tuning itself.
// Each element is a hash of (seed, its index), so the contents do not depend on the launch shape;
// checks download the rows they compare rather than recomputing them on the host.
//
//   kjit::random_fill<kjit::bf16><<<blocks, 256>>>(data, rows, cols, row_stride, seed, -8.f, 8.f);
#pragma once

#include "common.cuh"

namespace kjit {

// splitmix64's finalizer: consecutive indices give independent-looking 64-bit words.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void random_fill(T* data, long long rows, long long cols, long long row_stride,
                            unsigned long long seed, float lo, float hi) {
  const long long n = rows * cols;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = i / cols, c = i - r * cols;
    // The top 24 bits: exactly representable in fp32, so the value stays below hi.
    const float u = static_cast<float>(mix64(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * 0x1p-24f;
    data[r * row_stride + c] = from_float<T>(lo + (hi - lo) * u);
  }
}

// Integer targets in [0, modulus), one per row.
template <typename I>
__global__ void random_targets(I* data, long long rows, unsigned long long seed, long long modulus) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    data[i] = static_cast<I>(mix64(~seed * 0x9e3779b97f4a7c15ull + i) % modulus);
  }
}

}  // namespace kjit
