// kjit's GEMM for Hopper (sm_90a): C[M, N] = A[M, K] · B[K, N] in 16-bit inputs with fp32
// accumulation, for the lm_head's three products (logits = h·Wᵀ, d_hidden = dlogits·W,
// d_weight = dlogitsᵀ·h). Each operand is K-major or MN-major in global memory; the copy engine
// (TMA) brings 64-element-wide boxes into shared memory with the 128-byte swizzle, which is the
// layout wgmma reads in either major-ness for 16-bit types.
//
// One block per SM, persistent: a producer warpgroup (one thread issues the copies) fills a ring of
// kStages stages on full/empty mbarriers; kBM / 64 consumer warpgroups each multiply 64 rows of
// the tile by kBN columns with wgmma, keep one stage's products in flight, and write their rows of
// C from registers. Tiles go to blocks round-robin in a grouped order (kGroup tiles along one
// dimension before the other advances), so that the ~132 tiles in flight share few A and B panels
// in L2.
//
//   kjit::gemm_sm90<kjit::bf16, kjit::bf16, 128, 256, 4, false, false, 8, false, false>
//   // 384 threads, GemmSharedBytes(128, 256, 4) bytes of dynamic shared memory, one block per SM
#pragma once

#include "common.cuh"
#include "gemm_sm90_params.h"

namespace kjit {

// The accumulator operand lists of wgmma: %0..%63 and %64..%127.
#define KJIT_ACC_0_63                                                                           \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define KJIT_ACC_64_127                                                                           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "   \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "   \
  "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, " \
  "%115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define KJIT_F8(i)                                                                      \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define KJIT_F64(i) \
  KJIT_F8(i), KJIT_F8(i + 8), KJIT_F8(i + 16), KJIT_F8(i + 24), KJIT_F8(i + 32), KJIT_F8(i + 40), \
      KJIT_F8(i + 48), KJIT_F8(i + 56)
// d (+)= A·B for one 64 x N x 16 step of a warpgroup, A and B read from shared memory through
// their descriptors; scale_d 0 ignores d's old value (a tile's first step). The transposes are
// immediates: 1 reads that operand MN-major.
#define KJIT_WGMMA(shape, types, acc, a, b, scale, ta, tb, ...)                                \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, " scale ", 0; wgmma.mma_async.sync.aligned." \
               shape ".f32" types " {" acc "}, " a ", " b ", p, 1, 1, " ta ", " tb "; }"       \
               : __VA_ARGS__                                                                 \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kAMajorMN), "n"(kBMajorMN))
#define KJIT_WGMMA_N128(types) \
  KJIT_WGMMA("m64n128k16", types, KJIT_ACC_0_63, "%64", "%65", "%66", "%67", "%68", KJIT_F64(0))
#define KJIT_WGMMA_N256(types)                                                                   \
  KJIT_WGMMA("m64n256k16", types, KJIT_ACC_0_63 ", " KJIT_ACC_64_127, "%128", "%129", "%130",  \
             "%131", "%132", KJIT_F64(0), KJIT_F64(64))

template <typename T> struct WgmmaTypes;
template <> struct WgmmaTypes<bf16> { static constexpr bool kBF16 = true; };
template <> struct WgmmaTypes<f16> { static constexpr bool kBF16 = false; };

template <typename T, int kN, int kAMajorMN, int kBMajorMN>
__device__ __forceinline__ void wgmma(float (&d)[kN / 2], unsigned long long desc_a,
                                      unsigned long long desc_b, int scale_d) {
  static_assert(kN == 128 || kN == 256, "wgmma: a tile is 128 or 256 columns wide");
  if constexpr (kN == 256 && WgmmaTypes<T>::kBF16) {
    KJIT_WGMMA_N256(".bf16.bf16");
  } else if constexpr (kN == 256) {
    KJIT_WGMMA_N256(".f16.f16");
  } else if constexpr (WgmmaTypes<T>::kBF16) {
    KJIT_WGMMA_N128(".bf16.bf16");
  } else {
    KJIT_WGMMA_N128(".f16.f16");
  }
}
#undef KJIT_WGMMA_N256
#undef KJIT_WGMMA_N128
#undef KJIT_WGMMA
#undef KJIT_F64
#undef KJIT_F8
#undef KJIT_ACC_64_127
#undef KJIT_ACC_0_63

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// A wgmma shared-memory descriptor for the 128-byte swizzle (layout type 1). K-major operands
// ignore lbo; MN-major ones read 64-element chunks of MN lbo bytes apart. Groups of 8 rows (K-major:
// rows of MN, MN-major: rows of K) are sbo = 1024 bytes apart, one swizzle pattern each.
__device__ __forceinline__ unsigned long long smem_descriptor(unsigned address, unsigned lbo) {
  return static_cast<unsigned long long>((address & 0x3ffff) >> 4) |
         static_cast<unsigned long long>((lbo >> 4) & 0x3fff) << 16 |
         static_cast<unsigned long long>(1024 >> 4) << 32 | 1ull << 62;
}

