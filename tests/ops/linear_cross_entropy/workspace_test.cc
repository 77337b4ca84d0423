// The fused linear + cross-entropy on a compile-only runtime: made and built without a GPU, and its
// workspace's size against the header's formula (kjit/linear_cross_entropy.h).
#include "kjit/linear_cross_entropy.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ops/linear_cross_entropy/config.h"
#include "tests/expect_status.h"
#include "tests/ops/linear_cross_entropy/test_support.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;
using testing::Good;
using testing::LinearCrossEntropyRuntimeTest;

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

}  // namespace
}  // namespace kjit
