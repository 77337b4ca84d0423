// The RL heads (kjit/log_probs.h) without a GPU: the spec's checks, the rendering of their two
// programs (and that cross-entropy's are untouched: tests/ops/rendered_sources.golden), NVRTC
// compiles for every dtype on sm_80/sm_90/sm_100, the launch arguments' checks on a compile-only
// runtime, and the fp64 reference the GPU suite checks the kernels against: its gradient against
// central differences of its own outputs, at temperatures 0.3, 1 and 1.7, for the log-prob's
// upstream gradient alone, the entropy's alone and both.
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "jit/jit.h"
#include "kjit/kjit.h"
#include "ops/log_probs/program.h"
#include "ops/log_probs/tuning/reference.h"
#include "ops/registry.h"
#include "tests/expect_status.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

using ops::LogProbsProgram;

TEST(LogProbsSpec, ChecksNameTheField) {
  struct Bad {
    LogProbsSpec spec;
    std::string prefix;
  };
  const std::vector<Bad> cases = {
      {{.vocab = 1}, "vocab: 1 is out of range"},
      {{.vocab = (int64_t{1} << 20) + 1}, "vocab:"},
      {{.vocab = 10, .temperature = 0}, "temperature: 0 must be"},
      {{.vocab = 10, .temperature = -1}, "temperature: -1 must be"},
      {{.vocab = 10, .temperature = INFINITY}, "temperature: inf must be"},
      {{.vocab = 10, .temperature = NAN}, "temperature: nan must be"},
      {{.vocab = 10, .temperature = 1e-39f}, "temperature: 1e-39 is too small"},
      {{.vocab = 10, .target_type = IndexType::kInt32, .ignore_index = int64_t{1} << 40},
       "ignore_index:"},
      {{.vocab = 10, .config = CrossEntropyConfig{.vec = 8, .threads = 256, .cluster = 2}},
       "config.cluster: 2"},
      {{.vocab = 10, .config = CrossEntropyConfig{.vec = 8, .threads = 100}}, "config.threads:"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.prefix);
    testing::ExpectInvalid(ValidateLogProbsSpec(c.spec), c.prefix);
  }
  EXPECT_TRUE(ValidateLogProbsSpec({.vocab = 2, .temperature = 0.3f}).ok());
}

TEST(LogProbsRender, TwoProgramsOnCrossEntropysStreamingLayout) {
  const LogProbsSpec spec{.vocab = 151936, .temperature = 0.7f, .entropy = true};
  const CrossEntropyConfig c = ops::LogProbsConfig(spec, 90);
  EXPECT_EQ(c.cluster, 0);
  EXPECT_EQ(c.staged, 0);
  EXPECT_EQ(c.vec, 8);
  auto fwd = ops::RenderLogProbs(spec, c, LogProbsProgram::kForward);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->name, "log_probs.forward");
  ASSERT_EQ(fwd->name_expressions.size(), 1u);
  EXPECT_EQ(fwd->name_expressions[0], "kjit::log_probs_forward<kjit::bf16, long long, 151936, " +
                                          std::to_string(c.threads) + ", 8, " +
                                          std::to_string(c.unroll) + ", true>");
  EXPECT_EQ(fwd->params.count("temperature"), 0u) << "a launch argument";
  EXPECT_EQ(fwd->params.at("entropy"), "true");
  auto bwd = ops::RenderLogProbs(spec, c, LogProbsProgram::kBackward);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  EXPECT_EQ(bwd->name, "log_probs.backward");
  EXPECT_EQ(bwd->name_expressions[0].rfind("kjit::log_probs_backward<kjit::bf16, long long, "
                                           "151936, ",
                                           0),
            0u)
      << bwd->name_expressions[0];
  // The temperature and ignore_index are launch arguments: one program (one cache entry) serves
  // every value.
  LogProbsSpec hot = spec;
  hot.temperature = 1.7f;
  hot.ignore_index = 0;
  auto hot_fwd = ops::RenderLogProbs(hot, c, LogProbsProgram::kForward);
  ASSERT_TRUE(hot_fwd.ok());
  EXPECT_EQ(hot_fwd->text, fwd->text);
  // Without the entropy the forward is another kernel, the backward the same.
  LogProbsSpec plain = spec;
  plain.entropy = false;
  auto plain_fwd = ops::RenderLogProbs(plain, c, LogProbsProgram::kForward);
  ASSERT_TRUE(plain_fwd.ok());
  EXPECT_NE(plain_fwd->name_expressions, fwd->name_expressions);
  auto plain_bwd = ops::RenderLogProbs(plain, c, LogProbsProgram::kBackward);
  ASSERT_TRUE(plain_bwd.ok());
  EXPECT_EQ(plain_bwd->name_expressions, bwd->name_expressions);
}

