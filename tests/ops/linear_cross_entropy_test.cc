// The fused linear + cross-entropy without a GPU: spec and config validation, the config's text
// form, the chunking heuristic, NVRTC compiles of the op's own kernels, the workspace's size
// against the header's formula, argument checks through a compile-only runtime (each bad argument
// named, nothing launched), and loading cuBLASLt (and the error naming KJIT_CUBLASLT_PATH).
#include "kjit/linear_cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "jit/compiler.h"
#include "jit/dtype.h"
#include "jit/embedded_templates.h"
#include "jit/source.h"
#include "jit/status_helpers.h"
#include "kjit/runtime.h"
#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/cublaslt.h"
#include "ops/linear_cross_entropy/program.h"
#include "ops/linear_cross_entropy/tuning/reference.h"
#include "ops/linear_cross_entropy/tuning/search_space.h"
#include "tests/expect_status.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;

bool Contains(const absl::Status& s, const std::string& needle) {
  return ToStd(s.message()).find(needle) != std::string::npos;
}

LinearCrossEntropySpec Good() { return {.vocab = 128256, .hidden = 4096, .dtype = DType::kBF16}; }

// --- The spec ------------------------------------------------------------------------------------

TEST(LinearCrossEntropySpecTest, AcceptsGoodSpecs) {
  EXPECT_TRUE(ValidateLinearCrossEntropySpec(Good()).ok());
  // The bounds themselves.
  EXPECT_TRUE(ValidateLinearCrossEntropySpec({.vocab = 2, .hidden = 1}).ok());
  EXPECT_TRUE(ValidateLinearCrossEntropySpec({.vocab = 1 << 20, .hidden = 65536}).ok());
  // d_weight in the dtype (explicitly) or in fp32.
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType wg : {dt, DType::kF32}) {
      LinearCrossEntropySpec s = Good();
      s.dtype = dt;
      s.weight_grad_dtype = wg;
      EXPECT_TRUE(ValidateLinearCrossEntropySpec(s).ok()) << Name(dt) << " " << Name(wg);
    }
  }
  // Every option together, int64 targets with a large ignore_index, a config at its bounds.
  LinearCrossEntropySpec s = Good();
  s.bias = true;
  s.loss.ignore_index = int64_t{1} << 40;
  s.loss.reduction = Reduction::kNone;
  s.loss.label_smoothing = 0.1f;
  s.loss.z_loss = 1e-4f;
  s.loss.softcap = 30.0f;
  s.loss.argmax = true;
  s.weight_grad_accumulation = WeightGradAccumulation::kOutputDtype;
  s.config = LinearCrossEntropyConfig{
      .chunk_rows = 65536, .streams = 2, .logits_algo = 63, .d_hidden_algo = 0, .d_weight_algo = 7};
  EXPECT_TRUE(ValidateLinearCrossEntropySpec(s).ok()) << ValidateLinearCrossEntropySpec(s);
  s.config = LinearCrossEntropyConfig{.chunk_rows = 1};
  EXPECT_TRUE(ValidateLinearCrossEntropySpec(s).ok()) << ValidateLinearCrossEntropySpec(s);
}

TEST(LinearCrossEntropySpecTest, RejectsEachBadFieldNamingIt) {
  auto with = [](const std::function<void(LinearCrossEntropySpec&)>& f) {
    LinearCrossEntropySpec s = Good();
    f(s);
    return ValidateLinearCrossEntropySpec(s);
  };
  ExpectInvalid(with([](auto& s) { s.hidden = 0; }), "hidden:");
  ExpectInvalid(with([](auto& s) { s.hidden = -1; }), "hidden:");
  ExpectInvalid(with([](auto& s) { s.hidden = 65537; }), "hidden:");
  ExpectInvalid(with([](auto& s) { s.vocab = 1; }), "vocab:");
  ExpectInvalid(with([](auto& s) { s.vocab = 0; }), "vocab:");
  ExpectInvalid(with([](auto& s) { s.vocab = (int64_t{1} << 20) + 1; }), "vocab:");
  ExpectInvalid(with([](auto& s) { s.weight_grad_dtype = DType::kF16; }),
                "weight_grad_dtype: fp16 must be bf16 or fp32");
  ExpectInvalid(with([](auto& s) {
                  s.dtype = DType::kF16;
                  s.weight_grad_dtype = DType::kBF16;
                }),
                "weight_grad_dtype:");
  ExpectInvalid(with([](auto& s) {
                  s.dtype = DType::kF32;
                  s.weight_grad_dtype = DType::kBF16;  // narrower than the dtype
                }),
                "weight_grad_dtype:");
  ExpectInvalid(with([](auto& s) { s.loss.label_smoothing = 1.0f; }), "label_smoothing:");
  ExpectInvalid(with([](auto& s) { s.loss.label_smoothing = -0.1f; }), "label_smoothing:");
  ExpectInvalid(with([](auto& s) { s.loss.z_loss = -1e-4f; }), "z_loss:");
  ExpectInvalid(with([](auto& s) { s.loss.softcap = -30.0f; }), "softcap:");
  ExpectInvalid(with([](auto& s) {
                  s.loss.target_type = IndexType::kInt32;
                  s.loss.ignore_index = int64_t{1} << 40;
                }),
                "ignore_index:");
  ExpectInvalid(with([](auto& s) {
                  s.loss.target_type = IndexType::kInt32;
                  s.loss.ignore_index = int64_t{INT32_MIN} - 1;
                }),
                "ignore_index:");
  // The same ignore_index is fine with int32 in range, or int64 targets.
  EXPECT_TRUE(with([](auto& s) {
                s.loss.target_type = IndexType::kInt32;
                s.loss.ignore_index = INT32_MIN;
              }).ok());
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.chunk_rows = 0}; }),
                "config.chunk_rows:");
  ExpectInvalid(
      with([](auto& s) {
        s.config = LinearCrossEntropyConfig{.chunk_rows = ops::kMaxLinearCrossEntropyChunkRows + 1};
      }),
      "config.chunk_rows:");
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.streams = 3}; }),
                "config.streams:");
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.streams = 0}; }),
                "config.streams:");
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.logits_algo = -2}; }),
                "config.logits_algo:");
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.logits_algo = 64}; }),
                "config.logits_algo:");
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.d_hidden_algo = 64}; }),
                "config.d_hidden_algo:");
  ExpectInvalid(with([](auto& s) { s.config = LinearCrossEntropyConfig{.d_weight_algo = -2}; }),
                "config.d_weight_algo:");

  // The runtime refuses the same spec before compiling anything.
  auto rt = Runtime::Create(
      {.target = "sm_90", .compile_only = true, .disk_cache = false, .tuning_db = "off"});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto op = rt->LinearCrossEntropy({.vocab = 1000, .hidden = 0});
  ASSERT_FALSE(op.ok());
  ExpectInvalid(op.status(), "hidden:");
}

TEST(LinearCrossEntropySpecTest, ChunkLossCarriesTheLossOptions) {
  LinearCrossEntropySpec s = Good();
  s.loss.target_type = IndexType::kInt32;
  s.loss.ignore_index = 7;
  s.loss.label_smoothing = 0.1f;
  s.loss.z_loss = 1e-4f;
  s.loss.softcap = 30.0f;
  s.loss.argmax = true;
  for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    s.loss.reduction = r;
    const CrossEntropySpec c = s.ChunkLoss();
    EXPECT_EQ(c.vocab, s.vocab);
    EXPECT_EQ(c.dtype, s.dtype);
    EXPECT_EQ(c.loss.target_type, IndexType::kInt32);
    EXPECT_EQ(c.loss.ignore_index, 7);
    EXPECT_EQ(c.loss.label_smoothing, 0.1f);
    EXPECT_EQ(c.loss.z_loss, 1e-4f);
    EXPECT_EQ(c.loss.softcap, 30.0f);
    EXPECT_TRUE(c.loss.argmax);
    // Each chunk sums (the mean divides by the whole batch's count first); none stays none.
    EXPECT_EQ(c.loss.reduction, r == Reduction::kNone ? Reduction::kNone : Reduction::kSum);
  }
  EXPECT_STREQ(Name(WeightGradAccumulation::kFloat32), "fp32");
  EXPECT_STREQ(Name(WeightGradAccumulation::kOutputDtype), "output_dtype");
}

