// The fused linear + cross-entropy's config without a GPU: its text form (round trip, bad text
// naming the field) and the chunking heuristic (the budget, multiples of 128, the search space
// around it, the chunk's row stride).
#include "kjit/linear_cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/tuning/search_space.h"
#include "tests/expect_status.h"
#include "tests/ops/linear_cross_entropy/test_support.h"

namespace kjit {
namespace {

using testing::Contains;
using testing::ExpectInvalid;

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

}  // namespace
}  // namespace kjit