TEST(LogProbsCompile, EveryDtypeAndArchCompilesThroughNvrtc) {
  auto jit = jit::Jit::Create({.use_disk_cache = false});
  ASSERT_TRUE(jit.ok()) << jit.status();
  int built = 0;
  for (const char* arch : {"sm_80", "sm_90", "sm_100"}) {
    const jit::Target target = *jit::ParseTarget(arch);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int64_t vocab : {3, 50257, 151936}) {
        for (bool entropy : {false, true}) {
          const LogProbsSpec spec{.vocab = vocab,
                                  .dtype = t,
                                  .target_type = entropy ? IndexType::kInt64 : IndexType::kInt32,
                                  .temperature = 0.7f,
                                  .entropy = entropy};
          auto programs = ops::RenderLogProbsPrograms(spec, ops::LogProbsConfig(spec, target.arch));
          ASSERT_TRUE(programs.ok()) << programs.status();
          auto bins = (*jit)->BuildAll(*programs, target);
          ASSERT_TRUE(bins.ok()) << arch << " " << jit::FormatParams((*programs)[0].params) << ": "
                                 << bins.status();
          for (const auto& b : *bins) {
            EXPECT_EQ(b.binary->code.substr(0, 4),
                      "\x7f"
                      "ELF");
            ++built;
          }
        }
      }
    }
  }
  EXPECT_EQ(built, 3 * 3 * 3 * 2 * 2);
}

class CompileOnlyLogProbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    auto rt = Runtime::Create(
        {.target = "sm_90", .compile_only = true, .cache_dir = tmp_.path() + "/cache"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_.emplace(std::move(*rt));
    auto lp = rt_->LogProbs({.vocab = V, .temperature = 0.5f, .entropy = true});
    ASSERT_TRUE(lp.ok()) << lp.status();
    lp_.emplace(std::move(*lp));
  }
  static void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
  LogProbsArgs Good() const {
    return {.logits = TensorView::Matrix(Addr(0x1000000), DType::kBF16, R, V),
            .targets = IndexView::Of(Addr(0x2000000), IndexType::kInt64, R),
            .logprob = TensorView::Vector(Addr(0x3000000), DType::kF32, R),
            .entropy = TensorView::Vector(Addr(0x4000000), DType::kF32, R),
            .lse = TensorView::Vector(Addr(0x5000000), DType::kF32, R)};
  }
  LogProbsBackwardArgs GoodBackward() const {
    return {.logits = TensorView::Matrix(Addr(0x1000000), DType::kBF16, R, V),
            .targets = IndexView::Of(Addr(0x2000000), IndexType::kInt64, R),
            .lse = TensorView::Vector(Addr(0x5000000), DType::kF32, R),
            .entropy = TensorView::Vector(Addr(0x4000000), DType::kF32, R),
            .grad_logprob = TensorView::Vector(Addr(0x6000000), DType::kF32, R),
            .grad_entropy = TensorView::Vector(Addr(0x7000000), DType::kF32, R),
            .grad = TensorView::Matrix(Addr(0x1000000), DType::kBF16, R, V)};  // in place
  }
  static void ExpectReachesDevice(const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  static constexpr int64_t V = 1001, R = 8;
  testing::TempDir tmp_{"kjit_log_probs"};
  std::optional<Runtime> rt_;
  std::optional<LogProbs> lp_;
};

TEST_F(CompileOnlyLogProbsTest, ValidArgumentsReachTheCompileOnlyError) {
  ExpectReachesDevice(lp_->Forward(nullptr, Good()));
  auto no_lse = Good();
  no_lse.lse = {};
  ExpectReachesDevice(lp_->Forward(nullptr, no_lse));
  ExpectReachesDevice(lp_->Backward(nullptr, GoodBackward()));
  auto only_logprob = GoodBackward();  // no entropy term: the entropy is not needed
  only_logprob.grad_entropy = only_logprob.entropy = {};
  ExpectReachesDevice(lp_->Backward(nullptr, only_logprob));
  auto elsewhere = GoodBackward();
  elsewhere.grad = TensorView::Matrix(Addr(0x9000000), DType::kBF16, R, V);
  ExpectReachesDevice(lp_->Backward(nullptr, elsewhere));
}

TEST_F(CompileOnlyLogProbsTest, BuildCompilesBothPrograms) {
  auto built = lp_->Build();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->target, "sm_90");
  ASSERT_EQ(built->programs.size(), 2u);
  EXPECT_EQ(built->programs[0].program, "log_probs.forward");
  EXPECT_EQ(built->programs[1].program, "log_probs.backward");
  EXPECT_EQ(built->params.at("temperature"), "0.5");
  EXPECT_EQ(built->params.at("config"), lp_->config().ToString());
}

TEST_F(CompileOnlyLogProbsTest, LaunchesNameEveryBadArgument) {
  const std::vector<std::pair<std::function<void(LogProbsArgs&)>, std::string>> forward = {
      {[](auto& a) { a.logits.data = nullptr; }, "logits: null"},
      {[](auto& a) { a.logits.cols = V + 1; }, "logits: cols"},
      {[](auto& a) { a.targets.type = IndexType::kInt32; }, "targets: type"},
      {[](auto& a) { a.logprob = {}; }, "logprob: null"},
      {[](auto& a) { a.logprob.cols = R + 1; }, "logprob: cols"},
      {[](auto& a) { a.entropy = {}; }, "entropy: null"},
      {[](auto& a) { a.lse.dtype = DType::kBF16; }, "lse: dtype"},
      {[](auto& a) { a.lse.data = a.logprob.data; }, "lse: must not alias logprob"},
      {[](auto& a) { a.logprob.data = Addr(0x1000000 + 64); }, "logprob: overlaps logits"},
  };
  for (const auto& [edit, prefix] : forward) {
    LogProbsArgs a = Good();
    edit(a);
    SCOPED_TRACE(prefix);
    testing::ExpectInvalid(lp_->Forward(nullptr, a), prefix);
  }
  const std::vector<std::pair<std::function<void(LogProbsBackwardArgs&)>, std::string>> backward = {
      {[](auto& a) { a.lse = {}; }, "lse: null"},
      {[](auto& a) { a.entropy = {}; }, "entropy: null"},
      {[](auto& a) { a.grad_entropy.cols = 1; }, "grad_entropy: cols"},
      {[](auto& a) { a.grad_logprob.dtype = DType::kF16; }, "grad_logprob: dtype"},
      {[](auto& a) { a.grad = {}; }, "grad: null"},
      {[](auto& a) { a.grad.dtype = DType::kF32; }, "grad: dtype"},
      {[](auto& a) { a.grad.row_stride = V + 8; }, "grad: aliases logits with row_stride"},
      {[](auto& a) { a.grad.data = Addr(0x1000000 + 64); }, "grad: overlaps logits"},
      {[](auto& a) { a.grad = TensorView::Matrix(Addr(0x5000000), DType::kBF16, R, V); },
       "grad: must not alias lse"},
  };
  for (const auto& [edit, prefix] : backward) {
    LogProbsBackwardArgs a = GoodBackward();
    edit(a);
    SCOPED_TRACE(prefix);
    testing::ExpectInvalid(lp_->Backward(nullptr, a), prefix);
  }
  auto plain = rt_->LogProbs({.vocab = V});
  ASSERT_TRUE(plain.ok());
  testing::ExpectInvalid(plain->Forward(nullptr, Good()), "entropy: given, but the op was made");
}

