// Every standard shape's rendered programs, against tests/ops/rendered_sources.golden: each model
// preset's RMSNorm, cross-entropy, fused linear cross-entropy and vocab-parallel cross-entropy with
// its default config on sm_80, sm_90 and sm_100 and each option, one shape per op over its whole
// search space, the Hopper GEMM's configs, and last the RL heads (log_probs). A line holds the
// program's name, its name expressions and its cache key (which covers the stub and the text of
// every header it includes), so a refactor of the rendering that changes no kernel changes no line,
// and one that does shows which instantiation moved.
//
// After a deliberate change to a template or an instantiation, rewrite the file and review its
// diff:
//   KJIT_UPDATE_GOLDEN=1 build/tests/kjit_tests --gtest_filter='RenderedSources.*'
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/model_config.h"
#include "jit/cache_key.h"
#include "jit/target.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/program.h"
#include "ops/gemm/hopper_gemm.h"
#include "ops/linear_cross_entropy/program.h"
#include "ops/log_probs/program.h"
#include "ops/registry.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/program.h"

namespace kjit {
namespace {

constexpr char kGoldenPath[] = KJIT_SOURCE_DIR "/tests/ops/rendered_sources.golden";

// The key as the JIT computes it, for a fixed target, no options and a fixed compiler version: what
// the rendering decides, and nothing the toolkit on this machine does.
std::string Line(const std::string& label, const jit::Source& src) {
  std::string exprs;
  for (const std::string& e : src.name_expressions) exprs += (exprs.empty() ? "" : " ; ") + e;
  const jit::Target target = *jit::ParseTarget("sm_90");
  return fmt::format("{} | {} | {} | {}", label, src.name, jit::CacheKey(src, target, {}, "golden"),
                     exprs);
}

class Lines {
 public:
  void Add(const std::string& label, const absl::StatusOr<jit::Source>& src) {
    ASSERT_TRUE(src.ok()) << label << ": " << src.status();
    lines_.push_back(Line(label, *src));
  }
  void Add(const std::string& label, const absl::StatusOr<std::vector<jit::Source>>& srcs) {
    ASSERT_TRUE(srcs.ok()) << label << ": " << srcs.status();
    for (const jit::Source& s : *srcs) lines_.push_back(Line(label, s));
  }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

void AddCrossEntropy(Lines& out, const std::string& label, const CrossEntropySpec& spec, int arch) {
  const int elem = static_cast<int>(SizeOf(spec.dtype));
  const CrossEntropyConfig c =
      ops::DefaultCrossEntropyConfig(spec.vocab, ops::MaxVecForCrossEntropy(elem), arch, elem);
  out.Add(fmt::format("{} sm_{} {}", label, arch, c.ToString()),
          ops::RenderCrossEntropyPrograms(spec, c));
}

// The options each loss is rendered with, beside the default: one at a time, then all at once.
std::vector<std::pair<std::string, CrossEntropySpec>> CrossEntropyVariants(int64_t vocab,
                                                                           float softcap) {
  const CrossEntropySpec base{.vocab = vocab, .loss = {.softcap = softcap}};
  std::vector<std::pair<std::string, CrossEntropySpec>> v = {{"default", base}};
  auto with = [&](const char* name, auto change) {
    CrossEntropySpec s = base;
    change(s);
    v.emplace_back(name, s);
  };
  with("fp16", [](auto& s) { s.dtype = DType::kF16; });
  with("fp32", [](auto& s) { s.dtype = DType::kF32; });
  with("int32", [](auto& s) { s.loss.target_type = IndexType::kInt32; });
  with("none", [](auto& s) { s.loss.reduction = Reduction::kNone; });
  with("sum", [](auto& s) { s.loss.reduction = Reduction::kSum; });
  with("smoothing", [](auto& s) { s.loss.label_smoothing = 0.1f; });
  with("z_loss", [](auto& s) { s.loss.z_loss = 1e-4f; });
  with("argmax", [](auto& s) { s.loss.argmax = true; });
  with("entropy", [](auto& s) { s.loss.entropy = true; });
  with("weights", [](auto& s) { s.loss.class_weight_dtype = DType::kF32; });
  with("all", [](auto& s) {
    s.loss.reduction = Reduction::kSum;
    s.loss.label_smoothing = 0.1f;
    s.loss.z_loss = 1e-4f;
    s.loss.argmax = s.loss.entropy = true;
    s.loss.class_weight_dtype = DType::kBF16;
    s.loss.softcap = 30;
  });
  return v;
}

void AddModel(Lines& out, const autotune::ModelConfig& m) {
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (bool residual : {false, true}) {
      RmsNormSpec s{.hidden = m.hidden_size,
                    .dtype = dt,
                    .weight_offset = static_cast<float>(m.norm_weight_offset),
                    .casting = m.norm_rounds_once ? RmsNormCasting::kGemma : RmsNormCasting::kLlama,
                    .fused_residual = residual};
      const int vec = ops::MaxVecForHidden(s.hidden, static_cast<int>(SizeOf(dt)));
      const RmsNormConfig c = ops::DefaultRmsNormConfig(s.hidden, vec);
      out.Add(fmt::format("{} rms_norm {}{} {}", m.name, Name(dt), residual ? " residual" : "",
                          c.ToString()),
              ops::RenderRmsNorm(s, c));
    }
  }
  const auto softcap = static_cast<float>(m.final_logit_softcapping);
  for (const auto& [variant, spec] : CrossEntropyVariants(m.vocab_size, softcap)) {
    for (int arch : {80, 90, 100}) {
      AddCrossEntropy(out, fmt::format("{} cross_entropy {}", m.name, variant), spec, arch);
    }
  }
  for (bool bias : {false, true}) {
    LinearCrossEntropySpec s{
        .vocab = m.vocab_size, .hidden = m.hidden_size, .bias = bias, .loss = {.softcap = softcap}};
    const std::string label = fmt::format("{} linear_cross_entropy{}", m.name, bias ? " bias" : "");
    out.Add(label, ops::RenderLinearCrossEntropy(s));
    out.Add(label, ops::RenderLinearCrossEntropyRescale(s));
    AddCrossEntropy(out, label + " chunk", s.ChunkLoss(), 90);
  }
  for (int shards : {2, 8}) {
    const int64_t width = m.vocab_size / shards;
    const ShardedCrossEntropySpec s{.vocab = m.vocab_size,
                                    .shard_start = width,
                                    .shard_end = 2 * width,
                                    .loss = {.softcap = softcap}};
    const CrossEntropyConfig c = ops::DefaultShardedCrossEntropyConfig(width, 8);
    out.Add(fmt::format("{} sharded_cross_entropy 1/{} {}", m.name, shards, c.ToString()),
            ops::RenderShardedCrossEntropy(s, c));
  }
}

// One shape per op over every config its search space keeps for sm_90.
void AddSearchSpaces(Lines& out) {
  const RmsNormSpec rms{.hidden = 4096};
  const RmsNormConfig rms_heuristic = ops::DefaultRmsNormConfig(4096, 8);
  for (const auto& [text, pruned] : ops::SearchSpace(rms, rms_heuristic.ToString(), 90)) {
    if (!pruned.empty()) continue;
    auto c = ParseRmsNormConfig(text);
    ASSERT_TRUE(c.ok()) << text;
    out.Add("search rms_norm 4096 " + text, ops::RenderRmsNorm(rms, *c));
  }
  const CrossEntropySpec ce{.vocab = 128256};
  const CrossEntropyConfig ce_heuristic = ops::DefaultCrossEntropyConfig(128256, 8, 90, 2);
  for (const auto& [text, pruned] : ops::SearchSpace(ce, ce_heuristic.ToString(), 90)) {
    if (!pruned.empty()) continue;
    auto c = ParseCrossEntropyConfig(text);
    ASSERT_TRUE(c.ok()) << text;
    out.Add("search cross_entropy 128256 " + text, ops::RenderCrossEntropyPrograms(ce, *c));
  }
}

void AddGemms(Lines& out) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (DType o : {dt, DType::kF32}) {
      for (bool a_mn : {false, true}) {
        for (bool b_mn : {false, true}) {
          for (bool acc : {false, true}) {
            ops::GemmKernelSpec s{.dtype = dt,
                                  .out = o,
                                  .a_major_mn = a_mn,
                                  .b_major_mn = b_mn,
                                  .accumulate = acc,
                                  .config = ops::DefaultGemmConfig(8192, 128256, 4096)};
            out.Add("gemm_sm90 " + s.NameExpression(), ops::RenderGemm(s));
          }
        }
      }
    }
  }
  for (const auto& [m, n, k] : {std::tuple{8192, 4096, 128256}, std::tuple{4096, 128256, 8192},
                                std::tuple{256, 128256, 4096}}) {
    ops::GemmKernelSpec s{.config = ops::DefaultGemmConfig(m, n, k)};
    out.Add(fmt::format("gemm_sm90 {}x{}x{}", m, n, k), ops::RenderGemm(s));
  }
}