// --- The config's text ---------------------------------------------------------------------------

TEST(LinearCrossEntropyConfigTest, TextRoundTrips) {
  const LinearCrossEntropyConfig def;
  EXPECT_EQ(def.ToString(),
            "chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0");
  for (const LinearCrossEntropyConfig& c :
       {def, LinearCrossEntropyConfig{.chunk_rows = 1},
        LinearCrossEntropyConfig{.chunk_rows = 65536,
        .whole_rows = 65536,
        .streams = 2,
        .logits_algo = 63,
        .d_hidden_algo = 5,
        .d_weight_algo = 17},
        LinearCrossEntropyConfig{.chunk_rows = 384, .streams = 2, .d_weight_algo = 1},
        LinearCrossEntropyConfig{.chunk_rows = 1920, .whole_rows = 10112},
        LinearCrossEntropyConfig{.logits_algo = LinearCrossEntropyConfig::kOwnGemm,
        .d_weight_algo = LinearCrossEntropyConfig::kOwnGemm}}) {
    auto parsed = ParseLinearCrossEntropyConfig(c.ToString());
    ASSERT_TRUE(parsed.ok()) << c.ToString() << ": " << parsed.status();
    EXPECT_EQ(*parsed, c) << c.ToString() << " -> " << parsed->ToString();
    EXPECT_EQ(parsed->ToString(), c.ToString());
  }
  // kjit's own GEMM is written "kjit", never as its number.
  EXPECT_EQ(
      LinearCrossEntropyConfig{.d_hidden_algo = LinearCrossEntropyConfig::kOwnGemm}.ToString(),
      "chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=kjit d_weight_algo=0");
  // Any order, extra spaces.
  auto shuffled = ParseLinearCrossEntropyConfig(
      "  d_weight_algo=2 streams=2  chunk=256 d_hidden_algo=1 logits_algo=3 whole=512 ");
  ASSERT_TRUE(shuffled.ok()) << shuffled.status();
  EXPECT_EQ(*shuffled, (LinearCrossEntropyConfig{.chunk_rows = 256,
                                                 .whole_rows = 512,
                                                 .streams = 2,
                                                 .logits_algo = 3,
                                                 .d_hidden_algo = 1,
                                                 .d_weight_algo = 2}));
}

TEST(LinearCrossEntropyConfigTest, RejectsBadTextNamingTheField) {
  auto expect_bad = [](const std::string& text, const std::string& field) {
    auto c = ParseLinearCrossEntropyConfig(text);
    ASSERT_FALSE(c.ok()) << "\"" << text << "\" parsed as " << c->ToString();
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    EXPECT_TRUE(Contains(c.status(), field))
        << "\"" << text << "\": expected '" << field << "' in the message: " << c.status();
  };
  const std::string ok_tail = "whole=0 logits_algo=0 d_hidden_algo=0 d_weight_algo=0";
  // Missing fields.
  expect_bad("streams=1 " + ok_tail, "\"chunk\" is missing");
  expect_bad("chunk=1024 " + ok_tail, "\"streams\" is missing");
  expect_bad("chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=0",
             "\"d_weight_algo\" is missing");
  expect_bad("chunk=1024 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0",
             "\"whole\" is missing");
  expect_bad("", "is missing");
  // Unknown and duplicate fields, a token that is not name=value.
  expect_bad("chunk=1024 streams=1 vec=8 " + ok_tail, "unknown field \"vec\"");
  expect_bad("chunk_rows=1024 streams=1 " + ok_tail, "unknown field \"chunk_rows\"");
  expect_bad("chunk=1024 chunk=512 streams=1 " + ok_tail, "\"chunk\" appears twice");
  expect_bad("chunk=1024 streams=1 streams=2 " + ok_tail, "\"streams\" appears twice");
  expect_bad("chunk=1024 streams " + ok_tail, "\"streams\" is not name=value");
  // Values that are not whole numbers.
  expect_bad("chunk=abc streams=1 " + ok_tail, "chunk=abc");
  expect_bad("chunk=1.5 streams=1 " + ok_tail, "chunk=1.5");
  expect_bad("chunk= streams=1 " + ok_tail, "chunk=");
  expect_bad("chunk=99999999999 streams=1 " + ok_tail, "chunk=99999999999");
  expect_bad("chunk=1024 streams=x " + ok_tail, "streams=x");
  expect_bad("chunk=1024 whole=0 streams=1 logits_algo=1e2 d_hidden_algo=0 d_weight_algo=0",
             "logits_algo=1e2");
  // Whole numbers out of range: the validation's message, naming the config field.
  expect_bad("chunk=0 streams=1 " + ok_tail, "config.chunk_rows:");
  expect_bad("chunk=-128 streams=1 " + ok_tail, "config.chunk_rows:");
  expect_bad("chunk=65537 streams=1 " + ok_tail, "config.chunk_rows:");
  expect_bad("chunk=1024 streams=3 " + ok_tail, "config.streams:");
  expect_bad("chunk=1024 whole=-1 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0",
             "config.whole_rows:");
  expect_bad("chunk=1024 whole=65537 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0",
             "config.whole_rows:");
  expect_bad("chunk=1024 streams=0 " + ok_tail, "config.streams:");
  expect_bad("chunk=1024 whole=0 streams=1 logits_algo=-1 d_hidden_algo=0 d_weight_algo=0",
             "logits_algo=-1: expected an index from 0 to 63, or kjit");
  expect_bad("chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=64 d_weight_algo=0",
             "config.d_hidden_algo:");
  expect_bad("chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=99",
             "config.d_weight_algo:");
}

// --- The heuristic -------------------------------------------------------------------------------

// The most rows (a multiple of 128, at least 128, at most the cap) whose logits fit the budget.
int64_t ExpectedChunk(int64_t vocab, DType dtype) {
  const int64_t e = static_cast<int64_t>(SizeOf(dtype));
  const int64_t row_bytes = (vocab * e + 15) / 16 * 16;
  const int64_t rows = ops::kLinearCrossEntropyChunkBudgetBytes / row_bytes / 128 * 128;
  return std::clamp<int64_t>(rows, 128, ops::kMaxLinearCrossEntropyChunkRows);
}

TEST(LinearCrossEntropyConfigTest, DefaultChunkFillsTheBudget) {
  auto chunk = [](int64_t vocab, DType dtype) {
    return ops::DefaultLinearCrossEntropyConfig({.vocab = vocab, .hidden = 4096, .dtype = dtype})
        .chunk_rows;
  };
  const LinearCrossEntropyConfig llama =
      ops::DefaultLinearCrossEntropyConfig({.vocab = 128256, .hidden = 4096});
  EXPECT_EQ(llama.chunk_rows, ExpectedChunk(128256, DType::kBF16));
  EXPECT_EQ(llama.streams, 1);
  EXPECT_EQ(llama.logits_algo, 0);
  EXPECT_EQ(llama.d_hidden_algo, 0);
  EXPECT_EQ(llama.d_weight_algo, 0);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t vocab : {2, 3, 50257, 128256, 256000, 1 << 20}) {
      EXPECT_EQ(chunk(vocab, dtype), ExpectedChunk(vocab, dtype)) << Name(dtype) << " " << vocab;
    }
  }
  EXPECT_EQ(chunk(2, DType::kBF16), ops::kMaxLinearCrossEntropyChunkRows);
  EXPECT_EQ(chunk(2, DType::kF32), ops::kMaxLinearCrossEntropyChunkRows);
  // Rows too wide for 128 of them in the budget: still 128 rows.
  EXPECT_EQ(chunk(1 << 20, DType::kF32), 128);

  // The numbers at today's budget, so that a change of the heuristic shows here.
  ASSERT_EQ(ops::kLinearCrossEntropyChunkBudgetBytes, int64_t{479} << 20)
      << "the budget changed: update the chunk rows pinned below";
  EXPECT_EQ(llama.chunk_rows, 1920);
  EXPECT_EQ(chunk(128256, DType::kF16), 1920);
  EXPECT_EQ(chunk(256000, DType::kBF16), 896);
  EXPECT_EQ(chunk(128256, DType::kF32), 896);
  EXPECT_EQ(chunk(50257, DType::kBF16), 4992);

  // whole_rows: the rows whose logits fit the budget and the fp32 accumulator's bytes together,
  // only where there is an accumulator to trade.
  EXPECT_EQ(llama.whole_rows, 10112);
  EXPECT_LE(llama.whole_rows * 128256 * 2,
            ops::kLinearCrossEntropyChunkBudgetBytes + int64_t{128256} * 4096 * 4);
  LinearCrossEntropySpec fp32_grad{.vocab = 128256, .hidden = 4096};
  fp32_grad.weight_grad_dtype = DType::kF32;
  EXPECT_EQ(ops::DefaultLinearCrossEntropyConfig(fp32_grad).whole_rows, 0);
  LinearCrossEntropySpec output_dtype{.vocab = 128256, .hidden = 4096};
  output_dtype.weight_grad_accumulation = WeightGradAccumulation::kOutputDtype;
  EXPECT_EQ(ops::DefaultLinearCrossEntropyConfig(output_dtype).whole_rows, 0);
  EXPECT_EQ(
      ops::DefaultLinearCrossEntropyConfig({.vocab = 128256, .hidden = 4096, .dtype = DType::kF32})
          .whole_rows,
      0);  // fp32 weights: d_weight is fp32 itself
}

