// Device helpers shared by every kjit kernel: dtypes, conversions, vector access, reductions.
//
// This file and everything it includes must compile with NVRTC and no toolkit header (a
// runtime-only install has no cuda_bf16.h), so bf16/fp16 are kjit's own 16-bit types converted with
// bit operations and inline PTX `cvt`, which is what the toolkit's headers do inside.
//
//   using V = kjit::Vec<kjit::bf16, 8>;                  // 16 bytes: one ld.global.v4
//   V v = kjit::load_vec<kjit::bf16, 8>(row, col);
//   float s = kjit::row_sum<256>(partial, smem);         // sum over the 256 threads of a row
#pragma once

namespace kjit {

struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) {
  return __uint_as_float(static_cast<unsigned>(x.bits) << 16);
}
__device__ __forceinline__ float to_float(f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));  // round to nearest even; NaN stays NaN
  return r;
}
template <> __device__ __forceinline__ f16 from_float<f16>(float x) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
  return r;
}

// Two floats rounded to a 16-bit type with one cvt (sm_80 and newer).
__device__ __forceinline__ unsigned pack2(float lo, float hi, bf16*) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, f16*) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// N floats rounded to T: pairs of bf16 or fp16 take one instruction instead of two.
template <typename T, int N>
__device__ __forceinline__ void from_floats(const float (&x)[N], T (&out)[N]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (N % 2 == 0 && sizeof(T) == 2) {
#pragma unroll
    for (int k = 0; k < N; k += 2) {
      const unsigned packed = pack2(x[k], x[k + 1], static_cast<T*>(nullptr));
      out[k].bits = static_cast<unsigned short>(packed & 0xffffu);
      out[k + 1].bits = static_cast<unsigned short>(packed >> 16);
    }
    return;
  }
#endif
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = from_float<T>(x[k]);
}

// 2^x in one MUFU instruction; results below 2^-126 flush to 0 (exp2f adds a rescale for them).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Rounds through T and back: what storing a value in T and reading it again gives.
template <typename T> __device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

// N elements moved as one aligned access (16 bytes at most, the widest global load).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* base, long long index) {
  return *reinterpret_cast<const Vec<T, N>*>(base + index);
}
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* base, long long index, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(base + index) = v;
}

// The largest of a vector's elements as a float; NaN only when all are NaN (like fmaxf). Pairs of
// bf16 or fp16 are compared packed, one instruction for two elements.
__device__ __forceinline__ unsigned max2(unsigned a, unsigned b, bf16*) {
  unsigned r;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ unsigned max2(unsigned a, unsigned b, f16*) {
  unsigned r;
  asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
template <typename T, int N>
__device__ __forceinline__ float vec_max(const Vec<T, N>& v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(T) == 2 && N >= 2 && N % 2 == 0) {
    unsigned w[N / 2];
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      w[k] = static_cast<unsigned>(v.v[2 * k].bits) |
             (static_cast<unsigned>(v.v[2 * k + 1].bits) << 16);
    }
#pragma unroll
    for (int width = 1; width < N / 2; width *= 2) {
#pragma unroll
      for (int k = 0; k + width < N / 2; k += 2 * width) {
        w[k] = max2(w[k], w[k + width], static_cast<T*>(nullptr));
      }
    }
    T lo, hi;
    lo.bits = static_cast<unsigned short>(w[0] & 0xffffu);
    hi.bits = static_cast<unsigned short>(w[0] >> 16);
    return fmaxf(to_float(lo), to_float(hi));
  }
#endif
  float m = to_float(v.v[0]);
#pragma unroll
  for (int k = 1; k < N; ++k) m = fmaxf(m, to_float(v.v[k]));
  return m;
}

// Sum over groups of kWidth consecutive lanes (kWidth a power of two <= 32). Every lane of the warp
// must call it. The butterfly gives every lane the same, order-fixed result.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset, kWidth);
  }
  return v;
}

// Sum over the kWidth threads that share one row. kWidth <= 32: lanes of one warp, no barrier.
// kWidth > 32 (a multiple of 32, one row per block): warps, then shared memory; `smem` holds 32
// floats and every thread of the block must call it. Deterministic: a fixed tree.
template <int kWidth>
__device__ __forceinline__ float row_sum(float v, float* smem) {
  if constexpr (kWidth <= 32) {
    return group_sum<kWidth>(v);
  } else {
    static_assert(kWidth % 32 == 0 && kWidth <= 1024, "row width must be a multiple of 32");
    constexpr int kWarps = kWidth / 32;
    v = group_sum<32>(v);
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    float total = lane < kWarps ? smem[lane] : 0.0f;
    return group_sum<32>(total);
  }
}

