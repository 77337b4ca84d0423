#include "ops/linear_cross_entropy/config.h"

#include <algorithm>

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "ops/common/config_text.h"
#include "ops/gemm/gemm_args.h"

namespace kjit {

namespace {

static_assert(LinearCrossEntropyConfig::kOwnGemm == ops::kOwnGemm);

std::string AlgoText(int algo) {
  return algo == LinearCrossEntropyConfig::kOwnGemm ? "kjit" : std::to_string(algo);
}

}  // namespace

std::string LinearCrossEntropyConfig::ToString() const {
  return fmt::format(
      "chunk={} whole={} streams={} logits_algo={} d_hidden_algo={} d_weight_algo={}", chunk_rows,
      whole_rows, streams, AlgoText(logits_algo), AlgoText(d_hidden_algo), AlgoText(d_weight_algo));
}

const char* Name(WeightGradAccumulation a) {
  return a == WeightGradAccumulation::kFloat32 ? "fp32" : "output_dtype";
}

absl::StatusOr<LinearCrossEntropyConfig> ParseLinearCrossEntropyConfig(std::string_view text) {
  KJIT_ASSIGN_OR_RETURN(ops::ConfigText t,
                        ops::ConfigText::Split("linear cross-entropy config", text,
                                               {"chunk", "whole", "streams", "logits_algo",
                                                "d_hidden_algo", "d_weight_algo"}));
  LinearCrossEntropyConfig c;
  KJIT_ASSIGN_OR_RETURN(c.chunk_rows, t.Int("chunk"));
  KJIT_ASSIGN_OR_RETURN(c.whole_rows, t.Int("whole"));
  KJIT_ASSIGN_OR_RETURN(c.streams, t.Int("streams"));
  // An algorithm index, or "kjit" for kjit's own GEMM.
  auto algo = [&t](std::string_view name) -> absl::StatusOr<int> {
    if (t.Value(name) == "kjit") return LinearCrossEntropyConfig::kOwnGemm;
    KJIT_ASSIGN_OR_RETURN(const int index, t.Int(name));
    if (index < 0) return t.Invalid(name, "an index from 0 to 63, or kjit");
    return index;
  };
  KJIT_ASSIGN_OR_RETURN(c.logits_algo, algo("logits_algo"));
  KJIT_ASSIGN_OR_RETURN(c.d_hidden_algo, algo("d_hidden_algo"));
  KJIT_ASSIGN_OR_RETURN(c.d_weight_algo, algo("d_weight_algo"));
  const absl::Status valid = ops::ValidateLinearCrossEntropyConfig(c);
  if (!valid.ok())
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", jit::Quoted(text), ToStd(valid.message())));
  return c;
}

namespace ops {

absl::Status ValidateLinearCrossEntropyConfig(const LinearCrossEntropyConfig& c) {
  if (c.chunk_rows < 1 || c.chunk_rows > kMaxLinearCrossEntropyChunkRows) {
    return absl::InvalidArgumentError(fmt::format("config.chunk_rows: {} must be in [1, {}]",
                                                  c.chunk_rows, kMaxLinearCrossEntropyChunkRows));
  }
  if (c.whole_rows < 0 || c.whole_rows > kMaxLinearCrossEntropyChunkRows) {
    return absl::InvalidArgumentError(fmt::format("config.whole_rows: {} must be in [0, {}]",
                                                  c.whole_rows, kMaxLinearCrossEntropyChunkRows));
  }
  if (c.streams != 1 && c.streams != 2) {
    return absl::InvalidArgumentError(fmt::format(
        "config.streams: {} must be 1 (in order) or 2 (loss beside the GEMMs)", c.streams));
  }
  for (const auto& [name, algo] : {std::pair<const char*, int>{"logits_algo", c.logits_algo},
                                   {"d_hidden_algo", c.d_hidden_algo},
                                   {"d_weight_algo", c.d_weight_algo}}) {
    if ((algo < 0 || algo > 63) && algo != LinearCrossEntropyConfig::kOwnGemm) {
      return absl::InvalidArgumentError(
          fmt::format("config.{}: {} must be an index from 0 to 63 or kjit ({})", name, algo,
                      LinearCrossEntropyConfig::kOwnGemm));
    }
  }
  return absl::OkStatus();
}

int64_t ChunkRowStride(int64_t vocab, DType dtype) {
  const int64_t per_vector = 16 / static_cast<int64_t>(SizeOf(dtype));
  return (vocab + per_vector - 1) / per_vector * per_vector;
}

LinearCrossEntropyConfig DefaultLinearCrossEntropyConfig(const LinearCrossEntropySpec& spec) {
  const int64_t row_bytes =
      ChunkRowStride(spec.vocab, spec.dtype) * static_cast<int64_t>(SizeOf(spec.dtype));
  auto rows_in = [&](int64_t bytes) {
    return std::clamp<int64_t>(bytes / row_bytes / 128 * 128, 128, kMaxLinearCrossEntropyChunkRows);
  };
  LinearCrossEntropyConfig c{.chunk_rows = rows_in(kLinearCrossEntropyChunkBudgetBytes)};
  if (spec.weight_grad_accumulation == WeightGradAccumulation::kFloat32 &&
      spec.weight_grad() != DType::kF32) {
    c.whole_rows = rows_in(kLinearCrossEntropyChunkBudgetBytes + spec.vocab * spec.hidden * 4);
  }
  return c;
}

}  // namespace ops
}  // namespace kjit