TEST(LinearCrossEntropyConfigTest, DefaultChunkIsAValidMultipleOf128ForEveryShape) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t vocab = 2; vocab <= (int64_t{1} << 20); vocab = vocab * 3 / 2 + 1) {
      for (int64_t hidden : {1, 4096, 65536}) {
        const LinearCrossEntropySpec spec{.vocab = vocab, .hidden = hidden, .dtype = dtype};
        const LinearCrossEntropyConfig c = ops::DefaultLinearCrossEntropyConfig(spec);
        SCOPED_TRACE(
            fmt::format("{} vocab {} hidden {}: {}", Name(dtype), vocab, hidden, c.ToString()));
        EXPECT_EQ(c.chunk_rows % 128, 0);
        EXPECT_GE(c.chunk_rows, 128);
        EXPECT_LE(c.chunk_rows, ops::kMaxLinearCrossEntropyChunkRows);
        EXPECT_EQ(c.streams, 1);
        EXPECT_TRUE(ops::ValidateLinearCrossEntropyConfig(c).ok());
        // Within the budget unless 128 rows alone exceed it; the most rows that fit otherwise.
        const int64_t row_bytes =
            ops::ChunkRowStride(vocab, dtype) * static_cast<int64_t>(SizeOf(dtype));
        if (c.chunk_rows > 128) {
          EXPECT_LE(c.chunk_rows * row_bytes, ops::kLinearCrossEntropyChunkBudgetBytes);
        }
        if (c.chunk_rows < ops::kMaxLinearCrossEntropyChunkRows) {
          EXPECT_GT((c.chunk_rows + 128) * row_bytes, ops::kLinearCrossEntropyChunkBudgetBytes);
        }
        // All rows up to whole_rows fit where the chunks and the accumulator would be.
        if (c.whole_rows > 128) {
          EXPECT_LE(c.whole_rows * row_bytes,
                    ops::kLinearCrossEntropyChunkBudgetBytes + vocab * hidden * 4);
        }
        EXPECT_EQ(c.whole_rows % 128, 0);
      }
    }
  }
}

// The tuner's candidates at LLaMA 3's lm_head: the heuristic first, then the chunked schedules
// (whole_rows 0, so that at row counts the heuristic takes whole they are real alternatives), two
// streams pruned where two chunk buffers exceed the budget, then 7 more algorithms per GEMM.
TEST(LinearCrossEntropyConfigTest, SearchSpaceStartsAtTheHeuristicAndTriesChunks) {
  const LinearCrossEntropySpec spec{.vocab = 128256, .hidden = 4096};
  const LinearCrossEntropyConfig h = ops::DefaultLinearCrossEntropyConfig(spec);
  const auto space = ops::LinearCrossEntropySearchSpace(spec, h);
  ASSERT_FALSE(space.empty());
  EXPECT_EQ(space[0].config, h);
  EXPECT_TRUE(space[0].pruned.empty());
  int chunked = 0, pruned = 0, algos = 0;
  for (size_t i = 1; i < space.size(); ++i) {
    const LinearCrossEntropyConfig& c = space[i].config;
    SCOPED_TRACE(c.ToString());
    EXPECT_FALSE(c == h) << "the heuristic twice";
    EXPECT_TRUE(ops::ValidateLinearCrossEntropyConfig(c).ok());
    if (c.logits_algo + c.d_hidden_algo + c.d_weight_algo > 0) {
      ++algos;
      EXPECT_EQ(c.whole_rows, h.whole_rows);
      EXPECT_EQ(c.chunk_rows, h.chunk_rows);
      continue;
    }
    ++chunked;
    EXPECT_EQ(c.whole_rows, 0);
    EXPECT_TRUE(c.chunk_rows == h.chunk_rows || c.chunk_rows == h.chunk_rows / 2 ||
                c.chunk_rows == h.chunk_rows / 4);
    const bool over =
        c.streams * c.chunk_rows * 128256 * 2 > ops::kLinearCrossEntropyChunkBudgetBytes;
    EXPECT_EQ(space[i].pruned.empty(), !over) << space[i].pruned;
    pruned += over;
  }
  EXPECT_EQ(chunked, 6);  // 3 chunks x 1 and 2 streams
  EXPECT_EQ(pruned, 1);   // two buffers of the heuristic's chunk
  EXPECT_EQ(algos, 3 * 7);
}

TEST(LinearCrossEntropyConfigTest, ChunkRowStrideIsWhole16ByteVectors) {
  EXPECT_EQ(ops::ChunkRowStride(50257, DType::kBF16), 50264);
  EXPECT_EQ(ops::ChunkRowStride(50257, DType::kF16), 50264);
  EXPECT_EQ(ops::ChunkRowStride(50257, DType::kF32), 50260);
  EXPECT_EQ(ops::ChunkRowStride(128256, DType::kBF16), 128256);
  EXPECT_EQ(ops::ChunkRowStride(128256, DType::kF32), 128256);
  EXPECT_EQ(ops::ChunkRowStride(2, DType::kBF16), 8);
  EXPECT_EQ(ops::ChunkRowStride(2, DType::kF32), 4);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int64_t e = static_cast<int64_t>(SizeOf(dtype));
    for (int64_t vocab = 2; vocab < 300; ++vocab) {
      const int64_t stride = ops::ChunkRowStride(vocab, dtype);
      EXPECT_GE(stride, vocab);
      EXPECT_LT(stride - vocab, 16 / e);
      EXPECT_EQ(stride * e % 16, 0) << Name(dtype) << " " << vocab;
    }
  }
}

// --- NVRTC ---------------------------------------------------------------------------------------

const jit::Nvrtc& GetNvrtc() {
  auto n = jit::Nvrtc::Get();
  EXPECT_TRUE(n.ok()) << n.status();  // NVRTC is part of the CI machine's toolkit
  return **n;
}

void ExpectCompiles(const LinearCrossEntropySpec& spec, const char* arch) {
  auto src = ops::RenderLinearCrossEntropy(spec);
  ASSERT_TRUE(src.ok()) << src.status();
  const jit::Target target = *jit::ParseTarget(arch);
  auto bin = jit::Compile(GetNvrtc(), *src, target);
  ASSERT_TRUE(bin.ok()) << arch << " " << jit::FormatParams(src->params) << ": " << bin.status();
  EXPECT_EQ(bin->target, target);
  ASSERT_GE(bin->code.size(), 4u);
  EXPECT_EQ(bin->code.substr(0, 4),
            "\x7f"
            "ELF")
      << "CUBIN is an ELF image";
  ASSERT_EQ(bin->lowered_names.size(), src->name_expressions.size());
  for (const auto& [expr, lowered] : bin->lowered_names) {
    EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << expr << " -> " << lowered;
  }
}

