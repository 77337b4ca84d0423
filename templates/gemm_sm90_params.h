// Kernel arguments of kjit's Hopper GEMM (gemm_sm90.cuh), shared verbatim by the host
// (ops/gemm/gemm.cc) and the device. Plain C++ both compilers read.
//
// C[M, N] = A[M, K] · B[K, N] (+ C when accumulating). A and B are read through tensor maps the
// host encodes with cuTensorMapEncodeTiled (128-byte swizzle, boxes of 64 elements along the
// contiguous dimension); C is row-major with row stride ldc elements.
//
//   kjit::GemmParams p{};  // p.a, p.b filled by cuTensorMapEncodeTiled
//   p.c = c; p.ldc = n; p.m = m; p.n = n; p.k = k;
//   void* args[] = {&p};
//   cuLaunchKernel(fn, sms, 1, 1, 384, 1, 1, smem_bytes, stream, args, nullptr);
#pragma once

#if defined(__CUDACC__)
#define KJIT_HOST_DEVICE __host__ __device__
#else
#define KJIT_HOST_DEVICE
#endif

namespace kjit {

constexpr int kGemmBK = 64;  // one 128-byte swizzle span of 16-bit elements along K

// Dynamic shared memory of one block: the stages (a 64-deep slice of A's bm rows and B's bn
// columns each), their two mbarriers, and 1 KB to align the stages to the swizzle's 1024-byte
// pattern.
KJIT_HOST_DEVICE constexpr int gemm_shared_bytes(int bm, int bn, int stages) {
  return stages * (bm + bn) * kGemmBK * 2 + stages * 16 + 1024;
}

// Registers a consumer thread gets: the producer warpgroup keeps 40 a thread and the consumers
// share the rest of the SM's 64K (128 threads a warpgroup), at most 232, in multiples of 8.
KJIT_HOST_DEVICE constexpr int gemm_consumer_registers(int consumers) {
  return (65536 / 128 - 40) / consumers / 8 * 8 < 232 ? (65536 / 128 - 40) / consumers / 8 * 8
                                                      : 232;
}

// CUtensorMap's storage: 128 opaque bytes, 64-byte aligned. Passed by value in the kernel's
// parameters (__grid_constant__), which is where the copy engine reads it from.
struct alignas(64) GemmTensorMap {
  unsigned long long opaque[16];
};

struct GemmParams {
  GemmTensorMap a;
  GemmTensorMap b;
  void* c;
  long long ldc;
  int m;
  int n;
  int k;
};

}  // namespace kjit

#undef KJIT_HOST_DEVICE