// The RL heads (kjit/log_probs.h) of each preset's vocab, after every other line so that adding
// them moved none: bf16 on sm_90, with and without the entropy, and fp32 on sm_80.
void AddLogProbs(Lines& out) {
  for (const std::string& name : autotune::ModelPresetNames()) {
    auto m = autotune::ModelPreset(name);
    if (!m.ok()) continue;
    for (const auto& [dtype, arch] : {std::pair{DType::kBF16, 90}, std::pair{DType::kF32, 80}}) {
      for (bool entropy : {false, true}) {
        const LogProbsSpec s{.vocab = m->vocab_size, .dtype = dtype, .entropy = entropy};
        const CrossEntropyConfig c = ops::LogProbsConfig(s, arch);
        out.Add(fmt::format("{} log_probs {}{} sm_{} {}", m->name, Name(dtype),
                            entropy ? " entropy" : "", arch, c.ToString()),
                ops::RenderLogProbsPrograms(s, c));
      }
    }
  }
}

std::vector<std::string> RenderEverything() {
  Lines out;
  for (const std::string& name : autotune::ModelPresetNames()) {
    auto m = autotune::ModelPreset(name);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) AddModel(out, *m);
  }
  AddSearchSpaces(out);
  AddGemms(out);
  AddLogProbs(out);
  return out.lines();
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(RenderedSources, EveryStandardShapeRendersAsTheGoldenFileSays) {
  const std::vector<std::string> now = RenderEverything();
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_GT(now.size(), 500u) << "the shapes above render at least this many programs";
  if (std::getenv("KJIT_UPDATE_GOLDEN") != nullptr) {
    std::ofstream out(kGoldenPath, std::ios::trunc);
    for (const std::string& line : now) out << line << '\n';
    out.close();
    ASSERT_TRUE(out) << "could not write " << kGoldenPath;
    GTEST_SKIP() << "rewrote " << kGoldenPath << " with " << now.size()
                 << " lines; review its diff";
  }
  const std::vector<std::string> golden = ReadLines(kGoldenPath);
  ASSERT_FALSE(golden.empty()) << kGoldenPath << " is missing or empty";
  int shown = 0;
  for (size_t i = 0; i < std::max(now.size(), golden.size()) && shown < 10; ++i) {
    const std::string& g = i < golden.size() ? golden[i] : "(no line)";
    const std::string& n = i < now.size() ? now[i] : "(no line)";
    if (g != n) {
      ADD_FAILURE() << "line " << i + 1 << "\n golden: " << g << "\n    now: " << n;
      ++shown;
    }
  }
  EXPECT_EQ(now.size(), golden.size());
}

// The test of the test: one changed instantiation changes its line.
TEST(RenderedSources, AChangedInstantiationChangesItsLine) {
  const RmsNormSpec s{.hidden = 4096};
  const RmsNormConfig c = ops::DefaultRmsNormConfig(4096, 8);
  auto a = ops::RenderRmsNorm(s, c);
  ASSERT_TRUE(a.ok()) << a.status();
  jit::Source b = *a;
  b.name_expressions.back() += " ";
  EXPECT_NE(Line("x", *a), Line("x", b));
  jit::Source t = *a;
  t.headers.back().second += "\n";
  EXPECT_NE(Line("x", *a), Line("x", t)) << "a header's text is in the key";
}

}  // namespace
}  // namespace kjit
