// RMSNorm on the GPU against the fp64 CPU reference: every output (y, rstd, residual_out, dx, dw)
// elementwise, over hidden sizes, row counts, dtypes and options. Outputs are poisoned with NaN
// before each launch, padding between strided rows must stay untouched, and a second run must give
// the same bits.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "ops/common/tuning/compare.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/tuning/reference.h"
#include "ops/rms_norm/tuning/search_space.h"
#include "runtime/runtime_state.h"
#include "tests/gpu/gpu_test_env.h"

namespace kjit {
namespace {

struct Case {
  int64_t hidden = 4096;
  int64_t rows = 16;
  DType dtype = DType::kBF16;
  DType weight_dtype = DType::kBF16;
  RmsNormCasting casting = RmsNormCasting::kLlama;
  float offset = 0;
  bool residual = false;
  bool in_place = false;                // dx into dy; residual_out into residual
  int64_t pad = 0;                      // row_stride = hidden + pad
  int misalign = 0;                     // every pointer shifted by this many elements
  double scale = 1;                     // input magnitude
  bool specials = false;                // a NaN in one row, +Inf in another
  std::optional<RmsNormConfig> config;  // unset: the heuristic's

  std::string Name() const {
    return fmt::format(
        "hidden={} rows={} dtype={} wdtype={} cast={} offset={} residual={} "
        "in_place={} pad={} misalign={} scale={} specials={} config={}",
        hidden, rows, Name(dtype), Name(weight_dtype), kjit::Name(casting), offset, residual,
        in_place, pad, misalign, scale, specials, config ? config->ToString() : "heuristic");
  }
  static const char* Name(DType t) { return kjit::Name(t); }
};

// Fast deterministic-per-seed uniform values with unit variance.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return dist_(gen_); }

 private:
  std::mt19937_64 gen_;
  std::uniform_real_distribution<double> dist_{-1.7320508, 1.7320508};
};

// A [rows, hidden] matrix in a device buffer with a row stride and a misaligned start; everything
// outside the view is 0xFF and must stay so.
struct DeviceMatrix {
  std::optional<DeviceBuffer> buf;
  TensorView view;
  int64_t offset_elems = 0;
  size_t bytes = 0;
};

absl::StatusOr<DeviceMatrix> MakeMatrix(const Runtime& rt, int64_t rows, int64_t hidden,
                                        int64_t stride, int misalign, DType t,
                                        const std::vector<double>* values) {
  DeviceMatrix m;
  const size_t es = SizeOf(t);
  m.offset_elems = misalign;
  m.bytes = ((rows - 1) * stride + hidden + misalign) * es;
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, m.bytes));
  std::vector<unsigned char> image(m.bytes, 0xFF);
  if (values != nullptr) {
    const std::vector<unsigned char> enc = Encode(*values, t);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&image[(misalign + r * stride) * es], &enc[r * hidden * es], hidden * es);
    }
  }
  KJIT_RETURN_IF_ERROR(b.Upload(image.data(), image.size()));
  m.view =
      TensorView::Matrix(static_cast<char*>(b.data()) + misalign * es, t, rows, hidden, stride);
  m.buf.emplace(std::move(b));
  return m;
}

struct HostImage {
  std::vector<unsigned char> bytes;
  std::vector<double> values;  // the view's elements, row-major [rows, hidden]
  bool padding_untouched = true;
};

absl::StatusOr<HostImage> ReadMatrix(const DeviceMatrix& m) {
  HostImage h;
  h.bytes.resize(m.bytes);
  KJIT_RETURN_IF_ERROR(m.buf->Download(h.bytes.data(), h.bytes.size()));
  const TensorView& v = m.view;
  const size_t es = SizeOf(v.dtype);
  std::vector<unsigned char> packed(v.rows * v.cols * es);
  for (int64_t r = 0; r < v.rows; ++r) {
    const size_t start = (m.offset_elems + r * v.row_stride) * es;
    std::memcpy(&packed[r * v.cols * es], &h.bytes[start], v.cols * es);
    const size_t pad_end =
        r + 1 < v.rows ? (m.offset_elems + (r + 1) * v.row_stride) * es : h.bytes.size();
    for (size_t i = start + v.cols * es; i < pad_end; ++i)
      h.padding_untouched &= h.bytes[i] == 0xFF;
  }
  for (int64_t i = 0; i < m.offset_elems * static_cast<int64_t>(es); ++i)
    h.padding_untouched &= h.bytes[i] == 0xFF;
  h.values = Decode(packed, v.dtype);
  return h;
}

