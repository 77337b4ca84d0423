#include "autotune/cross_entropy_config.h"

#include <algorithm>

#include <fmt/format.h>

namespace kjit {

const char* Name(Reduction r) {
  switch (r) {
    case Reduction::kNone: return "none";
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
  }
  return "?";
}

namespace autotune {

std::string CrossEntropyConfig::ToString() const {
  return fmt::format("vec={} threads={} unroll={}", vec, threads, unroll);
}

int MaxVecForCrossEntropy(int elem_bytes) { return std::max(1, 16 / elem_bytes); }

namespace {
int64_t Vectors(int64_t vocab, int vec) { return (vocab + vec - 1) / vec; }
}  // namespace

CrossEntropyConfig DefaultCrossEntropyConfig(int64_t vocab, int vec) {
  CrossEntropyConfig c;
  c.vec = vec;
  // At most 512 threads: the kernels keep to 64 registers, so two blocks share an SM and one
  // streams while the other reduces.
  const int64_t wanted = (Vectors(vocab, vec) + 31) / 32;
  c.threads = 32;
  while (c.threads < 512 && c.threads < wanted) c.threads *= 2;
  const int64_t per_thread = (Vectors(vocab, vec) + c.threads - 1) / c.threads;
  c.unroll = 1;
  while (c.unroll < 4 && c.unroll * 2 <= per_thread) c.unroll *= 2;
  return c;
}

std::vector<CrossEntropyConfig> CrossEntropyConfigCandidates(int64_t vocab, int vec) {
  std::vector<CrossEntropyConfig> out;
  const int64_t vectors = Vectors(vocab, vec);
  for (int threads = 128; threads <= 1024; threads *= 2) {
    const int64_t per_thread = (vectors + threads - 1) / threads;
    if (per_thread > 256) continue;
    for (int unroll : {1, 2, 4, 8}) {
      if (unroll > 1 && unroll > per_thread) continue;
      out.push_back({vec, threads, unroll});
    }
  }
  const CrossEntropyConfig d = DefaultCrossEntropyConfig(vocab, vec);
  if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

}  // namespace autotune
}  // namespace kjit
