#include "autotune/rms_norm_config.h"

#include <algorithm>

#include <fmt/format.h>

namespace kjit::autotune {

std::string RmsNormConfig::ToString() const {
  return fmt::format("vec={} fwd={}x{} bwd={}x{}", vec, forward.threads_per_row,
                     forward.rows_per_block, backward.threads_per_row, backward.rows_per_block);
}

int MaxVecForHidden(int64_t hidden, int elem_bytes) {
  int vec = 16 / elem_bytes;
  while (vec > 1 && hidden % vec != 0) vec /= 2;
  return vec;
}

namespace {

// Threads per row so that each thread handles about `per_thread` vectors: sub-warp groups packed
// into 128-thread blocks for short rows, one block per row for long ones.
RowShape ShapeFor(int64_t hidden, int vec, int per_thread) {
  const int64_t vectors = (hidden + vec - 1) / vec;
  const int64_t wanted = (vectors + per_thread - 1) / per_thread;
  RowShape s;
  if (wanted <= 32) {
    int t = 1;
    while (t < wanted) t *= 2;
    s.threads_per_row = t;
    s.rows_per_block = 128 / t;
  } else {
    s.threads_per_row = static_cast<int>(std::min<int64_t>(1024, (wanted + 31) / 32 * 32));
    s.rows_per_block = 1;
  }
  return s;
}

}  // namespace

RmsNormConfig DefaultRmsNormConfig(int64_t hidden, int vec) {
  RmsNormConfig c;
  c.vec = vec;
  // Two vectors per thread in the forward: the fastest shape an H200 sweep found at hidden 1024
  // and 4096 (bench/NOTES.md).
  c.forward = ShapeFor(hidden, vec, 2);
  // One vector per thread in the backward: wider blocks, fewer row groups, smaller dw partials.
  c.backward = ShapeFor(hidden, vec, 1);
  return c;
}

std::vector<RowShape> RowShapeCandidates(int64_t hidden, int vec) {
  const int64_t vectors = (hidden + vec - 1) / vec;
  std::vector<RowShape> out;
  auto walk_ok = [&](int threads) {
    const int64_t per_thread = (vectors + threads - 1) / threads;
    return per_thread >= 1 && per_thread <= 16;
  };
  for (int t = 1; t <= 32; t *= 2) {
    if (t / 2 >= vectors || !walk_ok(t)) continue;  // half the group would idle
    for (int block : {128, 256}) out.push_back({t, block / t});
  }
  for (int t = 64; t <= 1024; t *= 2) {
    if (t - 32 >= vectors || !walk_ok(t)) continue;
    out.push_back({t, 1});
  }
  return out;
}

}  // namespace kjit::autotune
