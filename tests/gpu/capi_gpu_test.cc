// The C API (kjit/kjit_c.h) on the GPU: both ops run through libkjit_c.so and through the C++ API
// on the same inputs, with the same spec and config, and every output must have the same bits (the
// C layer only converts arguments). RMSNorm forward and backward with and without the fused
// residual; cross-entropy forward, forward_backward out of place and in place, backward from the
// lse and rescale_gradient (rows whose grad_output equals `applied` untouched, the others scaled by
// grad_output / applied), and with class weights (fp32 and bf16) forward_backward and backward;
// the fused linear + cross-entropy's forward, forward_backward and forward_backward accumulating
// into existing gradients, with one and two streams. Odd shapes, so that tails and scalar paths
// run.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "kjit/kjit_c.h"
#include "kjit/sharded_cross_entropy.h"
#include "ops/common/tuning/random_values.h"
#include "tests/gpu/gpu_test_env.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

// Test plumbing that throws (gtest reports the message and fails the test) instead of returning.
template <class T>
T Must(absl::StatusOr<T> v) {
  if (!v.ok()) throw std::runtime_error(std::string(ToStd(v.status().message())));
  return *std::move(v);
}
void Must(const absl::Status& s) {
  if (!s.ok()) throw std::runtime_error(std::string(ToStd(s.message())));
}
void MustC(kjit_status s) {
  if (s != KJIT_OK)
    throw std::runtime_error(fmt::format("{}: {}", kjit_status_name(s), kjit_last_error()));
}

kjit_tensor C(const TensorView& v) {
  return {v.data, static_cast<int32_t>(v.dtype), v.rows, v.cols, v.row_stride};
}
kjit_index C(const IndexView& v) { return {v.data, static_cast<int32_t>(v.type), v.size}; }

// The test's device buffers, on the GPU the C++ runtime holds; the C API's runtime uses the same
// device's primary context, so both read and write them.
class Memory {
 public:
  explicit Memory(const Runtime& rt) : rt_(rt) {}
  // Random values of `dtype` (unit deviation) in a [rows, cols] matrix.
  TensorView Random(DType dtype, int64_t rows, int64_t cols) {
    Keep(Must(UploadValues(rt_, ops::RandomValues(rng_, rows * cols, 1.0, 0.0, dtype), dtype)));
    return TensorView::Matrix(buffers_.back().data(), dtype, rows, cols);
  }
  TensorView Values(const std::vector<double>& values, DType dtype) {
    Keep(Must(UploadValues(rt_, values, dtype)));
    return TensorView::Vector(buffers_.back().data(), dtype, static_cast<int64_t>(values.size()));
  }
  // An output of this shape, poisoned with NaN bytes.
  TensorView Output(const TensorView& like) {
    return Bytes(like.rows * like.row_stride * SizeOf(like.dtype), like);
  }
  // A copy of `v`'s buffer, viewed the same way.
  TensorView Copy(const TensorView& v) {
    TensorView copy = Output(v);
    Must(buffers_.back().CopyFrom(Find(v.data)));
    return copy;
  }
  void* Workspace(int64_t bytes) { return Bytes(static_cast<size_t>(bytes), {}).data; }
  // int64 targets spread over the vocab, with one row ignored (-100).
  IndexView Targets(int64_t rows, int64_t vocab, int64_t ignored_row) {
    std::vector<int64_t> targets;
    for (int64_t r = 0; r < rows; ++r)
      targets.push_back(r == ignored_row ? -100 : r * 7919 % vocab);
    Keep(Must(DeviceBuffer::Create(rt_, targets.size() * sizeof(int64_t))));
    Must(buffers_.back().Upload(targets.data(), targets.size() * sizeof(int64_t)));
    return IndexView::Of(buffers_.back().data(), IndexType::kInt64, rows);
  }
  std::vector<unsigned char> Read(const TensorView& v) {
    const DeviceBuffer& b = Find(v.data);
    std::vector<unsigned char> out(b.size());
    Must(b.Download(out.data(), out.size()));
    return out;
  }
  std::vector<double> ReadValues(const TensorView& v) {
    return Must(DownloadValues(Find(v.data), v.dtype));
  }
  // `count` floats at `at`, inside one of the test's buffers (synchronous copies).
  std::vector<float> ReadFloats(const void* buffer, const float* at, int64_t count) {
    std::vector<float> out(count);
    Must(Find(buffer).Download(out.data(), count * sizeof(float), Offset(buffer, at)));
    return out;
  }
  void WriteFloats(const void* buffer, float* at, const std::vector<float>& values) {
    Must(Find(buffer).Upload(values.data(), values.size() * sizeof(float), Offset(buffer, at)));
  }