// The registry's view (`kjit compile --op log_probs`, `kjit bench --op log_probs`, the spec JSON).
TEST(LogProbsRegistry, SpecJsonTuningKeyAndFlags) {
  const ops::OpSpec op = LogProbsSpec{.vocab = 151936,
                                      .dtype = DType::kF16,
                                      .target_type = IndexType::kInt32,
                                      .ignore_index = -1,
                                      .temperature = 0.7f,
                                      .entropy = true};
  EXPECT_EQ(ops::OpName(op), "log_probs");
  EXPECT_EQ(ops::TuningShape(op), "vocab=151936 entropy");
  auto back = ops::SpecFromJson(ops::SpecToJson(op));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ops::SpecToJson(*back), ops::SpecToJson(op));
  EXPECT_EQ(std::get<LogProbsSpec>(*back).temperature, 0.7f);
  testing::ExpectInvalid(
      ops::SpecFromJson(R"({"op": "log_probs", "vocab": 100, "dtype": "bf16", "target_type":)"
                        R"( "int64", "ignore_index": -100, "temperature": 0, "entropy": false})")
          .status(),
      "temperature: 0 must be");
  auto spec = ops::DefaultSpec("log_probs", DType::kBF16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, ops::FlagValue>>{{"--vocab", {.integer = 50257}},
                                                           {"--temperature", {.real = 1.7f}},
                                                           {"--entropy", {.on = true}}}) {
    ASSERT_TRUE(ops::ApplyFlag(*spec, ops::FlagCommand::kCompile, flag, value).ok()) << flag;
  }
  EXPECT_EQ(ops::TuningShape(*spec), "vocab=50257 entropy");
  EXPECT_EQ(std::get<LogProbsSpec>(*spec).temperature, 1.7f);
  testing::ExpectInvalid(
      ops::ApplyFlag(*spec, ops::FlagCommand::kCompile, "--softcap", {.real = 30}),
      "--softcap does not apply to --op log_probs");
  EXPECT_TRUE(ops::TunedPasses(*spec).empty()) << "no tuning database record is read yet";
}

// ---- The fp64 reference -------------------------------------------------------------------------

struct Problem {
  int64_t rows, vocab;
  std::vector<double> logits;
  std::vector<int64_t> targets;
};

Problem MakeProblem(int64_t rows, int64_t vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> n(0.0, 2.0);
  Problem p{rows, vocab, std::vector<double>(rows * vocab), std::vector<int64_t>(rows)};
  for (double& z : p.logits) z = n(gen);
  for (int64_t i = 0; i < rows; ++i) p.targets[i] = static_cast<int64_t>(gen() % vocab);
  if (rows > 2) p.targets[1] = -100;
  return p;
}

// sum_i g_lp[i] logprob[i] + g_h[i] entropy[i], the scalar whose gradient the reference gives.
double Objective(const LogProbsSpec& spec, const Problem& p, const std::vector<double>* g_lp,
                 const std::vector<double>* g_h) {
  const ops::LogProbsResult r =
      ops::LogProbsReference(spec, p.rows, p.logits, p.targets, nullptr, nullptr);
  double f = 0;
  for (int64_t i = 0; i < p.rows; ++i) {
    if (g_lp != nullptr) f += (*g_lp)[i] * r.logprob[i];
    if (g_h != nullptr) f += (*g_h)[i] * r.entropy[i];
  }
  return f;
}