// Runs one case, forward then backward, and checks everything it wrote.
void RunCase(const Runtime& rt, const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.Name());
  RmsNormSpec spec{.hidden = c.hidden,
                   .dtype = c.dtype,
                   .weight_dtype = c.weight_dtype,
                   .eps = 1e-6f,
                   .weight_offset = c.offset,
                   .casting = c.casting,
                   .fused_residual = c.residual,
                   .config = c.config};
  auto norm = rt.RmsNorm(spec);
  ASSERT_TRUE(norm.ok()) << norm.status();
  const int64_t H = c.hidden, R = c.rows, stride = H + c.pad, n = R * H;

  Rng rng(seed);
  auto values = [&](int64_t count, double scale, double offset, DType t, bool row_scaled) {
    std::vector<double> v(count);
    for (int64_t i = 0; i < count; ++i) {
      const double row_scale =
          row_scaled && scale <= 1 ? std::ldexp(1.0, static_cast<int>((i / H) % 7) - 3) : 1.0;
      v[i] = RoundTo(offset + scale * row_scale * rng.Uniform(), t);
    }
    return v;
  };
  std::vector<double> x = values(n, c.scale, 0, c.dtype, true);
  const std::vector<double> w = values(H, 0.1, c.offset == 0 ? 1.0 : 0.0, c.weight_dtype, false);
  const std::vector<double> dy = values(n, 1.0, 0, c.dtype, false);
  const std::vector<double> residual =
      c.residual ? values(n, c.scale, 0, c.dtype, true) : std::vector<double>();
  const std::vector<double> dresidual =
      c.residual ? values(n, 0.5, 0, c.dtype, false) : std::vector<double>();
  if (c.specials) {
    x[(H / 2)] = NAN;                               // row 0
    x[std::min<int64_t>(2, R - 1) * H] = INFINITY;  // row 2 (or the last)
  }

  auto mk = [&](DType t, const std::vector<double>* v, int64_t rows, int64_t cols, int64_t st) {
    auto m = MakeMatrix(rt, rows, cols, st, c.misalign, t, v);
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(*m);
  };
  DeviceMatrix dx_in = mk(c.dtype, &x, R, H, stride);
  DeviceMatrix dw_in = mk(c.weight_dtype, &w, 1, H, H);
  DeviceMatrix dy_m = mk(c.dtype, nullptr, R, H, stride);
  DeviceMatrix drstd = mk(DType::kF32, nullptr, 1, R, R);
  DeviceMatrix dres = mk(c.dtype, c.residual ? &residual : nullptr, R, H, stride);
  DeviceMatrix dres_out = mk(c.dtype, nullptr, R, H, stride);
  DeviceMatrix d_dy = mk(c.dtype, &dy, R, H, stride);
  DeviceMatrix d_dx = mk(c.dtype, nullptr, R, H, stride);
  DeviceMatrix d_dw = mk(c.weight_dtype, nullptr, 1, H, H);
  DeviceMatrix d_dres = mk(c.dtype, c.residual ? &dresidual : nullptr, R, H, stride);
  if (::testing::Test::HasFailure()) return;
  auto ws = DeviceBuffer::Create(rt, norm->BackwardWorkspaceBytes(R));
  ASSERT_TRUE(ws.ok()) << ws.status();

  const DeviceMatrix& res_out = c.in_place ? dres : dres_out;
  const DeviceMatrix& dx_out = c.in_place ? d_dy : d_dx;
  RmsNormForwardArgs fa{.x = dx_in.view, .weight = dw_in.view, .y = dy_m.view, .rstd = drstd.view};
  if (c.residual) {
    fa.residual = dres.view;
    fa.residual_out = res_out.view;
  }
  RmsNormBackwardArgs ba{.dy = d_dy.view,
                         .x = c.residual ? res_out.view : dx_in.view,
                         .weight = dw_in.view,
                         .rstd = drstd.view,
                         .dx = dx_out.view,
                         .dw = d_dw.view,
                         .workspace = ws->data(),
                         .workspace_bytes = static_cast<int64_t>(ws->size())};
  if (c.residual) ba.dresidual = d_dres.view;

  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  auto run = [&]() -> absl::Status {
    KJIT_RETURN_IF_ERROR(norm->Forward(nullptr, fa));
    KJIT_RETURN_IF_ERROR(norm->Backward(nullptr, ba));
    return cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize (kernel fault?)");
  };
  const absl::Status first = run();
  ASSERT_TRUE(first.ok()) << first;

  auto read = [&](const DeviceMatrix& m) {
    auto h = ReadMatrix(m);
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(h->padding_untouched) << "bytes outside the view were written";
    return std::move(*h);
  };
  HostImage y = read(dy_m), rstd = read(drstd), dx = read(dx_out), dw = read(d_dw);

  // References. Casting none's rstd may round a near-tie mean either way: the check bounds it, and
  // y and the backward are computed with the kernel's own (ops/rms_norm/tuning/reference.h).
  const ops::RmsNormMath math{
      .hidden = H, .dtype = c.dtype, .eps = 1e-6, .weight_offset = c.offset, .casting = c.casting};
  const std::vector<double>* kernel_rstd =
      c.casting == RmsNormCasting::kNone ? &rstd.values : nullptr;
  const auto ref_f =
      ops::RmsNormForwardReference(math, R, x, c.residual ? &residual : nullptr, w, kernel_rstd);
  const std::vector<double>& normalized = c.residual ? ref_f.residual_out : x;
  const auto ref_b = ops::RmsNormBackwardReference(math, R, dy, normalized, w,
                                                   c.residual ? &dresidual : nullptr, kernel_rstd);
  std::optional<HostImage> ro;
  if (c.residual) ro = read(res_out);
  const ops::RmsNormOutputs outs{.y = &y.values,
                                 .rstd = &rstd.values,
                                 .residual_out = ro ? &ro->values : nullptr,
                                 .dx = &dx.values,
                                 .dw = &dw.values};
  bool all_ok = true;
  for (const auto& [name, r] : ops::CheckRmsNorm(math, R, c.weight_dtype, outs, ref_f, &ref_b)) {
    EXPECT_TRUE(r.ok) << r.Describe(name);
    all_ok &= r.ok;
  }

  // The check must be able to fail: push one finite y just past its tolerance.
  if (all_ok) {
    const auto tol = ops::RmsNormTolerancesFor(c.dtype, c.weight_dtype, c.casting);
    const std::vector<double> atol = ops::RmsNormYAtol(math, R, ref_f.y, tol);
    for (size_t i = 0; i < y.values.size(); ++i) {
      if (!std::isfinite(ref_f.y[i])) continue;
      std::vector<double> bad = y.values;
      bad[i] = ref_f.y[i] + 1.5 * (tol.y.atol + atol[i] + tol.y.rtol * std::fabs(ref_f.y[i]));
      const ops::RmsNormOutputs bad_outs{.y = &bad};
      EXPECT_FALSE(
          ops::CheckRmsNorm(math, R, c.weight_dtype, bad_outs, ref_f, nullptr)[0].second.ok)
          << "the y check accepts a perturbed output at " << i;
      break;
    }
  }

  // Same inputs, same bits. In-place runs overwrote dy and residual: restore them first.
  if (c.in_place) {
    DeviceMatrix fresh_dy = mk(c.dtype, &dy, R, H, stride);
    ASSERT_TRUE(d_dy.buf->Fill(0xFF).ok());
    std::vector<unsigned char> img(fresh_dy.bytes);
    ASSERT_TRUE(fresh_dy.buf->Download(img.data(), img.size()).ok());
    ASSERT_TRUE(d_dy.buf->Upload(img.data(), img.size()).ok());
    if (c.residual) {
      DeviceMatrix fresh_res = mk(c.dtype, &residual, R, H, stride);
      ASSERT_TRUE(fresh_res.buf->Download(img.data(), img.size()).ok());
      ASSERT_TRUE(dres.buf->Upload(img.data(), img.size()).ok());
    }
  }
  for (const DeviceMatrix* m : {&dy_m, &drstd, &d_dw}) ASSERT_TRUE(m->buf->Fill(0xFF).ok());
  if (!c.in_place) {
    ASSERT_TRUE(d_dx.buf->Fill(0xFF).ok());
  }
  ASSERT_TRUE(run().ok());
  EXPECT_EQ(read(dy_m).bytes, y.bytes) << "y differs between two runs";
  EXPECT_EQ(read(drstd).bytes, rstd.bytes) << "rstd differs between two runs";
  EXPECT_EQ(read(dx_out).bytes, dx.bytes) << "dx differs between two runs";
  EXPECT_EQ(read(d_dw).bytes, dw.bytes) << "dw differs between two runs";
}

