// The launch config of kjit's Hopper GEMM (templates/gemm_sm90.cuh): tile shape, pipeline depth and
// the order tiles are handed out in; its text form, its validity, and the heuristic used without
// tuning. No GPU needed.
//
//   KJIT_ASSIGN_OR_RETURN(GemmConfig c, ParseGemmConfig("tile_m=128 tile_n=256 stages=4 group=8
//   along_n=0")); GemmSharedBytes(c);   // 197760: four 48 KB stages, their barriers, 1 KB of
//   alignment
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kjit/status.h"

namespace kjit::ops {

struct GemmConfig {
  // A block's tile of C: tile_m rows (64 per consumer warpgroup) by tile_n columns.
  int tile_m = 128;
  int tile_n = 256;
  int stages = 4;  // shared-memory stages of 64-deep slices of A and B in flight
  // Tiles are handed out `group` at a time along M (along N when along_n), then the next position
  // along the other dimension: the tiles in flight then share few panels of A and B in L2.
  int group = 8;
  bool along_n = false;

  // "tile_m=128 tile_n=256 stages=4 group=8 along_n=0"
  std::string ToString() const;
  bool operator==(const GemmConfig&) const = default;
};

// The shared memory of H100 and H200 a block may opt into (227 KB).
inline constexpr int kGemmMaxSharedBytes = 232448;

absl::StatusOr<GemmConfig> ParseGemmConfig(std::string_view text);
// InvalidArgument naming the field out of range: tile_m 64, 128, 192 or 256; tile_n 128 or 256;
// the accumulators (tile_n / 2 registers a thread) within what tile_m / 64 warpgroups get; stages
// from 2 whose shared memory fits kGemmMaxSharedBytes; group 1 to 64.
absl::Status ValidateGemmConfig(const GemmConfig& c);
// Dynamic shared memory a block of `c` takes.
int GemmSharedBytes(const GemmConfig& c);
// 128 x 256 tiles (two consumer warpgroups of 64 x 256), four stages, groups of 8 along M.
GemmConfig DefaultGemmConfig(int64_t m, int64_t n, int64_t k);

}  // namespace kjit::ops
