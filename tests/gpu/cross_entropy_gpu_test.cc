// Cross-entropy on the GPU against the fp64 CPU reference: loss, lse, argmax, the workspace
// counters and every gradient entry, over vocab sizes, row counts, dtypes, every option and launch
// shape, targets at 0, vocab-1 and both sides of every chunk boundary, ignored and out-of-range
// targets, flat and peaked softmax, NaN/Inf, strided and misaligned views. Outputs are poisoned
// with NaN bytes before each launch, bytes outside the views must stay untouched, the comparator
// must reject a perturbed gradient, and a second run must give the same bits. RescaleGradient:
// bit for bit against its formula (rows whose factors are equal not even rewritten), and after a
// ForwardBackward as close to a ForwardBackward run with the new upstream gradient as one more
// rounding allows.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "ops/common/tuning/compare.h"
#include "ops/common/tuning/random_values.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/tuning/reference.h"
#include "runtime/runtime_state.h"
#include "templates/cross_entropy_params.h"
#include "tests/gpu/gpu_test_env.h"

namespace kjit {
namespace {

using testing::Download;
using testing::IndexBytes;
using testing::IndexValues;
using testing::Upload;

enum class Mode { kForward, kForwardBackward, kBackward };
enum class Targets {
  kRandom,      // uniform classes, one row in 8 ignored
  kBoundaries,  // 0, vocab-1, both sides of vector, chunk and tail boundaries, cycled over rows
  kAllIgnored,
  kOutOfRange,  // valid, ignored and out-of-range targets mixed
};
// Class weights of a case: none, or [vocab] values in the case's weight dtype.
enum class Weights {
  kNone,
  kPositive,  // uniform in [0, 2), every 7th class 0
  kNegative,  // as kPositive, every 5th class negated
  kZero,      // all 0: the mean's divisor is 0
  kNan,       // as kPositive, the target of row 1 NaN
};

const char* Name(Mode m) {
  return m == Mode::kForward ? "forward" : m == Mode::kBackward ? "backward" : "forward_backward";
}

struct Case {
  int64_t vocab = 1000;
  int64_t rows = 16;
  DType dtype = DType::kBF16;
  IndexType target_type = IndexType::kInt64;
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  float smoothing = 0, z = 0, softcap = 0;
  bool argmax = false;
  bool entropy = false;  // spec.loss.entropy, and the entropy output
  bool logprob = false;  // the target_logprob output
  bool lse = true;       // ask for lse (Backward always saves it)
  Mode mode = Mode::kForwardBackward;
  bool in_place = false;  // gradient into the logits
  bool upstream = false;  // a grad_output other than the implicit 1
  int64_t pad = 0;        // row_stride = vocab + pad
  int misalign = 0;       // logits and grad start this many elements past an aligned address
  int grad_shift = 0;     // a separate grad starts this many elements further (narrower vectors)
  double scale = 1;       // logits ~ uniform with standard deviation `scale`
  bool specials = false;  // NaN, +Inf, -Inf rows
  Targets targets = Targets::kRandom;
  Weights weights = Weights::kNone;
  DType weight_dtype = DType::kF32;
  std::optional<CrossEntropyConfig> config;

  CrossEntropySpec Spec() const {
    return {
        .vocab = vocab,
        .dtype = dtype,
        .loss = {.target_type = target_type,
                 .ignore_index = ignore_index,
                 .reduction = reduction,
                 .label_smoothing = smoothing,
                 .z_loss = z,
                 .softcap = softcap,
                 .argmax = argmax,
                 .entropy = entropy,
                 .class_weight_dtype =
                     weights == Weights::kNone ? std::nullopt : std::optional<DType>(weight_dtype)},
        .config = config};
  }
  std::string Describe() const {
    return fmt::format(
        "vocab={} rows={} dtype={} targets={} ignore={} reduction={} eps={} z={} cap={} argmax={} "
        "entropy={} logprob={} lse={} mode={} in_place={} upstream={} pad={} misalign={} "
        "grad_shift={} scale={} specials={} target_kind={} weights={} ({}) config={}",
        vocab, rows, kjit::Name(dtype), kjit::Name(target_type), ignore_index,
        kjit::Name(reduction), smoothing, z, softcap, argmax, entropy, logprob, lse, Name(mode),
        in_place, upstream, pad, misalign, grad_shift, scale, specials, static_cast<int>(targets),
        static_cast<int>(weights), kjit::Name(weight_dtype),
        config ? config->ToString() : "default");
  }
};

// Compiles many specs at once on the CPU's cores into the disk cache the GPU runtime reads, one
// spec a worker (each Build() compiles the op's programs in parallel too).
void Prebuild(const Runtime& rt, const std::vector<CrossEntropySpec>& specs) {
  const std::string target = rt.target();
  std::atomic<size_t> next{0};
  const size_t workers =
      std::min<size_t>(specs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      auto cpu = Runtime::Create({.target = target, .compile_only = true});
      if (!cpu.ok()) return;  // e.g. no usable disk cache: each case compiles when it runs
      for (size_t i; (i = next++) < specs.size();) {
        auto ce = cpu->CrossEntropy(specs[i]);
        if (ce.ok()) (void)ce->Build();
      }
    });
  }
  for (std::thread& t : pool) t.join();
}

// A [rows, cols] view `misalign` elements into a buffer, rows `stride` apart, 0xFF everywhere else.
struct Layout {
  DType dtype;
  int64_t rows, cols, stride;
  int misalign;
  size_t bytes() const { return ((rows - 1) * stride + cols + misalign) * SizeOf(dtype); }
  size_t offset(int64_t r) const { return (misalign + r * stride) * SizeOf(dtype); }

  std::vector<unsigned char> Image(const std::vector<double>& values) const {
    std::vector<unsigned char> image(bytes(), 0xFF);
    const std::vector<unsigned char> enc = Encode(values, dtype);
    const size_t row_bytes = cols * SizeOf(dtype);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(&image[offset(r)], &enc[r * row_bytes], row_bytes);
    return image;
  }
  // The view's elements; *outside_untouched says whether every other byte is still 0xFF.
  std::vector<double> Values(const std::vector<unsigned char>& image,
                             bool* outside_untouched) const {
    const size_t row_bytes = cols * SizeOf(dtype);
    std::vector<unsigned char> packed(rows * row_bytes);
    *outside_untouched = true;
    size_t gap_begin = 0;  // bytes before the first row, then between rows, then after the last
    for (int64_t r = 0; r <= rows; ++r) {
      const size_t gap_end = r < rows ? offset(r) : image.size();
      for (size_t i = gap_begin; i < gap_end; ++i) *outside_untouched &= image[i] == 0xFF;
      if (r == rows) break;
      std::memcpy(&packed[r * row_bytes], &image[offset(r)], row_bytes);
      gap_begin = offset(r) + row_bytes;
    }
    return Decode(packed, dtype);
  }
  TensorView View(void* base) const {
    return TensorView::Matrix(static_cast<char*>(base) + misalign * SizeOf(dtype), dtype, rows,
                              cols, stride);
  }
};

// Columns where a thread's share of the row changes hands: 0 and vocab-1, both sides of the
// first vectors, of every pass over the row (threads * vec elements, and threads * cluster * vec
// for the fused op's resident layout), of every unrolled batch, of the blocks' shares of a staged
// row, and of the scalar tail after the last whole vector. A row that does not start on a vector
// boundary shifts them by its head (CeLayout): every column of the first and last two vectors, and
// a staged share's first columns, are listed too.
std::vector<int64_t> BoundaryColumns(int64_t vocab, const CrossEntropyConfig& c) {
  std::set<int64_t> cols = {0, 1, vocab - 2, vocab - 1, c.vec - 1, c.vec};
  for (int64_t k = 0; k < 2 * c.vec; ++k) {
    cols.insert(k);
    cols.insert(vocab - 1 - k);
  }
  if (c.staged) {
    for (int64_t k = ops::StagedChunk(c, vocab); k < vocab; k += ops::StagedChunk(c, vocab)) {
      for (int64_t h = 0; h < c.vec; ++h) cols.insert(k + h);
    }
  }
  const int64_t body = vocab / c.vec * c.vec;
  cols.insert(body - 1);
  cols.insert(body);
  for (int64_t step : {int64_t{c.threads} * c.vec, int64_t{c.threads} * c.vec * c.unroll,
                       int64_t{c.threads} * c.vec * std::max(1, c.cluster),
                       c.staged ? ops::StagedChunk(c, vocab) : vocab}) {
    for (int64_t k = step; k < vocab; k += step) {
      cols.insert(k - 1);
      cols.insert(k);
    }
  }
  std::vector<int64_t> out;
  for (int64_t col : cols) {
    if (col >= 0 && col < vocab) out.push_back(col);
  }
  return out;
}

