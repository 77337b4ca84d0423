#include "ops/rms_norm/config.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "ops/common/config_text.h"

namespace kjit {

std::string RmsNormConfig::ToString() const {
  auto shape = [](const RowShape& s) {
    return s.ring == 0 ? fmt::format("{}x{}", s.threads_per_row, s.rows_per_block)
                       : fmt::format("{}x{}r{}", s.threads_per_row, s.rows_per_block, s.ring);
  };
  return fmt::format("vec={} fwd={} bwd={}", vec, shape(forward), shape(backward));
}

const char* Name(RmsNormCasting casting) {
  switch (casting) {
    case RmsNormCasting::kLlama: return "llama";
    case RmsNormCasting::kGemma: return "gemma";
    case RmsNormCasting::kNone: return "none";
  }
  return "?";
}

namespace ops {

absl::StatusOr<RmsNormCasting> ParseRmsNormCasting(std::string_view text) {
  for (RmsNormCasting c : {RmsNormCasting::kLlama, RmsNormCasting::kGemma, RmsNormCasting::kNone}) {
    if (text == Name(c)) return c;
  }
  return absl::InvalidArgumentError(
      fmt::format("casting: '{}' is not a casting (llama, gemma, none)", text));
}

int MaxVecForHidden(int64_t hidden, int elem_bytes) {
  int vec = 16 / elem_bytes;
  while (vec > 1 && hidden % vec != 0) vec /= 2;
  return vec;
}

namespace {

// "256x1": threads per row x rows per block; a backward shape may end in "r<ring>" (2 to 4).
absl::StatusOr<RowShape> ParseRowShape(const ConfigText& t, std::string_view name) {
  std::string_view v = t.Value(name);
  int ring = 0;
  if (const size_t r = v.find('r'); r != std::string_view::npos) {
    const std::optional<int> n = ParseInt(v.substr(r + 1));
    if (name != "bwd" || !n || *n < 2 || *n > 4) {
      return t.Invalid(name, "a ring of 2 to 4 rows, backward only, e.g. 512x1r3");
    }
    ring = *n;
    v = v.substr(0, r);
  }
  const size_t x = v.find('x');
  const std::optional<int> threads = ParseInt(v.substr(0, x));
  const std::optional<int> rows =
      x == std::string_view::npos ? std::nullopt : ParseInt(v.substr(x + 1));
  if (!threads || !rows) return t.Invalid(name, "<threads per row>x<rows per block>, e.g. 256x1");
  const bool sub_warp = IsPowerOfTwo(*threads) && *threads <= 32;
  const bool whole_warps = *threads > 0 && *threads <= 1024 && *threads % 32 == 0;
  if (!sub_warp && !whole_warps) {
    return t.Invalid(name, "threads per row a power of two <= 32 or a multiple of 32 <= 1024");
  }
  if (*rows < 1) return t.Invalid(name, "at least 1 row per block");
  if (*threads > 32 && *rows != 1) {
    return t.Invalid(name, "1 row per block when more than 32 threads share a row");
  }
  // In 64 bits: rows can be any int here.
  if (int64_t{*threads} * *rows > 1024) return t.Invalid(name, "at most 1024 threads per block");
  return RowShape{*threads, *rows, ring};
}

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

bool RowFitsRing(int64_t hidden, int vec, int elem_bytes, const RowShape& backward) {
  const int64_t per_pass = int64_t{backward.threads_per_row} * vec;
  const int64_t iters = (hidden + per_pass - 1) / per_pass;
  return 2 * iters * vec * elem_bytes <= 128;
}

RmsNormConfig DefaultRmsNormConfig(int64_t hidden, int vec) {
  RmsNormConfig c;
  c.vec = vec;
  // Two vectors per thread in the forward: the fastest shape an H200 sweep found at hidden 1024
  // and 4096 (bench/NOTES.md).
  c.forward = ShapeFor(hidden, vec, 2);
  // One vector per thread in the backward: wider blocks, fewer row groups, smaller dw partials.
  c.backward = ShapeFor(hidden, vec, 1);
  // 16-bit rows in blocks of 128 or more: a ring of two rows in registers keeps one in flight
  // while the other is reduced (H200, 16384 rows: hidden 4096 backward 137.7 -> 112.2 us, 68.6%
  // -> 84.2% of copy; hidden 8192 fwd+bwd 69.1% -> 79.1%; hidden 1024 backward 31.8 -> 30.6 us
  // once the dw partials were stored as vectors; fp32's wider registers spill).
  if (vec >= 8 && c.backward.threads_per_row >= 128 &&
      RowFitsRing(hidden, vec, /*elem_bytes=*/2, c.backward)) {
    c.backward.ring = 2;
  }
  return c;
}

}  // namespace ops

absl::StatusOr<RmsNormConfig> ParseRmsNormConfig(std::string_view text) {
  KJIT_ASSIGN_OR_RETURN(ops::ConfigText t,
                        ops::ConfigText::Split("RMSNorm config", text, {"vec", "fwd", "bwd"}));
  RmsNormConfig c;
  KJIT_ASSIGN_OR_RETURN(c.vec, t.Int("vec"));
  if (!ops::IsPowerOfTwo(c.vec) || c.vec > 16) {
    return t.Invalid("vec", "a power of two from 1 to 16");
  }
  KJIT_ASSIGN_OR_RETURN(c.forward, ops::ParseRowShape(t, "fwd"));
  KJIT_ASSIGN_OR_RETURN(c.backward, ops::ParseRowShape(t, "bwd"));
  return c;
}

}  // namespace kjit
