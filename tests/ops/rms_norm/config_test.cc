#include "ops/rms_norm/config.h"

#include <algorithm>

#include <gtest/gtest.h>

namespace kjit::ops {
namespace {

TEST(RmsNormConfigTest, MaxVecDividesHiddenWithin16Bytes) {
  EXPECT_EQ(MaxVecForHidden(4096, 2), 8);
  EXPECT_EQ(MaxVecForHidden(4096, 4), 4);
  EXPECT_EQ(MaxVecForHidden(1000, 2), 8);
  EXPECT_EQ(MaxVecForHidden(1002, 2), 2);
  EXPECT_EQ(MaxVecForHidden(7, 2), 1);
  EXPECT_EQ(MaxVecForHidden(1, 4), 1);
}

TEST(RmsNormConfigTest, DefaultShapesAreValidForEveryHidden) {
  for (int64_t hidden = 1; hidden <= 65536; hidden = hidden * 3 / 2 + 1) {
    for (int vec : {1, 2, 4, 8}) {
      if (hidden % vec) continue;
      const RmsNormConfig c = DefaultRmsNormConfig(hidden, vec);
      for (const RowShape& s : {c.forward, c.backward}) {
        const int t = s.threads_per_row;
        const bool warp_group = t <= 32 && (t & (t - 1)) == 0;
        EXPECT_TRUE(warp_group || (t % 32 == 0 && t <= 1024 && s.rows_per_block == 1))
            << hidden << " " << c.ToString();
        EXPECT_EQ(s.block_threads() % 32, 0) << hidden << " " << c.ToString();
        EXPECT_LE(s.block_threads(), 1024);
        // Enough threads that no thread walks more than 8 vectors of the row, while 1024 threads
        // suffice for that.
        if (hidden / vec <= 8192) {
          EXPECT_LE((hidden / vec + t - 1) / t, 8) << hidden << " " << c.ToString();
        }
      }
    }
  }
}

TEST(RmsNormConfigTest, LlamaHiddenGetsWideVectorsAndOneRowPerBlock) {
  const RmsNormConfig c = DefaultRmsNormConfig(4096, 8);
  EXPECT_EQ(c.ToString(), "vec=8 fwd=256x1 bwd=512x1r2");
}

TEST(RmsNormConfigTest, RingIsPartOfTheBackwardShapeText) {
  auto c = ParseRmsNormConfig("vec=8 fwd=256x1 bwd=512x1r3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backward, (RowShape{512, 1, 3}));
  EXPECT_EQ(c->ToString(), "vec=8 fwd=256x1 bwd=512x1r3");
  for (const char* bad :
       {"vec=8 fwd=256x1r2 bwd=512x1", "vec=8 fwd=256x1 bwd=512x1r1", "vec=8 fwd=256x1 bwd=512x1r5",
        "vec=8 fwd=256x1 bwd=512x1r", "vec=8 fwd=256x1 bwd=512r2x1"}) {
    EXPECT_FALSE(ParseRmsNormConfig(bad).ok()) << bad;
  }
  // The heuristic's ring (measured on the H200): 16-bit rows in blocks of 128 threads or more.
  for (int64_t hidden : {1024, 2048, 3584, 4096, 8192}) {
    EXPECT_EQ(DefaultRmsNormConfig(hidden, 8).backward.ring, 2) << hidden;
  }
  EXPECT_EQ(DefaultRmsNormConfig(512, 8).backward.ring, 0) << "64 threads: not measured";
  EXPECT_EQ(DefaultRmsNormConfig(4096, 4).backward.ring, 0) << "fp32 rows spill";
}

TEST(RmsNormConfigTest, RowFitsRingCountsDyAndXOfOneThread) {
  EXPECT_TRUE(RowFitsRing(4096, 8, 2, {512, 1}));  // 16 + 16 bytes
  EXPECT_TRUE(RowFitsRing(4096, 8, 2, {128, 1}));  // 4 vectors each: 128 bytes
  EXPECT_FALSE(RowFitsRing(4096, 8, 2, {64, 1}));  // 256 bytes
  EXPECT_TRUE(RowFitsRing(4096, 4, 4, {256, 1}));  // fp32: 4 vectors of 16 bytes each
  EXPECT_FALSE(RowFitsRing(65536, 8, 2, {1024, 1}));
}

}  // namespace
}  // namespace kjit::ops