// The config the op launches for a case: its own (or the default) at the widest vector at which a
// separate grad's rows are as misaligned as the logits' (CeLayout starts each row's vectors at its
// first boundary; device buffers start 256-byte aligned), as CrossEntropy picks it.
CrossEntropyConfig ConfigOf(const Case& c) {
  const int widest =
      c.config ? c.config->vec : ops::MaxVecForCrossEntropy(static_cast<int>(SizeOf(c.dtype)));
  int vec = widest;
  const bool separate_grad = c.mode != Mode::kForward && !c.in_place;
  while (vec > 1 && separate_grad && c.grad_shift % vec != 0) vec /= 2;
  if (c.config && vec == c.config->vec) return *c.config;
  return ops::DefaultCrossEntropyConfig(c.vocab, vec, testing::GpuRuntime()->arch(),
                                        static_cast<int>(SizeOf(c.dtype)));
}

std::vector<int64_t> MakeTargets(const Case& c, std::mt19937_64& gen) {
  std::vector<int64_t> t(c.rows);
  std::uniform_int_distribution<int64_t> cls(0, c.vocab - 1);
  const std::vector<int64_t> boundaries = BoundaryColumns(c.vocab, ConfigOf(c));
  const bool i32 = c.target_type == IndexType::kInt32;
  // Out of range, and for int64 a value whose low 32 bits are a valid class (no truncation).
  const std::vector<int64_t> bad =
      i32 ? std::vector<int64_t>{c.vocab, -1, -7, INT32_MAX, INT32_MIN}
          : std::vector<int64_t>{c.vocab,  -1, -7, int64_t{1} << 40, (int64_t{1} << 32) + 5,
                                 INT64_MIN};
  for (int64_t i = 0; i < c.rows; ++i) {
    switch (c.targets) {
      case Targets::kRandom: t[i] = i % 8 == 5 ? c.ignore_index : cls(gen); break;
      case Targets::kBoundaries: t[i] = boundaries[i % boundaries.size()]; break;
      case Targets::kAllIgnored: t[i] = c.ignore_index; break;
      case Targets::kOutOfRange:
        t[i] = i % 3 == 0 ? bad[(i / 3) % bad.size()] : i % 3 == 1 ? cls(gen) : c.ignore_index;
        break;
    }
  }
  return t;
}

std::vector<double> MakeLogits(const Case& c, const std::vector<int64_t>& targets,
                               std::mt19937_64& gen) {
  const int64_t V = c.vocab;
  std::uniform_real_distribution<double> u(-1.7320508, 1.7320508);
  std::vector<double> x(c.rows * V);
  for (double& v : x) v = RoundTo(c.scale * u(gen), c.dtype);
  for (int64_t i = 0; i < c.rows; ++i) {
    // One row in four: the target far above the rest, p_t near 1, where bf16 p - 1 would cancel.
    const int64_t t = targets[i];
    if (i % 4 == 1 && t >= 0 && t < V) x[i * V + t] = RoundTo(2 * c.scale + 8, c.dtype);
  }
  if (c.specials) {
    x[V / 2] = NAN;                                        // row 0
    if (c.rows > 1) x[V + 1] = INFINITY;                   // row 1
    if (c.rows > 2) x[2 * V] = x[3 * V - 1] = -INFINITY;   // row 2: masked classes
    if (c.rows > 3) std::fill_n(&x[3 * V], V, -INFINITY);  // row 3: all masked
  }
  return x;
}

std::vector<double> MakeWeights(const Case& c, const std::vector<int64_t>& targets,
                                std::mt19937_64& gen) {
  if (c.weights == Weights::kNone) return {};
  std::vector<double> w(c.vocab, 0.0);
  std::uniform_real_distribution<double> u(0.0, 2.0);
  for (int64_t j = 0; j < c.vocab; ++j) {
    if (c.weights == Weights::kZero || j % 7 == 3) continue;
    w[j] =
        RoundTo((c.weights == Weights::kNegative && j % 5 == 1 ? -1 : 1) * u(gen), c.weight_dtype);
  }
  if (c.weights == Weights::kNan && c.rows > 1 && targets[1] >= 0 && targets[1] < c.vocab) {
    w[targets[1]] = NAN;
  }
  return w;
}

// Everything one run wrote, as raw bytes (for the determinism check) and decoded.
struct Outputs {
  std::vector<unsigned char> loss, lse, argmax, grad, counters, entropy, logprob;
};

