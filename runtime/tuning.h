// How an op finds its tuned config: the tuning database's key (autotune/tuning_db.h) for an op
// spec on a runtime's GPU at a row count. The autotuner writes records under these keys and the
// ops look them up, so both sides name ops and shapes the same way.
//
//   TuningKey k = TuningKeyFor(rt, CrossEntropySpec{.vocab = 128256}, /*rows=*/16384);
//   // k.op == "cross_entropy", k.shape == "vocab=128256", k.rows_bucket == 16384
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "autotune/tuning_db.h"
#include "runtime/cross_entropy.h"
#include "runtime/rms_norm.h"

namespace kjit {

class Runtime;

// "rms_norm" or "rms_norm+residual"; "cross_entropy".
std::string TuningOp(const RmsNormSpec& spec);
std::string TuningOp(const CrossEntropySpec& spec);
// "cross_entropy.forward": the config of the streaming launches (forward only, backward from a
// saved lse), tuned apart from the fused forward+backward's.
std::string StreamingTuningOp(const CrossEntropySpec& spec);
// The compile-time parameters that change which config is fastest: the hidden size or vocab, and
// the options that add work per element ("hidden=3584 gemma", "vocab=256000 softcap").
std::string TuningShape(const RmsNormSpec& spec);
std::string TuningShape(const CrossEntropySpec& spec);

using OpSpec = std::variant<RmsNormSpec, CrossEntropySpec>;

// An op spec as JSON (its config left out) and back, validated: how KJIT_AUTOTUNE hands an op to
// `kjit-tune --spec` and the tuner hands it to its workers.
std::string SpecToJson(const OpSpec& spec);
absl::StatusOr<OpSpec> SpecFromJson(std::string_view text);

// The device fields come from the runtime's GPU (empty for a compile-only runtime).
autotune::TuningKey TuningKeyFor(const Runtime& rt, const RmsNormSpec& spec, int64_t rows);
autotune::TuningKey TuningKeyFor(const Runtime& rt, const CrossEntropySpec& spec, int64_t rows);

namespace internal {
struct RuntimeState;
autotune::TuningKey TuningKeyFor(const RuntimeState& rt, const std::string& op,
                                 const std::string& shape, DType dtype, int64_t rows);
}  // namespace internal

}  // namespace kjit
