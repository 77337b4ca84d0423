#include "ops/gemm/config.h"

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "ops/common/config_text.h"
#include "templates/gemm_sm90_params.h"

namespace kjit::ops {

std::string GemmConfig::ToString() const {
  return fmt::format("tile_m={} tile_n={} stages={} group={} along_n={}", tile_m, tile_n, stages,
                     group, along_n ? 1 : 0);
}

int GemmSharedBytes(const GemmConfig& c) { return gemm_shared_bytes(c.tile_m, c.tile_n, c.stages); }

absl::StatusOr<GemmConfig> ParseGemmConfig(std::string_view text) {
  KJIT_ASSIGN_OR_RETURN(
      ConfigText t,
      ConfigText::Split("GEMM config", text, {"tile_m", "tile_n", "stages", "group", "along_n"}));
  GemmConfig c;
  KJIT_ASSIGN_OR_RETURN(c.tile_m, t.Int("tile_m"));
  KJIT_ASSIGN_OR_RETURN(c.tile_n, t.Int("tile_n"));
  KJIT_ASSIGN_OR_RETURN(c.stages, t.Int("stages"));
  KJIT_ASSIGN_OR_RETURN(c.group, t.Int("group"));
  KJIT_ASSIGN_OR_RETURN(const int along_n, t.Int("along_n"));
  if (along_n != 0 && along_n != 1) return t.Invalid("along_n", "0 or 1");
  c.along_n = along_n == 1;
  const absl::Status valid = ValidateGemmConfig(c);
  if (!valid.ok())
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", jit::Quoted(text), ToStd(valid.message())));
  return c;
}

absl::Status ValidateGemmConfig(const GemmConfig& c) {
  if (c.tile_m != 64 && c.tile_m != 128 && c.tile_m != 192 && c.tile_m != 256) {
    return absl::InvalidArgumentError(
        fmt::format("tile_m: {} must be 64, 128, 192 or 256 (64 rows per warpgroup)", c.tile_m));
  }
  if (c.tile_n != 128 && c.tile_n != 256) {
    return absl::InvalidArgumentError(
        fmt::format("tile_n: {} must be 128 or 256 (one wgmma's width)", c.tile_n));
  }
  if (c.tile_n / 2 + 40 > gemm_consumer_registers(c.tile_m / 64)) {
    return absl::InvalidArgumentError(
        fmt::format("tile_n: {} needs {} accumulator registers a thread; {} warpgroups get {} each",
                    c.tile_n, c.tile_n / 2, c.tile_m / 64, gemm_consumer_registers(c.tile_m / 64)));
  }
  if (c.stages < 2 || GemmSharedBytes(c) > kGemmMaxSharedBytes) {
    return absl::InvalidArgumentError(
        fmt::format("stages: {} must be at least 2 with the shared memory ({} bytes) at most {}",
                    c.stages, GemmSharedBytes(c), kGemmMaxSharedBytes));
  }
  if (c.group < 1 || c.group > 64) {
    return absl::InvalidArgumentError(fmt::format("group: {} must be in [1, 64]", c.group));
  }
  return absl::OkStatus();
}

GemmConfig DefaultGemmConfig(int64_t, int64_t, int64_t) { return GemmConfig{}; }

}  // namespace kjit::ops
