#include "ops/rms_norm/tuning/search_space.h"

#include <fmt/format.h>

#include "ops/common/ceil_div.h"

namespace kjit::ops {

namespace {

constexpr int kMaxRowShapeVectors = 16;

}  // namespace

std::vector<Candidate<RowShape>> RowShapeSearchSpace(int64_t hidden, int vec) {
  const int64_t vectors = CeilDiv(hidden, vec);
  std::vector<Candidate<RowShape>> out;
  auto pruned = [&](int threads, int idle_below) -> std::string {
    if (threads - idle_below >= vectors) {
      return fmt::format("{} threads for a row of {} vectors: part of the group would idle",
                         threads, vectors);
    }
    if (CeilDiv(vectors, threads) > kMaxRowShapeVectors) {
      return fmt::format("each of {} threads would walk {} vectors (over {})", threads,
                         CeilDiv(vectors, threads), kMaxRowShapeVectors);
    }
    return "";
  };
  for (int t = 1; t <= 32; t *= 2) {
    for (int block : {128, 256}) out.push_back({{t, block / t}, pruned(t, t / 2)});
  }
  for (int t = 64; t <= 1024; t *= 2) out.push_back({{t, 1}, pruned(t, 32)});
  return out;
}

std::vector<Candidate<RmsNormConfig>> RmsNormSearchSpace(int64_t hidden, int vec, int elem_bytes) {
  const RmsNormConfig heuristic = DefaultRmsNormConfig(hidden, vec);
  std::vector<Candidate<RmsNormConfig>> out = {{heuristic, ""}};
  for (const Candidate<RowShape>& s : RowShapeSearchSpace(hidden, vec)) {
    RmsNormConfig f = heuristic, b = heuristic;
    f.forward = s.config;
    b.backward = s.config;
    if (!(f == heuristic)) out.push_back({f, s.pruned.empty() ? "" : "forward: " + s.pruned});
    if (!(b == heuristic)) out.push_back({b, s.pruned.empty() ? "" : "backward: " + s.pruned});
    if (!s.pruned.empty() || !RowFitsRing(hidden, vec, elem_bytes, s.config)) continue;
    for (int ring : {2, 3}) {
      RmsNormConfig r = heuristic;
      r.backward = s.config;
      r.backward.ring = ring;
      out.push_back({r, ""});
    }
  }
  return out;
}

}  // namespace kjit::ops
