// kjit's sm_90a GEMM template (compiled in by nvcc, see scripts/gpu/gemm.sh) against cuBLASLt's
// best heuristic algorithm and an fp64 reference on sampled elements.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gemm_sm90.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1);} } while (0)
#define CL(x) do { cublasStatus_t e = (x); if (e != CUBLAS_STATUS_SUCCESS) { printf("cublasLt %d at %s:%d\n", (int)e, __FILE__, __LINE__); exit(1);} } while (0)

using bf = kjit::bf16;

__global__ void fill(bf* x, long long n, unsigned seed, float scale) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    float u = (h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    x[i] = kjit::from_float<bf>(u * scale);
  }
}
__global__ void fillf(float* x, long long n, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = (h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
  }
}
__global__ void flush_read(const int4* p, long long n, int* sink) {
  int acc = 0;
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) acc ^= p[i].x;
  if (acc == 0x12345678) *sink = acc;
}

static float bf2f(unsigned short b) { unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f; }

typedef CUresult (*EncodeFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                             const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static EncodeFn encode;

// 2-D map over a row-major [rows][cols] bf16 matrix with box {64, box_rows}.
static void make_map(kjit::GemmTensorMap* out, const void* ptr, long long rows, long long cols, int box_rows) {
  cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
  cuuint32_t estr[2] = {1, 1};
  CUresult r = encode(reinterpret_cast<CUtensorMap*>(out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims,
                      strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("encode failed %d rows %lld cols %lld box %d\n", (int)r, rows, cols, box_rows); exit(1); }
}

struct Problem {
  int m, n, k, ta, tb;  // ta: A stored [K][M]; tb: B stored [K][N]
  bf *a, *b;
};

struct Config {
  const char* name;
  void (*kernel)(const kjit::GemmParams);
  int bm, bn, stages, ta, tb;
  bool f32out, accumulate;
};

#define CFG(T, TO, BM, BN, S, TA, TB, G, GN, ACC) \
  Config{#BM "x" #BN " s" #S " g" #G " alongN=" #GN " acc=" #ACC " " #TO, \
         kjit::gemm_sm90<T, TO, BM, BN, S, TA, TB, G, GN, ACC>, BM, BN, S, TA, TB, sizeof(TO) == 4, ACC}

static int sms;

static void launch(const Config& c, const Problem& p, void* out, cudaStream_t s, int grid = 0) {
  kjit::GemmParams prm{};
  if (p.ta) make_map(&prm.a, p.a, p.k, p.m, 64); else make_map(&prm.a, p.a, p.m, p.k, c.bm);
  if (p.tb) make_map(&prm.b, p.b, p.k, p.n, 64); else make_map(&prm.b, p.b, p.n, p.k, c.bn);
  prm.c = out; prm.ldc = p.n; prm.m = p.m; prm.n = p.n; prm.k = p.k;
  int smem = kjit::gemm_shared_bytes(c.bm, c.bn, c.stages);
  CK(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int tiles = ((p.m + c.bm - 1) / c.bm) * ((p.n + c.bn - 1) / c.bn);
  int g = grid ? grid : std::min(tiles, sms);
  c.kernel<<<g, 128 * (1 + c.bm / 64), smem, s>>>(prm);
  CK(cudaGetLastError());
}

struct Lt {
  cublasLtHandle_t h;
  void* ws; size_t ws_bytes = 64 << 20;
  Lt() { CL(cublasLtCreate(&h)); CK(cudaMalloc(&ws, ws_bytes)); }
  // row-major C[M][N] = A·B as column-major Cᵀ = Bᵀ·Aᵀ.
  struct Op { cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t la, lb, lc; std::vector<cublasLtMatmulHeuristicResult_t> algos; };
  Op make(const Problem& p, bool f32out) {
    Op o;
    CL(cublasLtMatmulDescCreate(&o.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = p.tb ? CUBLAS_OP_N : CUBLAS_OP_T, opb = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CL(cublasLtMatmulDescSetAttribute(o.d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CL(cublasLtMatmulDescSetAttribute(o.d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (p.tb) CL(cublasLtMatrixLayoutCreate(&o.la, CUDA_R_16BF, p.n, p.k, p.n));
    else CL(cublasLtMatrixLayoutCreate(&o.la, CUDA_R_16BF, p.k, p.n, p.k));
    if (p.ta) CL(cublasLtMatrixLayoutCreate(&o.lb, CUDA_R_16BF, p.m, p.k, p.m));
    else CL(cublasLtMatrixLayoutCreate(&o.lb, CUDA_R_16BF, p.k, p.m, p.k));
    CL(cublasLtMatrixLayoutCreate(&o.lc, f32out ? CUDA_R_32F : CUDA_R_16BF, p.n, p.m, p.n));
    cublasLtMatmulPreference_t pref;
    CL(cublasLtMatmulPreferenceCreate(&pref));
    CL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
    o.algos.resize(16); int got = 0;
    CL(cublasLtMatmulAlgoGetHeuristic(h, o.d, o.la, o.lb, o.lc, o.lc, pref, 16, o.algos.data(), &got));
    o.algos.resize(got);
    return o;
  }
  void run(const Op& o, const Problem& p, void* c, int algo, float beta, cudaStream_t s) {
    float alpha = 1;
    CL(cublasLtMatmul(h, o.d, &alpha, p.b, o.la, p.a, o.lb, &beta, c, o.lc, c, o.lc, &o.algos[algo].algo, ws, ws_bytes, s));
  }
};

static int* sink; static int4* flush_buf; static long long flush_n;
static void flush(cudaStream_t s) { flush_read<<<sms * 4, 256, 0, s>>>(flush_buf, flush_n, sink); }

static float time_it(const std::function<void()>& f, int reps, cudaStream_t s) {
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ts;
  f();
  for (int r = 0; r < reps; ++r) {
    flush(s);
    cudaEventRecord(e0, s); f(); cudaEventRecord(e1, s);
    CK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

__device__ float ld_elem(const void* p, long long i, bool f32) {
  return f32 ? ((const float*)p)[i] : kjit::to_float(((const bf*)p)[i]);
}
__global__ void compare_kernel(const void* g, const void* r, long long n, bool f32, float rel, float abs_tol,
                               unsigned long long* counts) {
  unsigned long long bad = 0, nonfinite = 0;
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    float x = ld_elem(g, i, f32), y = ld_elem(r, i, f32);
    if (!isfinite(x)) ++nonfinite;
    else if (fabsf(x - y) > rel * fabsf(y) + abs_tol) ++bad;
  }
  if (bad) atomicAdd(&counts[0], bad);
  if (nonfinite) atomicAdd(&counts[1], nonfinite);
}
// elementwise on the device: |got - ref| <= rel |ref| + 1e-2 rms(ref); rms from 4096 samples.
static bool compare(const char* what, const void* got, const void* ref, long long count, bool f32, double) {
  double ss = 0; int taken = 0;
  for (long long i = 0; i < count && taken < 4096; i += std::max(1ll, count / 4096), ++taken) {
    float v;
    if (f32) CK(cudaMemcpy(&v, (const float*)ref + i, 4, cudaMemcpyDeviceToHost));
    else { unsigned short h; CK(cudaMemcpy(&h, (const unsigned short*)ref + i, 2, cudaMemcpyDeviceToHost)); v = bf2f(h); }
    ss += (double)v * v;
  }
  const double rms = std::sqrt(ss / std::max(taken, 1));
  unsigned long long* counts; CK(cudaMalloc(&counts, 16)); CK(cudaMemset(counts, 0, 16));
  const float rel = f32 ? 1e-4f : 1.0f / 64;
  compare_kernel<<<sms * 8, 256>>>(got, ref, count, f32, rel, (float)(1e-2 * rms), counts);
  unsigned long long h[2]; CK(cudaMemcpy(h, counts, 16, cudaMemcpyDeviceToHost)); cudaFree(counts);
  bool ok = h[0] == 0 && h[1] == 0 && rms > 0;
  printf("  vs cublasLt %-22s rms %.3e bad %llu nonfinite %llu -> %s\n", what, rms, h[0], h[1], ok ? "ok" : "FAIL");
  return ok;
}

// fp64 reference at sampled (i, j)
static bool check_fp64(const char* what, const Problem& p, const void* c, bool f32, const void* c0, int samples) {
  std::vector<unsigned short> a((long long)p.m * p.k), b((long long)p.n * p.k);
  CK(cudaMemcpy(a.data(), p.a, a.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), p.b, b.size() * 2, cudaMemcpyDeviceToHost));
  std::mt19937 rng(7);
  long long bad = 0; double worst = 0;
  for (int s = 0; s < samples; ++s) {
    int i = s < 4 ? (s & 1 ? p.m - 1 : 0) : rng() % p.m, j = s < 4 ? (s & 2 ? p.n - 1 : 0) : rng() % p.n;
    double acc = 0, mag = 0;
    for (int kk = 0; kk < p.k; ++kk) {
      double x = bf2f(a[p.ta ? (long long)kk * p.m + i : (long long)i * p.k + kk]);
      double y = bf2f(b[p.tb ? (long long)kk * p.n + j : (long long)j * p.k + kk]);
      acc += x * y; mag += std::fabs(x * y);
    }
    float got;
    long long idx = (long long)i * p.n + j;
    if (f32) CK(cudaMemcpy(&got, (const float*)c + idx, 4, cudaMemcpyDeviceToHost));
    else { unsigned short h; CK(cudaMemcpy(&h, (const unsigned short*)c + idx, 2, cudaMemcpyDeviceToHost)); got = bf2f(h); }
    if (c0) { float o; CK(cudaMemcpy(&o, (const float*)c0 + idx, 4, cudaMemcpyDeviceToHost)); acc += o; mag += std::fabs(o); }
    double tol = (f32 ? 1e-5 * mag + 1e-6 : std::fabs(acc) / 128.0 + 1e-5 * mag + 1e-6);
    double d = std::fabs(got - acc);
    if (!(d <= tol)) { if (bad < 5) printf("    (%d,%d) got %.6f want %.6f\n", i, j, got, acc); ++bad; }
    worst = std::max(worst, d / (mag + 1e-30));
  }
  printf("  %-34s fp64 samples %d bad %lld worst/|.| %.2e -> %s\n", what, samples, bad, worst, bad ? "FAIL" : "ok");
  return bad == 0;
}

int main(int argc, char** argv) {
  CK(cudaFree(0));
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0)); sms = prop.multiProcessorCount;
  printf("%s, %d SMs\n", prop.name, sms);
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &q));
  flush_n = (512ll << 20) / 16; CK(cudaMalloc(&flush_buf, flush_n * 16)); CK(cudaMemset(flush_buf, 0, flush_n * 16)); CK(cudaMalloc(&sink, 4));
  cudaStream_t s; CK(cudaStreamCreate(&s));
  Lt lt;
  const bool quick = argc > 1 && std::string(argv[1]) == "quick";
  bool all_ok = true;

  std::vector<Config> by_layout[4] = {
    {CFG(bf, bf, 128, 256, 4, 0, 0, 8, false, false), CFG(bf, bf, 128, 256, 4, 0, 0, 16, false, false),
     CFG(bf, bf, 128, 256, 3, 0, 0, 8, false, false), CFG(bf, bf, 128, 128, 6, 0, 0, 8, false, false),
     CFG(bf, bf, 128, 256, 4, 0, 0, 8, true, false)},
    {CFG(bf, bf, 128, 256, 4, 0, 1, 8, false, false), CFG(bf, bf, 128, 256, 4, 0, 1, 16, false, false),
     CFG(bf, bf, 128, 128, 6, 0, 1, 8, false, false), CFG(bf, bf, 128, 256, 4, 0, 1, 8, true, false)},
    {},
    {CFG(bf, bf, 128, 256, 4, 1, 1, 8, false, false), CFG(bf, bf, 128, 256, 4, 1, 1, 16, true, false),
     CFG(bf, bf, 128, 256, 4, 1, 1, 8, true, false), CFG(bf, bf, 128, 128, 6, 1, 1, 8, false, false),
     CFG(bf, float, 128, 256, 4, 1, 1, 8, false, false), CFG(bf, float, 128, 256, 4, 1, 1, 8, false, true)},
  };
  auto layout_of = [](int ta, int tb) { return ta * 2 + tb; };

  // Correctness: small odd shapes and one big one per layout, every config.
  struct Shape { int m, n, k; };
  std::vector<Shape> shapes = {{1, 64, 64}, {200, 328, 136}, {130, 520, 4104}, {1000, 1000, 512}};
  for (int layout : {0, 1, 3}) {
    for (const Config& c : by_layout[layout]) {
      for (Shape sh : shapes) {
        Problem p{sh.m, sh.n, sh.k, c.ta, c.tb};
        if ((c.ta && sh.m % 8) || (!c.ta && sh.k % 8) || (c.tb && sh.n % 8) || (!c.tb && sh.k % 8)) continue;
        CK(cudaMalloc(&p.a, (long long)p.m * p.k * 2)); CK(cudaMalloc(&p.b, (long long)p.n * p.k * 2));
        fill<<<512, 256>>>(p.a, (long long)p.m * p.k, 1 + sh.m, 1.0f); fill<<<512, 256>>>(p.b, (long long)p.n * p.k, 99 + sh.n, 1.0f);
        size_t cbytes = (size_t)p.m * p.n * (c.f32out ? 4 : 2);
        void *c0 = nullptr, *cout;
        CK(cudaMalloc(&cout, cbytes));
        if (c.accumulate) { CK(cudaMalloc(&c0, cbytes)); fillf<<<512, 256>>>((float*)c0, (long long)p.m * p.n, 5); CK(cudaMemcpy(cout, c0, cbytes, cudaMemcpyDeviceToDevice)); }
        else CK(cudaMemset(cout, 0xff, cbytes));  // NaN poison
        launch(c, p, cout, s);
        CK(cudaStreamSynchronize(s));
        char what[128]; snprintf(what, sizeof what, "L%d %s %dx%dx%d", layout, c.name, p.m, p.n, p.k);
        all_ok &= check_fp64(what, p, cout, c.f32out, c0, 300);
        cudaFree(p.a); cudaFree(p.b); cudaFree(cout); if (c0) cudaFree(c0);
      }
    }
  }
  printf("small-shape correctness: %s\n", all_ok ? "ok" : "FAIL");
  if (quick) return all_ok ? 0 : 1;

  // The lm_head's three GEMMs at rows r: logits = h·Wᵀ (L0: M=r,N=V,K=H), d_hidden = dl·W
  // (L2: M=r,N=H,K=V), d_weight = dlᵀ·h (L3: M=V,N=H,K=r).
  const int H = 4096, V = 128256;
  std::vector<int> rows = {4096, 8192, 16384};
  printf("\n%-8s %-6s %-22s %10s %10s\n", "rows", "gemm", "config", "ms", "TFLOP/s");
  for (int r : rows) {
    bf *h, *w, *dl;
    CK(cudaMalloc(&h, (long long)r * H * 2)); CK(cudaMalloc(&w, (long long)V * H * 2)); CK(cudaMalloc(&dl, (long long)r * V * 2));
    fill<<<4096, 256>>>(h, (long long)r * H, 11, 1.0f); fill<<<4096, 256>>>(w, (long long)V * H, 12, 0.05f); fill<<<4096, 256>>>(dl, (long long)r * V, 13, 1e-3f);
    Problem probs[3] = {{r, V, H, 0, 0, h, w}, {r, H, V, 0, 1, dl, w}, {V, H, r, 1, 1, dl, h}};
    const char* names[3] = {"logits", "d_h", "d_w"};
    void* out; CK(cudaMalloc(&out, (size_t)r * V * 4 > (size_t)V * H * 4 ? (size_t)r * V * 2 : (size_t)V * H * 4));
    void* ref; CK(cudaMalloc(&ref, (size_t)r * V * 2 > (size_t)V * H * 4 ? (size_t)r * V * 2 : (size_t)V * H * 4));
    for (int g = 0; g < 3; ++g) {
      Problem& p = probs[g];
      double flop = 2.0 * p.m * p.n * p.k;
      for (bool f32 : {false, true}) {
        if (f32 && g != 2) continue;
        Lt::Op op = lt.make(p, f32);
        float best = 1e30; int best_algo = -1;
        for (int a = 0; a < (int)op.algos.size(); ++a) {
          float t = time_it([&] { lt.run(op, p, ref, a, 0.0f, s); }, 5, s);
          if (t < best) { best = t; best_algo = a; }
        }
        float t0 = time_it([&] { lt.run(op, p, ref, 0, 0.0f, s); }, 10, s);
        best = std::min(best, time_it([&] { lt.run(op, p, ref, best_algo, 0.0f, s); }, 10, s));
        printf("%-8d %-6s %-22s %10.3f %10.1f   (heuristic #0: %.3f ms, %zu algos)\n", r, names[g], f32 ? "cublasLt best f32" : "cublasLt best", best, flop / best / 1e9, t0, op.algos.size());
        lt.run(op, p, ref, best_algo, 0.0f, s);
        for (const Config& c : by_layout[layout_of(p.ta, p.tb)]) {
          if (c.f32out != f32 || c.accumulate) continue;
          CK(cudaMemsetAsync(out, 0xff, (size_t)p.m * p.n * (f32 ? 4 : 2), s));
          launch(c, p, out, s);
          CK(cudaStreamSynchronize(s));
          bool ok = compare(c.name, out, ref, (long long)p.m * p.n, f32, 0.0);
          all_ok &= ok;
          float t = time_it([&] { launch(c, p, out, s); }, 10, s);
          printf("%-8d %-6s %-22s %10.3f %10.1f   %.3fx cublasLt best%s\n", r, names[g], c.name, t, flop / t / 1e9, t / best, ok ? "" : "  WRONG");
        }
      }
    }
    cudaFree(h); cudaFree(w); cudaFree(dl); cudaFree(out); cudaFree(ref);
    if (r == rows.front() && !all_ok) break;
  }
  printf("overall: %s\n", all_ok ? "ok" : "FAIL");
  return all_ok ? 0 : 1;
}