// Programmatic dependent launch (sm_90 and newer): a kernel launched to overlap the kernel before
// it on the stream may start while that one still runs, and must wait for it before reading what
// it writes; the kernel before may let it start early. Both are no-ops for a kernel launched the
// ordinary way, and before sm_90.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thread-block clusters (sm_90 and newer): the blocks of a cluster run at once on one GPU
// processing cluster and can read each other's shared memory. Only kernels instantiated for a
// cluster of more than one block call these, and those are compiled for sm_90 or newer only.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// arrive (release) + wait (acquire): shared-memory writes made before a block's arrive are seen by
// every block of the cluster after its wait. Every thread of every block must take part.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Bulk asynchronous copies between global and shared memory (the Tensor Memory Accelerator's
// non-tensor form, sm_90 and newer): one thread moves a whole 16-byte-aligned range while the
// block computes. A load completes on an mbarrier that counts its bytes; a store is tracked by
// bulk groups of the issuing thread. Only kernels compiled for sm_90 or newer call these.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned a;
  asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals)
               : "memory");
}
// Makes initialized mbarriers visible to the async proxy (the copies that complete on them).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives on `bar` and adds `bytes` to the bytes its phase waits for (copies or st.async that
// complete on it).
__device__ __forceinline__ void mbarrier_arrive_expecting(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}
// Starts a copy of `bytes` (a multiple of 16) from global `src` into shared `dst`; the phase of
// `bar` completes when they have all arrived. The calling thread is the barrier's one arrival.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
  mbarrier_arrive_expecting(bar, bytes);
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}
// Waits until the phase of `bar` with this parity has completed. kFromCluster: the phase was
// completed by other blocks of the cluster (their writes are acquired at cluster scope).
template <bool kFromCluster = false>
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
  const unsigned b = shared_address(bar);
  unsigned done;
  do {
    if constexpr (kFromCluster) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
          "selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(b), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, "
          "0, p; }"
          : "=r"(done)
          : "r"(b), "r"(parity)
          : "memory");
    }
  } while (!done);
}
// Orders this thread's ordinary shared-memory writes before later bulk copies that read them.
__device__ __forceinline__ void async_proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Starts a copy of `bytes` (a multiple of 16) from shared `src` to global `dst`, as one bulk group.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(shared_address(src)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Starts pulling `bytes` (a multiple of 16) from global `src` into L2, without waiting or
// writing anywhere: a hint, so that a later load of them does not wait on DRAM.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// Waits until this thread's bulk stores have read their shared memory (it may be overwritten).
__device__ __forceinline__ void bulk_stores_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Gives every block of a cluster the value of every block, in its own shared memory: each block
// pushes its value into slot[its rank] of every block with st.async, which completes on the
// receiver's mbarrier. No block reads another's shared memory, so no block has to stay alive
// for the others' reads (the second cluster barrier that a pull exchange ends with), and a block
// waits only for the values, not for every thread of the cluster. One exchange per kernel (the
// mbarrier's first phase). Only kernels compiled for sm_90 or newer call it.
//
//   __shared__ ClusterMailbox<Stats, 6> box;
//   if (threadIdx.x == 0) box.init();
//   cluster_arrive();              // early: publishes the mbarrier
//   ...
//   box.exchange(my_stats, rank);  // box.slot[0..5] hold all six, the same in every block
template <typename U, int kBlocks>
struct ClusterMailbox {
  static_assert(sizeof(U) % 4 == 0, "values travel as 4-byte words");
  U slot[kBlocks];
  unsigned long long full;  // mbarrier: every slot has arrived

  // One thread, before the cluster_arrive that publishes it.
  __device__ __forceinline__ void init() {
    mbarrier_init(&full, 1);
    mbarrier_init_fence();
    mbarrier_arrive_expecting(&full, sizeof(slot));
  }
  // Every thread of every block calls it, after the cluster_arrive that follows init(); threads
  // 0..kBlocks-1 deliver `value` (thread b to the block of rank b), so they must hold the block's
  // value. Returns when every slot has arrived.
  __device__ __forceinline__ void exchange(const U& value, unsigned rank) {
    cluster_wait();  // every block's mbarrier is initialized
    send(value, rank);
    mbarrier_wait<true>(&full, 0);
  }

 private:
  __device__ __forceinline__ void send(const U& value, unsigned rank) {
    const unsigned to = threadIdx.x;
    if (to >= kBlocks) return;
    unsigned dst, bar;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(shared_address(&slot[rank])), "r"(to));
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(shared_address(&full)), "r"(to));
    const unsigned* words = reinterpret_cast<const unsigned*>(&value);
#pragma unroll
    for (int k = 0; k < static_cast<int>(sizeof(U) / 4); ++k) {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                       dst + 4u * k),
                   "r"(words[k]), "r"(bar)
                   : "memory");
    }
  }
};
}  // namespace kjit