void RunCase(const Runtime& rt, const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.Describe());
  ASSERT_OK_AND_ASSIGN(CrossEntropy ce, rt.CrossEntropy(c.Spec()));
  const int64_t V = c.vocab, R = c.rows;
  const bool none = c.reduction == Reduction::kNone;
  const bool with_grad = c.mode != Mode::kForward;
  const bool want_lse = c.lse || c.mode == Mode::kBackward;

  std::mt19937_64 gen(seed);
  const std::vector<int64_t> targets = MakeTargets(c, gen);
  const std::vector<double> logits = MakeLogits(c, targets, gen);
  const std::vector<double> weights = MakeWeights(c, targets, gen);
  std::vector<double> upstream;
  if (c.upstream) {
    std::uniform_real_distribution<double> u(0.25, 2.0);
    upstream.resize(none ? R : 1);
    for (size_t i = 0; i < upstream.size(); ++i) {
      upstream[i] = RoundTo((i % 3 == 2 ? -1 : 1) * u(gen), DType::kF32);
    }
  }

  const Layout lay{c.dtype, R, V, V + c.pad, c.misalign};
  const Layout grad_lay{c.dtype, R, V, V + c.pad,
                        c.in_place ? c.misalign : c.misalign + c.grad_shift};
  const std::vector<unsigned char> logits_image = lay.Image(logits);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logits, Upload(rt, logits_image));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_targets, Upload(rt, IndexBytes(targets, c.target_type)));
  const size_t loss_bytes = (none ? R : 1) * sizeof(float);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, loss_bytes));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_lse, DeviceBuffer::Create(rt, R * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_argmax, DeviceBuffer::Create(rt, R * SizeOf(c.target_type)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_entropy, DeviceBuffer::Create(rt, R * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logprob, DeviceBuffer::Create(rt, R * sizeof(float)));
  std::optional<DeviceBuffer> d_grad, d_up;
  if (with_grad && !c.in_place) {
    ASSERT_OK_AND_ASSIGN(d_grad, DeviceBuffer::Create(rt, grad_lay.bytes()));
  }
  if (c.upstream) {
    const std::vector<unsigned char> enc = Encode(upstream, DType::kF32);
    ASSERT_OK_AND_ASSIGN(d_up, Upload(rt, enc));
  }
  const int64_t ws_bytes = ce.WorkspaceBytes(R);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ws_bytes));
  std::optional<DeviceBuffer> d_weights;
  TensorView class_weight;
  if (!weights.empty()) {
    ASSERT_OK_AND_ASSIGN(d_weights, Upload(rt, Encode(weights, c.weight_dtype)));
    class_weight = TensorView::Vector(d_weights->data(), c.weight_dtype, V);
  }

  const DeviceBuffer* grad_buf = !with_grad ? nullptr : c.in_place ? &d_logits : &*d_grad;
  CrossEntropyArgs args{
      .logits = lay.View(d_logits.data()),
      .targets = IndexView::Of(d_targets.data(), c.target_type, R),
      .loss = TensorView::Vector(d_loss.data(), DType::kF32, none ? R : 1),
      .lse = want_lse ? TensorView::Vector(d_lse.data(), DType::kF32, R) : TensorView{},
      .argmax = c.argmax ? IndexView::Of(d_argmax.data(), c.target_type, R) : IndexView{},
      .entropy = c.entropy ? TensorView::Vector(d_entropy.data(), DType::kF32, R) : TensorView{},
      .target_logprob =
          c.logprob ? TensorView::Vector(d_logprob.data(), DType::kF32, R) : TensorView{},
      .class_weight = class_weight,
      .workspace = d_ws.data(),
      .workspace_bytes = ws_bytes};
  const TensorView up =
      c.upstream ? TensorView::Vector(d_up->data(), DType::kF32, none ? R : 1) : TensorView{};
  if (c.mode == Mode::kForwardBackward) {
    args.grad = grad_lay.View(grad_buf->data());
    args.grad_output = up;
  }
  CrossEntropyBackwardArgs bargs{.logits = args.logits,
                                 .targets = args.targets,
                                 .lse = args.lse,
                                 .grad_output = up,
                                 .class_weight = class_weight,
                                 .workspace = d_ws.data(),
                                 .workspace_bytes = ws_bytes};
  if (with_grad) bargs.grad = grad_lay.View(grad_buf->data());

  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  // Poisons every output (NaN in every float type, -1 in the integers), runs, and reads back.
  auto run = [&](Outputs* out) -> absl::Status {
    for (const DeviceBuffer* b : {&d_loss, &d_lse, &d_argmax, &d_ws, &d_entropy, &d_logprob})
      KJIT_RETURN_IF_ERROR(b->Fill(0xFF));
    if (d_grad) KJIT_RETURN_IF_ERROR(d_grad->Fill(0xFF));
    if (c.mode == Mode::kForward) {
      KJIT_RETURN_IF_ERROR(ce.Forward(nullptr, args));
    } else if (c.mode == Mode::kForwardBackward) {
      KJIT_RETURN_IF_ERROR(ce.ForwardBackward(nullptr, args));
    } else {
      KJIT_RETURN_IF_ERROR(ce.Forward(nullptr, args));
      // Poison what the forward wrote that the backward must rewrite: the counters.
      KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize"));
      KJIT_RETURN_IF_ERROR(cu.Check(cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(d_ws.data()),
                                                       0xFF, sizeof(CrossEntropyCounters), nullptr),
                                    "cuMemsetD8Async"));
      KJIT_RETURN_IF_ERROR(ce.Backward(nullptr, bargs));
    }
    KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize (kernel fault?)"));
    KJIT_ASSIGN_OR_RETURN(out->loss, Download(d_loss, loss_bytes));
    KJIT_ASSIGN_OR_RETURN(out->lse, Download(d_lse, R * sizeof(float)));
    KJIT_ASSIGN_OR_RETURN(out->argmax, Download(d_argmax, R * SizeOf(c.target_type)));
    KJIT_ASSIGN_OR_RETURN(out->counters, Download(d_ws, sizeof(CrossEntropyCounters)));
    KJIT_ASSIGN_OR_RETURN(out->entropy, Download(d_entropy, R * sizeof(float)));
    KJIT_ASSIGN_OR_RETURN(out->logprob, Download(d_logprob, R * sizeof(float)));
    if (with_grad) {
      KJIT_ASSIGN_OR_RETURN(out->grad, Download(*grad_buf, grad_lay.bytes()));
    }
    return absl::OkStatus();
  };
  Outputs first;
  ASSERT_OK(run(&first));

  const ops::CrossEntropyMath math{
      .vocab = V, .dtype = c.dtype, .loss = c.Spec().loss, .class_weight = weights};
  const ops::CrossEntropyResult ref = ops::CrossEntropyReference(
      math, R, logits, targets, c.upstream ? &upstream : nullptr, with_grad);

  const std::vector<double> loss = Decode(first.loss, DType::kF32);
  const std::vector<double> lse = Decode(first.lse, DType::kF32);
  const std::vector<double> argmax = IndexValues(first.argmax, c.target_type);
  const std::vector<double> entropy = Decode(first.entropy, DType::kF32);
  const std::vector<double> logprob = Decode(first.logprob, DType::kF32);
  CrossEntropyCounters counters;
  std::memcpy(&counters, first.counters.data(), sizeof(counters));
  const std::vector<double> counter_values = {static_cast<double>(counters.valid_rows),
                                              static_cast<double>(counters.out_of_range_rows)};
  std::vector<double> grad;
  bool untouched = true;
  if (with_grad) {
    grad = grad_lay.Values(first.grad, &untouched);
    EXPECT_TRUE(untouched) << "bytes outside the gradient view were written";
  }
  // In backward mode the loss, lse and argmax are the forward's, the counters the backward's.
  ops::CrossEntropyOutputs outs{.loss = &loss, .counters = &counter_values};
  if (want_lse) outs.lse = &lse;
  if (c.argmax) outs.argmax = &argmax;
  if (c.entropy) outs.entropy = &entropy;
  if (c.logprob) outs.target_logprob = &logprob;
  if (with_grad) outs.grad = &grad;
  bool all_ok = true;
  for (const auto& [name, r] : ops::CheckCrossEntropy(math, outs, ref)) {
    EXPECT_TRUE(r.ok) << r.Describe(name);
    all_ok &= r.ok;
  }

  // The check must be able to fail: push one finite gradient entry just past its tolerance. (On
  // cases up to 4M entries: the many small cases cover it without copying a 2^25 gradient.)
  if (all_ok && with_grad && grad.size() <= (size_t{1} << 22)) {
    const auto tol = ops::CrossEntropyTolerancesFor(c.dtype);
    const std::vector<double> atol = ops::CrossEntropyGradAtol(math, ref, tol);
    for (size_t k = grad.size() / 2; k < grad.size(); ++k) {
      if (!std::isfinite(ref.grad[k]) || ref.grad[k] == 0) continue;
      std::vector<double> bad = grad;
      bad[k] =
          ref.grad[k] + 1.5 * (tol.grad.atol + atol[k] + tol.grad.rtol * std::fabs(ref.grad[k]));
      EXPECT_FALSE(ops::CheckCrossEntropy(math, {.grad = &bad}, ref)[0].second.ok)
          << "the gradient check accepts a perturbed entry at " << k;
      break;
    }
  }

  // The entropy and log-probability checks must be able to fail too.
  if (all_ok && (c.entropy || c.logprob)) {
    for (int64_t i = 0; i < R; ++i) {
      if (c.entropy && std::isfinite(ref.entropy[i])) {
        std::vector<double> bad = entropy;
        bad[i] = ref.entropy[i] + 1.5 * (ref.entropy_atol[i] + 1e-5 * std::fabs(ref.entropy[i]));
        EXPECT_FALSE(ops::CheckCrossEntropy(math, {.entropy = &bad}, ref)[0].second.ok)
            << "the entropy check accepts a perturbed row " << i;
        break;
      }
    }
  }

  // Same inputs, same bits. An in-place run overwrote the logits: restore them first.
  if (c.in_place) ASSERT_OK(d_logits.Upload(logits_image.data(), logits_image.size()));
  Outputs second;
  ASSERT_OK(run(&second));
  EXPECT_EQ(second.loss, first.loss) << "loss differs between two runs";
  EXPECT_EQ(second.lse, first.lse) << "lse differs between two runs";
  EXPECT_EQ(second.argmax, first.argmax) << "argmax differs between two runs";
  EXPECT_EQ(second.entropy, first.entropy) << "entropy differs between two runs";
  EXPECT_EQ(second.logprob, first.logprob) << "target_logprob differs between two runs";
  EXPECT_EQ(second.counters, first.counters) << "counters differ between two runs";
  EXPECT_EQ(second.grad, first.grad) << "the gradient differs between two runs";
}

constexpr int64_t kMaxElements = int64_t{1}
                                 << 25;  // keeps each case's fp64 reference well under 1 s

const std::vector<int64_t> kVocabs = {2, 3, 1000, 32000, 50257, 128256, 151936, 256000, 262144};
const std::vector<DType> kDtypes = {DType::kBF16, DType::kF16, DType::kF32};

// Row counts for a vocab: 1, 7, 512, 4097 where the reference stays small, else the most rows that
// fit (so large vocabs still run many rows).
std::vector<int64_t> RowsFor(int64_t vocab) {
  std::vector<int64_t> out;
  for (int64_t rows : {1, 7, 512, 4097}) {
    if (rows * vocab <= kMaxElements) out.push_back(rows);
  }
  if (out.back() != 4097) out.push_back(kMaxElements / vocab);
  return out;
}

// Compiles every case's program in parallel first, then runs the cases in order (a Case here, a
// RescaleCase below).
template <typename C>
void RunAll(const Runtime& rt, const std::vector<C>& cases, uint64_t seed) {
  std::vector<CrossEntropySpec> specs;
  for (const C& c : cases) specs.push_back(c.Spec());
  Prebuild(rt, specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    RunCase(rt, cases[i], seed + i);
    if (::testing::Test::HasFatalFailure()) return;
  }
  fmt::print("checked {} cases\n", cases.size());
}

TEST(CrossEntropyGpu, ShapesAndDtypes) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (int64_t vocab : kVocabs) {
      for (int64_t rows : RowsFor(vocab)) {
        // Alternate the gradient's destination and the softmax's shape across cases.
        const size_t n = cases.size();
        cases.push_back({.vocab = vocab,
                         .rows = rows,
                         .dtype = t,
                         .in_place = n % 2 == 0,
                         .scale = n % 3 == 2 ? 30.0 : 1.0});
      }
    }
  }
  RunAll(rt, cases, 1000);
}

