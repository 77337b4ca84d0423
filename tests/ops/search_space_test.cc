// The search spaces: every unpruned config is one the runtime accepts for the shape, every pruned
// one says why, the heuristic is always a candidate, and the arch and register limits prune.
#include "ops/cross_entropy/tuning/search_space.h"
#include "ops/rms_norm/tuning/search_space.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kjit/kjit.h"

namespace kjit::ops {
namespace {

TEST(SearchSpace, CrossEntropyCandidatesAreValidAndPrunedOnesSayWhy) {
  for (int arch : {80, 90, 100}) {
    for (int64_t vocab : {2, 1000, 32000, 128256, 262144, 1 << 20}) {
      const auto space = CrossEntropySearchSpace(vocab, 8, arch);
      const CrossEntropyConfig heuristic = DefaultCrossEntropyConfig(vocab, 8, arch, 2);
      bool heuristic_found = false;
      std::set<std::string> seen;
      for (const auto& c : space) {
        EXPECT_TRUE(seen.insert(c.config.ToString()).second) << "duplicate " << c.config.ToString();
        if (!c.pruned.empty()) continue;
        heuristic_found |= c.config == heuristic;
        CrossEntropySpec spec{.vocab = vocab, .dtype = DType::kBF16, .config = c.config};
        EXPECT_TRUE(ValidateCrossEntropySpec(spec).ok())
            << vocab << " sm_" << arch << " " << c.config.ToString() << ": "
            << ValidateCrossEntropySpec(spec);
        if (arch < kMinClusterArch) {
          EXPECT_LE(c.config.cluster, 1) << c.config.ToString();
        }
      }
      EXPECT_TRUE(heuristic_found) << vocab << " sm_" << arch;
      const auto unpruned = Unpruned(space);
      if (vocab >= 1000) {
        EXPECT_TRUE(std::any_of(unpruned.begin(), unpruned.end(),
                                [](const CrossEntropyConfig& c) { return c.cluster == 0; }))
            << vocab << ": streaming configs are candidates";
      }
    }
  }
  // Hopper's 128256: one block would need more registers than an SM has (resident), or more
  // shared memory (staged); the staged row splits over any number of blocks, the resident one
  // over a power of two.
  std::set<int> resident, staged;
  for (const auto& c : Unpruned(CrossEntropySearchSpace(128256, 8, 90))) {
    (c.staged ? staged : resident).insert(c.cluster);
  }
  EXPECT_EQ(resident, (std::set<int>{0, 2, 4, 8}));
  EXPECT_EQ(staged, (std::set<int>{2, 3, 4, 5, 6, 7, 8}));
}

TEST(SearchSpace, CrossEntropyPrunesClustersWithoutHardwareAndRowsThatSpill) {
  std::map<std::string, std::string> pruned;
  for (const auto& c : CrossEntropySearchSpace(262144, 8, 80))
    pruned[c.config.ToString()] = c.pruned;
  EXPECT_NE(pruned.at("vec=8 threads=512 unroll=4 cluster=4 staged=0").find("sm_90"),
            std::string::npos);
  // 262144 / 8 / 128 = 256 resident vectors per thread: far over the register file.
  EXPECT_NE(pruned.at("vec=8 threads=128 unroll=4 cluster=1 staged=0").find("registers"),
            std::string::npos)
      << pruned.at("vec=8 threads=128 unroll=4 cluster=1 staged=0");
  std::map<std::string, std::string> on_hopper;
  for (const auto& c : CrossEntropySearchSpace(128256, 8, 90))
    on_hopper[c.config.ToString()] = c.pruned;
  EXPECT_EQ(on_hopper.at("vec=8 threads=1024 unroll=4 cluster=2 staged=0"), "");
  // The row staged in shared memory: bulk copies need sm_90, and a block's share must fit.
  EXPECT_NE(pruned.at("vec=8 threads=512 unroll=4 cluster=4 staged=1").find("sm_90"),
            std::string::npos);
  EXPECT_EQ(on_hopper.at("vec=8 threads=256 unroll=4 cluster=4 staged=1"), "");
  EXPECT_NE(on_hopper.at("vec=8 threads=256 unroll=4 cluster=1 staged=1").find("shared memory"),
            std::string::npos)
      << on_hopper.at("vec=8 threads=256 unroll=4 cluster=1 staged=1");
  // A thread with 2 vectors to read cannot keep 8 loads in flight.
  std::map<std::string, std::string> small;
  for (const auto& c : CrossEntropySearchSpace(2000, 8, 90)) small[c.config.ToString()] = c.pruned;
  EXPECT_NE(small.at("vec=8 threads=128 unroll=8 cluster=0 staged=0").find("unroll 8"),
            std::string::npos)
      << small.at("vec=8 threads=128 unroll=8 cluster=0 staged=0");
}

TEST(SearchSpace, RmsNormCandidatesAreValidAndVaryOnePassAtATime) {
  for (int64_t hidden : {1, 64, 896, 2048, 4096, 8192, 65536}) {
    const int vec = MaxVecForHidden(hidden, 2);
    const RmsNormConfig heuristic = DefaultRmsNormConfig(hidden, vec);
    const auto space = RmsNormSearchSpace(hidden, vec);
    ASSERT_FALSE(space.empty());
    EXPECT_EQ(space.front().config, heuristic);
    EXPECT_EQ(space.front().pruned, "");
    int candidates = 0;
    for (const auto& c : space) {
      EXPECT_TRUE(c.config.forward == heuristic.forward || c.config.backward == heuristic.backward)
          << c.config.ToString();
      if (!c.pruned.empty()) {
        EXPECT_TRUE(c.pruned.rfind("forward: ", 0) == 0 || c.pruned.rfind("backward: ", 0) == 0)
            << c.pruned;
        continue;
      }
      ++candidates;
      for (const RowShape& shape : {c.config.forward, c.config.backward}) {
        const int64_t per_thread =
            (hidden / vec + shape.threads_per_row - 1) / shape.threads_per_row;
        EXPECT_GE(per_thread, 1) << c.config.ToString();
        EXPECT_LE(per_thread, 16) << c.config.ToString();
        EXPECT_EQ(shape.block_threads() % 32, 0) << c.config.ToString();
      }
      RmsNormSpec spec{.hidden = hidden, .dtype = DType::kBF16, .config = c.config};
      EXPECT_TRUE(ValidateRmsNormSpec(spec).ok())
          << hidden << " " << c.config.ToString() << ": " << ValidateRmsNormSpec(spec);
    }
    EXPECT_GE(candidates, hidden >= 64 ? 3 : 1) << hidden;
  }
}

TEST(SearchSpace, RowShapesThatWouldIdleOrWalkTooFarArePruned) {
  std::map<std::pair<int, int>, std::string> pruned;
  for (const auto& s : RowShapeSearchSpace(4096, 8)) {
    pruned[{s.config.threads_per_row, s.config.rows_per_block}] = s.pruned;
  }
  // 512 vectors: one thread would walk all of them; 1024 threads would leave half idle.
  EXPECT_NE(pruned.at({1, 128}).find("over 16"), std::string::npos) << pruned.at({1, 128});
  EXPECT_NE(pruned.at({1024, 1}).find("idle"), std::string::npos) << pruned.at({1024, 1});
  EXPECT_EQ(pruned.at({256, 1}), "");
}

}  // namespace
}  // namespace kjit::ops