TEST(LinearCrossEntropyCompileTest, TemplatesAreEmbeddedAndUseNoToolkitHeader) {
  for (const char* name : {"linear_cross_entropy.cuh", "linear_cross_entropy_params.h"}) {
    const std::string* text = jit::FindEmbeddedTemplate(name);
    ASSERT_NE(text, nullptr) << name;
    EXPECT_FALSE(text->empty()) << name;
    EXPECT_EQ(text->find("#include <"), std::string::npos) << name << " includes a system header";
    EXPECT_EQ(text->find("#include \"cuda"), std::string::npos)
        << name << " includes a toolkit header";
  }
}

TEST(LinearCrossEntropyCompileTest, RendersTheKernelsThePlanNeeds) {
  // count, scale, reduce; and the 4 stores into a d_weight that is not fp32.
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType wg : {dt, DType::kF32}) {
      LinearCrossEntropySpec s{.vocab = 1000, .hidden = 64, .dtype = dt, .weight_grad_dtype = wg};
      auto src = ops::RenderLinearCrossEntropy(s);
      ASSERT_TRUE(src.ok()) << src.status();
      EXPECT_EQ(src->name_expressions.size(), wg == DType::kF32 ? 3u : 7u)
          << Name(dt) << " " << Name(wg);
      EXPECT_EQ(src->params.at("op"), "linear_cross_entropy");
      EXPECT_EQ(src->params.at("weight_grad_dtype"), Name(wg));
    }
  }
  // A bad spec is refused before rendering.
  auto bad = ops::RenderLinearCrossEntropy({.vocab = 1, .hidden = 64});
  ASSERT_FALSE(bad.ok());
  ExpectInvalid(bad.status(), "vocab:");
}

TEST(LinearCrossEntropyCompileTest, EveryArchDtypeReductionAndWeightGradDtype) {
  int compiled = 0;
  for (const char* arch : {"sm_80", "sm_90", "sm_100", "sm_120"}) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
        for (DType wg : {dt, DType::kF32}) {
          const LinearCrossEntropySpec spec{.vocab = 128256,
                                            .hidden = 4096,
                                            .dtype = dt,
                                            .weight_grad_dtype = wg,
                                            .loss = {.reduction = r}};
          SCOPED_TRACE(fmt::format("{} {} {} weight_grad {}", arch, Name(dt), Name(r), Name(wg)));
          ExpectCompiles(spec, arch);
          if (::testing::Test::HasFatalFailure()) return;
          ++compiled;
          if (dt == DType::kF32) break;  // wg == dt: the fp32 case is the same program
        }
      }
    }
  }
  EXPECT_EQ(compiled, 4 * (3 * 2 + 3 * 2 + 3));
}

// RescaleGradients' program: scalar and 4-wide kernels per gradient dtype, the dtype's first.
TEST(LinearCrossEntropyCompileTest, RescaleProgramPerGradientDtype) {
  for (const char* arch : {"sm_80", "sm_90", "sm_100", "sm_120"}) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (DType wg : {dt, DType::kF32}) {
        SCOPED_TRACE(fmt::format("{} {} weight_grad {}", arch, Name(dt), Name(wg)));
        const LinearCrossEntropySpec s{
            .vocab = 50257, .hidden = 4095, .dtype = dt, .weight_grad_dtype = wg};
        auto src = ops::RenderLinearCrossEntropyRescale(s);
        ASSERT_TRUE(src.ok()) << src.status();
        ASSERT_EQ(src->name_expressions.size(), wg == dt ? 2u : 4u);
        EXPECT_EQ(
            src->name_expressions[0],
            fmt::format("kjit::linear_cross_entropy_rescale<{}, 256, 1>", DeviceTypeName(dt)));
        EXPECT_EQ(
            src->name_expressions.back(),
            fmt::format("kjit::linear_cross_entropy_rescale<{}, 256, 4>", DeviceTypeName(wg)));
        auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget(arch));
        ASSERT_TRUE(bin.ok()) << bin.status();
        EXPECT_EQ(bin->lowered_names.size(), src->name_expressions.size());
        if (dt == DType::kF32) break;
      }
    }
  }
  auto bad = ops::RenderLinearCrossEntropyRescale({.vocab = 1, .hidden = 64});
  ASSERT_FALSE(bad.ok());
  ExpectInvalid(bad.status(), "vocab:");
}