constexpr int64_t kMaxElements = int64_t{1} << 25;  // keeps the fp64 reference within seconds
constexpr RmsNormCasting kCastings[] = {RmsNormCasting::kLlama, RmsNormCasting::kGemma,
                                        RmsNormCasting::kNone};

TEST(RmsNormGpu, ShapesAndDtypes) {
  KJIT_REQUIRE_GPU(rt);
  int cases = 0;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t hidden : {1, 7, 64, 1000, 2048, 4096, 5120, 8192, 16384, 65536}) {
      for (int64_t rows : {1, 3, 256, 4097, 16384}) {
        if (rows * hidden > kMaxElements) continue;
        RunCase(rt, {.hidden = hidden, .rows = rows, .dtype = t, .weight_dtype = t}, 1000 + cases);
        ++cases;
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  RecordProperty("cases", cases);
  fmt::print("checked {} shape/dtype cases\n", cases);
}

TEST(RmsNormGpu, EveryOptionCombination) {
  KJIT_REQUIRE_GPU(rt);
  int cases = 0;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (auto [hidden, rows] : {std::pair<int64_t, int64_t>{7, 3}, {1000, 257}, {4096, 64}}) {
      for (RmsNormCasting casting : kCastings) {
        for (int bits = 0; bits < 32; ++bits) {
          Case c{.hidden = hidden, .rows = rows, .dtype = t, .weight_dtype = t, .casting = casting};
          c.offset = (bits & 1) ? 1.0f : 0.0f;
          c.residual = bits & 2;
          if (bits & 4) c.weight_dtype = DType::kF32;
          c.in_place = bits & 8;
          c.pad = (bits & 16) ? 24 : 0;
          // Casting none computes in the dtype and refuses another weight dtype
          // (CastingNoneNeedsTheWeightInTheDtype).
          if (casting == RmsNormCasting::kNone && c.weight_dtype != t) continue;
          RunCase(rt, c, 5000 + cases);
          ++cases;
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
  fmt::print("checked {} option cases\n", cases);
}

// Casting none rounds at every step of the forward (kjit/rms_norm.h), checked tightly: y to half an
// ulp given the kernel's rstd, and that rstd a value of the dtype within what an fp32 sum allows.
TEST(RmsNormGpu, CastingNoneShapesAndDtypes) {
  KJIT_REQUIRE_GPU(rt);
  int cases = 0;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t hidden : {1, 7, 4095, 4096, 65536}) {
      for (int64_t rows : {1, 5, 300}) {
        for (bool residual : {false, true}) {
          RunCase(rt,
                  {.hidden = hidden,
                   .rows = rows,
                   .dtype = t,
                   .weight_dtype = t,
                   .casting = RmsNormCasting::kNone,
                   .offset = (cases % 3 == 2) ? 1.0f : 0.0f,
                   .residual = residual},
                  3000 + cases);
          ++cases;
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
  fmt::print("checked {} casting-none cases\n", cases);
}

// The ring backward (RowShape::ring) at every ring and the shapes the sweep times, odd sizes and
// every option in turn; row counts that leave the last ring turn partly empty and groups with no
// row at all (rows < groups).
TEST(RmsNormGpu, RingBackwardConfigs) {
  KJIT_REQUIRE_GPU(rt);
  int cases = 0;
  struct Shape {
    int64_t hidden, rows;
    RowShape backward;
  };
  const Shape shapes[] = {{4096, 1, {512, 1}},   {4096, 4097, {512, 1}}, {4096, 8192, {512, 1}},
                          {4096, 300, {256, 1}}, {4096, 777, {128, 1}},  {8192, 1000, {1024, 1}},
                          {1024, 2049, {32, 4}}, {1024, 513, {128, 1}},  {4095, 33, {1024, 1}},
                          {7, 257, {8, 16}},     {1, 3, {1, 128}},       {5120, 300, {640, 1}}};
  // Each shape's three rings take the three dtypes in turn (every dtype meets every shape): all
  // nine pairs a shape ran 100-odd cases, about 4 s each on an H100 with the fp64 reference.
  constexpr DType kDtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  for (size_t s = 0; s < std::size(shapes); ++s) {
    const Shape& sh = shapes[s];
    for (int ring : {2, 3, 4}) {
      const DType t = kDtypes[(s + static_cast<size_t>(ring)) % std::size(kDtypes)];
      const int vec = ops::MaxVecForHidden(sh.hidden, static_cast<int>(SizeOf(t)));
      RmsNormConfig config = ops::DefaultRmsNormConfig(sh.hidden, vec);
      config.backward = sh.backward;
      config.backward.ring = ring;
      if (!ops::RowFitsRing(sh.hidden, vec, static_cast<int>(SizeOf(t)), config.backward)) {
        continue;
      }
      Case c{.hidden = sh.hidden, .rows = sh.rows, .dtype = t, .weight_dtype = t};
      c.config = config;
      const int bits = cases % 16;
      c.casting = kCastings[cases % 3];
      c.offset = (bits & 1) ? 1.0f : 0.0f;
      c.residual = bits & 2;
      c.in_place = bits & 4;
      c.pad = (bits & 8) ? 24 : 0;
      // One line a case, flushed: a run cut off by its time limit shows where it stopped (one
      // did twice on an H100, 300 s and 200 s, with no output).
      fmt::print("ring case {}: {} hidden={} rows={} config {}\n", cases, Name(t), sh.hidden,
                 sh.rows, config.ToString());
      std::fflush(stdout);
      RunCase(rt, c, 11000 + cases);
      ++cases;
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // The sweep's ring candidates for the benchmark's shape, at a row count the reference affords.
  for (const auto& cand : ops::RmsNormSearchSpace(4096, 8, 2)) {
    if (!cand.pruned.empty() || cand.config.backward.ring == 0) continue;
    Case c{.hidden = 4096, .rows = 2000, .residual = (cases % 2) == 1};
    c.config = cand.config;
    RunCase(rt, c, 11000 + cases);
    ++cases;
    if (::testing::Test::HasFatalFailure()) return;
  }
  fmt::print("checked {} ring backward cases\n", cases);
}

TEST(RmsNormGpu, MisalignedViewsUseNarrowerVectors) {
  KJIT_REQUIRE_GPU(rt);
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (int misalign : {1, 2, 3}) {
      for (int64_t pad : {0, 1, 5}) {
        RunCase(rt,
                {.hidden = 4096,
                 .rows = 33,
                 .dtype = t,
                 .weight_dtype = t,
                 .residual = true,
                 .pad = pad,
                 .misalign = misalign},
                9000 + misalign * 10 + pad);
        RunCase(rt,
                {.hidden = 1000,
                 .rows = 5,
                 .dtype = t,
                 .weight_dtype = t,
                 .pad = pad,
                 .misalign = misalign},
                9500 + misalign * 10 + pad);
      }
    }
  }
}

TEST(RmsNormGpu, LargeMagnitudesAndSpecialValues) {
  KJIT_REQUIRE_GPU(rt);
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t hidden : {7, 1000, 4096, 65536}) {
      auto with = [&](RmsNormCasting casting, double scale, bool residual, bool specials) {
        return Case{.hidden = hidden,
                    .rows = 5,
                    .dtype = t,
                    .weight_dtype = t,
                    .casting = casting,
                    .residual = residual,
                    .scale = scale,
                    .specials = specials};
      };
      RunCase(rt, with(RmsNormCasting::kLlama, 1e4, false, false), 7000 + hidden);
      RunCase(rt, with(RmsNormCasting::kLlama, 1, false, true), 7100 + hidden);
      RunCase(rt, with(RmsNormCasting::kGemma, 1, true, true), 7200 + hidden);
      // Casting none: fp16 squares of 1e4 overflow to inf, so rstd is 0, as in PyTorch.
      RunCase(rt, with(RmsNormCasting::kNone, 1e4, false, false), 7300 + hidden);
      RunCase(rt, with(RmsNormCasting::kNone, 1, true, true), 7400 + hidden);
    }
  }
}

TEST(RmsNormGpu, NanRowLeavesOtherRowsFinite) {
  KJIT_REQUIRE_GPU(rt);
  // Explicit rather than through the reference: row 0 holds a NaN, rows 1.. must be all finite.
  const int64_t H = 4096, R = 4;
  auto norm = rt.RmsNorm({.hidden = H, .dtype = DType::kBF16});
  ASSERT_TRUE(norm.ok()) << norm.status();
  std::vector<double> x(R * H, 0.5);
  x[17] = NAN;
  std::vector<double> w(H, 1.0);
  auto dx_in = MakeMatrix(rt, R, H, H, 0, DType::kBF16, &x);
  auto dw = MakeMatrix(rt, 1, H, H, 0, DType::kBF16, &w);
  auto dy = MakeMatrix(rt, R, H, H, 0, DType::kBF16, nullptr);
  ASSERT_TRUE(dx_in.ok() && dw.ok() && dy.ok());
  ASSERT_TRUE(norm->Forward(nullptr, {.x = dx_in->view, .weight = dw->view, .y = dy->view}).ok());
  auto y = ReadMatrix(*dy);
  ASSERT_TRUE(y.ok());
  for (int64_t c = 0; c < H; ++c) EXPECT_TRUE(std::isnan(y->values[c])) << "row 0 col " << c;
  for (int64_t i = H; i < R * H; ++i) {
    ASSERT_TRUE(std::isfinite(y->values[i])) << "element " << i;
    ASSERT_NEAR(y->values[i], 1.0, 1.0 / 128) << "element " << i;
  }
}

TEST(RmsNormGpu, BadInputLaunchesNothing) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t H = 64, R = 2;
  auto norm = rt.RmsNorm({.hidden = H, .dtype = DType::kBF16});
  ASSERT_TRUE(norm.ok());
  std::vector<double> x(R * H, 1.0), w(H, 1.0);
  auto dx_in = MakeMatrix(rt, R, H, H, 0, DType::kBF16, &x);
  auto dw = MakeMatrix(rt, 1, H, H, 0, DType::kBF16, &w);
  auto dy = MakeMatrix(rt, R, H, H, 0, DType::kBF16, nullptr);
  ASSERT_TRUE(dx_in.ok() && dw.ok() && dy.ok());
  RmsNormForwardArgs a{.x = dx_in->view, .weight = dw->view, .y = dy->view};
  a.y.row_stride = H - 1;  // shorter than the row
  absl::Status s = norm->Forward(nullptr, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ToStd(s.message()).find("y: row_stride"), std::string_view::npos) << s;
  ASSERT_EQ(kjit::internal::StateOf(rt).driver->cuCtxSynchronize(), CUDA_SUCCESS);
  auto y = ReadMatrix(*dy);
  ASSERT_TRUE(y.ok());
  for (unsigned char b : y->bytes) ASSERT_EQ(b, 0xFF) << "the output was written despite the error";
}

}  // namespace
}  // namespace kjit