// Every option alone and combined, for every dtype and reduction, on a small vocab; the modes,
// index types, upstream gradient and in-place choice rotate across the combinations.
TEST(CrossEntropyGpu, EveryOptionCombination) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
      for (int bits = 0; bits < 16; ++bits) {
        const int n = static_cast<int>(cases.size());
        Case c{.vocab = 1000, .rows = 67, .dtype = t, .reduction = red};
        c.smoothing = (bits & 1) ? 0.1f : 0.0f;
        c.z = (bits & 2) ? 1e-3f : 0.0f;
        c.softcap = (bits & 4) ? 7.5f : 0.0f;  // small enough that x30 logits saturate it
        c.argmax = bits & 8;
        c.target_type = n % 2 ? IndexType::kInt32 : IndexType::kInt64;
        c.upstream = n % 3 != 0;
        c.scale = n % 4 == 3 ? 30.0 : 1.0;
        for (Mode m : {Mode::kForward, Mode::kForwardBackward, Mode::kBackward}) {
          c.mode = m;
          c.in_place = m != Mode::kForward && (n + static_cast<int>(m)) % 2 == 0;
          c.lse = m == Mode::kBackward || (bits + static_cast<int>(m)) % 2 == 0;
          cases.push_back(c);
        }
      }
    }
  }
  // Odd vocabs (a scalar tail, one thread's worth) with every option on and off.
  for (DType t : kDtypes) {
    for (int64_t vocab : {3, 50257}) {
      for (bool on : {false, true}) {
        Case c{.vocab = vocab, .rows = vocab == 3 ? 7 : 33, .dtype = t};
        if (on) {
          c.smoothing = 0.2f;
          c.z = 1e-4f;
          c.softcap = 30.0f;
          c.argmax = true;
          c.upstream = true;
        }
        for (Reduction red : {Reduction::kNone, Reduction::kMean}) {
          c.reduction = red;
          c.mode = Mode::kForwardBackward;
          cases.push_back(c);
          c.mode = Mode::kBackward;
          cases.push_back(c);
        }
      }
    }
  }
  // ignore_index naming a real class.
  cases.push_back({.vocab = 1000, .rows = 40, .ignore_index = 0, .targets = Targets::kBoundaries});
  RunAll(rt, cases, 5000);
}

TEST(CrossEntropyGpu, TargetsAtZeroLastAndEveryChunkBoundary) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (int64_t vocab : {3, 1000, 50257, 128256, 262144}) {
      // fp32's 4-element vectors give 128 passes over a 262144 row: 260 rows of it would take the
      // reference seconds; its boundaries are covered at 128256.
      if (t == DType::kF32 && vocab == 262144) continue;
      Case c{
          .vocab = vocab, .rows = 2, .dtype = t, .argmax = true, .targets = Targets::kBoundaries};
      c.rows = static_cast<int64_t>(BoundaryColumns(vocab, ConfigOf(c)).size());
      c.in_place = cases.size() % 4 == 0;
      c.reduction = cases.size() % 3 == 0 ? Reduction::kNone : Reduction::kMean;
      cases.push_back(c);
      c.mode = Mode::kBackward;
      cases.push_back(c);
    }
  }
  RunAll(rt, cases, 8000);
}

TEST(CrossEntropyGpu, AllRowsIgnored) {
  KJIT_REQUIRE_GPU(rt);
  // Mean: NaN (0/0, as PyTorch); sum: 0; none: zeros. The gradient is zero everywhere.
  std::vector<Case> cases;
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    for (Mode m : {Mode::kForward, Mode::kForwardBackward, Mode::kBackward}) {
      cases.push_back({.vocab = 32000,
                       .rows = 7,
                       .reduction = red,
                       .argmax = true,
                       .mode = m,
                       .in_place = m != Mode::kForward,
                       .targets = Targets::kAllIgnored});
      cases.push_back({.vocab = 1000,
                       .rows = 513,
                       .dtype = DType::kF32,
                       .reduction = red,
                       .lse = false,
                       .mode = m,
                       .upstream = true,
                       .targets = Targets::kAllIgnored});
    }
  }
  RunAll(rt, cases, 9000);
}

// Class weights (PyTorch's `weight`) in every mode and reduction, with every other option on and
// off, fp32 weights and weights in the logits' dtype, weights with zeros and negatives, odd vocabs,
// one row, targets at every chunk boundary, all rows ignored, a zero divisor and a NaN weight.
TEST(CrossEntropyGpu, ClassWeights) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
      for (int bits = 0; bits < 8; ++bits) {
        const int n = static_cast<int>(cases.size());
        Case c{.vocab = 1000, .rows = 67, .dtype = t, .reduction = red};
        c.weights = n % 3 == 0 ? Weights::kNegative : Weights::kPositive;
        c.weight_dtype = n % 2 ? t : DType::kF32;
        c.smoothing = (bits & 1) ? 0.1f : 0.0f;
        c.z = (bits & 2) ? 1e-3f : 0.0f;
        c.softcap = (bits & 4) ? 7.5f : 0.0f;
        c.upstream = n % 4 != 0;
        c.scale = n % 5 == 4 ? 30.0 : 1.0;
        for (Mode m : {Mode::kForward, Mode::kForwardBackward, Mode::kBackward}) {
          c.mode = m;
          c.in_place = m != Mode::kForward && (n + static_cast<int>(m)) % 2 == 0;
          cases.push_back(c);
        }
      }
    }
  }
  for (int64_t vocab : {3, 50257, 128256, 151936}) {
    for (int64_t rows : {int64_t{1}, std::min<int64_t>(kMaxElements / vocab, 300)}) {
      Case c{.vocab = vocab, .rows = rows, .in_place = true, .weights = Weights::kPositive};
      cases.push_back(c);
      c.smoothing = 0.1f;
      c.mode = Mode::kBackward;
      cases.push_back(c);
    }
  }
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (int64_t vocab : {1000, 128256}) {
      Case c{.vocab = vocab,
             .dtype = t,
             .argmax = true,
             .targets = Targets::kBoundaries,
             .weights = Weights::kPositive,
             .weight_dtype = t};
      c.rows = static_cast<int64_t>(BoundaryColumns(vocab, ConfigOf(c)).size());
      cases.push_back(c);
      c.smoothing = 0.2f;
      c.reduction = Reduction::kNone;
      cases.push_back(c);
    }
  }
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    cases.push_back({.vocab = 1000,
                     .rows = 33,
                     .reduction = red,
                     .targets = Targets::kAllIgnored,
                     .weights = Weights::kPositive});
    // A zero divisor: the mean is 0/0 = NaN, and so is its gradient (inf * 0), as PyTorch gives.
    cases.push_back({.vocab = 1000, .rows = 33, .reduction = red, .weights = Weights::kZero});
    // A NaN target weight: its row NaN; through the mean's divisor every valid row.
    cases.push_back({.vocab = 1000, .rows = 33, .reduction = red, .weights = Weights::kNan});
    cases.push_back(
        {.vocab = 1000, .rows = 33, .reduction = red, .smoothing = 0.1f, .weights = Weights::kNan});
  }
  RunAll(rt, cases, 12000);
}

TEST(CrossEntropyGpu, OutOfRangeTargetsAreCountedAndIgnored) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (IndexType it : {IndexType::kInt32, IndexType::kInt64}) {
    for (Reduction red : {Reduction::kNone, Reduction::kMean}) {
      for (int64_t rows : {7, 4097}) {
        cases.push_back({.vocab = 1000,
                         .rows = rows,
                         .target_type = it,
                         .reduction = red,
                         .argmax = true,
                         .targets = Targets::kOutOfRange});
        cases.push_back({.vocab = 1000,
                         .rows = rows,
                         .target_type = it,
                         .reduction = red,
                         .mode = Mode::kBackward,
                         .targets = Targets::kOutOfRange});
      }
    }
  }
  RunAll(rt, cases, 9100);
}

TEST(CrossEntropyGpu, PeakedSoftmaxAndSpecialValues) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (int64_t vocab : {3, 1000, 128256}) {
      for (double scale : {1.0, 30.0}) {
        cases.push_back({.vocab = vocab,
                         .rows = 9,
                         .dtype = t,
                         .reduction = Reduction::kNone,
                         .argmax = true,
                         .scale = scale,
                         .specials = true});
        cases.push_back({.vocab = vocab,
                         .rows = 9,
                         .dtype = t,
                         .softcap = 10.0f,
                         .argmax = true,
                         .in_place = true,
                         .scale = scale,
                         .specials = true});
        cases.push_back({.vocab = vocab,
                         .rows = 9,
                         .dtype = t,
                         .reduction = Reduction::kSum,
                         .smoothing = 0.1f,
                         .z = 1e-4f,
                         .mode = Mode::kBackward,
                         .scale = scale,
                         .specials = true});
      }
    }
  }
  RunAll(rt, cases, 9300);
}