 private:
  TensorView Bytes(size_t bytes, TensorView view) {
    Keep(Must(DeviceBuffer::Create(rt_, bytes)));
    Must(buffers_.back().Fill(0xFF));
    view.data = buffers_.back().data();
    return view;
  }
  void Keep(DeviceBuffer b) { buffers_.push_back(std::move(b)); }
  static size_t Offset(const void* buffer, const float* at) {
    return static_cast<size_t>(reinterpret_cast<const unsigned char*>(at) -
                               static_cast<const unsigned char*>(buffer));
  }
  const DeviceBuffer& Find(const void* data) const {
    for (const DeviceBuffer& b : buffers_) {
      if (b.data() == data) return b;
    }
    throw std::runtime_error("no such buffer");
  }

  const Runtime& rt_;
  std::mt19937_64 rng_{20261202};
  std::deque<DeviceBuffer> buffers_;
};

// The index of the first byte where two outputs differ, or -1.
int64_t FirstDifference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

void ExpectSameBits(Memory& mem, const TensorView& cpp, const TensorView& c, const char* what) {
  EXPECT_EQ(FirstDifference(mem.Read(cpp), mem.Read(c)), -1)
      << what << ": the C API's output differs from the C++ API's at that byte";
}

// The C API's own runtime on device 0.
std::unique_ptr<kjit_runtime, decltype(&kjit_runtime_destroy)> CRuntime() {
  kjit_runtime* rt = nullptr;
  MustC(kjit_runtime_create(nullptr, &rt));
  return {rt, kjit_runtime_destroy};
}

TEST(CapiGpu, RuntimeInfoDescribesTheGpu) {
  KJIT_REQUIRE_GPU(rt);
  auto crt = CRuntime();
  char* text = nullptr;
  MustC(kjit_runtime_info(crt.get(), &text));
  const std::string json = text;
  kjit_free(text);
  EXPECT_NE(json.find(fmt::format("\"target\":\"{}\"", rt.target())), std::string::npos) << json;
  EXPECT_NE(json.find(fmt::format("\"sm_count\":{}", rt.device().sm_count)), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"compile_only\":false"), std::string::npos) << json;
}