TEST(LogProbsReference, GradientIsTheCentralDifferenceOfItsOutputs) {
  for (float temperature : {0.3f, 1.0f, 1.7f}) {
    for (int which = 0; which < 3; ++which) {  // log-prob alone, entropy alone, both
      for (auto [rows, vocab] : {std::pair<int64_t, int64_t>{5, 7}, {1, 11}, {3, 2}}) {
        SCOPED_TRACE(::testing::Message() << "T=" << temperature << " which=" << which
                                          << " rows=" << rows << " vocab=" << vocab);
        Problem p = MakeProblem(rows, vocab, 7 + which);
        const LogProbsSpec spec{.vocab = vocab, .temperature = temperature};
        std::vector<double> g_lp(rows), g_h(rows);
        for (int64_t i = 0; i < rows; ++i) {
          g_lp[i] = 0.5 + 0.25 * i;
          g_h[i] = -0.75 + 0.5 * i;
        }
        const std::vector<double>* lp = which != 1 ? &g_lp : nullptr;
        const std::vector<double>* h = which != 0 ? &g_h : nullptr;
        const ops::LogProbsResult r =
            ops::LogProbsReference(spec, rows, p.logits, p.targets, lp, h);
        ASSERT_EQ(r.grad.size(), static_cast<size_t>(rows * vocab));
        const double step = 1e-6;
        for (size_t k = 0; k < p.logits.size(); ++k) {
          Problem up = p, down = p;
          up.logits[k] += step;
          down.logits[k] -= step;
          const double numeric =
              (Objective(spec, up, lp, h) - Objective(spec, down, lp, h)) / (2 * step);
          EXPECT_NEAR(r.grad[k], numeric, 1e-6 * (1 + std::fabs(numeric))) << "element " << k;
        }
      }
    }
  }
}

TEST(LogProbsReference, OutputsIgnoredRowsAndMaskedClasses) {
  const LogProbsSpec spec{.vocab = 4, .ignore_index = -1, .temperature = 2.0f};
  // Row 0: uniform over 4 classes at any temperature; row 1: ignored; row 2: one class masked.
  const double inf = INFINITY;
  const std::vector<double> logits = {3, 3, 3, 3, 1, 2, 3, 4, 0, -inf, 2, 0};
  const std::vector<int64_t> targets = {2, -1, 3};
  const std::vector<double> g = {1.0, 1.0, 1.0};
  const ops::LogProbsResult r = ops::LogProbsReference(spec, 3, logits, targets, &g, &g);
  EXPECT_NEAR(r.logprob[0], -std::log(4.0), 1e-15);
  EXPECT_NEAR(r.entropy[0], std::log(4.0), 1e-15);
  EXPECT_NEAR(r.lse[0], 1.5 + std::log(4.0), 1e-15);
  EXPECT_EQ(r.logprob[1], 0.0);
  EXPECT_EQ(r.entropy[1], 0.0);
  for (int j = 4; j < 8; ++j) EXPECT_EQ(r.grad[j], 0.0) << "an ignored row's gradient is 0";
  EXPECT_EQ(r.grad[9], 0.0) << "a masked class's gradient is 0, not NaN";
  // Row 2 at T = 2: x = {0, -inf, 1, 0}.
  const double s = 2 + std::exp(1.0);
  EXPECT_NEAR(r.logprob[2], 0.0 - std::log(s), 1e-15);
  const double h =
      -(2 * (1 / s) * std::log(1 / s) + (std::exp(1.0) / s) * std::log(std::exp(1.0) / s));
  EXPECT_NEAR(r.entropy[2], h, 1e-14);
}

}  // namespace
}  // namespace kjit