// Copies one box of a 2-D tensor map at element coordinates (x along the contiguous dimension,
// y) into shared memory; completes on bar's transaction count.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const GemmTensorMap* map,
                                            unsigned long long* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(shared_address(bar))
      : "memory");
}

// One stage's slice of an operand: kRows rows of M (or N) from mn0, 64 deep from k0. K-major: one
// box of 64 x kRows. MN-major: kRows / 64 boxes of 64 (along MN) x 64 (along K), one after another.
template <bool kMajorMN, int kRows>
__device__ __forceinline__ void gemm_load_operand(unsigned dst, const GemmTensorMap* map,
                                                  unsigned long long* bar, int mn0, int k0) {
  if constexpr (kMajorMN) {
#pragma unroll
    for (int c = 0; c < kRows / 64; ++c) tma_load_2d(dst + c * kGemmBK * 128, map, bar, mn0 + c * 64, k0);
  } else {
    tma_load_2d(dst, map, bar, k0, mn0);
  }
}

__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// Tile t's (row, column) tile indices: kGroup tiles along one dimension (M, or N when
// kGroupAlongN), then the next position along the other, group after group.
template <int kGroup, bool kGroupAlongN>
__device__ __forceinline__ void gemm_tile(int t, int m_tiles, int n_tiles, int& mt, int& nt) {
  const int along = kGroupAlongN ? n_tiles : m_tiles, across = kGroupAlongN ? m_tiles : n_tiles;
  const int per_group = kGroup * across, group = t / per_group, first = group * kGroup;
  const int size = min(along - first, kGroup), r = t - group * per_group;
  const int a = first + r % size, b = r / size;
  mt = kGroupAlongN ? b : a;
  nt = kGroupAlongN ? a : b;
}

// Writes a warpgroup's 64 x kN accumulators to C rows row0.., columns col0.. (clipped to m x n).
// Thread lane of warp w holds, for each 8-column block j, rows 16w + lane/4 (+8) and columns
// 8j + 2(lane%4) (+1).
template <typename TOut, int kN, bool kAccumulate>
__device__ __forceinline__ void gemm_store(const float (&d)[kN / 2], TOut* c, long long ldc, int m,
                                           int n, int row0, int col0) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + warp * 16 + lane / 4 + half * 8;
    if (row >= m) continue;
    TOut* out = c + row * ldc;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const int col = col0 + j * 8 + (lane % 4) * 2;
      float x0 = d[j * 4 + half * 2], x1 = d[j * 4 + half * 2 + 1];
      if (col + 1 < n) {
        if constexpr (sizeof(TOut) == 4) {
          float* p = out + col;
          if constexpr (kAccumulate) {
            float o0, o1;
            asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(o0), "=f"(o1) : "l"(p));
            x0 += o0;
            x1 += o1;
          }
          asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x0), "f"(x1) : "memory");
        } else {
          unsigned* p = reinterpret_cast<unsigned*>(out + col);
          if constexpr (kAccumulate) {
            const unsigned o = *p;
            TOut lo, hi;
            lo.bits = static_cast<unsigned short>(o & 0xffffu);
            hi.bits = static_cast<unsigned short>(o >> 16);
            x0 += to_float(lo);
            x1 += to_float(hi);
          }
          *p = pack2(x0, x1, static_cast<TOut*>(nullptr));
        }
      } else if (col < n) {
        if constexpr (kAccumulate) x0 += to_float(out[col]);
        out[col] = from_float<TOut>(x0);
      }
    }
  }
}