// A tuning database that is not JSON: the runtime goes on with the heuristics and says so through
// the warning callback (a compile-only runtime reads no database, so tests/capi cannot see this).
TEST(CapiGpu, TuningDatabaseWarningsReachTheCallback) {
  KJIT_REQUIRE_GPU(rt);
  testing::TempDir tmp("kjit_capi_gpu_test");
  const std::string db = tmp.path() + "/tuning.json";
  std::FILE* f = std::fopen(db.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("{not json", f);
  std::fclose(f);
  std::vector<std::string> warnings;
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.tuning_db = db.c_str();
  o.warning = [](const char* message, void* user_data) {
    static_cast<std::vector<std::string>*>(user_data)->push_back(message);
  };
  o.warning_user_data = &warnings;
  kjit_runtime* crt = nullptr;
  MustC(kjit_runtime_create(&o, &crt));
  kjit_runtime_destroy(crt);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ignoring the tuning database"), std::string::npos) << warnings[0];
}

class CapiRmsNormGpu : public ::testing::TestWithParam<bool> {};

TEST_P(CapiRmsNormGpu, SameBitsAsTheCppApi) {
  KJIT_REQUIRE_GPU(rt);
  const bool fused = GetParam();
  const int64_t rows = 7, hidden = 4095;
  RmsNormSpec spec{.hidden = hidden, .dtype = DType::kBF16, .eps = 1e-5f, .fused_residual = fused};
  spec.config = Must(rt.RmsNorm(spec)).ConfigFor(rows);
  const RmsNorm cpp = Must(rt.RmsNorm(spec));
  const std::string config = spec.config->ToString();

  auto crt = CRuntime();
  kjit_rms_norm_spec cspec;
  kjit_rms_norm_spec_init(&cspec);
  cspec.hidden = hidden;
  cspec.dtype = KJIT_BF16;
  cspec.eps = 1e-5f;
  cspec.fused_residual = fused;
  cspec.config = config.c_str();
  kjit_rms_norm* raw = nullptr;
  MustC(kjit_rms_norm_create(crt.get(), &cspec, &raw));
  std::unique_ptr<kjit_rms_norm, decltype(&kjit_rms_norm_destroy)> c(raw, kjit_rms_norm_destroy);

  Memory mem(rt);
  const TensorView x = mem.Random(DType::kBF16, rows, hidden);
  const TensorView w = mem.Random(DType::kBF16, 1, hidden);
  const TensorView residual = fused ? mem.Random(DType::kBF16, rows, hidden) : TensorView{};
  const TensorView rstd_like = TensorView::Vector(nullptr, DType::kF32, rows);
  RmsNormForwardArgs f{.x = x, .weight = w, .y = mem.Output(x), .rstd = mem.Output(rstd_like)};
  if (fused) {
    f.residual = residual;
    f.residual_out = mem.Output(x);
  }
  kjit_rms_norm_forward_args cf;
  kjit_rms_norm_forward_args_init(&cf);
  cf.x = C(x);
  cf.weight = C(w);
  const TensorView y = mem.Output(x), rstd = mem.Output(rstd_like);
  const TensorView residual_out = fused ? mem.Output(x) : TensorView{};
  cf.y = C(y);
  cf.rstd = C(rstd);
  cf.residual = C(residual);
  cf.residual_out = C(residual_out);
  Must(cpp.Forward(nullptr, f));
  MustC(kjit_rms_norm_forward(c.get(), nullptr, &cf));
  ExpectSameBits(mem, f.y, y, "y");
  ExpectSameBits(mem, f.rstd, rstd, "rstd");
  if (fused) ExpectSameBits(mem, f.residual_out, residual_out, "residual_out");

  int64_t ws_bytes = -1;
  MustC(kjit_rms_norm_backward_workspace_bytes(c.get(), rows, &ws_bytes));
  EXPECT_EQ(ws_bytes, cpp.BackwardWorkspaceBytes(rows));
  const TensorView dy = mem.Random(DType::kBF16, rows, hidden);
  const TensorView normalized = fused ? f.residual_out : x;
  RmsNormBackwardArgs b{.dy = dy,
                        .x = normalized,
                        .weight = w,
                        .rstd = f.rstd,
                        .dx = mem.Output(x),
                        .dw = mem.Output(w),
                        .dresidual = fused ? mem.Random(DType::kBF16, rows, hidden) : TensorView{},
                        .workspace = mem.Workspace(ws_bytes),
                        .workspace_bytes = ws_bytes};
  kjit_rms_norm_backward_args cb;
  kjit_rms_norm_backward_args_init(&cb);
  const TensorView dx = mem.Output(x), dw = mem.Output(w);
  cb.dy = C(dy);
  cb.x = C(normalized);
  cb.weight = C(w);
  cb.rstd = C(f.rstd);
  cb.dx = C(dx);
  cb.dw = C(dw);
  cb.dresidual = C(b.dresidual);
  cb.workspace = mem.Workspace(ws_bytes);
  cb.workspace_bytes = ws_bytes;
  Must(cpp.Backward(nullptr, b));
  MustC(kjit_rms_norm_backward(c.get(), nullptr, &cb));
  ExpectSameBits(mem, b.dx, dx, "dx");
  ExpectSameBits(mem, b.dw, dw, "dw");
}

INSTANTIATE_TEST_SUITE_P(Residual, CapiRmsNormGpu, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Fused" : "Plain"; });

// Cross-entropy through both APIs: one op each, the same spec and config, shared inputs.
class CapiCrossEntropyGpu : public ::testing::Test {
 protected:
  static constexpr int64_t kRows = 7, kVocab = 50257;

  void SetUp() override {
    const auto& gpu = testing::GpuRuntime();
    if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << ToStd(gpu.status().message());
    rt_ = &*gpu;
    spec_.config = Must(rt_->CrossEntropy(spec_)).ConfigFor(kRows);
    cpp_.emplace(Must(rt_->CrossEntropy(spec_)));
    config_ = spec_.config->ToString();

    crt_ = CRuntime();
    kjit_cross_entropy_spec cspec;
    kjit_cross_entropy_spec_init(&cspec);
    cspec.vocab = kVocab;
    cspec.dtype = KJIT_BF16;
    cspec.loss.target_type = KJIT_INT64;
    cspec.loss.reduction = KJIT_REDUCTION_MEAN;
    cspec.config = config_.c_str();
    kjit_cross_entropy* raw = nullptr;
    MustC(kjit_cross_entropy_create(crt_.get(), &cspec, &raw));
    c_.reset(raw);

    mem_.emplace(*rt_);
    logits_ = mem_->Random(DType::kBF16, kRows, kVocab);
    targets_ = mem_->Targets(kRows, kVocab, /*ignored_row=*/3);
    MustC(kjit_cross_entropy_workspace_bytes(c_.get(), kRows, &ws_bytes_));
    EXPECT_EQ(ws_bytes_, cpp_->WorkspaceBytes(kRows));
  }

  // Arguments for both APIs with their own outputs (and workspaces) and the shared inputs.
  struct Both {
    CrossEntropyArgs cpp;
    kjit_cross_entropy_args c;
    TensorView c_loss, c_lse, c_grad;
  };
  Both Args(bool grad, bool in_place) {
    Both a;
    const TensorView loss_like = TensorView::Vector(nullptr, DType::kF32, 1);
    const TensorView lse_like = TensorView::Vector(nullptr, DType::kF32, kRows);
    a.cpp = {.logits = in_place ? mem_->Copy(logits_) : logits_,
             .targets = targets_,
             .loss = mem_->Output(loss_like),
             .lse = mem_->Output(lse_like),
             .workspace = mem_->Workspace(ws_bytes_),
             .workspace_bytes = ws_bytes_};
    if (grad) a.cpp.grad = in_place ? a.cpp.logits : mem_->Output(logits_);
    kjit_cross_entropy_args_init(&a.c);
    const TensorView c_logits = in_place ? mem_->Copy(logits_) : logits_;
    a.c_loss = mem_->Output(loss_like);
    a.c_lse = mem_->Output(lse_like);
    a.c_grad = !grad ? TensorView{} : in_place ? c_logits : mem_->Output(logits_);
    a.c.logits = C(c_logits);
    a.c.targets = C(targets_);
    a.c.loss = C(a.c_loss);
    a.c.lse = C(a.c_lse);
    a.c.grad = C(a.c_grad);
    a.c.workspace = mem_->Workspace(ws_bytes_);
    a.c.workspace_bytes = ws_bytes_;
    return a;
  }
  void ExpectSame(const Both& a) {
    ExpectSameBits(*mem_, a.cpp.loss, a.c_loss, "loss");
    ExpectSameBits(*mem_, a.cpp.lse, a.c_lse, "lse");
    if (!a.c_grad.empty()) ExpectSameBits(*mem_, a.cpp.grad, a.c_grad, "grad");
  }
  // The gradient from a forward's lse (upstream 0.5) through both APIs: the same bits.
  void ExpectBackwardSame(const CrossEntropy& cpp, kjit_cross_entropy* c, const TensorView& lse,
                          const TensorView& class_weight) {
    const TensorView grad_output = mem_->Values({0.5}, DType::kF32);
    const CrossEntropyBackwardArgs b{.logits = logits_,
                                     .targets = targets_,
                                     .lse = lse,
                                     .grad_output = grad_output,
                                     .grad = mem_->Output(logits_),
                                     .class_weight = class_weight,
                                     .workspace = mem_->Workspace(ws_bytes_),
                                     .workspace_bytes = ws_bytes_};
    const TensorView grad = mem_->Output(logits_);
    kjit_cross_entropy_backward_args cb;
    kjit_cross_entropy_backward_args_init(&cb);
    cb.logits = C(logits_);
    cb.targets = C(targets_);
    cb.lse = C(lse);
    cb.grad_output = C(grad_output);
    cb.grad = C(grad);
    cb.class_weight = C(class_weight);
    cb.workspace = mem_->Workspace(ws_bytes_);
    cb.workspace_bytes = ws_bytes_;
    Must(cpp.Backward(nullptr, b));
    MustC(kjit_cross_entropy_backward(c, nullptr, &cb));
    ExpectSameBits(*mem_, b.grad, grad, "grad from the lse");
  }

  const Runtime* rt_ = nullptr;
  CrossEntropySpec spec_{.vocab = kVocab, .dtype = DType::kBF16};
  std::optional<CrossEntropy> cpp_;
  std::string config_;
  std::unique_ptr<kjit_runtime, decltype(&kjit_runtime_destroy)> crt_{nullptr,
                                                                      kjit_runtime_destroy};
  std::unique_ptr<kjit_cross_entropy, decltype(&kjit_cross_entropy_destroy)> c_{
      nullptr, kjit_cross_entropy_destroy};
  std::optional<Memory> mem_;
  TensorView logits_;
  IndexView targets_;
  int64_t ws_bytes_ = 0;
};

TEST_F(CapiCrossEntropyGpu, Forward) {
  const Both a = Args(/*grad=*/false, /*in_place=*/false);
  Must(cpp_->Forward(nullptr, a.cpp));
  MustC(kjit_cross_entropy_forward(c_.get(), nullptr, &a.c));
  ExpectSame(a);
}

TEST_F(CapiCrossEntropyGpu, ForwardBackwardOutOfPlaceAndInPlace) {
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    const Both a = Args(/*grad=*/true, in_place);
    Must(cpp_->ForwardBackward(nullptr, a.cpp));
    MustC(kjit_cross_entropy_forward_backward(c_.get(), nullptr, &a.c));
    ExpectSame(a);
  }
}

TEST_F(CapiCrossEntropyGpu, BackwardFromTheLse) {
  const Both f = Args(/*grad=*/false, /*in_place=*/false);
  Must(cpp_->Forward(nullptr, f.cpp));
  ExpectBackwardSame(*cpp_, c_.get(), f.cpp.lse, {});
}

// Class weights (some zero, the target's among them; label smoothing reads every one), fp32 and in
// the logits' bf16: forward_backward in place and backward from the lse, through both APIs, the
// same bits.
TEST_F(CapiCrossEntropyGpu, ClassWeights) {
  std::vector<double> weights;
  for (int64_t j = 0; j < kVocab; ++j) weights.push_back(0.5 * (j % 5));  // class 0: row 0's
  for (DType weight_dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Name(weight_dtype));
    CrossEntropySpec spec{.vocab = kVocab,
                          .dtype = DType::kBF16,
                          .loss = {.label_smoothing = 0.1f, .class_weight_dtype = weight_dtype}};
    spec.config = Must(rt_->CrossEntropy(spec)).ConfigFor(kRows);
    const CrossEntropy cpp = Must(rt_->CrossEntropy(spec));
    const std::string config = spec.config->ToString();
    kjit_cross_entropy_spec cspec;
    kjit_cross_entropy_spec_init(&cspec);
    cspec.vocab = kVocab;
    cspec.dtype = KJIT_BF16;
    cspec.loss.label_smoothing = 0.1f;
    cspec.loss.class_weight_dtype = static_cast<int32_t>(weight_dtype);
    cspec.config = config.c_str();
    kjit_cross_entropy* raw = nullptr;
    MustC(kjit_cross_entropy_create(crt_.get(), &cspec, &raw));
    std::unique_ptr<kjit_cross_entropy, decltype(&kjit_cross_entropy_destroy)> c(
        raw, kjit_cross_entropy_destroy);
    const TensorView w = mem_->Values(weights, weight_dtype);

    Both a = Args(/*grad=*/true, /*in_place=*/true);
    a.cpp.class_weight = w;
    a.c.class_weight = C(w);
    Must(cpp.ForwardBackward(nullptr, a.cpp));
    MustC(kjit_cross_entropy_forward_backward(c.get(), nullptr, &a.c));
    ExpectSame(a);

    const Both f = Args(/*grad=*/false, /*in_place=*/false);
    CrossEntropyArgs forward = f.cpp;
    forward.class_weight = w;
    Must(cpp.Forward(nullptr, forward));
    ExpectBackwardSame(cpp, c.get(), forward.lse, w);
  }
}

