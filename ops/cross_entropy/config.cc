#include "ops/cross_entropy/config.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/common/ceil_div.h"
#include "ops/common/config_text.h"

namespace kjit {

std::string CrossEntropyConfig::ToString() const {
  return fmt::format("vec={} threads={} unroll={} cluster={} staged={}", vec, threads, unroll,
                     cluster, staged);
}

absl::StatusOr<CrossEntropyConfig> ParseCrossEntropyConfig(std::string_view text) {
  KJIT_ASSIGN_OR_RETURN(ops::ConfigText t,
                        ops::ConfigText::Split("cross-entropy config", text,
                                               {"vec", "threads", "unroll", "cluster", "staged"}));
  CrossEntropyConfig c;
  KJIT_ASSIGN_OR_RETURN(c.vec, t.Int("vec"));
  KJIT_ASSIGN_OR_RETURN(c.threads, t.Int("threads"));
  KJIT_ASSIGN_OR_RETURN(c.unroll, t.Int("unroll"));
  KJIT_ASSIGN_OR_RETURN(c.cluster, t.Int("cluster"));
  KJIT_ASSIGN_OR_RETURN(c.staged, t.Int("staged"));
  if (!ops::IsPowerOfTwo(c.vec) || c.vec > 16) {
    return t.Invalid("vec", "a power of two from 1 to 16");
  }
  if (c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0) {
    return t.Invalid("threads", "a multiple of 32 from 32 to 1024");
  }
  if (!ops::IsPowerOfTwo(c.unroll) || c.unroll > 8) return t.Invalid("unroll", "1, 2, 4 or 8");
  if (c.cluster < 0 || c.cluster > 8) return t.Invalid("cluster", "0 (streaming) to 8 blocks");
  if (c.staged != 0 && (c.staged != 1 || c.cluster == 0)) {
    return t.Invalid("staged", "0, or 1 with a cluster of 1 to 8 blocks");
  }
  return c;
}

namespace ops {

namespace {
int64_t Vectors(int64_t vocab, int vec) { return ops::CeilDiv(vocab, vec); }
int64_t PowerOfTwoAtLeast(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}
// 8 resident vectors (32 registers of 16-byte vectors) per thread: with 512 threads, two blocks
// share an SM.
constexpr int kDefaultResidentVectors = 8;
constexpr int kMaxCluster = 8;  // the portable cluster size
// The staged kernel's own shared variables (mbarrier, statistics), beside its share of the row.
constexpr int64_t kStagedStaticBytes = 1024;
constexpr int kDefaultStagedThreads = 256;
// Blocks whose shares of a row an SM should hold at once, each in its own phase: the first count
// that some cluster size allows. On the H200, 128256 bf16 logits in 6 blocks of 256 threads (five
// an SM) reached 89.8% of copy bandwidth, 4 blocks (three an SM) 86.7%, 5, 7 and 8 blocks 83-86%.
constexpr int kStagedBlocksPerSm[] = {5, 3};
}  // namespace

int MaxSharedBytesPerBlock(int arch) {
  switch (arch) {
    case 90:
    case 100:
    case 103:
    case 110: return 227 * 1024;
    case 120:
    case 121: return 99 * 1024;
    default: return 48 * 1024;  // what every GPU gives without opting in
  }
}

int64_t StagedChunk(const CrossEntropyConfig& c, int64_t vocab) {
  return CeilDiv(Vectors(vocab, c.vec), std::max(1, c.cluster)) *
         c.vec;  // as CeStageLayout::kChunk
}

int64_t StagedSharedBytes(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes) {
  return StagedChunk(c, vocab) * elem_bytes;
}

std::string StagedUnfit(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes, int arch) {
  const int cluster = c.cluster, vec = c.vec;
  if (cluster < 1) return "the staged row needs a cluster of 1 to 8 blocks";
  if (arch < kMinClusterArch) {
    return fmt::format("bulk copies need sm_{} or newer", kMinClusterArch);
  }
  if (vec * elem_bytes != 16) {
    return fmt::format("bulk copies move 16-byte vectors; vec={} is {} bytes", vec,
                       vec * elem_bytes);
  }
  // A row that starts vec - 1 elements short of a vector boundary has that many fewer columns for
  // its vectors (CeStageLayout).
  if (vocab - (vec - 1) - (cluster - 1) * StagedChunk(c, vocab) < vec) {
    return fmt::format(
        "{} blocks of {} columns leave the last less than a vector of the {}-column row", cluster,
        StagedChunk(c, vocab), vocab);
  }
  const int64_t bytes = StagedSharedBytes(c, vocab, elem_bytes) + kStagedStaticBytes;
  if (bytes > MaxSharedBytesPerBlock(arch)) {
    return fmt::format(
        "{} columns need {} bytes of shared memory, over the {} a block has on "
        "sm_{}",
        StagedChunk(c, vocab), bytes, MaxSharedBytesPerBlock(arch), arch);
  }
  return "";
}

int64_t ResidentVectors(const CrossEntropyConfig& c, int64_t vocab) {
  if (c.cluster < 1) return 0;
  return CeilDiv(vocab / c.vec, int64_t{c.threads} * c.cluster);
}

bool ResidentFits(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes) {
  const int64_t row_registers = CeilDiv(ResidentVectors(c, vocab) * c.vec * elem_bytes, 4);
  return row_registers + kCeOtherRegisters <= kMaxRegistersPerThread &&
         int64_t{c.threads} * (row_registers + kCeOtherRegisters) <= kCeRegistersPerSm;
}

int StreamingUnroll(int64_t vocab, int vec, int threads) {
  const int64_t per_thread = CeilDiv(Vectors(vocab, vec), threads);
  int unroll = 1;
  while (unroll < 4 && unroll * 2 <= per_thread) unroll *= 2;
  return unroll;
}

int MaxVecForCrossEntropy(int elem_bytes) { return std::max(1, 16 / elem_bytes); }

CrossEntropyConfig DefaultCrossEntropyConfig(int64_t vocab, int vec, int arch, int elem_bytes) {
  CrossEntropyConfig c;
  c.vec = vec;
  for (const int blocks_per_sm : kStagedBlocksPerSm) {
    for (int cluster = 1; cluster <= kMaxCluster; ++cluster) {
      CrossEntropyConfig staged{vec, kDefaultStagedThreads, 1, cluster, 1};
      if (!StagedUnfit(staged, vocab, elem_bytes, arch).empty() ||
          blocks_per_sm * (StagedSharedBytes(staged, vocab, elem_bytes) + kStagedStaticBytes) >
              MaxSharedBytesPerBlock(arch)) {
        continue;
      }
      const int64_t chunk_vectors = StagedChunk(staged, vocab) / vec;
      while (staged.threads > 32 && staged.threads / 2 >= chunk_vectors) staged.threads /= 2;
      staged.unroll = StreamingUnroll(vocab, vec, staged.threads);
      return staged;
    }
  }
  const int64_t vectors = Vectors(vocab, vec);
  const int64_t holders = CeilDiv(vectors, kDefaultResidentVectors);
  const int64_t cluster = CeilDiv(holders, 512);
  if (cluster == 1) {
    c.threads = static_cast<int>(std::max<int64_t>(32, PowerOfTwoAtLeast(holders)));
    c.cluster = 1;
  } else if (arch >= kMinClusterArch && PowerOfTwoAtLeast(cluster) <= kMaxCluster) {
    c.threads = 512;
    c.cluster = static_cast<int>(PowerOfTwoAtLeast(cluster));
  } else {
    // At most 512 threads: the kernels keep to 64 registers, so two blocks share an SM and one
    // streams while the other reduces.
    const int64_t wanted = CeilDiv(vectors, 32);
    c.threads = 32;
    while (c.threads < 512 && c.threads < wanted) c.threads *= 2;
    c.cluster = 0;
  }
  c.unroll = StreamingUnroll(vocab, vec, c.threads);
  return c;
}

}  // namespace ops
}  // namespace kjit
