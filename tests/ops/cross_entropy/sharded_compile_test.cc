// The vocab-parallel cross-entropy without a GPU: NVRTC compiles of its program for sm_80, sm_90
// and sm_100 in every dtype (odd shard widths included) and every option, spec validation, argument
// checks through a compile-only runtime, and that the ranks of an even split share one program.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "jit/compiler.h"
#include "jit/embedded_templates.h"
#include "kjit/runtime.h"
#include "kjit/sharded_cross_entropy.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/program.h"
#include "tests/expect_status.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;

void ExpectCompiles(const ShardedCrossEntropySpec& spec, const char* arch) {
  const int vec = ops::MaxVecForCrossEntropy(static_cast<int>(SizeOf(spec.dtype)));
  auto src = ops::RenderShardedCrossEntropy(
      spec, ops::DefaultShardedCrossEntropyConfig(spec.width(), vec));
  ASSERT_TRUE(src.ok()) << src.status();
  auto nvrtc = jit::Nvrtc::Get();
  ASSERT_TRUE(nvrtc.ok()) << nvrtc.status();  // NVRTC is part of the CI machine's toolkit
  const jit::Target target = *jit::ParseTarget(arch);
  auto bin = jit::Compile(**nvrtc, *src, target);
  ASSERT_TRUE(bin.ok()) << arch << " " << jit::FormatParams(src->params) << ": " << bin.status();
  ASSERT_GE(bin->code.size(), 4u);
  EXPECT_EQ(bin->code.substr(0, 4),
            "\x7f"
            "ELF")
      << "CUBIN is an ELF image";
  // count, stats, rescale, combine, finish without and with the gradient, and the loss reduce.
  EXPECT_EQ(bin->lowered_names.size(), spec.loss.reduction == Reduction::kNone ? 6u : 7u);
}

TEST(ShardedCrossEntropyCompileTest, TemplatesAreEmbeddedAndUseNoToolkitHeader) {
  for (const char* name : {"cross_entropy_sharded.cuh", "cross_entropy_sharded_params.h"}) {
    const std::string* text = jit::FindEmbeddedTemplate(name);
    ASSERT_NE(text, nullptr) << name;
    EXPECT_EQ(text->find("#include <"), std::string::npos) << name << " includes a system header";
  }
}

TEST(ShardedCrossEntropyCompileTest, EveryDtypeAndArch) {
  for (const char* arch : {"sm_80", "sm_90", "sm_100"}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      // 128256 split 4 ways, and the middle of 50257 split 3 ways unevenly (odd width and start).
      SCOPED_TRACE(::testing::Message() << arch << " " << Name(t));
      ExpectCompiles({.vocab = 128256, .shard_start = 32064, .shard_end = 64128, .dtype = t}, arch);
      ExpectCompiles({.vocab = 50257,
                      .shard_start = 16753,
                      .shard_end = 33507,
                      .dtype = t,
                      .loss = {.reduction = Reduction::kNone}},
                     arch);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(ShardedCrossEntropyCompileTest, EveryOption) {
  for (int bits = 0; bits < 8; ++bits) {
    ShardedCrossEntropySpec s{.vocab = 1000, .shard_start = 750, .shard_end = 1000};
    if (bits & 1) s.loss.label_smoothing = 0.1f;
    if (bits & 2) s.loss.z_loss = 1e-4f;
    if (bits & 4) s.loss.softcap = 30.0f;
    s.loss.target_type = bits % 2 ? IndexType::kInt64 : IndexType::kInt32;
    s.loss.reduction = static_cast<Reduction>(bits % 3);
    SCOPED_TRACE(bits);
    ExpectCompiles(s, "sm_90");
    if (::testing::Test::HasFatalFailure()) return;
  }
  ExpectCompiles({.vocab = 7, .shard_start = 6, .shard_end = 7}, "sm_90");  // a one-class shard
}

TEST(ShardedCrossEntropyCompileTest, RejectsBadSpecsNamingTheField) {
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_start = -1, .shard_end = 10}),
      "shard_start:");
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_start = 1000, .shard_end = 1001}),
      "shard_start:");
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_start = 10, .shard_end = 10}),
      "shard_end:");  // empty
  ExpectInvalid(ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_start = 10, .shard_end = 5}),
                "shard_end:");
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_start = 500, .shard_end = 1001}),
      "shard_end:");
  ExpectInvalid(ValidateShardedCrossEntropySpec({.vocab = 1, .shard_end = 1}), "vocab:");
  ExpectInvalid(ValidateShardedCrossEntropySpec(
                    {.vocab = 1000, .shard_end = 500, .loss = {.label_smoothing = 1.0f}}),
                "label_smoothing:");
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_end = 500, .loss = {.softcap = NAN}}),
      "softcap:");
  ExpectInvalid(ValidateShardedCrossEntropySpec(
                    {.vocab = 1000,
                     .shard_end = 500,
                     .config = CrossEntropyConfig{.vec = 8, .threads = 256, .cluster = 2}}),
                "config.cluster:");
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 1000,
                                       .shard_end = 500,
                                       .config = CrossEntropyConfig{.vec = 3, .threads = 256}}),
      "config.vec:");
  EXPECT_TRUE(
      ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_start = 999, .shard_end = 1000}).ok());
  EXPECT_TRUE(ValidateShardedCrossEntropySpec({.vocab = 1000, .shard_end = 1000}).ok());

  auto rt = Runtime::Create({.target = "sm_90", .compile_only = true});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto op = rt->ShardedCrossEntropy({.vocab = 1000, .shard_start = 20, .shard_end = 20});
  ASSERT_FALSE(op.ok());
  ExpectInvalid(op.status(), "shard_end:");
}

