#include "bench/finetune_step/eager_kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "jit/embedded_templates.h"
#include "jit/instantiation.h"
#include "jit/source.h"
#include "jit/status_helpers.h"
#include "runtime/runtime_state.h"

namespace finetune {

namespace {

using kjit::DType;
using kjit::TensorView;

// The device code, kept here as a raw string rather than as an embedded .cuh: a copy of this
// example then builds against an installed kjit, which ships the templates inside its library but
// not the CMake step that embeds them. It includes kjit's common.cuh for the bf16 conversions and
// vector access, so the baseline rounds exactly as the kjit kernels do.
constexpr char kSource[] = R"cuda(
#include "common.cuh"

namespace eager {

using kjit::Vec;
using kjit::from_float;
using kjit::load_vec;
using kjit::store_vec;
using kjit::to_float;

enum UnaryOp { kCast = 0, kSquare = 1 };
enum BinaryOp { kMul = 0, kAdd = 1 };
enum Broadcast { kFull = 0, kPerColumn = 1, kPerRow = 2 };
enum RowStat { kRstd = 0, kRstdBackward = 1 };
constexpr int kRowThreads = 1024;  // one block per row

__device__ __forceinline__ long long first_index(int vec) {
  return (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) * vec;
}
__device__ __forceinline__ long long grid_stride(int vec) {
  return static_cast<long long>(gridDim.x) * blockDim.x * vec;
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Box-Muller on two 24-bit uniforms drawn from a hash of (seed, i).
template <typename T>
__global__ void fill_normal(T* out, long long n, unsigned long long seed, float mean,
                            float stddev) {
  for (long long i = first_index(1); i < n; i += grid_stride(1)) {
    const unsigned long long h = splitmix64(seed ^ splitmix64(static_cast<unsigned long long>(i)));
    const float u1 = static_cast<float>((h >> 40) + 1) * 0x1p-24f;  // (0, 1]
    const float u2 = static_cast<float>(h & 0xffffffull) * 0x1p-24f;
    out[i] = from_float<T>(mean + stddev * sqrtf(-2.0f * logf(u1)) * cosf(6.28318531f * u2));
  }
}

template <typename A, typename Out, int kOp, int kVec>
__global__ void unary(const A* a, Out* out, long long n) {
  for (long long i = first_index(kVec); i < n; i += grid_stride(kVec)) {
    const Vec<A, kVec> va = load_vec<A, kVec>(a, i);
    Vec<Out, kVec> vo;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float x = to_float(va.v[k]);
      vo.v[k] = from_float<Out>(kOp == kSquare ? x * x : x);
    }
    store_vec<Out, kVec>(out, i, vo);
  }
}

// b is a's shape (kFull), one row of cols values (kPerColumn) or one value per row (kPerRow).
template <typename A, typename B, typename Out, int kOp, int kBroadcast, int kVec>
__global__ void binary(const A* a, const B* b, Out* out, long long n, long long cols) {
  for (long long i = first_index(kVec); i < n; i += grid_stride(kVec)) {
    const Vec<A, kVec> va = load_vec<A, kVec>(a, i);
    Vec<B, kVec> vb;
    if constexpr (kBroadcast == kFull) {
      vb = load_vec<B, kVec>(b, i);
    } else if constexpr (kBroadcast == kPerColumn) {
      vb = load_vec<B, kVec>(b, i % cols);
    } else {
      const B s = b[i / cols];
#pragma unroll
      for (int k = 0; k < kVec; ++k) vb.v[k] = s;
    }
    Vec<Out, kVec> vo;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float x = to_float(va.v[k]), y = to_float(vb.v[k]);
      vo.v[k] = from_float<Out>(kOp == kMul ? x * y : x + y);
    }
    store_vec<Out, kVec>(out, i, vo);
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The largest value of the block's kRowThreads threads, in each of them (kjit::row_sum's pattern).
__device__ __forceinline__ float block_max(float v, float* smem) {
  v = warp_max(v);
  __syncthreads();  // smem may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  return warp_max(smem[threadIdx.x % 32]);  // kRowThreads / 32 == 32 warps
}

// Sum of an fp32 row, in every thread of the block.
template <int kVec>
__device__ __forceinline__ float row_total(const float* x, long long cols, float* smem) {
  float s = 0.0f;
  for (long long c = threadIdx.x * kVec; c < cols; c += kRowThreads * kVec) {
    const Vec<float, kVec> v = load_vec<float, kVec>(x, c);
#pragma unroll
    for (int k = 0; k < kVec; ++k) s += v.v[k];
  }
  return kjit::row_sum<kRowThreads>(s, smem);
}

template <int kStat, int kVec>
__global__ void __launch_bounds__(kRowThreads)
row_stat(const float* in, long long cols, float eps, const float* rstd, float* out) {
  __shared__ float smem[32];
  const float s = row_total<kVec>(in + blockIdx.x * cols, cols, smem);
  if (threadIdx.x != 0) return;
  if constexpr (kStat == kRstd) {
    out[blockIdx.x] = rsqrtf(s / cols + eps);
  } else {
    const float r = rstd[blockIdx.x];
    out[blockIdx.x] = -r * r * r * s / cols;
  }
}

// 32 columns per block of 1024 threads; the 32 threads of a column add every 32nd row, then their
// sums are added in a fixed order (deterministic, like the kjit backward's dw).
template <typename T, typename Out>
__global__ void __launch_bounds__(1024)
column_sum(const T* in, long long rows, long long cols, Out* out) {
  __shared__ float partial[32][33];
  const int lane = threadIdx.x % 32, row_lane = threadIdx.x / 32;
  const long long c = blockIdx.x * 32LL + lane;
  float s = 0.0f;
  if (c < cols) {
    for (long long r = row_lane; r < rows; r += 32) s += to_float(in[r * cols + c]);
  }
  partial[row_lane][lane] = s;
  __syncthreads();
  if (row_lane == 0 && c < cols) {
    float total = 0.0f;
    for (int y = 0; y < 32; ++y) total += partial[y][lane];
    out[c] = from_float<Out>(total);
  }
}

// Three passes over the row (max, sum of exponentials, write), as PyTorch's softmax kernel makes
// for rows too long for shared memory.
template <int kVec>
__global__ void __launch_bounds__(kRowThreads)
log_softmax_forward(const float* in, float* out, long long cols) {
  __shared__ float smem[32];
  const float* x = in + blockIdx.x * cols;
  float* y = out + blockIdx.x * cols;
  float m = -__int_as_float(0x7f800000);
  for (long long c = threadIdx.x * kVec; c < cols; c += kRowThreads * kVec) {
    const Vec<float, kVec> v = load_vec<float, kVec>(x, c);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = fmaxf(m, v.v[k]);
  }
  m = block_max(m, smem);
  float s = 0.0f;
  for (long long c = threadIdx.x * kVec; c < cols; c += kRowThreads * kVec) {
    const Vec<float, kVec> v = load_vec<float, kVec>(x, c);
#pragma unroll
    for (int k = 0; k < kVec; ++k) s += expf(v.v[k] - m);
  }
  const float lse = m + logf(kjit::row_sum<kRowThreads>(s, smem));
  for (long long c = threadIdx.x * kVec; c < cols; c += kRowThreads * kVec) {
    Vec<float, kVec> v = load_vec<float, kVec>(x, c);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v.v[k] -= lse;
    store_vec<float, kVec>(y, c, v);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kRowThreads)
log_softmax_backward(const float* grad_out, const float* out, float* grad_in, long long cols) {
  __shared__ float smem[32];
  const long long base = blockIdx.x * cols;
  const float s = row_total<kVec>(grad_out + base, cols, smem);
  for (long long c = threadIdx.x * kVec; c < cols; c += kRowThreads * kVec) {
    const Vec<float, kVec> g = load_vec<float, kVec>(grad_out + base, c);
    const Vec<float, kVec> o = load_vec<float, kVec>(out + base, c);
    Vec<float, kVec> r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.v[k] = g.v[k] - expf(o.v[k]) * s;
    store_vec<float, kVec>(grad_in + base, c, r);
  }
}

// One block. The targets are in range by construction (PyTorch would assert on the device).
__global__ void __launch_bounds__(kRowThreads)
nll_loss(const float* logp, const long long* targets, long long rows, long long cols,
         long long ignore_index, float* loss, float* total_weight) {
  __shared__ float smem[32];
  float sum = 0.0f, count = 0.0f;
  for (long long r = threadIdx.x; r < rows; r += kRowThreads) {
    const long long t = targets[r];
    if (t != ignore_index) {
      sum -= logp[r * cols + t];
      count += 1.0f;
    }
  }
  sum = kjit::row_sum<kRowThreads>(sum, smem);
  count = kjit::row_sum<kRowThreads>(count, smem);
  if (threadIdx.x == 0) {
    *loss = sum / count;
    *total_weight = count;
  }
}

__global__ void nll_loss_backward(const long long* targets, long long rows, long long cols,
                                  long long ignore_index, const float* total_weight, float* grad) {
  const long long r = first_index(1);
  if (r < rows && targets[r] != ignore_index) grad[r * cols + targets[r]] = -1.0f / *total_weight;
}

}  // namespace eager
)cuda";

// The same values as the enums of kSource.
enum UnaryOp { kCast = 0, kSquare = 1 };
enum BinaryOp { kMul = 0, kAdd = 1 };
enum Broadcast { kFull = 0, kPerColumn = 1, kPerRow = 2 };
enum RowStat { kRstd = 0, kRstdBackward = 1 };
constexpr int kThreads = 256;      // elementwise kernels
constexpr int kRowThreads = 1024;  // kSource's kRowThreads

std::string UnaryName(DType a, DType out, int op, int vec) {
  return kjit::jit::Instantiate("eager::unary", a, out, op, vec);
}
std::string BinaryName(DType a, DType b, DType out, int op, int broadcast, int vec) {
  return kjit::jit::Instantiate("eager::binary", a, b, out, op, broadcast, vec);
}
std::string FillName(DType t) { return kjit::jit::Instantiate("eager::fill_normal", t); }
std::string RowStatName(int stat, int vec) {
  return kjit::jit::Instantiate("eager::row_stat", stat, vec);
}
std::string ColumnSumName(DType a, DType out) {
  return kjit::jit::Instantiate("eager::column_sum", a, out);
}
std::string LogSoftmaxName(bool backward, int vec) {
  return kjit::jit::Instantiate(
      backward ? "eager::log_softmax_backward" : "eager::log_softmax_forward", vec);
}
constexpr char kNllLoss[] = "eager::nll_loss";
constexpr char kNllLossBackward[] = "eager::nll_loss_backward";

absl::Status Contiguous(const char* name, const TensorView& v) {
  if (v.empty() || v.row_stride != v.cols) {
    return absl::InvalidArgumentError(fmt::format("{}: must be a contiguous matrix", name));
  }
  return absl::OkStatus();
}

absl::Status SameShape(const char* name, const TensorView& v, const TensorView& like) {
  KJIT_RETURN_IF_ERROR(Contiguous(name, v));
  if (v.rows != like.rows || v.cols != like.cols) {
    return absl::InvalidArgumentError(
        fmt::format("{}: is {}x{}, expected {}x{}", name, v.rows, v.cols, like.rows, like.cols));
  }
  return absl::OkStatus();
}

absl::Status OfShape(const char* name, const TensorView& v, DType dtype, int64_t rows,
                     int64_t cols) {
  KJIT_RETURN_IF_ERROR(SameShape(name, v, TensorView::Matrix(nullptr, dtype, rows, cols)));
  if (v.dtype != dtype) {
    return absl::InvalidArgumentError(fmt::format("{}: must be {}", name, kjit::Name(dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<kjit::jit::Source> EagerKernelsSource(int vec) {
  if (vec != 1 && vec != 4) return absl::InvalidArgumentError("vec: must be 1 or 4");
  const std::string* common = kjit::jit::FindEmbeddedTemplate("common.cuh");
  if (common == nullptr) return absl::NotFoundError("common.cuh is not embedded in this kjit");
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  kjit::jit::Source src;
  src.name = "finetune_step_eager";
  src.text = kSource;
  src.headers = {{"common.cuh", *common}};
  // Every instantiation the baseline launches.
  src.name_expressions = {
      FillName(bf16),
      UnaryName(bf16, f32, kCast, vec),
      UnaryName(f32, bf16, kCast, vec),
      UnaryName(f32, f32, kSquare, vec),
      BinaryName(f32, f32, f32, kMul, kPerRow, vec),
      BinaryName(f32, f32, f32, kMul, kFull, vec),
      BinaryName(f32, f32, f32, kAdd, kFull, vec),
      BinaryName(bf16, bf16, bf16, kMul, kPerColumn, vec),
      BinaryName(bf16, bf16, bf16, kMul, kFull, vec),
      RowStatName(kRstd, vec),
      RowStatName(kRstdBackward, vec),
      ColumnSumName(bf16, bf16),
      LogSoftmaxName(false, vec),
      LogSoftmaxName(true, vec),
      kNllLoss,
      kNllLossBackward,
  };
  src.params = {{"op", "finetune_step_eager"}, {"vec", std::to_string(vec)}};
  return src;
}

absl::StatusOr<EagerKernels> EagerKernels::Create(const kjit::Runtime& rt, int vec) {
  KJIT_ASSIGN_OR_RETURN(kjit::jit::Source src, EagerKernelsSource(vec));
  KJIT_ASSIGN_OR_RETURN(
      auto module, kjit::internal::StateOf(rt).jit->Load(src, kjit::internal::StateOf(rt).target,
                                                         *kjit::internal::StateOf(rt).driver,
                                                         kjit::internal::StateOf(rt).ctx));
  return EagerKernels(*kjit::internal::StateOf(rt).driver, std::move(module), vec,
                      rt.device().sm_count);
}

absl::Status EagerKernels::Launch(const std::string& kernel, int64_t grid, int block,
                                  void** args) const {
  if (grid < 1 || grid > 0x7fffffff) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} blocks is outside the grid", kernel, grid));
  }
  KJIT_ASSIGN_OR_RETURN(CUfunction fn, module_->Function(kernel));
  return kjit::Annotate(cu_->Check(cu_->cuLaunchKernel(fn, static_cast<unsigned>(grid), 1, 1, block,
                                                       1, 1, 0, nullptr, args, nullptr),
                                   "cuLaunchKernel"),
                        kernel);
}

absl::Status EagerKernels::LaunchElementwise(const std::string& kernel, int64_t n, int vec,
                                             void** args) const {
  // Grid-stride loops: enough blocks to fill the GPU, not one per element.
  const int64_t needed = (n / vec + kThreads - 1) / kThreads;
  return Launch(kernel, std::clamp<int64_t>(needed, 1, int64_t{sm_count_} * 32), kThreads, args);
}

absl::Status EagerKernels::FillNormal(const TensorView& out, uint64_t seed, float mean,
                                      float stddev) const {
  KJIT_RETURN_IF_ERROR(Contiguous("out", out));
  long long n = out.rows * out.cols;
  unsigned long long s = seed;
  void* data = out.data;
  void* args[] = {&data, &n, &s, &mean, &stddev};
  return LaunchElementwise(FillName(out.dtype), n, /*vec=*/1, args);
}

absl::Status EagerKernels::Unary(int op, const TensorView& a, const TensorView& out) const {
  KJIT_RETURN_IF_ERROR(Contiguous("a", a));
  KJIT_RETURN_IF_ERROR(SameShape("out", out, a));
  long long n = a.rows * a.cols;
  void* in = a.data;
  void* o = out.data;
  void* args[] = {&in, &o, &n};
  return LaunchElementwise(UnaryName(a.dtype, out.dtype, op, vec_), n, vec_, args);
}

absl::Status EagerKernels::Cast(const TensorView& a, const TensorView& out) const {
  return Unary(kCast, a, out);
}

absl::Status EagerKernels::Square(const TensorView& a, const TensorView& out) const {
  return Unary(kSquare, a, out);
}

absl::Status EagerKernels::Binary(int op, const TensorView& a, const TensorView& b,
                                  const TensorView& out) const {
  KJIT_RETURN_IF_ERROR(Contiguous("a", a));
  KJIT_RETURN_IF_ERROR(Contiguous("b", b));
  KJIT_RETURN_IF_ERROR(SameShape("out", out, a));
  int broadcast;
  if (b.rows == a.rows && b.cols == a.cols) {
    broadcast = kFull;
  } else if (b.rows == 1 && b.cols == a.cols) {
    broadcast = kPerColumn;
  } else if (b.rows == a.rows && b.cols == 1) {
    broadcast = kPerRow;
  } else {
    return absl::InvalidArgumentError(
        fmt::format("b: {}x{} does not broadcast to a's {}x{}", b.rows, b.cols, a.rows, a.cols));
  }
  long long n = a.rows * a.cols, cols = a.cols;
  void* pa = a.data;
  void* pb = b.data;
  void* po = out.data;
  void* args[] = {&pa, &pb, &po, &n, &cols};
  return LaunchElementwise(BinaryName(a.dtype, b.dtype, out.dtype, op, broadcast, vec_), n, vec_,
                           args);
}

absl::Status EagerKernels::Mul(const TensorView& a, const TensorView& b,
                               const TensorView& out) const {
  return Binary(kMul, a, b, out);
}

absl::Status EagerKernels::Add(const TensorView& a, const TensorView& b,
                               const TensorView& out) const {
  return Binary(kAdd, a, b, out);
}

absl::Status EagerKernels::ColumnSum(const TensorView& a, const TensorView& out) const {
  KJIT_RETURN_IF_ERROR(Contiguous("a", a));
  KJIT_RETURN_IF_ERROR(OfShape("out", out, out.dtype, 1, a.cols));
  long long rows = a.rows, cols = a.cols;
  void* in = a.data;
  void* o = out.data;
  void* args[] = {&in, &rows, &cols, &o};
  return Launch(ColumnSumName(a.dtype, out.dtype), (cols + 31) / 32, 1024, args);
}

absl::Status EagerKernels::Rstd(const TensorView& squares, float eps,
                                const TensorView& rstd) const {
  KJIT_RETURN_IF_ERROR(OfShape("squares", squares, DType::kF32, squares.rows, squares.cols));
  KJIT_RETURN_IF_ERROR(OfShape("rstd", rstd, DType::kF32, squares.rows, 1));
  long long cols = squares.cols;
  void* in = squares.data;
  void* unused = nullptr;
  void* o = rstd.data;
  void* args[] = {&in, &cols, &eps, &unused, &o};
  return Launch(RowStatName(kRstd, vec_), squares.rows, kRowThreads, args);
}

absl::Status EagerKernels::RstdBackward(const TensorView& prod, const TensorView& rstd,
                                        const TensorView& coef) const {
  KJIT_RETURN_IF_ERROR(OfShape("prod", prod, DType::kF32, prod.rows, prod.cols));
  KJIT_RETURN_IF_ERROR(OfShape("rstd", rstd, DType::kF32, prod.rows, 1));
  KJIT_RETURN_IF_ERROR(OfShape("coef", coef, DType::kF32, prod.rows, 1));
  long long cols = prod.cols;
  float eps = 0;
  void* in = prod.data;
  void* r = rstd.data;
  void* o = coef.data;
  void* args[] = {&in, &cols, &eps, &r, &o};
  return Launch(RowStatName(kRstdBackward, vec_), prod.rows, kRowThreads, args);
}

absl::Status EagerKernels::LogSoftmax(const TensorView& in, const TensorView& out) const {
  KJIT_RETURN_IF_ERROR(OfShape("in", in, DType::kF32, in.rows, in.cols));
  KJIT_RETURN_IF_ERROR(OfShape("out", out, DType::kF32, in.rows, in.cols));
  long long cols = in.cols;
  void* i = in.data;
  void* o = out.data;
  void* args[] = {&i, &o, &cols};
  return Launch(LogSoftmaxName(false, vec_), in.rows, kRowThreads, args);
}

absl::Status EagerKernels::LogSoftmaxBackward(const TensorView& grad_out, const TensorView& out,
                                              const TensorView& grad_in) const {
  KJIT_RETURN_IF_ERROR(OfShape("grad_out", grad_out, DType::kF32, grad_out.rows, grad_out.cols));
  KJIT_RETURN_IF_ERROR(OfShape("out", out, DType::kF32, grad_out.rows, grad_out.cols));
  KJIT_RETURN_IF_ERROR(OfShape("grad_in", grad_in, DType::kF32, grad_out.rows, grad_out.cols));
  long long cols = grad_out.cols;
  void* g = grad_out.data;
  void* o = out.data;
  void* gi = grad_in.data;
  void* args[] = {&g, &o, &gi, &cols};
  return Launch(LogSoftmaxName(true, vec_), grad_out.rows, kRowThreads, args);
}

absl::Status EagerKernels::NllLoss(const TensorView& logp, const void* targets,
                                   int64_t ignore_index, const TensorView& loss,
                                   const TensorView& total_weight) const {
  KJIT_RETURN_IF_ERROR(OfShape("logp", logp, DType::kF32, logp.rows, logp.cols));
  KJIT_RETURN_IF_ERROR(OfShape("loss", loss, DType::kF32, 1, 1));
  KJIT_RETURN_IF_ERROR(OfShape("total_weight", total_weight, DType::kF32, 1, 1));
  long long rows = logp.rows, cols = logp.cols, ignore = ignore_index;
  void* lp = logp.data;
  void* t = const_cast<void*>(targets);
  void* l = loss.data;
  void* w = total_weight.data;
  void* args[] = {&lp, &t, &rows, &cols, &ignore, &l, &w};
  return Launch(kNllLoss, 1, kRowThreads, args);
}

absl::Status EagerKernels::NllLossBackward(const void* targets, int64_t ignore_index,
                                           const TensorView& total_weight,
                                           const TensorView& grad) const {
  KJIT_RETURN_IF_ERROR(OfShape("grad", grad, DType::kF32, grad.rows, grad.cols));
  KJIT_RETURN_IF_ERROR(OfShape("total_weight", total_weight, DType::kF32, 1, 1));
  // zeros_like(logp), then the scatter: PyTorch's nll_loss_backward.
  KJIT_RETURN_IF_ERROR(cu_->Check(cu_->cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(grad.data), 0,
                                                        grad.rows * grad.cols, nullptr),
                                  "cuMemsetD32Async"));
  long long rows = grad.rows, cols = grad.cols, ignore = ignore_index;
  void* t = const_cast<void*>(targets);
  void* w = total_weight.data;
  void* g = grad.data;
  void* args[] = {&t, &rows, &cols, &ignore, &w, &g};
  return Launch(kNllLossBackward, (rows + kThreads - 1) / kThreads, kThreads, args);
}

}  // namespace finetune