TEST(CrossEntropyGpu, NanRowLeavesOtherRowsFinite) {
  KJIT_REQUIRE_GPU(rt);
  // Explicit rather than through the reference: row 0 holds a NaN, rows 1.. must be all finite.
  const int64_t V = 32000, R = 4;
  auto ce = rt.CrossEntropy({.vocab = V, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(ce.ok()) << ce.status();
  std::vector<double> x(R * V, 0.5);
  x[17] = NAN;
  const Layout lay{DType::kBF16, R, V, V, 0};
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload(rt, lay.Image(x)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_t, Upload(rt, IndexBytes({1, 2, 3, 4}, IndexType::kInt64)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, R * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ce->WorkspaceBytes(R)));
  ASSERT_OK(
      ce->ForwardBackward(nullptr, {.logits = lay.View(d_x.data()),
                                    .targets = IndexView::Of(d_t.data(), IndexType::kInt64, R),
                                    .loss = TensorView::Vector(d_loss.data(), DType::kF32, R),
                                    .grad = lay.View(d_x.data()),
                                    .workspace = d_ws.data(),
                                    .workspace_bytes = ce->WorkspaceBytes(R)}));
  ASSERT_EQ(kjit::internal::StateOf(rt).driver->cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_OK_AND_ASSIGN(auto loss_bytes, Download(d_loss, R * 4));
  ASSERT_OK_AND_ASSIGN(auto grad_bytes, Download(d_x, lay.bytes()));
  const auto loss = Decode(loss_bytes, DType::kF32);
  bool untouched;
  const auto grad = lay.Values(grad_bytes, &untouched);
  EXPECT_TRUE(std::isnan(loss[0]));
  for (int64_t c = 0; c < V; ++c) ASSERT_TRUE(std::isnan(grad[c])) << "row 0 col " << c;
  for (int64_t i = 1; i < R; ++i) {
    EXPECT_NEAR(loss[i], std::log(static_cast<double>(V)), 1e-4) << "row " << i;
    for (int64_t c = 0; c < V; ++c) ASSERT_TRUE(std::isfinite(grad[i * V + c])) << i << " " << c;
  }
}

// Rows that start off a vector boundary (a misaligned view, an odd row stride) still move by whole
// vectors after a scalar head; only a separate grad offset from the logits by a part of a vector
// narrows them.
TEST(CrossEntropyGpu, StridedAndMisalignedViewsSplitIntoHeadVectorsAndTail) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (int misalign : {0, 1, 3}) {
      for (int64_t pad : {0, 5, 24}) {
        cases.push_back({.vocab = 32000,
                         .rows = 33,
                         .dtype = t,
                         .argmax = true,
                         .in_place = cases.size() % 4 == 0,
                         .pad = pad,
                         .misalign = misalign});
        cases.push_back({.vocab = 1000,
                         .rows = 5,
                         .dtype = t,
                         .mode = Mode::kBackward,
                         .pad = pad,
                         .misalign = misalign});
      }
    }
  }
  for (int shift : {1, 2, 4}) {
    cases.push_back({.vocab = 1000, .rows = 9, .argmax = true, .misalign = 3, .grad_shift = shift});
  }
  // 50257 contiguous has a head of 0 to 7 elements per row; padded to 50264 it has 8-aligned rows
  // and a one-element tail.
  cases.push_back({.vocab = 50257, .rows = 65, .in_place = true});
  cases.push_back({.vocab = 50257, .rows = 65, .targets = Targets::kBoundaries});
  cases.push_back({.vocab = 50257, .rows = 65, .in_place = true, .pad = 7});
  RunAll(rt, cases, 9600);
}

// One case per config (streaming, resident in 1, 2, 3 and 8 blocks, staged in 1 and 3) and
// vocab (3, 1000, 50264) that fits: argmax on, rows targeting every boundary of the config.
std::vector<Case> OtherConfigCases(const Runtime& rt) {
  const std::vector<CrossEntropyConfig> configs = {
      {.vec = 1, .threads = 32, .unroll = 8},
      {.vec = 2, .threads = 96, .unroll = 1},
      {.vec = 4, .threads = 1024, .unroll = 2},
      {.vec = 8, .threads = 128, .unroll = 8},
      // The fused op with the row resident in one block, and in clusters of 2, 3 and 8 blocks.
      {.vec = 2, .threads = 512, .unroll = 4, .cluster = 1},
      {.vec = 8, .threads = 256, .unroll = 4, .cluster = 2},
      {.vec = 8, .threads = 96, .unroll = 2, .cluster = 3},
      {.vec = 4, .threads = 128, .unroll = 2, .cluster = 8},
      // The row staged in shared memory: one block, and a cluster of 3 (uneven shares).
      {.vec = 8, .threads = 128, .unroll = 4, .cluster = 1, .staged = 1},
      {.vec = 8, .threads = 256, .unroll = 4, .cluster = 3, .staged = 1}};
  std::vector<Case> cases;
  for (const auto& config : configs) {
    // 50257: rows with heads of every length before their vectors (CeLayout, CeStageLayout).
    for (int64_t vocab : {3, 1000, 50257, 50264}) {
      if (vocab == 50257 && config.vec < 4) continue;
      if (config.staged && !ops::StagedUnfit(config, vocab, 2, rt.arch()).empty()) continue;
      Case c{.vocab = vocab,
             .rows = 2,
             .argmax = true,
             .targets = Targets::kBoundaries,
             .config = config};
      c.rows = static_cast<int64_t>(BoundaryColumns(vocab, ConfigOf(c)).size());
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(CrossEntropyGpu, OtherLaunchConfigs) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (Case c : OtherConfigCases(rt)) {
    c.in_place = cases.size() % 4 == 0;
    cases.push_back(c);
    c.mode = Mode::kBackward;
    c.smoothing = 0.1f;
    c.softcap = 20.0f;
    cases.push_back(c);
  }
  RunAll(rt, cases, 9800);
}

// The per-row extras (issue 35): entropy and the target's log-probability beside lse and argmax,
// with every option, odd vocabs, every kernel (streaming, resident, staged: OtherLaunchConfigs'
// configs), peaked and flat rows and NaN/Inf/masked rows; outputs poisoned, two runs bit-equal.
TEST(CrossEntropyGpu, EntropyAndTargetLogprob) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    for (int64_t vocab : {2, 3, 1000, 50257, 128256}) {
      for (int bits = 0; bits < 8; ++bits) {
        const int n = static_cast<int>(cases.size());
        Case c{.vocab = vocab, .rows = vocab > 50000 ? 37 : 67, .dtype = t};
        c.smoothing = (bits & 1) ? 0.1f : 0.0f;
        c.z = (bits & 2) ? 1e-3f : 0.0f;
        c.softcap = (bits & 4) ? 15.0f : 0.0f;
        c.entropy = true;
        c.logprob = n % 3 != 1;
        c.argmax = n % 2 == 0;
        c.lse = n % 4 != 3;
        c.reduction = n % 3 == 0   ? Reduction::kNone
                      : n % 3 == 1 ? Reduction::kSum
                                   : Reduction::kMean;
        c.target_type = n % 2 ? IndexType::kInt32 : IndexType::kInt64;
        c.upstream = n % 2 == 1;
        c.scale = n % 4 == 2 ? 30.0 : 1.0;
        c.weights = n % 5 == 4 ? Weights::kPositive : Weights::kNone;
        c.mode = n % 3 == 2 ? Mode::kForward : Mode::kForwardBackward;
        c.in_place = c.mode == Mode::kForwardBackward && n % 2 == 0;
        cases.push_back(c);
      }
      Case s{.vocab = vocab, .rows = 9, .dtype = t, .reduction = Reduction::kNone};
      s.entropy = s.logprob = s.argmax = true;
      s.specials = true;
      cases.push_back(s);
      s.targets = Targets::kOutOfRange;
      s.specials = false;
      s.mode = Mode::kForward;
      cases.push_back(s);
    }
  }
  // Every kernel and launch shape, targets at every chunk boundary (OtherLaunchConfigs').
  for (Case c : OtherConfigCases(rt)) {
    c.entropy = c.logprob = c.in_place = true;
    c.scale = c.vocab == 1000 ? 30.0 : 1.0;
    cases.push_back(c);
    c.softcap = 20.0f;
    c.reduction = Reduction::kNone;
    c.specials = c.rows > 3;
    cases.push_back(c);
  }
  RunAll(rt, cases, 9900);
}

// The op allocates nothing: device memory is the same before and after a launch on a 1 GB
// in-place problem, and the workspace it asks for is O(rows).
TEST(CrossEntropyGpu, AllocatesNothingAndTheWorkspaceIsORows) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t V = 128256, R = 4096;
  auto ce = rt.CrossEntropy({.vocab = V, .dtype = DType::kBF16});
  ASSERT_TRUE(ce.ok()) << ce.status();
  EXPECT_LT(ce->WorkspaceBytes(R), 1 << 20);
  EXPECT_LE(ce->WorkspaceBytes(R), 16 + 4 * R + 15);
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, DeviceBuffer::Create(rt, R * V * 2));
  ASSERT_OK(d_x.Fill(0x3c));  // bf16 0x3c3c ~ 0.0115 everywhere: a flat softmax
  std::vector<int64_t> t(R);
  for (int64_t i = 0; i < R; ++i) t[i] = (i * 7919) % V;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_t, Upload(rt, IndexBytes(t, IndexType::kInt64)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ce->WorkspaceBytes(R)));
  const TensorView x = TensorView::Matrix(d_x.data(), DType::kBF16, R, V);
  const CrossEntropyArgs args{.logits = x,
                              .targets = IndexView::Of(d_t.data(), IndexType::kInt64, R),
                              .loss = TensorView::Vector(d_loss.data(), DType::kF32, 1),
                              .grad = x,
                              .workspace = d_ws.data(),
                              .workspace_bytes = ce->WorkspaceBytes(R)};
  ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cu.cuMemGetInfo(&free_before, &total), CUDA_SUCCESS);
  ASSERT_OK(ce->ForwardBackward(nullptr, args));
  ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_EQ(cu.cuMemGetInfo(&free_after, &total), CUDA_SUCCESS);
  const int64_t grown = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
  fmt::print("device memory taken by one in-place launch on {} MB of logits: {} bytes\n",
             R * V * 2 >> 20, grown);
  // 32 MB leaves room for the driver's lazily grown local-memory pool; the logits are 1 GB.
  EXPECT_LE(grown, 32 << 20) << "the op must not allocate O(rows x vocab)";
  float loss = 0;
  ASSERT_OK(d_loss.Download(&loss, 4));
  EXPECT_NEAR(loss, std::log(static_cast<double>(V)), 1e-3) << "a flat softmax gives log(vocab)";
}