// rescale_gradient on copies of one forward_backward's gradient: through both APIs, the same bits;
// rows whose grad_output equals applied keep theirs, the others become grad * grad_output / applied
// (in fp32, rounded once to bf16).
TEST_F(CapiCrossEntropyGpu, RescaleGradient) {
  const Both fb = Args(/*grad=*/true, /*in_place=*/false);
  Must(cpp_->ForwardBackward(nullptr, fb.cpp));
  const std::vector<unsigned char> before_bytes = mem_->Read(fb.cpp.grad);
  const std::vector<double> before = Decode(before_bytes, DType::kBF16);
  const size_t row_bytes = kVocab * sizeof(uint16_t);

  struct Case {
    const char* name;
    std::vector<double> grad_output, applied;
  };
  std::vector<double> per_row_output, per_row_applied;
  for (int64_t r = 0; r < kRows; ++r) {
    per_row_output.push_back(r % 2 == 0 ? 2.0 : 3.0);
    per_row_applied.push_back(r % 2 == 0 ? 2.0 : 0.75);
  }
  for (const Case& k : {Case{"[1], grad_output == applied", {2.0}, {2.0}},
                        Case{"[1], grad_output != applied", {3.0}, {2.0}},
                        Case{"[rows], odd rows differ", per_row_output, per_row_applied}}) {
    SCOPED_TRACE(k.name);
    const TensorView g = mem_->Values(k.grad_output, DType::kF32);
    const TensorView s = mem_->Values(k.applied, DType::kF32);
    const CrossEntropyRescaleArgs cpp{
        .grad = mem_->Copy(fb.cpp.grad), .grad_output = g, .applied = s};
    const TensorView grad = mem_->Copy(fb.cpp.grad);
    kjit_cross_entropy_rescale_args cr;
    kjit_cross_entropy_rescale_args_init(&cr);
    cr.grad = C(grad);
    cr.grad_output = C(g);
    cr.applied = C(s);
    Must(cpp_->RescaleGradient(nullptr, cpp));
    MustC(kjit_cross_entropy_rescale_gradient(c_.get(), nullptr, &cr));
    ExpectSameBits(*mem_, cpp.grad, grad, "rescaled grad");

    const std::vector<unsigned char> after_bytes = mem_->Read(grad);
    const std::vector<double> after = Decode(after_bytes, DType::kBF16);
    int wrong = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const size_t i = k.grad_output.size() == 1 ? 0 : r;
      if (k.grad_output[i] == k.applied[i]) {
        EXPECT_EQ(std::memcmp(&before_bytes[r * row_bytes], &after_bytes[r * row_bytes], row_bytes),
                  0)
            << "row " << r << " was touched";
        continue;
      }
      const float factor = static_cast<float>(k.grad_output[i]) / static_cast<float>(k.applied[i]);
      for (int64_t j = 0; j < kVocab; ++j) {
        const double old = before[r * kVocab + j], now = after[r * kVocab + j];
        const double want = RoundTo(static_cast<float>(old) * factor, DType::kBF16);
        // fp32 arithmetic in another order may round to the neighbouring bf16 value.
        if (!(std::abs(now - want) <= std::abs(want) * 0x1p-7) && ++wrong <= 5) {
          ADD_FAILURE() << "row " << r << " col " << j << ": " << old << " became " << now
                        << ", expected " << want;
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

// Linear + cross-entropy through both APIs: 77 rows in chunks of 32 (a short last chunk), a bias,
// argmax, label smoothing and z-loss, an upstream gradient, one and two streams (the parameter);
// forward, forward_backward, and forward_backward adding to existing gradients. Each API has its
// own op, outputs and workspace, and every output must have the same bits.
class CapiLinearCrossEntropyGpu : public ::testing::TestWithParam<int> {};

TEST_P(CapiLinearCrossEntropyGpu, SameBitsAsTheCppApi) {
  KJIT_REQUIRE_GPU(rt);
  const int streams = GetParam();
  const int64_t rows = 77, vocab = 1000, hidden = 64;
  const LinearCrossEntropySpec spec{
      .vocab = vocab,
      .hidden = hidden,
      .dtype = DType::kBF16,
      .bias = true,
      .loss = {.label_smoothing = 0.05f, .z_loss = 1e-4f, .argmax = true},
      .config = LinearCrossEntropyConfig{.chunk_rows = 32, .streams = streams}};
  const LinearCrossEntropy cpp = Must(rt.LinearCrossEntropy(spec));
  const std::string config = spec.config->ToString();

  auto crt = CRuntime();
  kjit_linear_cross_entropy_spec cspec;
  kjit_linear_cross_entropy_spec_init(&cspec);
  cspec.vocab = vocab;
  cspec.hidden = hidden;
  cspec.dtype = KJIT_BF16;
  cspec.bias = 1;
  cspec.loss.label_smoothing = 0.05f;
  cspec.loss.z_loss = 1e-4f;
  cspec.loss.argmax = 1;
  cspec.config = config.c_str();
  kjit_linear_cross_entropy* raw = nullptr;
  MustC(kjit_linear_cross_entropy_create(crt.get(), &cspec, &raw));
  std::unique_ptr<kjit_linear_cross_entropy, decltype(&kjit_linear_cross_entropy_destroy)> c(
      raw, kjit_linear_cross_entropy_destroy);

  char* text = nullptr;
  MustC(kjit_linear_cross_entropy_config_for(c.get(), rows, &text));
  EXPECT_EQ(std::string(text), cpp.ConfigFor(rows).ToString());
  kjit_free(text);
  int64_t ws_bytes = -1, acc_bytes = -1;
  MustC(kjit_linear_cross_entropy_workspace_bytes(c.get(), rows, &ws_bytes));
  EXPECT_EQ(ws_bytes, cpp.WorkspaceBytes(rows));
  MustC(kjit_linear_cross_entropy_accumulator_bytes(c.get(), rows, &acc_bytes));
  EXPECT_EQ(acc_bytes, cpp.AccumulatorBytes(rows));
  EXPECT_GT(acc_bytes, 0) << "bf16 d_weight: an fp32 accumulator";

  Memory mem(rt);
  const TensorView h = mem.Random(DType::kBF16, rows, hidden);
  const TensorView w = mem.Random(DType::kBF16, vocab, hidden);
  const TensorView b = mem.Random(DType::kBF16, 1, vocab);
  const IndexView targets = mem.Targets(rows, vocab, /*ignored_row=*/5);
  const TensorView grad_output = mem.Values({0.75}, DType::kF32);
  const TensorView d_weight_before = mem.Random(DType::kBF16, vocab, hidden);
  const TensorView d_bias_before = mem.Random(DType::kBF16, 1, vocab);

  struct Outputs {
    TensorView loss, lse, argmax, d_hidden, d_weight, d_bias;
  };
  auto outputs = [&](bool accumulate) {
    return Outputs{.loss = mem.Output(TensorView::Vector(nullptr, DType::kF32, 1)),
                   .lse = mem.Output(TensorView::Vector(nullptr, DType::kF32, rows)),
                   // int64 argmax: the bytes of 2 * rows floats
                   .argmax = mem.Output(TensorView::Vector(nullptr, DType::kF32, 2 * rows)),
                   .d_hidden = mem.Output(h),
                   .d_weight = accumulate ? mem.Copy(d_weight_before) : mem.Output(w),
                   .d_bias = accumulate ? mem.Copy(d_bias_before) : mem.Output(b)};
  };
  struct Mode {
    const char* name;
    bool gradient, accumulate;
  };
  for (const Mode& m : {Mode{"forward", false, false}, Mode{"forward_backward", true, false},
                        Mode{"forward_backward accumulating", true, true}}) {
    SCOPED_TRACE(m.name);
    const Outputs o = outputs(m.accumulate), co = outputs(m.accumulate);
    LinearCrossEntropyArgs a{.hidden_states = h,
                             .weight = w,
                             .bias = b,
                             .targets = targets,
                             .loss = o.loss,
                             .lse = o.lse,
                             .argmax = IndexView::Of(o.argmax.data, IndexType::kInt64, rows),
                             .workspace = mem.Workspace(ws_bytes),
                             .workspace_bytes = ws_bytes};
    kjit_linear_cross_entropy_args ca;
    kjit_linear_cross_entropy_args_init(&ca);
    ca.hidden_states = C(h);
    ca.weight = C(w);
    ca.bias = C(b);
    ca.targets = C(targets);
    ca.loss = C(co.loss);
    ca.lse = C(co.lse);
    ca.argmax = C(IndexView::Of(co.argmax.data, IndexType::kInt64, rows));
    ca.workspace = mem.Workspace(ws_bytes);
    ca.workspace_bytes = ws_bytes;
    if (m.gradient) {
      a.grad_output = grad_output;
      a.d_hidden = o.d_hidden;
      a.d_weight = o.d_weight;
      a.d_bias = o.d_bias;
      a.accumulate = m.accumulate;
      ca.grad_output = C(grad_output);
      ca.d_hidden = C(co.d_hidden);
      ca.d_weight = C(co.d_weight);
      ca.d_bias = C(co.d_bias);
      ca.accumulate = m.accumulate;
      Must(cpp.ForwardBackward(nullptr, a));
      MustC(kjit_linear_cross_entropy_forward_backward(c.get(), nullptr, &ca));
    } else {
      Must(cpp.Forward(nullptr, a));
      MustC(kjit_linear_cross_entropy_forward(c.get(), nullptr, &ca));
    }
    ExpectSameBits(mem, o.loss, co.loss, "loss");
    ExpectSameBits(mem, o.lse, co.lse, "lse");
    ExpectSameBits(mem, o.argmax, co.argmax, "argmax");
    // A launch that wrote nothing would leave the 0xFF bytes: a NaN loss.
    const std::vector<double> loss = Decode(mem.Read(co.loss), DType::kF32);
    EXPECT_TRUE(std::isfinite(loss[0])) << loss[0];
    if (!m.gradient) continue;
    ExpectSameBits(mem, o.d_hidden, co.d_hidden, "d_hidden");
    ExpectSameBits(mem, o.d_weight, co.d_weight, "d_weight");
    ExpectSameBits(mem, o.d_bias, co.d_bias, "d_bias");
    EXPECT_NE(FirstDifference(mem.Read(co.d_weight), mem.Read(d_weight_before)), -1)
        << "d_weight was not written";
  }
}

INSTANTIATE_TEST_SUITE_P(Streams, CapiLinearCrossEntropyGpu, ::testing::Values(1, 2),
                         [](const auto& info) { return info.param == 1 ? "One" : "Two"; });

}  // namespace
}  // namespace kjit

namespace kjit {
namespace {

// The vocab-parallel cross-entropy: two shards of an odd vocab (label smoothing, z-loss and the
// mean, so that every statistic counts), through the C++ API and the C API on the same logits.
// compute_stats, combine_stats and finish give the C++ op's bits; the per-step path a framework
// takes with its own collectives (stats_of, an all-reduce with max done here on the host,
// rescale_stats, an all-reduce with sum) gives the combine's loss and gradients to within fp32
// rounding of the sums' order (relative 1e-6 on the loss, 2 bf16 ulps on the gradients).
TEST(CapiShardedCrossEntropyGpu, SameBitsAsTheCppApiAndOwnAllReduces) {
  KJIT_REQUIRE_GPU(rt);
  constexpr int64_t kRows = 7, kVocab = 50257, kSplit = 25000;
  Memory mem(rt);
  const TensorView logits[2] = {mem.Random(DType::kBF16, kRows, kSplit),
                                mem.Random(DType::kBF16, kRows, kVocab - kSplit)};
  const IndexView targets = mem.Targets(kRows, kVocab, /*ignored_row=*/3);
  auto crt = CRuntime();
  std::vector<ShardedCrossEntropy> cpp;
  std::vector<
      std::unique_ptr<kjit_sharded_cross_entropy, decltype(&kjit_sharded_cross_entropy_destroy)>>
      c;
  for (int i = 0; i < 2; ++i) {
    const ShardedCrossEntropySpec spec{.vocab = kVocab,
                                       .shard_start = i == 0 ? 0 : kSplit,
                                       .shard_end = i == 0 ? kSplit : kVocab,
                                       .loss = {.label_smoothing = 0.1f, .z_loss = 1e-4f}};
    cpp.push_back(Must(rt.ShardedCrossEntropy(spec)));
    const std::string config = cpp.back().config().ToString();
    kjit_sharded_cross_entropy_spec cs;
    kjit_sharded_cross_entropy_spec_init(&cs);
    cs.vocab = spec.vocab;
    cs.shard_start = spec.shard_start;
    cs.shard_end = spec.shard_end;
    cs.loss.label_smoothing = spec.loss.label_smoothing;
    cs.loss.z_loss = spec.loss.z_loss;
    cs.config = config.c_str();
    kjit_sharded_cross_entropy* raw = nullptr;
    MustC(kjit_sharded_cross_entropy_create(crt.get(), &cs, &raw));
    c.emplace_back(raw, kjit_sharded_cross_entropy_destroy);
  }
  int64_t ws_bytes = 0;
  MustC(kjit_sharded_cross_entropy_workspace_bytes(c[0].get(), kRows, &ws_bytes));
  ASSERT_EQ(ws_bytes, cpp[0].WorkspaceBytes(kRows));
  const TensorView loss_like = TensorView::Vector(nullptr, DType::kF32, 1);
  // Three runs, each with its own outputs: C++ with CombineStats, C with combine_stats, C with
  // stats_of and host all-reduces.
  struct Run {
    ShardedCrossEntropyArgs a[2];
    kjit_sharded_cross_entropy_args ca[2];
  };
  std::vector<Run> runs(3);
  for (Run& r : runs) {
    for (int i = 0; i < 2; ++i) {
      r.a[i] = {.logits = logits[i],
                .targets = targets,
                .loss = mem.Output(loss_like),
                .grad = mem.Output(logits[i]),
                .workspace = mem.Workspace(ws_bytes),
                .workspace_bytes = ws_bytes};
      kjit_sharded_cross_entropy_args_init(&r.ca[i]);
      r.ca[i].logits = C(r.a[i].logits);
      r.ca[i].targets = C(targets);
      r.ca[i].loss = C(r.a[i].loss);
      r.ca[i].grad = C(r.a[i].grad);
      r.ca[i].workspace = r.a[i].workspace;
      r.ca[i].workspace_bytes = ws_bytes;
    }
  }
  for (int i = 0; i < 2; ++i) Must(cpp[i].ComputeStats(nullptr, runs[0].a[i]));
  Must(ShardedCrossEntropy::CombineStats(
      nullptr, {{&cpp[0], runs[0].a[0].workspace}, {&cpp[1], runs[0].a[1].workspace}}, kRows));
  for (int i = 0; i < 2; ++i) Must(cpp[i].Finish(nullptr, runs[0].a[i]));

  const kjit_sharded_cross_entropy* ops[2] = {c[0].get(), c[1].get()};
  void* workspaces[2] = {runs[1].ca[0].workspace, runs[1].ca[1].workspace};
  for (int i = 0; i < 2; ++i)
    MustC(kjit_sharded_cross_entropy_compute_stats(ops[i], nullptr, &runs[1].ca[i]));
  MustC(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, workspaces, 2, kRows));
  for (int i = 0; i < 2; ++i)
    MustC(kjit_sharded_cross_entropy_finish(ops[i], nullptr, &runs[1].ca[i]));
  for (int i = 0; i < 2; ++i) {
    ExpectSameBits(mem, runs[0].a[i].loss, runs[1].a[i].loss, "loss");
    ExpectSameBits(mem, runs[0].a[i].grad, runs[1].a[i].grad, "grad");
  }

  // The per-step path: all-reduces by hand (max, then the sums in shard order).
  Run& own = runs[2];
  float* max[2] = {};
  float* sums[2] = {};
  for (int i = 0; i < 2; ++i) {
    MustC(kjit_sharded_cross_entropy_compute_stats(ops[i], nullptr, &own.ca[i]));
    MustC(
        kjit_sharded_cross_entropy_stats_of(ops[i], own.ca[i].workspace, kRows, &max[i], &sums[i]));
    const ShardStatsView v = cpp[i].StatsOf(own.a[i].workspace, kRows);
    ASSERT_EQ(v.max, max[i]);
    ASSERT_EQ(v.sums, sums[i]);
  }
  std::vector<float> row_max = mem.ReadFloats(own.ca[0].workspace, max[0], kRows);
  const std::vector<float> other = mem.ReadFloats(own.ca[1].workspace, max[1], kRows);
  for (int64_t r = 0; r < kRows; ++r) row_max[r] = std::max(row_max[r], other[r]);
  for (int i = 0; i < 2; ++i) {
    mem.WriteFloats(own.ca[i].workspace, max[i], row_max);
    MustC(kjit_sharded_cross_entropy_rescale_stats(ops[i], nullptr, own.ca[i].workspace, kRows));
  }
  std::vector<float> total = mem.ReadFloats(own.ca[0].workspace, sums[0], 3 * kRows);
  const std::vector<float> more = mem.ReadFloats(own.ca[1].workspace, sums[1], 3 * kRows);
  for (int64_t k = 0; k < 3 * kRows; ++k) total[k] += more[k];
  for (int i = 0; i < 2; ++i) {
    mem.WriteFloats(own.ca[i].workspace, sums[i], total);
    MustC(kjit_sharded_cross_entropy_finish(ops[i], nullptr, &own.ca[i]));
  }
  for (int i = 0; i < 2; ++i) {
    const float expected = mem.ReadFloats(runs[0].a[i].loss.data,
                                          static_cast<const float*>(runs[0].a[i].loss.data), 1)[0];
    const float got =
        mem.ReadFloats(own.a[i].loss.data, static_cast<const float*>(own.a[i].loss.data), 1)[0];
    EXPECT_NEAR(got, expected, 1e-6 * std::fabs(expected)) << "shard " << i;
    const std::vector<double> g0 = mem.ReadValues(runs[0].a[i].grad);
    const std::vector<double> g1 = mem.ReadValues(own.a[i].grad);
    for (size_t k = 0; k < g0.size(); ++k) {
      ASSERT_NEAR(g1[k], g0[k], 2 * 0.0078125 * std::fabs(g0[k]) + 1e-12)
          << "shard " << i << " gradient element " << k;
    }
  }
}

}  // namespace
}  // namespace kjit