// The start is a kernel argument: an even split compiles once for all its ranks.
TEST(ShardedCrossEntropyCompileTest, RanksOfAnEvenSplitShareOneProgram) {
  const auto config = ops::DefaultShardedCrossEntropyConfig(32064, 8);
  EXPECT_EQ(config.cluster, 0);
  auto a = ops::RenderShardedCrossEntropy({.vocab = 128256, .shard_start = 0, .shard_end = 32064},
                                          config);
  auto b = ops::RenderShardedCrossEntropy(
      {.vocab = 128256, .shard_start = 96192, .shard_end = 128256}, config);
  auto c = ops::RenderShardedCrossEntropy({.vocab = 128256, .shard_start = 0, .shard_end = 64128},
                                          config);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->text, b->text);
  EXPECT_EQ(a->params, b->params);
  EXPECT_NE(a->text, c->text);
}

// Each bad argument is named before anything launches; a good set reaches the compile-only refusal.
TEST(ShardedCrossEntropyCompileTest, ChecksArgumentsNamingThem) {
  auto rt = Runtime::Create({.target = "sm_90", .compile_only = true});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto op = rt->ShardedCrossEntropy({.vocab = 1000, .shard_start = 500, .shard_end = 1000});
  ASSERT_TRUE(op.ok()) << op.status();
  constexpr int64_t rows = 4;
  alignas(16) static char logits[rows * 500 * 2], targets[rows * 8], loss[16], ws[4096];
  const ShardedCrossEntropyArgs good{.logits = TensorView::Matrix(logits, DType::kBF16, rows, 500),
                                     .targets = IndexView::Of(targets, IndexType::kInt64, rows),
                                     .loss = TensorView::Vector(loss, DType::kF32, 1),
                                     .grad = TensorView::Matrix(logits, DType::kBF16, rows, 500),
                                     .workspace = ws,
                                     .workspace_bytes = op->WorkspaceBytes(rows)};
  ASSERT_LE(op->WorkspaceBytes(rows), static_cast<int64_t>(sizeof(ws)));
  EXPECT_EQ(op->ComputeStats(nullptr, good).code(), absl::StatusCode::kFailedPrecondition);

  ShardedCrossEntropyArgs a = good;
  a.logits.cols = 1000;  // the whole row instead of the shard's
  ExpectInvalid(op->ComputeStats(nullptr, a), "logits:");
  a = good;
  a.targets.type = IndexType::kInt32;
  ExpectInvalid(op->Finish(nullptr, a), "targets:");
  a = good;
  a.loss = TensorView::Vector(loss, DType::kF32, rows);
  ExpectInvalid(op->Finish(nullptr, a), "loss:");
  a = good;
  a.workspace_bytes -= 1;
  ExpectInvalid(op->ComputeStats(nullptr, a), "workspace_bytes:");
  a = good;
  a.workspace = ws + 4;
  ExpectInvalid(op->ComputeStats(nullptr, a), "workspace:");
  a = good;
  a.grad = TensorView::Matrix(logits + 2, DType::kBF16, rows, 500);
  ExpectInvalid(op->Finish(nullptr, a), "grad:");
  a = good;
  a.loss = TensorView::Vector(ws, DType::kF32, 1);
  ExpectInvalid(op->Finish(nullptr, a), "workspace:");  // overlaps the loss
  // Found by sharded_capi_fuzzer: the workspace's size for a wild row count overflowed (signed,
  // undefined) before the rows were refused.
  a = good;
  a.logits.rows = 6691465987522092250;
  ExpectInvalid(op->ComputeStats(nullptr, a), "logits:");
  EXPECT_EQ(op->WorkspaceBytes(INT64_MAX), op->WorkspaceBytes(INT32_MAX));
  EXPECT_EQ(op->WorkspaceBytes(INT64_MIN), op->WorkspaceBytes(1));
}

TEST(ShardedCrossEntropyCompileTest, CombineNeedsShardsTilingTheVocab) {
  auto rt = Runtime::Create({.target = "sm_90", .compile_only = true});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto lo = rt->ShardedCrossEntropy({.vocab = 1000, .shard_start = 0, .shard_end = 400});
  auto hi = rt->ShardedCrossEntropy({.vocab = 1000, .shard_start = 400, .shard_end = 1000});
  auto mid = rt->ShardedCrossEntropy({.vocab = 1000, .shard_start = 300, .shard_end = 1000});
  ASSERT_TRUE(lo.ok() && hi.ok() && mid.ok());
  alignas(16) static char ws[2][4096];
  using Shard = ShardedCrossEntropy::Shard;
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {{&*hi, ws[0]}, {&*lo, ws[1]}}, 4),
                "shards[0]:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {{&*lo, ws[0]}, {&*mid, ws[1]}}, 4),
                "shards[1]:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {Shard{&*lo, ws[0]}}, 4), "shards:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {}, 4), "shards:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {{&*lo, nullptr}, {&*hi, ws[1]}}, 4),
                "shards[0].workspace:");
  EXPECT_EQ(ShardedCrossEntropy::CombineStats(nullptr, {{&*lo, ws[0]}, {&*hi, ws[1]}}, 4).code(),
            absl::StatusCode::kFailedPrecondition);  // compile-only
}

}  // namespace
}  // namespace kjit
