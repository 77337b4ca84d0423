// Reads a buffer larger than the L2 so that the next timed kernel starts with a cold cache.
//
// A read, not a memset: a memset leaves the L2 full of dirty lines whose write-back would land
// inside the next timed kernel and be charged to it.
//
//   kjit::l2_flush<<<blocks, 256>>>(buffer, n_vectors, sink);
#pragma once

#include "common.cuh"

namespace kjit {

__global__ void l2_flush(const Vec<unsigned, 4>* data, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const Vec<unsigned, 4> v = data[i];
    acc ^= v.v[0] ^ v.v[1] ^ v.v[2] ^ v.v[3];
  }
  // Practically never true; it keeps the loads from being optimized away.
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace kjit