// Graph-safe: the op captured into a CUDA graph on a stream of its own (its kernels overlapping
// one another there, sm_90 and newer) gives, replayed twice, the bits of a direct launch. Enough
// rows that each kernel takes several waves of blocks.
TEST(CrossEntropyGpu, CapturedInAGraphGivesTheBitsOfADirectLaunch) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t V = 128256, R = 1000;
  auto ce = rt.CrossEntropy({.vocab = V, .dtype = DType::kBF16});
  ASSERT_TRUE(ce.ok()) << ce.status();
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  std::mt19937 gen(7);
  std::normal_distribution<double> logit(0.0, 3.0);
  std::vector<double> logits(R * V);
  for (double& x : logits) x = logit(gen);
  const std::vector<unsigned char> image = Encode(logits, DType::kBF16);
  std::vector<int64_t> t(R);
  for (int64_t i = 0; i < R; ++i) t[i] = i % 5 == 4 ? -100 : (i * 7919) % V;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, Upload(rt, image));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_t, Upload(rt, IndexBytes(t, IndexType::kInt64)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_grad, DeviceBuffer::Create(rt, R * V * 2));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ce->WorkspaceBytes(R)));
  const CrossEntropyArgs args{.logits = TensorView::Matrix(d_x.data(), DType::kBF16, R, V),
                              .targets = IndexView::Of(d_t.data(), IndexType::kInt64, R),
                              .loss = TensorView::Vector(d_loss.data(), DType::kF32, 1),
                              .grad = TensorView::Matrix(d_grad.data(), DType::kBF16, R, V),
                              .workspace = d_ws.data(),
                              .workspace_bytes = ce->WorkspaceBytes(R)};
  CUstream stream = nullptr;
  ASSERT_EQ(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  auto outputs = [&](std::vector<unsigned char>* loss, std::vector<unsigned char>* grad) {
    ASSERT_EQ(cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
    ASSERT_OK_AND_ASSIGN(*loss, Download(d_loss, 4));
    ASSERT_OK_AND_ASSIGN(*grad, Download(d_grad, R * V * 2));
    for (const DeviceBuffer* b : {&d_loss, &d_grad, &d_ws}) ASSERT_OK(b->Fill(0xFF));
  };
  std::vector<unsigned char> direct_loss, direct_grad;
  ASSERT_OK(ce->ForwardBackward(stream, args));
  outputs(&direct_loss, &direct_grad);
  float loss = 0;
  std::memcpy(&loss, direct_loss.data(), 4);
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;

  ASSERT_EQ(cu.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  const absl::Status captured = ce->ForwardBackward(stream, args);
  CUgraph graph = nullptr;
  ASSERT_EQ(cu.cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_OK(captured);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cu.cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    std::vector<unsigned char> graph_loss, graph_grad;
    outputs(&graph_loss, &graph_grad);
    EXPECT_EQ(graph_loss, direct_loss) << "replay " << replay;
    EXPECT_TRUE(graph_grad == direct_grad) << "replay " << replay << ": the gradients differ";
  }
  EXPECT_EQ(cu.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuStreamDestroy(stream), CUDA_SUCCESS);
}

// --- RescaleGradient -----------------------------------------------------------------------------

// What RescaleGradient leaves in the gradient, checked against its bytes before: rows whose g ==
// applied (as floats) bit for bit as they were (a NaN with a payload there shows that the row was
// not even rewritten: the GPU's arithmetic gives NaNs its own bits), every other element exactly
// round_dtype(old * (g / applied)) in fp32 (NaN wherever that is NaN), and no byte outside the view
// written. g and applied hold one value for every row or one per row; applied empty means 1.
void ExpectRescaled(const Layout& lay, const std::vector<unsigned char>& before,
                    const std::vector<unsigned char>& after, const std::vector<float>& g,
                    const std::vector<float>& applied) {
  bool untouched = true, ignored = true;
  const std::vector<double> old = lay.Values(before, &ignored);
  const std::vector<double> out = lay.Values(after, &untouched);
  EXPECT_TRUE(untouched) << "bytes outside the gradient view were written";
  const size_t row_bytes = lay.cols * SizeOf(lay.dtype);
  int64_t bad = 0;
  for (int64_t r = 0; r < lay.rows; ++r) {
    const float gr = g[g.size() == 1 ? 0 : r];
    const float ar = applied.empty() ? 1.0f : applied[applied.size() == 1 ? 0 : r];
    if (gr == ar) {
      if (std::memcmp(&before[lay.offset(r)], &after[lay.offset(r)], row_bytes) != 0 && bad++ < 5) {
        ADD_FAILURE() << fmt::format("row {}: g == applied == {}, but the row was rewritten", r,
                                     gr);
      }
      continue;
    }
    const float factor = gr / ar;
    for (int64_t c = 0; c < lay.cols; ++c) {
      const size_t i = r * lay.cols + c;
      const double want = RoundTo(static_cast<float>(old[i]) * factor, lay.dtype);
      const double got = out[i];
      const bool same = std::isnan(want) ? std::isnan(got)
                                         : got == want && std::signbit(got) == std::signbit(want);
      if (!same && bad++ < 5) {
        ADD_FAILURE() << fmt::format("row {} col {}: got {} expected {} = round({} * ({} / {}))", r,
                                     c, got, want, old[i], gr, ar);
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements (or rows) that differ from the formula";
}

std::vector<unsigned char> FloatBytes(const std::vector<float>& v) {
  return Encode(std::vector<double>(v.begin(), v.end()), DType::kF32);
}

struct RescaleCase {
  int64_t vocab = 1000, rows = 8;
  DType dtype = DType::kBF16;
  int64_t pad = 0;             // row_stride = vocab + pad
  int misalign = 0;            // the gradient starts this many elements past an aligned address
  std::vector<float> g;        // grad_output: [1] or [rows]
  std::vector<float> applied;  // [1] or [rows], as g; empty: none (1)

  CrossEntropySpec Spec() const { return {.vocab = vocab, .dtype = dtype}; }

  std::string Describe() const {
    return fmt::format("vocab={} rows={} dtype={} pad={} misalign={} g=[{}] applied=[{}]", vocab,
                       rows, kjit::Name(dtype), pad, misalign, fmt::join(g, ", "),
                       fmt::join(applied, ", "));
  }
};

// Rescales a random gradient (with zeros, -0, subnormals, values that overflow when scaled up and
// a NaN with a payload in every row) in place and checks it with ExpectRescaled.
void RunCase(const Runtime& rt, const RescaleCase& c, uint64_t seed) {
  SCOPED_TRACE(c.Describe());
  ASSERT_OK_AND_ASSIGN(CrossEntropy ce, rt.CrossEntropy(c.Spec()));
  const int64_t V = c.vocab, R = c.rows;
  std::mt19937_64 gen(seed);
  std::vector<double> values = ops::RandomValues(gen, R * V, 0.01, 0, c.dtype);
  const bool f16 = c.dtype == DType::kF16;
  for (int64_t r = 0; r < R; ++r) {
    double* row = &values[r * V];
    row[0] = 0.0;
    row[1] = -0.0;
    row[V / 2] = RoundTo(f16 ? 1e-7 : 1e-40, c.dtype);  // a subnormal
    row[V - 1] = RoundTo(f16 ? 6e4 : 3e38, c.dtype);    // Inf when scaled up enough
  }
  const Layout lay{c.dtype, R, V, V + c.pad, c.misalign};
  std::vector<unsigned char> before = lay.Image(values);
  for (int64_t r = 0; r < R; ++r) {
    std::memset(&before[lay.offset(r) + (V / 3) * SizeOf(c.dtype)], 0xFF, SizeOf(c.dtype));
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_grad, Upload(rt, before));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_g, Upload(rt, FloatBytes(c.g)));
  std::optional<DeviceBuffer> d_applied;
  if (!c.applied.empty()) {
    ASSERT_OK_AND_ASSIGN(d_applied, Upload(rt, FloatBytes(c.applied)));
  }
  const auto n = static_cast<int64_t>(c.g.size());
  const CrossEntropyRescaleArgs args{
      .grad = lay.View(d_grad.data()),
      .grad_output = TensorView::Vector(d_g.data(), DType::kF32, n),
      .applied = d_applied ? TensorView::Vector(d_applied->data(), DType::kF32, n) : TensorView{}};
  ASSERT_OK(ce.RescaleGradient(nullptr, args));
  ASSERT_EQ(kjit::internal::StateOf(rt).driver->cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> after, Download(d_grad, lay.bytes()));
  ExpectRescaled(lay, before, after, c.g, c.applied);
}

// Equal factors, the common case: one value for every row (both 1, both a loss scale, g 1 with
// applied absent) or per row. Nothing may change, the NaN payloads included.
TEST(CrossEntropyGpu, RescaleGradientWithEqualFactorsLeavesTheGradientUntouched) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<RescaleCase> cases;
  for (DType t : kDtypes) {
    for (auto [vocab, rows] : {std::pair<int64_t, int64_t>{50257, 37}, {32000, 1}, {3, 5000}}) {
      cases.push_back({.vocab = vocab, .rows = rows, .dtype = t, .g = {1}, .applied = {1}});
      cases.push_back({.vocab = vocab, .rows = rows, .dtype = t, .g = {0.25f}, .applied = {0.25f}});
      cases.push_back({.vocab = vocab, .rows = rows, .dtype = t, .pad = 5, .g = {1}});
      // -0 == +0 as floats: equal too.
      cases.push_back({.vocab = vocab, .rows = rows, .dtype = t, .g = {-0.0f}, .applied = {0}});
      RescaleCase per_row{.vocab = vocab, .rows = rows, .dtype = t};
      for (int64_t r = 0; r < rows; ++r) per_row.g.push_back(0.5f + 0.01f * static_cast<float>(r));
      per_row.applied = per_row.g;
      cases.push_back(per_row);
    }
  }
  RunAll(rt, cases, 20000);
}

// One factor for every row, g != applied: every element, bit for bit; vocabs that are and are not
// multiples of the vector width, one row to more rows than the GPU has blocks in two waves (one
// block per row), strided and misaligned views (narrower vectors).
TEST(CrossEntropyGpu, RescaleGradientByOneFactorMatchesTheFormulaBitForBit) {
  KJIT_REQUIRE_GPU(rt);
  const std::vector<std::pair<std::vector<float>, std::vector<float>>> factors = {
      {{1.7f}, {0.3f}}, {{0.25f}, {}}, {{-2.0f}, {0.5f}}, {{1.0f}, {3.0f}}};
  std::vector<RescaleCase> cases;
  for (DType t : kDtypes) {
    for (int64_t vocab : {2, 3, 7, 1000, 32000, 50257, 128256}) {
      for (int64_t rows : {1, 37, 3000}) {
        if (rows * vocab > (int64_t{1} << 24)) continue;
        const size_t n = cases.size();
        const auto& [g, applied] = factors[n % factors.size()];
        cases.push_back({.vocab = vocab,
                         .rows = rows,
                         .dtype = t,
                         .pad = n % 3 == 1   ? 8
                                : n % 3 == 2 ? 3
                                             : 0,
                         .misalign = n % 5 == 4 ? 1 : 0,
                         .g = g,
                         .applied = applied});
      }
    }
  }
  RunAll(rt, cases, 21000);
}

// One factor per row: rows with g == applied left alone among rows rescaled, applied absent (1),
// NaN g (with applied finite, and with applied NaN too: NaN != NaN) making its row NaN while the
// others stay finite, Inf g, and a zero g.
TEST(CrossEntropyGpu, RescaleGradientPerRowLeavesEqualRowsAndNanOnlyItsRow) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<RescaleCase> cases;
  for (DType t : kDtypes) {
    for (auto [vocab, rows] : {std::pair<int64_t, int64_t>{50257, 37}, {1000, 3000}, {3, 11}}) {
      for (bool with_applied : {true, false}) {
        RescaleCase c{.vocab = vocab, .rows = rows, .dtype = t};
        for (int64_t r = 0; r < rows; ++r) {
          const float a = with_applied ? 0.125f * static_cast<float>(1 + r % 7) : 1.0f;
          float g = r % 3 == 0 ? a : a * (r % 2 ? 1.37f : -0.61f);
          if (r == 4) g = NAN;
          if (r == 5) g = INFINITY;
          if (r == 7) g = 0;
          c.g.push_back(g);
          if (with_applied) c.applied.push_back(r == 10 ? NAN : a);
        }
        if (with_applied) c.g[10] = NAN;
        cases.push_back(c);
      }
    }
  }
  // ExpectRescaled wants every element of a NaN row NaN (x * NaN) and every other row as its
  // formula says: untouched where g == applied, finite where the old value and g / applied are.
  RunAll(rt, cases, 22000);
}

// ForwardBackward with grad_output = applied, then RescaleGradient to g, against ForwardBackward
// run with grad_output = g directly. The two differ by the rounding of the first gradient to the
// dtype, of g / applied and of one more product, and by the fp32 rounding of the scales each run
// computes: |rescaled - direct| <= (3 u + 8 * 2^-24) |direct| + 4 * half the smallest subnormal,
// u the dtype's unit roundoff (2^-8 bf16, 2^-24 fp32), plus 8 * 2^-24 * |row scale| on the target
// column, whose gradient p - 1 cancels in fp32 before its rounding. That tolerance must reject
// the gradient before the rescale and a rescaled entry pushed just past it.
struct RescaledForwardBackward {
  Case c;  // ForwardBackward's; c.upstream: an applied grad_output, else none (1)
  CrossEntropySpec Spec() const { return c.Spec(); }
};

void RunCase(const Runtime& rt, const RescaledForwardBackward& rc, uint64_t seed) {
  const Case& c = rc.c;
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  SCOPED_TRACE(c.Describe());
  ASSERT_OK_AND_ASSIGN(CrossEntropy ce, rt.CrossEntropy(c.Spec()));
  const int64_t V = c.vocab, R = c.rows;
  const bool none = c.reduction == Reduction::kNone;
  const int64_t n = none ? R : 1;
  std::mt19937_64 gen(seed);
  const std::vector<int64_t> targets = MakeTargets(c, gen);
  const std::vector<double> logits = MakeLogits(c, targets, gen);
  // applied in +-[0.25, 2]; g = applied in one row of four (none), else applied times a
  // factor far enough from 1 that the gradient for applied fails the check below.
  std::uniform_real_distribution<float> u(0.25f, 2.0f);
  const float factors[] = {1.37f, -0.61f, 2.9f, 0.23f};
  std::vector<float> applied, g;
  for (int64_t i = 0; i < n; ++i) {
    const float a = c.upstream ? static_cast<float>(i % 3 == 2 ? -1 : 1) * u(gen) : 1.0f;
    if (c.upstream) applied.push_back(a);
    g.push_back(none && i % 4 == 3 ? a : a * factors[i % 4]);
  }
  const Layout lay{c.dtype, R, V, V + c.pad, 0};
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_logits, Upload(rt, lay.Image(logits)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_targets, Upload(rt, IndexBytes(targets, c.target_type)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, n * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ce.WorkspaceBytes(R)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_rescaled, DeviceBuffer::Create(rt, lay.bytes()));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_direct, DeviceBuffer::Create(rt, lay.bytes()));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_g, Upload(rt, FloatBytes(g)));
  std::optional<DeviceBuffer> d_applied;
  if (c.upstream) {
    ASSERT_OK_AND_ASSIGN(d_applied, Upload(rt, FloatBytes(applied)));
  }
  const TensorView g_view = TensorView::Vector(d_g.data(), DType::kF32, n);
  const TensorView applied_view =
      c.upstream ? TensorView::Vector(d_applied->data(), DType::kF32, n) : TensorView{};
  CrossEntropyArgs args{.logits = lay.View(d_logits.data()),
                        .targets = IndexView::Of(d_targets.data(), c.target_type, R),
                        .loss = TensorView::Vector(d_loss.data(), DType::kF32, n),
                        .grad = lay.View(d_rescaled.data()),
                        .grad_output = applied_view,
                        .workspace = d_ws.data(),
                        .workspace_bytes = ce.WorkspaceBytes(R)};
  for (const DeviceBuffer* b : {&d_rescaled, &d_direct}) ASSERT_OK(b->Fill(0xFF));
  ASSERT_OK(ce.ForwardBackward(nullptr, args));
  ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> before, Download(d_rescaled, lay.bytes()));
  ASSERT_OK(ce.RescaleGradient(
      nullptr, {.grad = args.grad, .grad_output = g_view, .applied = applied_view}));
  args.grad = lay.View(d_direct.data());
  args.grad_output = g_view;
  ASSERT_OK(ce.ForwardBackward(nullptr, args));
  ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> after, Download(d_rescaled, lay.bytes()));
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> direct, Download(d_direct, lay.bytes()));
  // The rescale itself, bit for bit, on what ForwardBackward wrote.
  ExpectRescaled(lay, before, after, g, applied);

  bool untouched = true;
  const std::vector<double> first = lay.Values(before, &untouched);
  const std::vector<double> out = lay.Values(after, &untouched);
  const std::vector<double> ref = lay.Values(direct, &untouched);
  EXPECT_TRUE(untouched) << "bytes outside a gradient view were written";
  const double u32 = std::ldexp(1.0, -24);
  const ops::Tolerance tol{.rtol = 3 * ops::RoundingRtol(c.dtype) + 8 * u32,
                           .atol = 4 * ops::RoundingAtol(c.dtype)};
  int64_t valid = 0;
  for (int64_t t : targets) valid += t >= 0 && t < V && t != c.ignore_index;
  std::vector<double> target_atol(R * V, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = targets[r];
    if (t < 0 || t >= V || t == c.ignore_index) continue;
    const double scale = none ? g[r] : g[0] / static_cast<double>(valid);
    target_atol[r * V + t] = 8 * u32 * std::fabs(scale);
  }
  const ops::CompareResult r = ops::Compare(out, ref, tol, target_atol);
  EXPECT_TRUE(r.ok) << r.Describe("rescaled gradient against the direct one");
  EXPECT_FALSE(ops::Compare(first, ref, tol, target_atol).ok)
      << "the tolerance accepts the gradient for applied as the gradient for g";
  for (size_t k = out.size() / 2; r.ok && k < out.size(); ++k) {
    if (!std::isfinite(ref[k]) || ref[k] == 0) continue;
    std::vector<double> bad = out;
    bad[k] = ref[k] + 1.5 * (tol.atol + target_atol[k] + tol.rtol * std::fabs(ref[k]));
    EXPECT_FALSE(ops::Compare(bad, ref, tol, target_atol).ok)
        << "the check accepts a perturbed entry at " << k;
    break;
  }
}