// Options reach the count kernel (target type, ignore_index); cover them with an odd vocab.
TEST(LinearCrossEntropyCompileTest, Options) {
  for (int bits = 0; bits < 8; ++bits) {
    LinearCrossEntropySpec s{.vocab = 50257, .hidden = 1000, .dtype = DType::kBF16};
    s.loss.target_type = bits & 1 ? IndexType::kInt32 : IndexType::kInt64;
    s.bias = (bits & 2) != 0;
    s.loss.argmax = (bits & 4) != 0;
    s.loss.label_smoothing = bits & 2 ? 0.1f : 0.0f;
    s.loss.softcap = bits & 4 ? 30.0f : 0.0f;
    s.loss.z_loss = bits & 1 ? 1e-4f : 0.0f;
    s.loss.reduction = static_cast<Reduction>(bits % 3);
    SCOPED_TRACE(bits);
    ExpectCompiles(s, "sm_90");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Issue 45, defect 13: programs whose text differs are described apart (their params are what
// `kjit cache ls` shows).
TEST(LinearCrossEntropyCompileTest, ProgramsThatDifferHaveParamsThatDiffer) {
  std::vector<LinearCrossEntropySpec> specs(3, {.vocab = 50257, .hidden = 1000});
  specs[1].loss.label_smoothing = 0.1f;
  specs[2].loss.class_weight_dtype = DType::kF32;
  std::set<std::string> texts, described;
  for (const LinearCrossEntropySpec& s : specs) {
    auto src = ops::RenderLinearCrossEntropy(s);
    ASSERT_TRUE(src.ok()) << src.status();
    texts.insert(fmt::format("{}", fmt::join(src->name_expressions, ";")));
    described.insert(jit::FormatParams(src->params));
  }
  EXPECT_EQ(texts.size(), 3u);
  EXPECT_EQ(described.size(), 3u) << fmt::format("{}", fmt::join(described, "\n"));
}

// --- The op on a compile-only runtime ------------------------------------------------------------

class LinearCrossEntropyRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto rt = Runtime::Create(
        {.target = "sm_90", .compile_only = true, .disk_cache = false, .tuning_db = "off"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_.emplace(std::move(*rt));
  }
  std::optional<Runtime> rt_;
};

constexpr int64_t kAlign = 256;
constexpr int64_t kLtWorkspace = int64_t{32} << 20;
int64_t AlignUp(int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// The header's formula (kjit/linear_cross_entropy.h), without its O(rows / C) term.
int64_t HeaderTerms(const LinearCrossEntropySpec& s, const LinearCrossEntropyConfig& c,
                    bool accumulator) {
  const int64_t e = static_cast<int64_t>(SizeOf(s.dtype));
  const int64_t per_vec = 16 / e;
  const int64_t stride = (s.vocab + per_vec - 1) / per_vec * per_vec;
  int64_t bytes = c.streams * c.chunk_rows * stride * e + kLtWorkspace;
  if (accumulator) bytes += s.vocab * s.hidden * 4;
  // The bias's fp32 accumulator goes with the weight's; the ones with any bias.
  if (s.bias) bytes += (accumulator ? s.vocab * 4 : 0) + c.chunk_rows * e;
  bytes += c.chunk_rows * 4;  // the chunk loss's per-row losses
  return bytes;
}

TEST_F(LinearCrossEntropyRuntimeTest, CreatesAndBuildsCompileOnly) {
  auto op = rt_->LinearCrossEntropy(Good());
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->spec().vocab, 128256);
  EXPECT_EQ(op->ConfigFor(8192), ops::DefaultLinearCrossEntropyConfig(Good()));
  auto built = op->Build();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->target, "sm_90");
  EXPECT_EQ(built->params.at("op"), "linear_cross_entropy");
  EXPECT_EQ(built->params.at("vocab"), "128256");
  EXPECT_EQ(built->params.at("hidden"), "4096");
  // Its own programs first, then the chunk loss's programs that Run launches.
  ASSERT_EQ(built->programs.size(), 5u);
  EXPECT_EQ(built->program, "linear_cross_entropy");
  EXPECT_EQ(built->programs[0].kernels.size(), 7u);
  EXPECT_EQ(built->programs[1].program, "linear_cross_entropy.rescale");
  EXPECT_EQ(built->programs[2].program, "cross_entropy.forward_backward");
  EXPECT_EQ(built->programs[3].program, "cross_entropy.count_reduce");
  EXPECT_EQ(built->programs[4].program, "cross_entropy.forward");
  EXPECT_GT(built->bytes, built->programs[0].bytes);
  // The spec's config overrides the heuristic.
  LinearCrossEntropySpec tuned = Good();
  tuned.config = LinearCrossEntropyConfig{.chunk_rows = 384, .streams = 2, .logits_algo = 3};
  auto op2 = rt_->LinearCrossEntropy(tuned);
  ASSERT_TRUE(op2.ok()) << op2.status();
  EXPECT_EQ(op2->ConfigFor(100), *tuned.config);
  // A bad spec is refused when the op is made.
  LinearCrossEntropySpec bad = Good();
  bad.config = LinearCrossEntropyConfig{.streams = 3};
  auto op3 = rt_->LinearCrossEntropy(bad);
  ASSERT_FALSE(op3.ok());
  ExpectInvalid(op3.status(), "config.streams:");
}

TEST_F(LinearCrossEntropyRuntimeTest, WorkspaceFollowsTheHeaderFormula) {
  const int64_t V = 128256, H = 4096;
  auto op = rt_->LinearCrossEntropy(Good());  // bf16 d_weight: an fp32 accumulator
  ASSERT_TRUE(op.ok()) << op.status();
  const LinearCrossEntropyConfig c = op->ConfigFor(16384);
  EXPECT_EQ(c, op->config());  // no tuning database
  EXPECT_EQ(c, ops::DefaultLinearCrossEntropyConfig(Good()));
  ASSERT_EQ(c.streams, 1);
  const int64_t C = c.chunk_rows;
  EXPECT_EQ(op->AccumulatorBytes(16384), AlignUp(V * H * 4));
  EXPECT_EQ(op->AccumulatorBytes(16384), V * H * 4);  // already a multiple of 256

  const int64_t at_16k = op->WorkspaceBytes(16384);
  const int64_t terms = HeaderTerms(Good(), c, /*accumulator=*/true);
  // The header's terms, plus the O(rows / C) counters and per-chunk losses and the rounding of
  // each buffer to 256 bytes: well under a few KiB.
  EXPECT_GE(at_16k, terms);
  EXPECT_LE(at_16k - terms, 4 << 10) << "beyond the header's terms: " << at_16k - terms;
  EXPECT_EQ(at_16k % kAlign, 0);
  // Without the accumulator: under 0.5 GiB (config.h's budget), whatever the row count.
  const int64_t without_acc = at_16k - op->AccumulatorBytes(16384);
  EXPECT_LE(without_acc, int64_t{1} << 29) << without_acc;
  // The row count only moves the O(rows / C) term.
  const int64_t at_128k = op->WorkspaceBytes(131072);
  EXPECT_GE(at_128k, at_16k);
  EXPECT_LE(at_128k - at_16k, 4 << 10) << at_16k << " vs " << at_128k;
  const int64_t chunks_16k = (16384 + C - 1) / C, chunks_1m = ((1 << 20) + C - 1) / C;
  EXPECT_EQ(op->WorkspaceBytes(1 << 20) - at_16k, AlignUp(chunks_1m * 4) - AlignUp(chunks_16k * 4));

  // d_weight in fp32 is its own accumulator.
  LinearCrossEntropySpec fp32_grad = Good();
  fp32_grad.weight_grad_dtype = DType::kF32;
  auto op_f = rt_->LinearCrossEntropy(fp32_grad);
  ASSERT_TRUE(op_f.ok()) << op_f.status();
  EXPECT_EQ(op_f->AccumulatorBytes(16384), 0);
  EXPECT_EQ(op_f->WorkspaceBytes(16384), at_16k - op->AccumulatorBytes(16384));
  EXPECT_GE(op_f->WorkspaceBytes(16384), HeaderTerms(fp32_grad, c, false));

  // Rounding into d_weight as it goes: no accumulator.
  LinearCrossEntropySpec direct = Good();
  direct.weight_grad_accumulation = WeightGradAccumulation::kOutputDtype;
  auto op_d = rt_->LinearCrossEntropy(direct);
  ASSERT_TRUE(op_d.ok()) << op_d.status();
  EXPECT_EQ(op_d->AccumulatorBytes(16384), 0);
  EXPECT_EQ(op_d->WorkspaceBytes(16384), at_16k - op->AccumulatorBytes(16384));

  // Two streams: two chunk buffers.
  LinearCrossEntropySpec two = Good();
  two.config = LinearCrossEntropyConfig{.chunk_rows = C, .streams = 2};
  auto op_2 = rt_->LinearCrossEntropy(two);
  ASSERT_TRUE(op_2.ok()) << op_2.status();
  EXPECT_EQ(op_2->WorkspaceBytes(16384) - at_16k, C * V * 2);

  // A bias: its fp32 accumulator and the ones.
  LinearCrossEntropySpec bias = Good();
  bias.bias = true;
  auto op_b = rt_->LinearCrossEntropy(bias);
  ASSERT_TRUE(op_b.ok()) << op_b.status();
  EXPECT_EQ(op_b->WorkspaceBytes(16384) - at_16k, AlignUp(V * 4) + AlignUp(C * 2));

  // Rows up to whole_rows run as one chunk of their own size: no accumulator (the GEMM's product
  // goes straight into d_weight), and never more workspace than the accumulator and 0.5 GiB.
  const int64_t W = c.whole_rows;
  ASSERT_GT(W, C);
  for (int64_t rows : {int64_t{100}, C, C + 1, int64_t{8192}, W}) {
    SCOPED_TRACE(rows);
    EXPECT_EQ(op->AccumulatorBytes(rows), 0);
    const int64_t at = op->WorkspaceBytes(rows);
    const int64_t t = HeaderTerms(Good(), {.chunk_rows = rows}, /*accumulator=*/false);
    EXPECT_GE(at, t);
    EXPECT_LE(at - t, 4 << 10) << at - t;
    EXPECT_LE(at, V * H * 4 + (int64_t{1} << 29));  // the accumulator's and the chunks' budget
  }
  EXPECT_EQ(op->AccumulatorBytes(W + 1), V * H * 4);
  EXPECT_GT(op->WorkspaceBytes(0), 0);

  // Without whole_rows, rows that fit one chunk shrink it to the rows; one row more than a chunk
  // needs the accumulator.
  LinearCrossEntropySpec chunked = Good();
  chunked.config = LinearCrossEntropyConfig{.chunk_rows = C};
  auto op_c = rt_->LinearCrossEntropy(chunked);
  ASSERT_TRUE(op_c.ok()) << op_c.status();
  EXPECT_EQ(op_c->AccumulatorBytes(100), 0);
  EXPECT_EQ(op_c->AccumulatorBytes(C), 0);
  EXPECT_EQ(op_c->AccumulatorBytes(C + 1), V * H * 4);
  EXPECT_EQ(op_c->WorkspaceBytes(100), op->WorkspaceBytes(100));
  EXPECT_EQ(op_c->WorkspaceBytes(C),
            at_16k - op->AccumulatorBytes(16384) - (AlignUp(chunks_16k * 4) - AlignUp(4)));
  EXPECT_GE(op_c->WorkspaceBytes(C + 1), op_c->WorkspaceBytes(C) + V * H * 4);
}

// config.h: the chunks' budget (0.5 GiB less cuBLASLt's 32 MiB and 1 MiB for the counters and
// per-row losses) keeps the workspace beyond the accumulator under 0.5 GiB, one stream and the
// heuristic's chunk, wherever 128 rows fit the budget at all, up to a million rows; rows taken
// whole use no more than that and the accumulator's bytes.
TEST_F(LinearCrossEntropyRuntimeTest, WorkspaceBeyondTheAccumulatorIsUnderHalfAGiB) {
  std::vector<int64_t> vocabs = {32000, 50257, 128256, 131072, 151936, 152064, 256000, 262144};
  for (int64_t vocab = 2; vocab <= (int64_t{1} << 20); vocab = vocab * 5 / 4 + 1) {
    vocabs.push_back(vocab);
  }
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t vocab : vocabs) {
      const int64_t row_bytes = (vocab * static_cast<int64_t>(SizeOf(dtype)) + 15) / 16 * 16;
      if (128 * row_bytes > ops::kLinearCrossEntropyChunkBudgetBytes) continue;
      auto op = rt_->LinearCrossEntropy({.vocab = vocab, .hidden = 4096, .dtype = dtype});
      ASSERT_TRUE(op.ok()) << op.status();
      const int64_t C = op->config().chunk_rows;
      EXPECT_LE(C * row_bytes, ops::kLinearCrossEntropyChunkBudgetBytes);
      const int64_t whole = op->config().whole_rows;
      const int64_t accumulator = whole > 0 ? vocab * 4096 * 4 : 0;
      for (int64_t rows : {int64_t{1}, int64_t{8192}, whole, whole + 1, int64_t{1} << 20}) {
        const bool taken_whole = rows <= whole;
        const int64_t bytes = op->WorkspaceBytes(rows) - op->AccumulatorBytes(rows);
        EXPECT_LE(bytes, (int64_t{1} << 29) + (taken_whole ? accumulator : 0))
            << Name(dtype) << " vocab " << vocab << " rows " << rows << ": "
            << op->ConfigFor(rows).ToString() << " takes " << bytes << " bytes";
        if (rows > whole && rows > C) {
          EXPECT_EQ(op->AccumulatorBytes(rows), accumulator);
        }
      }
    }
  }
  // The shape the budget was set at (LLaMA 3, bf16): under 0.5 GiB.
  auto llama = rt_->LinearCrossEntropy(Good());
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_LE(llama->WorkspaceBytes(131072) - llama->AccumulatorBytes(131072), int64_t{1} << 29);
}

