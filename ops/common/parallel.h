// Host-side loops split over the machine's cores, for the fp64 references and the trials' checks:
// their iterations (rows, mostly) are independent, and at LLaMA 3's vocab a single core takes
// seconds where the GPU took microseconds.
//
//   ForEachIndex(rows, /*cost_per_index=*/vocab, [&](int64_t r) { CheckRow(r); });
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace kjit::ops {

// The cores ForEachIndex spreads over (at least 1).
inline int64_t HostCores() { return std::max<int64_t>(1, std::thread::hardware_concurrency()); }

// Calls f(i) for every i in [0, n), on up to one thread per core; threads only when the work
// (n * cost_per_index, in rough element operations) pays for them. f must be safe to run
// concurrently for different i; each i's result must not depend on the split.
template <typename F>
void ForEachIndex(int64_t n, int64_t cost_per_index, F&& f) {
  const int64_t cores = HostCores();
  const int64_t workers = std::clamp<int64_t>(n * cost_per_index / (1 << 16), 1,
                                              std::max<int64_t>(1, std::min(cores, n)));
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += workers) f(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace kjit::ops
