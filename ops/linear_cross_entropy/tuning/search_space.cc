#include "ops/linear_cross_entropy/tuning/search_space.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "ops/linear_cross_entropy/config.h"

namespace kjit::ops {

std::vector<Candidate<LinearCrossEntropyConfig>> LinearCrossEntropySearchSpace(
    const LinearCrossEntropySpec& spec, const LinearCrossEntropyConfig& heuristic) {
  const int64_t row_bytes =
      ChunkRowStride(spec.vocab, spec.dtype) * static_cast<int64_t>(SizeOf(spec.dtype));
  std::vector<Candidate<LinearCrossEntropyConfig>> out = {{heuristic, ""}};
  // Chunked throughout, so that they differ from the heuristic at row counts it takes whole.
  for (int64_t chunk : {heuristic.chunk_rows, heuristic.chunk_rows / 2, heuristic.chunk_rows / 4}) {
    if (chunk < 1) continue;
    for (int streams : {1, 2}) {
      LinearCrossEntropyConfig c = heuristic;
      c.chunk_rows = chunk;
      c.whole_rows = 0;
      c.streams = streams;
      if (c == heuristic) continue;
      const int64_t bytes = streams * chunk * row_bytes;
      std::string pruned;
      if (bytes > std::max(kLinearCrossEntropyChunkBudgetBytes,
                           heuristic.streams * heuristic.chunk_rows * row_bytes)) {
        pruned = fmt::format("{} MiB of chunk logits exceed the {} MiB budget", bytes >> 20,
                             kLinearCrossEntropyChunkBudgetBytes >> 20);
      }
      out.push_back({c, pruned});
    }
  }
  constexpr int kAlgos = 8;  // of LtGemm::kMaxAlgos: the rest are for `kjit bench --sweep`
  for (int gemm = 0; gemm < 3; ++gemm) {
    for (int algo = 1; algo < kAlgos; ++algo) {
      LinearCrossEntropyConfig c = heuristic;
      (gemm == 0 ? c.logits_algo : gemm == 1 ? c.d_hidden_algo : c.d_weight_algo) = algo;
      out.push_back({c, ""});
    }
  }
  return out;
}

}  // namespace kjit::ops
