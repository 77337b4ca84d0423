#include "ops/cross_entropy/tuning/search_space.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/common/ceil_div.h"

namespace kjit::ops {

namespace {

// A streaming thread walks its share of the row `unroll` vectors at a time.
constexpr int64_t kMaxVectorsPerThread = 256;

std::string StreamingPruned(int64_t vectors, int threads, int unroll) {
  const int64_t per_thread = CeilDiv(vectors, threads);
  if (per_thread > kMaxVectorsPerThread) {
    return fmt::format("each of {} threads would walk {} vectors (over {}): too few threads",
                       threads, per_thread, kMaxVectorsPerThread);
  }
  if (unroll > 1 && unroll > per_thread) {
    return fmt::format("unroll {} exceeds the {} vectors each thread walks", unroll, per_thread);
  }
  return "";
}

std::string ResidentPruned(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes, int arch) {
  if (c.cluster > 1 && arch < kMinClusterArch) {
    return fmt::format("{} blocks per row need thread-block clusters (sm_{} or newer)", c.cluster,
                       kMinClusterArch);
  }
  const int64_t resident = ResidentVectors(c, vocab);
  if (resident < 2) {
    return fmt::format("each thread would hold {} vector(s): more blocks than the row needs",
                       resident);
  }
  if (!ResidentFits(c, vocab, elem_bytes)) {
    const int64_t registers = CeilDiv(resident * c.vec * elem_bytes, 4) + kCeOtherRegisters;
    return fmt::format(
        "{} resident vectors need about {} registers per thread ({} per block): over the {} a "
        "thread or the {} an SM has",
        resident, registers, registers * c.threads, kMaxRegistersPerThread, kCeRegistersPerSm);
  }
  return "";
}

std::string StagedPruned(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes, int arch) {
  const std::string unfit = StagedUnfit(c, vocab, elem_bytes, arch);
  if (!unfit.empty()) return unfit;
  const int64_t chunk_vectors = StagedChunk(c, vocab) / c.vec;
  if (c.threads > chunk_vectors) {
    return fmt::format("{} threads for the {} vectors a block stages: part of the block would idle",
                       c.threads, chunk_vectors);
  }
  return "";
}

}  // namespace

std::vector<Candidate<CrossEntropyConfig>> CrossEntropySearchSpace(int64_t vocab, int vec,
                                                                   int arch) {
  const int elem_bytes = 16 / vec;
  const int64_t vectors = CeilDiv(vocab, vec);
  const CrossEntropyConfig heuristic = DefaultCrossEntropyConfig(vocab, vec, arch, elem_bytes);
  std::vector<Candidate<CrossEntropyConfig>> out;
  for (int threads = 128; threads <= 1024; threads *= 2) {
    for (int unroll : {1, 2, 4, 8}) {
      out.push_back({{vec, threads, unroll, 0}, StreamingPruned(vectors, threads, unroll)});
    }
    for (int cluster = 1; cluster <= 8; ++cluster) {
      // The forward-only kernel streams with these threads: it takes the heuristic's unroll.
      const CrossEntropyConfig c{vec, threads, StreamingUnroll(vocab, vec, threads), cluster};
      // The resident kernel splits a row over a power of two of blocks; the staged one over any.
      if ((cluster & (cluster - 1)) == 0) {
        out.push_back({c, ResidentPruned(c, vocab, elem_bytes, arch)});
      }
      CrossEntropyConfig staged = c;
      staged.staged = 1;
      out.push_back({staged, StagedPruned(staged, vocab, elem_bytes, arch)});
    }
  }
  auto it =
      std::find_if(out.begin(), out.end(), [&](const auto& c) { return c.config == heuristic; });
  if (it == out.end()) {
    out.push_back({heuristic, ""});
  } else {
    it->pruned.clear();
  }
  return out;
}

}  // namespace kjit::ops