// Fake device addresses, never dereferenced: the checks run before the compile-only error.
void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
void* Offset(const void* p, intptr_t bytes) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + bytes);
}
// Distinct, 16 MiB apart, far from anything real: views here are a few hundred KiB.
void* Slot(int i) { return Addr((uintptr_t{1} << 36) + (static_cast<uintptr_t>(i) << 24)); }
void* WorkspaceAddr() { return Addr(uintptr_t{1} << 40); }  // WorkspaceBytes is over 32 MiB

constexpr int64_t kRows = 8, kVocab = 1000, kHidden = 64;

class LinearCrossEntropyBadInputTest : public LinearCrossEntropyRuntimeTest {
 protected:
  // Everything a ForwardBackward of the spec can take, valid.
  static LinearCrossEntropyArgs GoodArgs(const LinearCrossEntropySpec& s, int64_t ws_bytes) {
    LinearCrossEntropyArgs a{
        .hidden_states = TensorView::Matrix(Slot(1), s.dtype, kRows, s.hidden),
        .weight = TensorView::Matrix(Slot(2), s.dtype, s.vocab, s.hidden),
        .targets = IndexView::Of(Slot(4), s.loss.target_type, kRows),
        .loss = TensorView::Vector(Slot(5), DType::kF32,
                                   s.loss.reduction == Reduction::kNone ? kRows : 1),
        .lse = TensorView::Vector(Slot(6), DType::kF32, kRows),
        .d_hidden = TensorView::Matrix(Slot(9), s.dtype, kRows, s.hidden),
        .d_weight = TensorView::Matrix(Slot(10), s.weight_grad(), s.vocab, s.hidden),
        .workspace = WorkspaceAddr(),
        .workspace_bytes = ws_bytes};
    if (s.bias) {
      a.bias = TensorView::Vector(Slot(3), s.dtype, s.vocab);
      a.d_bias = TensorView::Vector(Slot(11), s.weight_grad(), s.vocab);
    }
    if (s.loss.argmax) a.argmax = IndexView::Of(Slot(7), s.loss.target_type, kRows);
    a.grad_output =
        TensorView::Vector(Slot(8), DType::kF32, s.loss.reduction == Reduction::kNone ? kRows : 1);
    return a;
  }
  static LinearCrossEntropyArgs ForwardOnly(LinearCrossEntropyArgs a) {
    a.grad_output = a.d_hidden = a.d_weight = a.d_bias = TensorView{};
    return a;
  }
};

TEST_F(LinearCrossEntropyBadInputTest, ValidArgumentsReachTheCompileOnlyError) {
  for (bool bias : {false, true}) {
    for (bool argmax : {false, true}) {
      for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
        for (DType wg : {DType::kBF16, DType::kF32}) {
          const LinearCrossEntropySpec s{
              .vocab = kVocab,
              .hidden = kHidden,
              .dtype = DType::kBF16,
              .weight_grad_dtype = wg,
              .bias = bias,
              .loss = {.target_type = IndexType::kInt32, .reduction = r, .argmax = argmax}};
          SCOPED_TRACE(fmt::format("bias {} argmax {} {} {}", bias, argmax, Name(r), Name(wg)));
          auto op = rt_->LinearCrossEntropy(s);
          ASSERT_TRUE(op.ok()) << op.status();
          const LinearCrossEntropyArgs a = GoodArgs(s, op->WorkspaceBytes(kRows));
          absl::Status fb = op->ForwardBackward(nullptr, a);
          EXPECT_EQ(fb.code(), absl::StatusCode::kFailedPrecondition) << fb;
          absl::Status f = op->Forward(nullptr, ForwardOnly(a));
          EXPECT_EQ(f.code(), absl::StatusCode::kFailedPrecondition) << f;
          // The gradients are each optional.
          LinearCrossEntropyArgs loss_only = a;
          loss_only.d_hidden = loss_only.d_weight = loss_only.d_bias = loss_only.grad_output =
              loss_only.lse = TensorView{};
          absl::Status lo = op->ForwardBackward(nullptr, loss_only);
          EXPECT_EQ(lo.code(), absl::StatusCode::kFailedPrecondition) << lo;
        }
      }
    }
  }
}