TEST(CrossEntropyGpu, RescaleAfterForwardBackwardMatchesAForwardBackwardWithTheNewGradient) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<RescaledForwardBackward> cases;
  for (Reduction red : {Reduction::kMean, Reduction::kNone}) {
    for (DType t : {DType::kBF16, DType::kF32}) {
      for (int64_t vocab : {50257, 32000}) {
        for (int64_t rows : {1, 37}) {
          const size_t n = cases.size();
          cases.push_back({{.vocab = vocab,
                            .rows = rows,
                            .dtype = t,
                            .reduction = red,
                            .lse = false,
                            .upstream = n % 4 != 1,  // else applied is absent (1)
                            .pad = n % 3 == 1   ? 8
                                   : n % 3 == 2 ? 3
                                                : 0}});
        }
      }
    }
  }
  RunAll(rt, cases, 23000);
}

// Captured into a CUDA graph, the rescale reads g and applied when it runs: one graph replayed
// with g == applied leaves the gradient alone, and after g changes on the device it rescales, as
// a direct launch does.
TEST(CrossEntropyGpu, RescaleGradientInAGraphReadsItsFactorsWhenItRuns) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t V = 32000, R = 64;
  ASSERT_OK_AND_ASSIGN(CrossEntropy ce, rt.CrossEntropy({.vocab = V, .dtype = DType::kBF16}));
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  std::mt19937_64 gen(24000);
  const Layout lay{DType::kBF16, R, V, V, 0};
  const std::vector<unsigned char> image =
      lay.Image(ops::RandomValues(gen, R * V, 0.01, 0, lay.dtype));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_grad, Upload(rt, image));
  const std::vector<float> applied = {0.5f}, g = {1.5f};
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_g, Upload(rt, Encode({0.5}, DType::kF32)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_applied, Upload(rt, Encode({0.5}, DType::kF32)));
  const CrossEntropyRescaleArgs args{
      .grad = lay.View(d_grad.data()),
      .grad_output = TensorView::Vector(d_g.data(), DType::kF32, 1),
      .applied = TensorView::Vector(d_applied.data(), DType::kF32, 1)};
  CUstream stream = nullptr;
  ASSERT_EQ(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cu.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  const absl::Status captured = ce.RescaleGradient(stream, args);
  CUgraph graph = nullptr;
  ASSERT_EQ(cu.cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_OK(captured);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  auto replay = [&]() -> absl::StatusOr<std::vector<unsigned char>> {
    KJIT_RETURN_IF_ERROR(cu.Check(cu.cuGraphLaunch(exec, stream), "cuGraphLaunch"));
    KJIT_RETURN_IF_ERROR(cu.Check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize"));
    return Download(d_grad, lay.bytes());
  };
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> same, replay());
  EXPECT_TRUE(same == image) << "g == applied: the replay changed the gradient";
  ASSERT_OK(d_g.Upload(g.data(), sizeof(float)));
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> scaled, replay());
  ExpectRescaled(lay, image, scaled, g, applied);
  ASSERT_OK(d_grad.Upload(image.data(), image.size()));
  ASSERT_OK(ce.RescaleGradient(stream, args));
  ASSERT_EQ(cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
  ASSERT_OK_AND_ASSIGN(const std::vector<unsigned char> direct, Download(d_grad, lay.bytes()));
  EXPECT_TRUE(direct == scaled) << "the replay and a direct launch differ";
  EXPECT_EQ(cu.cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuStreamDestroy(stream), CUDA_SUCCESS);
}

TEST(CrossEntropyGpu, BadInputLaunchesNothing) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t V = 64, R = 2;
  auto ce = rt.CrossEntropy({.vocab = V, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(ce.ok()) << ce.status();
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_x, DeviceBuffer::Create(rt, R * V * 2));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_t, Upload(rt, IndexBytes({1, 2}, IndexType::kInt64)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, R * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ce->WorkspaceBytes(R)));
  ASSERT_OK(d_loss.Fill(0xFF));
  CrossEntropyArgs a{.logits = TensorView::Matrix(d_x.data(), DType::kBF16, R, V),
                     .targets = IndexView::Of(d_t.data(), IndexType::kInt64, R),
                     .loss = TensorView::Vector(d_loss.data(), DType::kF32, R),
                     .workspace = d_ws.data(),
                     .workspace_bytes = ce->WorkspaceBytes(R) - 1};
  const absl::Status s = ce->Forward(nullptr, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(ToStd(s.message()).find("workspace_bytes"), std::string_view::npos) << s;
  ASSERT_EQ(kjit::internal::StateOf(rt).driver->cuCtxSynchronize(), CUDA_SUCCESS);
  ASSERT_OK_AND_ASSIGN(auto bytes, Download(d_loss, R * 4));
  for (unsigned char b : bytes) ASSERT_EQ(b, 0xFF) << "the output was written despite the error";
}

}  // namespace
}  // namespace kjit
