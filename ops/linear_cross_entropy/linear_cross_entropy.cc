#include "kjit/linear_cross_entropy.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "jit/dtype.h"
#include "jit/instantiation.h"
#include "jit/status_helpers.h"
#include "ops/cross_entropy/program.h"
#include "ops/gemm/hopper_gemm.h"
#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/cublaslt.h"
#include "ops/linear_cross_entropy/launch_args.h"
#include "ops/linear_cross_entropy/program.h"
#include "ops/linear_cross_entropy/tuning_key.h"
#include "runtime/op_kernels.h"
#include "runtime/runtime_state.h"
#include "runtime/tensor_checks.h"
#include "runtime/tuned_configs.h"
#include "templates/linear_cross_entropy_params.h"

namespace kjit {

namespace {

constexpr int64_t kMaxHidden = 65536;
constexpr int kCountThreads = 1024;
constexpr int kReduceThreads = 1024;
constexpr int kStoreThreads = 256;  // the store and rescale kernels'
constexpr int kStoreVec = 4;
constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// One chunk's product goes straight into d_weight, rounded once as the accumulator's would be.
bool NeedsWeightAccumulator(const LinearCrossEntropySpec& s, int64_t chunks) {
  return s.weight_grad_accumulation == WeightGradAccumulation::kFloat32 &&
         s.weight_grad() != DType::kF32 && chunks > 1;
}

int64_t ChunkRows(const LinearCrossEntropyConfig& c, int64_t rows) {
  rows = std::max<int64_t>(rows, 1);
  return rows <= c.whole_rows ? rows : std::min(c.chunk_rows, rows);
}
int64_t Chunks(const LinearCrossEntropyConfig& c, int64_t rows) {
  return (std::max<int64_t>(rows, 1) + ChunkRows(c, rows) - 1) / ChunkRows(c, rows);
}

std::string StoreExpr(const LinearCrossEntropySpec& s, int vec, bool accumulate) {
  return jit::Instantiate("kjit::linear_cross_entropy_store", s.weight_grad(), kStoreThreads, vec,
                          accumulate);
}

// The dtypes RescaleGradients scales, in the rescale program's order.
std::vector<DType> RescaleDTypes(const LinearCrossEntropySpec& s) {
  if (s.weight_grad() == s.dtype) return {s.dtype};
  return {s.dtype, s.weight_grad()};
}

// The grid-stride launch of the store and rescale kernels over a [rows, cols] matrix: the widest
// vectors its address, row stride and width allow, at most 16 blocks per SM.
struct MatrixLaunch {
  bool wide = false;
  int64_t blocks = 1;
};
MatrixLaunch MatrixLaunchFor(const TensorView& t, int sm_count) {
  MatrixLaunch m;
  m.wide = internal::WidestAlignedVec(kStoreVec, {&t}) == kStoreVec && t.cols % kStoreVec == 0;
  const int64_t vectors = t.rows * (t.cols / (m.wide ? kStoreVec : 1));
  m.blocks =
      std::clamp<int64_t>((vectors + kStoreThreads - 1) / kStoreThreads, 1, int64_t{sm_count} * 16);
  return m;
}

}  // namespace

CrossEntropySpec LinearCrossEntropySpec::ChunkLoss() const {
  CrossEntropySpec chunk{.vocab = vocab, .dtype = dtype, .loss = loss};
  if (loss.reduction == Reduction::kMean) chunk.loss.reduction = Reduction::kSum;
  return chunk;
}

absl::Status ValidateLinearCrossEntropySpec(const LinearCrossEntropySpec& s) {
  if (s.hidden < 1 || s.hidden > kMaxHidden) {
    return absl::InvalidArgumentError(
        fmt::format("hidden: {} is out of range, expected 1 to {}", s.hidden, kMaxHidden));
  }
  if (s.weight_grad() != s.dtype && s.weight_grad() != DType::kF32) {
    return absl::InvalidArgumentError(fmt::format("weight_grad_dtype: {} must be {} or fp32",
                                                  Name(s.weight_grad()), Name(s.dtype)));
  }
  if (s.config) KJIT_RETURN_IF_ERROR(ops::ValidateLinearCrossEntropyConfig(*s.config));
  // The rest are the loss's options, worded as CrossEntropy words them.
  return ValidateCrossEntropySpec(s.ChunkLoss());
}

absl::StatusOr<jit::Source> ops::RenderLinearCrossEntropy(const LinearCrossEntropySpec& s) {
  KJIT_RETURN_IF_ERROR(ValidateLinearCrossEntropySpec(s));
  const CrossEntropySpec loss = s.ChunkLoss();
  std::map<std::string, std::string> params = {
      {"op", "linear_cross_entropy"},
      {"vocab", std::to_string(s.vocab)},
      {"hidden", std::to_string(s.hidden)},
      {"dtype", Name(s.dtype)},
      {"weight_grad_dtype", Name(s.weight_grad())},
      {"target_type", Name(s.loss.target_type)},
      {"reduction", Name(s.loss.reduction)},
  };
  // What else the program's text depends on (the count kernel's), so that `kjit cache ls` tells
  // such entries apart; absent when off, as older entries were made.
  if (s.loss.label_smoothing > 0) params["label_smoothing"] = "on";
  if (s.loss.class_weight_dtype) params["class_weight_dtype"] = Name(*s.loss.class_weight_dtype);
  // Order matters: LinearCrossEntropyKernels reads them back by position.
  std::vector<std::string> kernels = {
      CrossEntropyCountExpr(loss, kCountThreads),
      jit::Instantiate("kjit::linear_cross_entropy_scale", s.loss.reduction == Reduction::kMean),
      CrossEntropyReduceExpr(
          s.loss.reduction == Reduction::kMean ? Reduction::kMean : Reduction::kSum,
          kReduceThreads)};
  if (s.weight_grad() != DType::kF32) {
    for (int vec : {1, kStoreVec}) {
      for (bool accumulate : {false, true}) kernels.push_back(StoreExpr(s, vec, accumulate));
    }
  }
  return jit::RenderSource("linear_cross_entropy",
                           {"common.cuh", "cross_entropy_params.h", "cross_entropy.cuh",
                            "linear_cross_entropy_params.h", "linear_cross_entropy.cuh"},
                           std::move(kernels), std::move(params));
}

absl::StatusOr<jit::Source> ops::RenderLinearCrossEntropyRescale(const LinearCrossEntropySpec& s) {
  KJIT_RETURN_IF_ERROR(ValidateLinearCrossEntropySpec(s));
  std::vector<std::string> kernels;
  for (DType t : RescaleDTypes(s)) {
    for (int vec : {1, kStoreVec}) {
      kernels.push_back(
          jit::Instantiate("kjit::linear_cross_entropy_rescale", t, kStoreThreads, vec));
    }
  }
  return jit::RenderSource("linear_cross_entropy.rescale",
                           {"common.cuh", "cross_entropy_params.h", "cross_entropy.cuh",
                            "linear_cross_entropy_params.h", "linear_cross_entropy.cuh"},
                           std::move(kernels),
                           {{"op", "linear_cross_entropy"},
                            {"dtype", Name(s.dtype)},
                            {"weight_grad_dtype", Name(s.weight_grad())}});
}

namespace internal {

struct LinearCrossEntropyKernels {
  enum Kernel { kCount, kScale, kReduce, kStore, kStoreAccumulate, kStoreVec, kStoreVecAccumulate };
  LoadedProgram program;
  CUfunction operator[](Kernel k) const { return program.functions[k]; }
};

struct LinearCrossEntropyState {
  LinearCrossEntropySpec spec;
  LinearCrossEntropyConfig config;  // the spec's or the heuristic's
  // Unless the spec has a config: kjit-tune's per rows bucket (never tuned at a launch: a tuning
  // run of this op takes minutes). Under config_mu.
  std::optional<TunedConfigs<LinearCrossEntropyConfig>> tuned;
  std::mutex config_mu;
  std::optional<kjit::CrossEntropy> loss;
  const jit::Driver* driver = nullptr;
  // Under mu: one launch sequence at a time, since the GEMM plans, the second stream and its
  // events are shared.
  std::mutex mu;
  std::optional<LinearCrossEntropyKernels> kernels;
  std::optional<LoadedProgram> rescale;  // RescaleGradients', loaded on its first call
  std::unique_ptr<ops::LtGemm> gemm;
  std::unique_ptr<ops::HopperGemm> own_gemm;  // for the config's GEMMs that ask for kjit's
  CUstream side = nullptr;
  CUevent logits_ready[2] = {}, loss_done[2] = {};