TEST_F(LinearCrossEntropyBadInputTest, RescaleGradientsChecksEachArgument) {
  const LinearCrossEntropySpec s{.vocab = kVocab,
                                 .hidden = kHidden,
                                 .dtype = DType::kBF16,
                                 .weight_grad_dtype = DType::kF32,
                                 .bias = true};
  auto op = rt_->LinearCrossEntropy(s);
  ASSERT_TRUE(op.ok()) << op.status();
  const LinearCrossEntropyRescaleArgs good{
      .d_hidden = TensorView::Matrix(Slot(9), DType::kBF16, kRows, kHidden),
      .d_weight = TensorView::Matrix(Slot(10), DType::kF32, kVocab, kHidden),
      .d_bias = TensorView::Vector(Slot(11), DType::kF32, kVocab),
      .grad_output = TensorView::Vector(Slot(8), DType::kF32, 1),
      .applied = TensorView::Vector(Slot(12), DType::kF32, 1)};
  // Valid, also with any of the gradients or applied left out: only the device is missing.
  for (int skip = 0; skip < 16; ++skip) {
    LinearCrossEntropyRescaleArgs a = good;
    if (skip & 1) a.d_hidden = TensorView{};
    if (skip & 2) a.d_weight = TensorView{};
    if (skip & 4) a.d_bias = TensorView{};
    if (skip & 8) a.applied = TensorView{};
    const absl::Status st = op->RescaleGradients(nullptr, a);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << skip << ": " << st;
  }
  struct Case {
    std::string prefix;
    std::function<void(LinearCrossEntropyRescaleArgs&)> mutate;
  };
  const std::vector<Case> cases = {
      {"d_hidden:", [](auto& a) { a.d_hidden.cols = a.d_hidden.row_stride = kHidden + 1; }},
      {"d_hidden:", [](auto& a) { a.d_hidden.dtype = DType::kF32; }},
      {"d_weight:", [](auto& a) { a.d_weight.dtype = DType::kBF16; }},
      {"d_weight:", [](auto& a) { a.d_weight.rows = kVocab - 1; }},
      {"d_bias:",
       [](auto& a) { a.d_bias = TensorView::Vector(Slot(11), DType::kF32, kVocab + 1); }},
      {"grad_output:", [](auto& a) { a.grad_output = TensorView{}; }},
      {"grad_output:",
       [](auto& a) { a.grad_output = TensorView::Vector(Slot(8), DType::kF32, 2); }},
      {"grad_output:", [](auto& a) { a.grad_output.dtype = DType::kBF16; }},
      {"applied:", [](auto& a) { a.applied = TensorView::Vector(Slot(12), DType::kF32, kRows); }},
      {"d_weight:", [](auto& a) { a.d_weight.data = a.grad_output.data; }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    LinearCrossEntropyRescaleArgs a = good;
    cases[i].mutate(a);
    SCOPED_TRACE(i);
    ExpectInvalid(op->RescaleGradients(nullptr, a), cases[i].prefix);
  }
  // No bias in the spec; reduction none, whose per-row upstream gradients do not scale d_weight.
  auto plain = rt_->LinearCrossEntropy({.vocab = kVocab, .hidden = kHidden});
  ASSERT_TRUE(plain.ok()) << plain.status();
  LinearCrossEntropyRescaleArgs with_bias = good;
  with_bias.d_hidden = with_bias.d_weight = TensorView{};
  ExpectInvalid(plain->RescaleGradients(nullptr, with_bias), "d_bias:");
  auto none = rt_->LinearCrossEntropy(
      {.vocab = kVocab, .hidden = kHidden, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(none.ok()) << none.status();
  const absl::Status st = none->RescaleGradients(nullptr, {.grad_output = good.grad_output});
  ExpectInvalid(st, "RescaleGradients:");
  EXPECT_TRUE(Contains(st, "ForwardBackward")) << st;
}

TEST_F(LinearCrossEntropyBadInputTest, EachBadArgumentIsNamed) {
  const LinearCrossEntropySpec mean{.vocab = kVocab, .hidden = kHidden, .dtype = DType::kBF16};
  auto op = rt_->LinearCrossEntropy(mean);
  ASSERT_TRUE(op.ok()) << op.status();
  const int64_t ws = op->WorkspaceBytes(kRows);
  struct Case {
    std::string what;
    std::string prefix;  // the message must start with it
    std::function<void(LinearCrossEntropyArgs&)> mutate;
    std::string also = "";  // and contain this
  };
  const std::vector<Case> cases = {
      {"hidden_states wrong cols", "hidden_states:",
       [](auto& a) { a.hidden_states.cols = a.hidden_states.row_stride = kHidden + 1; }},
      {"hidden_states null", "hidden_states:", [](auto& a) { a.hidden_states.data = nullptr; }},
      {"hidden_states zero rows", "hidden_states:", [](auto& a) { a.hidden_states.rows = 0; }},
      {"hidden_states fp16",
       "hidden_states:", [](auto& a) { a.hidden_states.dtype = DType::kF16; }},
      {"weight wrong rows", "weight:", [](auto& a) { a.weight.rows = kVocab - 1; }},
      {"weight wrong cols", "weight:", [](auto& a) { a.weight.cols = a.weight.row_stride = 32; }},
      {"weight null", "weight:", [](auto& a) { a.weight.data = nullptr; }},
      {"bias without spec.bias",
       "bias:", [](auto& a) { a.bias = TensorView::Vector(Slot(3), DType::kBF16, kVocab); },
       "without a bias"},
      {"d_bias without spec.bias",
       "d_bias:", [](auto& a) { a.d_bias = TensorView::Vector(Slot(11), DType::kBF16, kVocab); },
       "without a bias"},
      {"targets wrong size", "targets:", [](auto& a) { a.targets.size = kRows + 1; }},
      {"targets int32", "targets:", [](auto& a) { a.targets.type = IndexType::kInt32; }},
      {"targets null", "targets:", [](auto& a) { a.targets.data = nullptr; }},
      {"loss per row for the mean",
       "loss:", [](auto& a) { a.loss = TensorView::Vector(Slot(5), DType::kF32, kRows); }},
      {"loss bf16", "loss:", [](auto& a) { a.loss.dtype = DType::kBF16; }},
      {"loss null", "loss:", [](auto& a) { a.loss.data = nullptr; }},
      {"lse wrong size",
       "lse:", [](auto& a) { a.lse = TensorView::Vector(Slot(6), DType::kF32, kRows - 1); }},
      {"argmax without spec.argmax",
       "argmax:", [](auto& a) { a.argmax = IndexView::Of(Slot(7), IndexType::kInt64, kRows); },
       "without argmax"},
      {"grad_output per row for the mean", "grad_output:",
       [](auto& a) { a.grad_output = TensorView::Vector(Slot(8), DType::kF32, kRows); }},
      {"d_hidden wrong rows", "d_hidden:", [](auto& a) { a.d_hidden.rows = kRows - 1; }},
      {"d_weight fp16 for a bf16 op", "d_weight:", [](auto& a) { a.d_weight.dtype = DType::kF16; },
       "fp16"},
      {"d_weight fp32 for a bf16 d_weight",
       "d_weight:", [](auto& a) { a.d_weight.dtype = DType::kF32; }},
      {"d_weight wrong rows", "d_weight:", [](auto& a) { a.d_weight.rows = kVocab + 1; }},
      {"workspace too small", "workspace_bytes:", [ws](auto& a) { a.workspace_bytes = ws - 1; },
       "WorkspaceBytes"},
      {"workspace null", "workspace:", [](auto& a) { a.workspace = nullptr; }, "WorkspaceBytes"},
      {"workspace 16-byte aligned only", "workspace:",
       [](auto& a) { a.workspace = Offset(WorkspaceAddr(), 16); }, "256-byte aligned"},
      {"workspace 128-byte aligned only", "workspace:",
       [](auto& a) { a.workspace = Offset(WorkspaceAddr(), 128); }, "256-byte aligned"},
      {"workspace misaligned",
       "workspace:", [](auto& a) { a.workspace = Offset(WorkspaceAddr(), 4); }},
      {"d_hidden aliases hidden_states",
       "d_hidden:", [](auto& a) { a.d_hidden.data = a.hidden_states.data; }, "hidden_states"},
      {"d_hidden overlaps hidden_states", "d_hidden:",
       [](auto& a) { a.d_hidden.data = Offset(a.hidden_states.data, 16); }, "hidden_states"},
      {"d_weight aliases weight", "d_weight:", [](auto& a) { a.d_weight.data = a.weight.data; },
       "weight"},
      {"loss overlaps targets", "loss:", [](auto& a) { a.loss.data = a.targets.data; }, "targets"},
      {"lse overlaps d_hidden", "d_hidden:", [](auto& a) { a.lse.data = a.d_hidden.data; }, "lse"},
      {"workspace overlaps weight", "workspace:", [](auto& a) { a.workspace = a.weight.data; },
       "weight"},
  };
  for (const Case& c : cases) {
    LinearCrossEntropyArgs a = GoodArgs(mean, ws);
    c.mutate(a);
    const absl::Status s = op->ForwardBackward(nullptr, a);
    SCOPED_TRACE(c.what);
    ExpectInvalid(s, c.prefix);
    if (!c.also.empty()) {
      EXPECT_TRUE(Contains(s, c.also)) << "expected '" << c.also << "': " << s;
    }
  }

  // Forward computes no gradient: each gradient argument is refused, pointing to ForwardBackward.
  const LinearCrossEntropyArgs good = GoodArgs(mean, ws);
  for (const auto& [name, member] : {std::pair<const char*, TensorView LinearCrossEntropyArgs::*>{
                                         "d_weight", &LinearCrossEntropyArgs::d_weight},
                                     {"d_hidden", &LinearCrossEntropyArgs::d_hidden},
                                     {"grad_output", &LinearCrossEntropyArgs::grad_output}}) {
    LinearCrossEntropyArgs a = ForwardOnly(good);
    a.*member = good.*member;
    const absl::Status s = op->Forward(nullptr, a);
    ExpectInvalid(s, std::string(name) + ":");
    EXPECT_TRUE(Contains(s, "ForwardBackward")) << s;
  }

  // Reduction none: the loss (and grad_output) per row.
  auto none = rt_->LinearCrossEntropy({.vocab = kVocab,
                                       .hidden = kHidden,
                                       .dtype = DType::kBF16,
                                       .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(none.ok()) << none.status();
  {
    LinearCrossEntropyArgs a = GoodArgs(none->spec(), none->WorkspaceBytes(kRows));
    a.loss = TensorView::Vector(Slot(5), DType::kF32, 1);
    ExpectInvalid(none->ForwardBackward(nullptr, a), "loss:");
    a = GoodArgs(none->spec(), none->WorkspaceBytes(kRows));
    a.grad_output = TensorView::Vector(Slot(8), DType::kF32, 1);
    ExpectInvalid(none->ForwardBackward(nullptr, a), "grad_output:");
  }

  // With a bias and argmax: the bias and its gradient are checked, argmax is required.
  LinearCrossEntropySpec full = mean;
  full.bias = true;
  full.loss.argmax = true;
  full.weight_grad_dtype = DType::kF32;
  auto op_full = rt_->LinearCrossEntropy(full);
  ASSERT_TRUE(op_full.ok()) << op_full.status();
  const int64_t ws_full = op_full->WorkspaceBytes(kRows);
  const std::vector<Case> full_cases = {
      {"bias missing", "bias:", [](auto& a) { a.bias = TensorView{}; }},
      {"bias wrong size", "bias:", [](auto& a) { a.bias.cols = a.bias.row_stride = kVocab - 1; }},
      {"d_bias bf16 for an fp32 weight gradient",
       "d_bias:", [](auto& a) { a.d_bias.dtype = DType::kBF16; }},
      {"d_weight bf16 for an fp32 weight gradient",
       "d_weight:", [](auto& a) { a.d_weight.dtype = DType::kBF16; }},
      {"argmax missing", "argmax:", [](auto& a) { a.argmax = IndexView{}; }},
      {"argmax wrong size", "argmax:", [](auto& a) { a.argmax.size = kRows - 1; }},
      {"d_bias overlaps bias", "d_bias:", [](auto& a) { a.d_bias.data = a.bias.data; }, "bias"},
      {"workspace a byte short", "workspace_bytes:",
       [ws_full](auto& a) { a.workspace_bytes = ws_full - 1; }, "WorkspaceBytes"},
  };
  for (const Case& c : full_cases) {
    LinearCrossEntropyArgs a = GoodArgs(full, ws_full);
    c.mutate(a);
    const absl::Status s = op_full->ForwardBackward(nullptr, a);
    SCOPED_TRACE(c.what);
    ExpectInvalid(s, c.prefix);
    if (!c.also.empty()) {
      EXPECT_TRUE(Contains(s, c.also)) << "expected '" << c.also << "': " << s;
    }
  }
  const absl::Status ok_full = op_full->ForwardBackward(nullptr, GoodArgs(full, ws_full));
  EXPECT_EQ(ok_full.code(), absl::StatusCode::kFailedPrecondition) << ok_full;
}

// --- cuBLASLt ------------------------------------------------------------------------------------

// CublasLt::Get() remembers its first answer for the process, so the failing load runs in a
// child that starts afresh: a "threadsafe" death test re-executes this binary for this test
// alone, where nothing has called Get() yet.
void LoadFromANonexistentPathAndExit() {
  ::setenv("KJIT_CUBLASLT_PATH", "/nonexistent/libcublasLt.so", 1);
  const auto lt = ops::CublasLt::Get();
  const absl::Status s = lt.status();
  const std::string message(ToStd(s.message()));
  std::fprintf(stderr, "status: %s\n", s.ToString().c_str());
  const bool right = s.code() == absl::StatusCode::kFailedPrecondition &&
                     message.find("KJIT_CUBLASLT_PATH") != std::string::npos &&
                     message.find("/nonexistent/libcublasLt.so") != std::string::npos;
  std::fprintf(stderr, "%s\n", right ? "verdict: right" : "verdict: WRONG");
  std::fflush(stderr);
  std::_Exit(right ? 0 : 1);
}

TEST(LinearCrossEntropyCublasLtTest, ANonexistentPathIsAFailedPreconditionNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(LoadFromANonexistentPathAndExit(), ::testing::ExitedWithCode(0), "verdict: right");
}

// $KJIT_CUBLASLT_PATH alone when set (a typo is an error, not a silent fallback); else the
// sonames, then the toolkit's own copy for a machine whose loader path lacks it.
TEST(LinearCrossEntropyCublasLtTest, DefaultCandidatesFollowTheVariable) {
  const char* saved = std::getenv("KJIT_CUBLASLT_PATH");
  const std::string restore = saved ? saved : "";
  ::setenv("KJIT_CUBLASLT_PATH", "/opt/x/libcublasLt.so", 1);
  EXPECT_EQ(ops::CublasLt::DefaultCandidates(), std::vector<std::string>{"/opt/x/libcublasLt.so"});
  ::unsetenv("KJIT_CUBLASLT_PATH");
  const std::vector<std::string> names = ops::CublasLt::DefaultCandidates();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names.front(), "libcublasLt.so.13");
  EXPECT_EQ(names.back(), "/usr/local/cuda/lib64/libcublasLt.so");
  if (saved != nullptr) ::setenv("KJIT_CUBLASLT_PATH", restore.c_str(), 1);
}

TEST(LinearCrossEntropyCublasLtTest, LoadNamesEveryCandidateTried) {
  auto lt = ops::CublasLt::Load({"/nonexistent/a/libcublasLt.so", "/nonexistent/b/libcublasLt.so"});
  ASSERT_FALSE(lt.ok());
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(lt.status(), "/nonexistent/a/libcublasLt.so")) << lt.status();
  EXPECT_TRUE(Contains(lt.status(), "/nonexistent/b/libcublasLt.so")) << lt.status();
  EXPECT_TRUE(Contains(lt.status(), "KJIT_CUBLASLT_PATH")) << lt.status();
}

TEST(LinearCrossEntropyCublasLtTest, LoadsFromTheLoadersPath) {
  if (const char* env = std::getenv("KJIT_CUBLASLT_PATH"); env != nullptr && *env != '\0') {
    GTEST_SKIP() << "KJIT_CUBLASLT_PATH is set (" << env << "): the loader's path is not used";
  }
  auto lt = ops::CublasLt::Get();
  if (!lt.ok() && Contains(lt.status(), "could not load")) {
    GTEST_SKIP() << "no libcublasLt on this machine's loader path: " << lt.status();
  }
  ASSERT_TRUE(lt.ok()) << lt.status();
  EXPECT_GT((*lt)->version(), 0u);
  EXPECT_GE((*lt)->cudart_version(), 12000u) << "cuBLASLt 12 or newer";
  EXPECT_NE((*lt)->path().find("libcublasLt"), std::string::npos) << (*lt)->path();
  // Every entry point the op calls was found.
  EXPECT_NE((*lt)->cublasLtCreate, nullptr);
  EXPECT_NE((*lt)->cublasLtMatmul, nullptr);
  EXPECT_NE((*lt)->cublasLtMatmulAlgoGetHeuristic, nullptr);
  EXPECT_NE((*lt)->cublasLtGetStatusString, nullptr);
  // Cached: the same object every time.
  auto again = ops::CublasLt::Get();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lt);
}

}  // namespace
}  // namespace kjit