// kAMajorMN: A is stored [K][M] (M contiguous), else [M][K]. kBMajorMN: B is stored [K][N], else
// [N][K]. The host's tensor maps follow: the contiguous dimension first, boxes of 64 elements
// along it and kBM / kBN (K-major) or kGemmBK (MN-major) along the other.
template <typename T, typename TOut, int kBM, int kBN, int kStages, int kAMajorMN, int kBMajorMN,
          int kGroup, bool kGroupAlongN, bool kAccumulate>
__global__ void __launch_bounds__(128 * (1 + kBM / 64), 1)
    gemm_sm90(const __grid_constant__ GemmParams p) {
  static_assert(kBM == 64 || kBM == 128 || kBM == 192 || kBM == 256, "kBM: 64..256, by 64");
  constexpr int kConsumers = kBM / 64;
  // The producer gives registers back (40 a thread) so that the consumers' accumulators fit: the
  // SM's 64K registers shared by 128 (40 + kConsumers * regs) threads, at most 232.
  constexpr int kConsumerRegs = gemm_consumer_registers(kConsumers);
  static_assert(kConsumerRegs >= kBN / 2 + 40, "the accumulators do not fit the registers");
  constexpr int kABytes = kBM * kGemmBK * 2, kBBytes = kBN * kGemmBK * 2;
  constexpr int kStageBytes = kABytes + kBBytes;
  constexpr int kChunkBytes = kGemmBK * 128;  // one 64-element-wide MN-major box
  extern __shared__ unsigned char gemm_smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned raw = shared_address(gemm_smem);
  const unsigned base = (raw + 1023) & ~1023u;
  unsigned long long* full =
      reinterpret_cast<unsigned long long*>(gemm_smem + (base - raw) + kStages * kStageBytes);
  unsigned long long* empty = full + kStages;
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kConsumers * 4);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  const int m_tiles = (p.m + kBM - 1) / kBM, n_tiles = (p.n + kBN - 1) / kBN;
  const int tiles = m_tiles * n_tiles, k_blocks = (p.k + kGemmBK - 1) / kGemmBK;
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x != 0) return;
    int stage = 0;
    unsigned phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int mt, nt;
      gemm_tile<kGroup, kGroupAlongN>(t, m_tiles, n_tiles, mt, nt);
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbarrier_wait(&empty[stage], phase ^ 1);
        mbarrier_arrive_expecting(&full[stage], kStageBytes);
        const unsigned a = base + stage * kStageBytes, b = a + kABytes;
        const int k0 = kb * kGemmBK;
        gemm_load_operand<kAMajorMN, kBM>(a, &p.a, &full[stage], mt * kBM, k0);
        gemm_load_operand<kBMajorMN, kBN>(b, &p.b, &full[stage], nt * kBN, k0);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int consumer = warpgroup - 1;
    const bool arrives = threadIdx.x % 32 == 0;
    // A: this warpgroup's 64 rows; a 16-deep step of K is 32 bytes further along a K-major row, or
    // 16 rows of 128 bytes further down an MN-major chunk.
    const unsigned a_offset = kAMajorMN ? consumer * kChunkBytes : consumer * 64 * 128;
    constexpr unsigned kAStep = kAMajorMN ? 16 * 128 : 32, kBStep = kBMajorMN ? 16 * 128 : 32;
    constexpr unsigned kALbo = kAMajorMN ? kChunkBytes : 16, kBLbo = kBMajorMN ? kChunkBytes : 16;
    int stage = 0;
    unsigned phase = 0;
    float d[kBN / 2];
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int mt, nt;
      gemm_tile<kGroup, kGroupAlongN>(t, m_tiles, n_tiles, mt, nt);
      int previous = 0;
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbarrier_wait(&full[stage], phase);
        const unsigned a = base + stage * kStageBytes + a_offset, b = base + stage * kStageBytes + kABytes;
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kGemmBK / 16; ++j) {
          wgmma<T, kBN, kAMajorMN, kBMajorMN>(d, smem_descriptor(a + j * kAStep, kALbo),
                                          smem_descriptor(b + j * kBStep, kBLbo),
                                          kb > 0 || j > 0);
        }
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();  // the previous stage's products are done: its buffers can refill
          if (arrives) mbarrier_arrive(&empty[previous]);
        }
        previous = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      if (arrives) mbarrier_arrive(&empty[previous]);
      gemm_store<TOut, kBN, kAccumulate>(d, static_cast<TOut*>(p.c), p.ldc, p.m, p.n,
                                         mt * kBM + consumer * 64, nt * kBN);
    }
  }
#endif
}

}  // namespace kjit