  ~LinearCrossEntropyState() {
    if (driver == nullptr) return;
    for (CUevent e : {logits_ready[0], logits_ready[1], loss_done[0], loss_done[1]}) {
      if (e) driver->cuEventDestroy(e);
    }
    if (side) driver->cuStreamDestroy(side);
  }
};

}  // namespace internal

namespace {

// Where each part of the caller's workspace lies, for one launch config.
struct WorkspaceLayout {
  int64_t counters = 0;  // CrossEntropyCounters, then the scale (one float)
  int64_t parts = 0;     // one fp32 loss per chunk (sum, mean)
  int64_t loss_workspace = 0;
  int64_t ones = 0;      // chunk_rows ones in dtype (bias)
  int64_t bias_acc = 0;  // fp32 [vocab] (bias, fp32 accumulation into a non-fp32 d_bias)
  int64_t lt = 0;        // cuBLASLt's
  int64_t chunks = 0;    // streams chunk buffers
  int64_t chunk_bytes = 0;
  int64_t weight_acc = 0;  // fp32 [vocab, hidden]
  int64_t total = 0;
};

WorkspaceLayout LayoutFor(const LinearCrossEntropySpec& s, const LinearCrossEntropyConfig& c,
                          int64_t rows, int64_t loss_workspace_bytes) {
  const int64_t chunk_rows = ChunkRows(c, rows), chunks = Chunks(c, rows);
  const int64_t e = static_cast<int64_t>(SizeOf(s.dtype));
  const bool acc = NeedsWeightAccumulator(s, chunks);
  WorkspaceLayout l;
  int64_t at = AlignUp(int64_t{sizeof(CrossEntropyCounters)} + 4);
  l.parts = at;
  at += AlignUp(chunks * 4);
  l.loss_workspace = at;
  at += AlignUp(loss_workspace_bytes);
  l.ones = at;
  if (s.bias) at += AlignUp(chunk_rows * e);
  l.bias_acc = at;
  if (s.bias && acc) at += AlignUp(s.vocab * 4);
  l.lt = at;
  at += static_cast<int64_t>(ops::LtGemm::kWorkspaceBytes);
  l.chunks = at;
  l.chunk_bytes = AlignUp(chunk_rows * ops::ChunkRowStride(s.vocab, s.dtype) * e);
  at += (chunks > 1 ? c.streams : 1) * l.chunk_bytes;
  l.weight_acc = at;
  if (acc) at += AlignUp(s.vocab * s.hidden * 4);
  l.total = at;
  return l;
}

TensorView RowsOf(const TensorView& t, int64_t first, int64_t rows) {
  TensorView v = t;
  v.data =
      static_cast<char*>(t.data) + first * t.row_stride * static_cast<int64_t>(SizeOf(t.dtype));
  v.rows = rows;
  return v;
}
// Columns of a vector; an absent (null) vector stays absent.
TensorView ColsOf(const TensorView& t, int64_t first, int64_t cols) {
  TensorView v = t;
  if (!t.empty())
    v.data = static_cast<char*>(t.data) + first * static_cast<int64_t>(SizeOf(t.dtype));
  v.cols = v.row_stride = cols;
  return v;
}
IndexView PartOf(const IndexView& v, int64_t first, int64_t size) {
  if (v.empty()) return v;
  return IndexView::Of(static_cast<char*>(v.data) + first * static_cast<int64_t>(SizeOf(v.type)),
                       v.type, size);
}

absl::Status LoadKernels(const internal::RuntimeState& rt, internal::LinearCrossEntropyState& op) {
  if (op.kernels) return absl::OkStatus();
  KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderLinearCrossEntropy(op.spec));
  KJIT_ASSIGN_OR_RETURN(internal::LoadedProgram program, internal::LoadProgram(rt, src));
  op.kernels.emplace(internal::LinearCrossEntropyKernels{std::move(program)});
  return absl::OkStatus();
}

// The GEMM handle, the second stream and its events, made on first use (the context current).
absl::Status Prepare(const internal::RuntimeState& rt, internal::LinearCrossEntropyState& op,
                     int streams) {
  KJIT_RETURN_IF_ERROR(LoadKernels(rt, op));
  if (!op.gemm) {
    KJIT_ASSIGN_OR_RETURN(const ops::CublasLt* lt, ops::CublasLt::Get());
    KJIT_ASSIGN_OR_RETURN(op.gemm, ops::LtGemm::Create(*lt));
    op.own_gemm = std::make_unique<ops::HopperGemm>(rt);
  }
  if (streams > 1 && op.side == nullptr) {
    const jit::Driver& cu = *rt.driver;
    op.driver = rt.driver;
    KJIT_RETURN_IF_ERROR(
        cu.Check(cu.cuStreamCreate(&op.side, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    for (CUevent* e :
         {&op.logits_ready[0], &op.logits_ready[1], &op.loss_done[0], &op.loss_done[1]}) {
      KJIT_RETURN_IF_ERROR(cu.Check(cu.cuEventCreate(e, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    }
  }
  return absl::OkStatus();
}

// One Run's launches, once its arguments are checked and the op prepared (under its mutex): each
// kernel and GEMM a named step, all on `stream` but the loss kernels, which run on the op's second
// stream when the config has two.
struct ChunkedRun {
  ChunkedRun(const internal::RuntimeState& rt, internal::LinearCrossEntropyState& op,
             CUstream stream, const LinearCrossEntropyArgs& a, bool gradient,
             const LinearCrossEntropyConfig& config, const WorkspaceLayout& l);

  // The whole batch's counters, and for sum and mean the scale every chunk's gradient takes.
  absl::Status Count();
  absl::Status Scale();
  // chunk_rows ones in dtype, which the bias gradient's GEMM sums a chunk's rows with.
  absl::Status FillOnes();
  // Every chunk's logits GEMM, loss kernel and (with the gradient) gradient GEMMs.
  absl::Status ChunkLoop();
  // The chunks' losses into the loss (sum, mean).
  absl::Status Reduce();
  // The fp32 accumulator `sum` into the gradient `out` (absent: nothing).
  absl::Status Store(const TensorView& sum, const TensorView& out);

  TensorView ChunkView(int64_t c) const;
  // kjit's own GEMM where the config asks for it and it applies; else cuBLASLt (loudly when asked).
  absl::Status RunGemm(const ops::GemmArgs& args);
  absl::Status LogitsGemm(int64_t c);
  absl::Status LossKernel(int64_t c);
  absl::Status GradientGemms(int64_t c);
  absl::Status StartChunk(int64_t c);
  absl::Status Record(CUevent e, CUstream on);
  absl::Status Wait(CUstream on, CUevent e);

  const internal::RuntimeState& rt;
  internal::LinearCrossEntropyState& op;
  const internal::LinearCrossEntropyKernels& k;
  const jit::Driver& cu;
  const CUstream stream;
  const LinearCrossEntropyArgs& a;
  const bool gradient;
  const LinearCrossEntropySpec& s;
  const LinearCrossEntropyConfig& config;
  const WorkspaceLayout& l;
  const int64_t rows, chunk_rows, chunks;
  char* const ws;
  CrossEntropyCounters* const counters;
  float* const scale;
  float* const parts;
  void* const lt_workspace;
  const bool reduced;
  const bool acc;
  const TensorView weight_sum, bias_sum;
  // Adding to what d_weight holds from the first chunk on when it is the accumulator itself.
  const bool add_first;
  const bool want_bias_grad;
  const int64_t stride;
  const CUstream loss_stream;
};

ChunkedRun::ChunkedRun(const internal::RuntimeState& rt_in,
                       internal::LinearCrossEntropyState& op_in, CUstream stream_in,
                       const LinearCrossEntropyArgs& a_in, bool gradient_in,
                       const LinearCrossEntropyConfig& config_in, const WorkspaceLayout& l_in)
    : rt(rt_in),
      op(op_in),
      k(*op.kernels),
      cu(*rt.driver),
      stream(stream_in),
      a(a_in),
      gradient(gradient_in),
      s(op.spec),
      config(config_in),
      l(l_in),
      rows(a.hidden_states.rows),
      chunk_rows(ChunkRows(config, rows)),
      chunks((rows + chunk_rows - 1) / chunk_rows),
      ws(static_cast<char*>(a.workspace)),
      counters(reinterpret_cast<CrossEntropyCounters*>(ws + l.counters)),
      scale(reinterpret_cast<float*>(ws + l.counters + sizeof(CrossEntropyCounters))),
      parts(reinterpret_cast<float*>(ws + l.parts)),
      lt_workspace(ws + l.lt),
      reduced(s.loss.reduction != Reduction::kNone),
      acc(NeedsWeightAccumulator(s, chunks)),
      weight_sum(acc ? TensorView::Matrix(ws + l.weight_acc, DType::kF32, s.vocab, s.hidden)
                     : a.d_weight),
      bias_sum(acc ? TensorView::Vector(ws + l.bias_acc, DType::kF32, s.vocab) : a.d_bias),
      add_first(a.accumulate && !acc),
      want_bias_grad(gradient && !a.d_bias.empty()),
      stride(ops::ChunkRowStride(s.vocab, s.dtype)),
      loss_stream(config.streams > 1 ? op.side : stream) {}

absl::Status ChunkedRun::Count() {
  CrossEntropyCountParams count{a.targets.data, rows, s.loss.ignore_index, a.class_weight.data,
                                counters};
  return rt.Launch(k[k.kCount], 1, kCountThreads, stream, &count);
}

absl::Status ChunkedRun::Scale() {
  LinearCrossEntropyScaleParams p{counters, static_cast<const float*>(a.grad_output.data), scale};
  return rt.Launch(k[k.kScale], 1, 32, stream, &p, 1, 0, true);
}

absl::Status ChunkedRun::FillOnes() {
  void* ones = ws + l.ones;
  const CUresult r =
      s.dtype == DType::kF32
          ? cu.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(ones), 0x3f800000u, chunk_rows,
                                stream)
          : cu.cuMemsetD16Async(reinterpret_cast<CUdeviceptr>(ones),
                                s.dtype == DType::kBF16 ? 0x3f80 : 0x3c00, chunk_rows, stream);
  return cu.Check(r, s.dtype == DType::kF32 ? "cuMemsetD32Async" : "cuMemsetD16Async");
}

TensorView ChunkedRun::ChunkView(int64_t c) const {
  const int64_t first = c * chunk_rows;
  return TensorView::Matrix(ws + l.chunks + (c % config.streams) * l.chunk_bytes, s.dtype,
                            std::min(chunk_rows, rows - first), s.vocab, stride);
}

absl::Status ChunkedRun::RunGemm(const ops::GemmArgs& args) {
  if (args.algo == ops::kOwnGemm) {
    const absl::Status applies = ops::HopperGemm::Supports(args, rt.target);
    if (applies.ok()) {
      KJIT_ASSIGN_OR_RETURN(const ops::GemmShape shape, ops::ShapeOf(args));
      return op.own_gemm->Run(args, ops::DefaultGemmConfig(shape.m, shape.n, shape.k), stream);
    }
    rt.Warn(
        fmt::format("linear cross-entropy: a GEMM runs on cuBLASLt: {}", ToStd(applies.message())));
  }
  return op.gemm->Run(args, lt_workspace, stream);
}

absl::Status ChunkedRun::LogitsGemm(int64_t c) {
  const TensorView logits = ChunkView(c);
  return RunGemm({.a = RowsOf(a.hidden_states, c * chunk_rows, logits.rows),
                  .b = a.weight,
                  .transpose_b = true,
                  .out = logits,
                  .bias = a.bias,
                  .algo = config.logits_algo});
}

absl::Status ChunkedRun::LossKernel(int64_t c) {
  const TensorView logits = ChunkView(c);
  const int64_t first = c * chunk_rows, n = logits.rows;
  CrossEntropyArgs ce{
      .logits = logits,
      .targets = PartOf(a.targets, first, n),
      .loss = reduced ? TensorView::Vector(parts + c, DType::kF32, 1) : ColsOf(a.loss, first, n),
      .lse = ColsOf(a.lse, first, n),
      .argmax = PartOf(a.argmax, first, n),
      .entropy = ColsOf(a.entropy, first, n),
      .target_logprob = ColsOf(a.target_logprob, first, n),
      .class_weight = a.class_weight,
      .workspace = ws + l.loss_workspace,
      .workspace_bytes = op.loss->WorkspaceBytes(chunk_rows)};
  if (!gradient) return op.loss->Forward(loss_stream, ce);
  ce.grad = logits;  // in place
  ce.grad_output =
      reduced ? TensorView::Vector(scale, DType::kF32, 1) : ColsOf(a.grad_output, first, n);
  return op.loss->ForwardBackward(loss_stream, ce);
}

absl::Status ChunkedRun::GradientGemms(int64_t c) {
  const TensorView dlogits = ChunkView(c);
  const int64_t first = c * chunk_rows;
  const TensorView h = RowsOf(a.hidden_states, first, dlogits.rows);
  if (!a.d_hidden.empty()) {
    KJIT_RETURN_IF_ERROR(RunGemm({.a = dlogits,
                                  .b = a.weight,
                                  .out = RowsOf(a.d_hidden, first, dlogits.rows),
                                  .algo = config.d_hidden_algo}));
  }
  const float beta = c > 0 || add_first ? 1.0f : 0.0f;
  if (!a.d_weight.empty()) {
    KJIT_RETURN_IF_ERROR(RunGemm({.a = dlogits,
                                  .transpose_a = true,
                                  .b = h,
                                  .out = weight_sum,
                                  .beta = beta,
                                  .algo = config.d_weight_algo}));
  }
  if (want_bias_grad) {
    const TensorView ones = TensorView::Matrix(ws + l.ones, s.dtype, 1, dlogits.rows);
    KJIT_RETURN_IF_ERROR(RunGemm({.a = ones, .b = dlogits, .out = bias_sum, .beta = beta}));
  }
  return absl::OkStatus();
}

absl::Status ChunkedRun::Record(CUevent e, CUstream on) {
  return cu.Check(cu.cuEventRecord(e, on), "cuEventRecord");
}

absl::Status ChunkedRun::Wait(CUstream on, CUevent e) {
  return cu.Check(cu.cuStreamWaitEvent(on, e, 0), "cuStreamWaitEvent");
}

absl::Status ChunkedRun::StartChunk(int64_t c) {
  KJIT_RETURN_IF_ERROR(LogitsGemm(c));
  if (config.streams == 1) return LossKernel(c);
  KJIT_RETURN_IF_ERROR(Record(op.logits_ready[c % 2], stream));
  KJIT_RETURN_IF_ERROR(Wait(op.side, op.logits_ready[c % 2]));
  KJIT_RETURN_IF_ERROR(LossKernel(c));
  return Record(op.loss_done[c % 2], op.side);
}

// One stream: logits, loss, gradients, chunk after chunk. Two: chunk c + 1's logits GEMM is
// enqueued before chunk c's gradient GEMMs, so that c's loss kernel (on the second stream) runs
// beside it; each buffer's reuse two chunks later follows its gradient GEMMs on `stream`.
absl::Status ChunkedRun::ChunkLoop() {
  KJIT_RETURN_IF_ERROR(StartChunk(0));
  for (int64_t c = 0; c < chunks; ++c) {
    if (config.streams > 1) {
      if (c + 1 < chunks) KJIT_RETURN_IF_ERROR(StartChunk(c + 1));
      KJIT_RETURN_IF_ERROR(Wait(stream, op.loss_done[c % 2]));  // joins the second stream
    }
    if (gradient) KJIT_RETURN_IF_ERROR(GradientGemms(c));
    if (config.streams == 1 && c + 1 < chunks) KJIT_RETURN_IF_ERROR(StartChunk(c + 1));
  }
  return absl::OkStatus();
}

absl::Status ChunkedRun::Reduce() {
  CrossEntropyReduceParams r{parts, chunks, counters, static_cast<float*>(a.loss.data)};
  return rt.Launch(k[k.kReduce], 1, kReduceThreads, stream, &r);
}

absl::Status ChunkedRun::Store(const TensorView& sum, const TensorView& out) {
  if (out.empty()) return absl::OkStatus();
  const MatrixLaunch m = MatrixLaunchFor(out, rt.device.sm_count);
  const auto kernel = m.wide ? (a.accumulate ? k.kStoreVecAccumulate : k.kStoreVec)
                             : (a.accumulate ? k.kStoreAccumulate : k.kStore);
  LinearCrossEntropyStoreParams p{static_cast<const float*>(sum.data), out.data, out.rows, out.cols,
                                  out.row_stride};
  return rt.Launch(k[kernel], m.blocks, kStoreThreads, stream, &p);
}

}  // namespace

const LinearCrossEntropySpec& LinearCrossEntropy::spec() const { return op_->spec; }

const LinearCrossEntropyConfig& LinearCrossEntropy::config() const { return op_->config; }

LinearCrossEntropyConfig LinearCrossEntropy::ConfigFor(int64_t rows) const {
  if (!op_->tuned) return op_->config;
  std::lock_guard<std::mutex> lock(op_->config_mu);
  return op_->tuned->For(rows, /*may_tune=*/false).value_or(op_->config);
}

int64_t LinearCrossEntropy::AccumulatorBytes(int64_t rows) const {
  return NeedsWeightAccumulator(op_->spec, Chunks(ConfigFor(rows), rows))
             ? AlignUp(op_->spec.vocab * op_->spec.hidden * 4)
             : 0;
}

int64_t LinearCrossEntropy::WorkspaceBytes(int64_t rows) const {
  const LinearCrossEntropyConfig c = ConfigFor(rows);
  return LayoutFor(op_->spec, c, rows, op_->loss->WorkspaceBytes(ChunkRows(c, rows))).total;
}

absl::StatusOr<BuildInfo> LinearCrossEntropy::Build() const {
  KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderLinearCrossEntropy(op_->spec));
  KJIT_ASSIGN_OR_RETURN(jit::Source rescale, ops::RenderLinearCrossEntropyRescale(op_->spec));
  // With the chunk loss's programs for the launches Run makes of it (forward+backward, forward;
  // never its backward or rescale), all built in parallel.
  std::vector<jit::Source> sources = {std::move(src), std::move(rescale)};
  std::vector<ops::CrossEntropyProgram> programs;
  for (ops::CrossEntropyLaunch launch :
       {ops::CrossEntropyLaunch::kForwardBackward, ops::CrossEntropyLaunch::kForward}) {
    for (ops::CrossEntropyProgram p : ops::CrossEntropyLaunchPrograms(launch)) {
      if (std::find(programs.begin(), programs.end(), p) == programs.end()) programs.push_back(p);
    }
  }
  for (ops::CrossEntropyProgram program : programs) {
    KJIT_ASSIGN_OR_RETURN(jit::Source loss,
                          ops::RenderCrossEntropy(op_->loss->spec(), op_->loss->config(), program));
    sources.push_back(std::move(loss));
  }
  KJIT_ASSIGN_OR_RETURN(std::vector<jit::Jit::Built> built,
                        rt_->jit->BuildAll(sources, rt_->target));
  return internal::ToBuildInfo(built);
}

absl::Status LinearCrossEntropy::Forward(CUstream stream, const LinearCrossEntropyArgs& a) const {
  return Run(stream, a, /*gradient=*/false);
}

absl::Status LinearCrossEntropy::ForwardBackward(CUstream stream,
                                                 const LinearCrossEntropyArgs& a) const {
  return Run(stream, a, /*gradient=*/true);
}

absl::Status LinearCrossEntropy::Run(CUstream stream, const LinearCrossEntropyArgs& a,
                                     bool gradient) const {
  const LinearCrossEntropySpec& s = op_->spec;
  KJIT_RETURN_IF_ERROR(ops::CheckLinearCrossEntropyArgs(s, a, gradient));
  const int64_t rows = a.hidden_states.rows;
  // One lookup: the layout and the size checked are the same config's.
  const LinearCrossEntropyConfig config = ConfigFor(rows);
  const int64_t chunk_rows = ChunkRows(config, rows);
  const WorkspaceLayout l = LayoutFor(s, config, rows, op_->loss->WorkspaceBytes(chunk_rows));
  KJIT_RETURN_IF_ERROR(ops::CheckLinearCrossEntropyWorkspace(a, l.total, kAlign));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());
  KJIT_RETURN_IF_ERROR(rt_->MakeCurrent());

  internal::LinearCrossEntropyState& op = *op_;
  std::lock_guard<std::mutex> lock(op.mu);
  KJIT_RETURN_IF_ERROR(Prepare(*rt_, op, config.streams));
  ChunkedRun run(*rt_, op, stream, a, gradient, config, l);
  KJIT_RETURN_IF_ERROR(run.Count());
  if (gradient && run.reduced) KJIT_RETURN_IF_ERROR(run.Scale());
  if (run.want_bias_grad) KJIT_RETURN_IF_ERROR(run.FillOnes());
  KJIT_RETURN_IF_ERROR(run.ChunkLoop());
  if (run.reduced) KJIT_RETURN_IF_ERROR(run.Reduce());
  if (!run.acc || !gradient) return absl::OkStatus();
  KJIT_RETURN_IF_ERROR(run.Store(run.weight_sum, a.d_weight));
  return run.Store(run.bias_sum, a.d_bias);
}

absl::Status LinearCrossEntropy::RescaleGradients(CUstream stream,
                                                  const LinearCrossEntropyRescaleArgs& a) const {
  using internal::CheckMatrix;
  const LinearCrossEntropySpec& s = op_->spec;
  if (s.loss.reduction == Reduction::kNone) {
    return absl::InvalidArgumentError(
        "RescaleGradients: reduction none's per-row upstream gradients do not scale d_weight; run "
        "ForwardBackward with them as grad_output instead");
  }
  if (!a.d_hidden.empty()) {
    KJIT_RETURN_IF_ERROR(
        CheckMatrix("d_hidden", a.d_hidden, s.dtype, internal::kAnyRows, s.hidden));
  }
  if (!a.d_weight.empty())
    KJIT_RETURN_IF_ERROR(CheckMatrix("d_weight", a.d_weight, s.weight_grad(), s.vocab, s.hidden));
  if (!a.d_bias.empty()) {
    if (!s.bias) {
      return absl::InvalidArgumentError(
          "d_bias: given, but the op was created without a bias (set the spec's bias)");
    }
    KJIT_RETURN_IF_ERROR(CheckMatrix("d_bias", a.d_bias, s.weight_grad(), 1, s.vocab));
  }
  KJIT_RETURN_IF_ERROR(CheckMatrix("grad_output", a.grad_output, DType::kF32, 1, 1));
  if (!a.applied.empty())
    KJIT_RETURN_IF_ERROR(CheckMatrix("applied", a.applied, DType::kF32, 1, 1));
  KJIT_RETURN_IF_ERROR(internal::CheckDisjoint(
      {{"d_hidden", a.d_hidden}, {"d_weight", a.d_weight}, {"d_bias", a.d_bias}},
      {{"grad_output", a.grad_output}, {"applied", a.applied}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());
  KJIT_RETURN_IF_ERROR(rt_->MakeCurrent());

  internal::LinearCrossEntropyState& op = *op_;
  std::lock_guard<std::mutex> lock(op.mu);
  if (!op.rescale) {
    KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderLinearCrossEntropyRescale(s));
    KJIT_ASSIGN_OR_RETURN(internal::LoadedProgram program, internal::LoadProgram(*rt_, src));
    op.rescale.emplace(std::move(program));
  }
  const std::vector<DType> dtypes = RescaleDTypes(s);
  for (const TensorView* g : {&a.d_hidden, &a.d_weight, &a.d_bias}) {
    if (g->empty()) continue;
    const size_t first =
        2 * static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), g->dtype) - dtypes.begin());
    const MatrixLaunch m = MatrixLaunchFor(*g, rt_->device.sm_count);
    LinearCrossEntropyRescaleParams p{static_cast<const float*>(a.grad_output.data),
                                      static_cast<const float*>(a.applied.data),
                                      g->data,
                                      g->rows,
                                      g->cols,
                                      g->row_stride};
    KJIT_RETURN_IF_ERROR(rt_->Launch(op.rescale->functions[first + (m.wide ? 1 : 0)], m.blocks,
                                     kStoreThreads, stream, &p));
  }
  return absl::OkStatus();
}

absl::StatusOr<kjit::LinearCrossEntropy> Runtime::LinearCrossEntropy(
    const LinearCrossEntropySpec& spec) const {
  KJIT_RETURN_IF_ERROR(ValidateLinearCrossEntropySpec(spec));
  KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(state_->target, {{"dtype", spec.dtype}}));
  auto op = std::make_shared<internal::LinearCrossEntropyState>();
  op->spec = spec;
  op->config = spec.config.value_or(ops::DefaultLinearCrossEntropyConfig(spec));
  if (!spec.config) {
    op->tuned.emplace(*state_, ops::LinearCrossEntropyTuningOp(spec),
                      ops::LinearCrossEntropyTuningShape(spec), spec.dtype,
                      ops::LinearCrossEntropyToJson(spec).dump(), ParseLinearCrossEntropyConfig,
                      ops::ValidateLinearCrossEntropyConfig);
  }
  KJIT_ASSIGN_OR_RETURN(op->loss, CrossEntropy(spec.ChunkLoss()));
  kjit::LinearCrossEntropy lce(state_, op);
  if (!state_->compile_only) {
    // Errors surface here, not in the first launch: the kernels, and cuBLASLt's presence.
    KJIT_RETURN_IF_ERROR(state_->MakeCurrent());
    std::lock_guard<std::mutex> lock(op->mu);
    KJIT_RETURN_IF_ERROR(Prepare(*state_, *op, op->config.streams));
  }
  return lce;
}

}  // namespace kjit