namespace kjit {
namespace {

// The argmax check accepts a column whose exact logit is within twice the row's logit error
// (logit_error is per row) of the largest, and rejects one further off. A GPU run (H100,
// 2026-12-05) failed LinearCrossEntropyGpu.EveryOption when the check read logit_error per element.
TEST(LinearCrossEntropyCheck, ArgmaxAcceptsOnlyNearTiesWithinTheRowsLogitError) {
  ops::LinearCrossEntropyResult ref;
  ref.logits = {1.0, 3.0, 2.99, 0.0,   // row 0: columns 1 and 2 within 2 * 0.01
                5.0, 4.9, 0.0,  0.0};  // row 1: columns 0 and 1 further apart than 2 * 0.01
  ref.logit_error = {0.01, 0.01};
  ref.loss.argmax = {1, 0};
  const auto check = [&](std::vector<double> got) {
    return ops::CheckLinearCrossEntropy({.argmax = &got}, ref).at(0).second.ok;
  };
  EXPECT_TRUE(check({1, 0}));
  EXPECT_TRUE(check({2, 0})) << "a near tie may pick either";
  EXPECT_FALSE(check({1, 1})) << "0.1 apart is not a tie at an error of 0.01";
  EXPECT_FALSE(check({3, 0}));
}

}  // namespace
}  // namespace kjit
