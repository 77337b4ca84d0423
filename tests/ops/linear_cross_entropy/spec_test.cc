// The fused linear + cross-entropy's spec without a GPU: the bounds it accepts, each bad field
// refused naming it, and the loss options its chunk loss carries.
#include "kjit/linear_cross_entropy.h"

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "kjit/runtime.h"
#include "ops/linear_cross_entropy/config.h"
#include "tests/expect_status.h"
#include "tests/ops/linear_cross_entropy/test_support.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;
using testing::Good;

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

}  // namespace
}  // namespace kjit
