// The fused linear + cross-entropy as the tuner, `kjit compile` and doctor see it
// (ops/op_trait.h). `kjit bench` times it against GEMM baselines instead of through BenchSpec
// (tools/bench_linear_cross_entropy.h); the bench members here serve the registry's generic
// paths.
//
//   using T = OpTrait<LinearCrossEntropySpec>;
//   T::TuningShape({.vocab = 128256, .hidden = 4096});   // "vocab=128256 hidden=4096"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/linear_cross_entropy.h"
#include "ops/common/spec_flags.h"
#include "ops/common/tuning/search_space.h"
#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/tuning/search_space.h"
#include "ops/linear_cross_entropy/tuning/trial.h"
#include "ops/linear_cross_entropy/tuning_key.h"
#include "ops/op_trait.h"

namespace kjit::ops {

template <>
struct OpTrait<LinearCrossEntropySpec> {
  using Spec = LinearCrossEntropySpec;
  using Config = LinearCrossEntropyConfig;
  using Op = LinearCrossEntropy;
  using Trial = LinearCrossEntropyTrial;
  static constexpr std::string_view kName = kLinearCrossEntropyName;

  // ops/linear_cross_entropy/tuning_key.h: "vocab=128256 hidden=4096", the spec JSON.
  static std::string TuningOp(const Spec& s) { return LinearCrossEntropyTuningOp(s); }
  static std::string TuningShape(const Spec& s) { return LinearCrossEntropyTuningShape(s); }
  static std::optional<Spec> FromTuningKey(std::string_view op, const TuningShapeWords& shape,
                                           DType dtype) {
    return LinearCrossEntropyFromTuningKey(op, shape, dtype);
  }
  static nlohmann::json ToJson(const Spec& s) { return LinearCrossEntropyToJson(s); }
  static absl::StatusOr<Spec> FromJson(const nlohmann::json& j) {
    return LinearCrossEntropyFromJson(j);
  }
  static absl::StatusOr<Config> ParseConfig(std::string_view text) {
    return ParseLinearCrossEntropyConfig(text);
  }
  static absl::StatusOr<Op> Create(const Runtime& rt, const Spec& s) {
    return rt.LinearCrossEntropy(s);
  }
  static std::vector<TunedPass> TunedPasses(const Spec& s) {
    return {{Pass::kForwardBackward, TuningOp(s)}};
  }
  static std::vector<Candidate<Config>> SearchSpace(const Spec& s, const Config& heuristic,
                                                    int /*arch*/) {
    return LinearCrossEntropySearchSpace(s, heuristic);
  }
  static std::vector<Pass> PassesToTime(const Config&, const Config&, Pass tuned) {
    return {tuned};
  }
  static std::optional<Config> Combine(const Config&, const Config&, const Config&) {
    return std::nullopt;
  }
  static Config ConfigUsed(const Op& op, const Trial& t, Pass) { return op.ConfigFor(t.rows()); }

  static constexpr std::string_view kSizeName = "vocab";
  static std::vector<Pass> BenchPasses() { return {Pass::kForwardBackward}; }
  static Spec BenchSpec(int64_t vocab, DType dtype) {
    return {.vocab = vocab, .hidden = 4096, .dtype = dtype};
  }
  static std::vector<std::pair<int64_t, int64_t>> BenchShapes() { return {{128256, 8192}}; }
  static nlohmann::json BenchFields(const Spec& s, const Trial& t, int64_t rows) {
    return {{"vocab", s.vocab},
            {"hidden", s.hidden},
            {"rows", rows},
            {"extra_device_bytes", t.workspace_bytes()}};
  }

  // The op's flags for `kjit compile`, `kjit bench` and `kjit-tune` (ops/common/spec_flags.h),
  // its spec's checks, and the specs a model's fine-tuning runs (what `kjit-tune --model` tunes).
  static std::vector<SpecFlag<Spec>> Flags();
  static absl::Status Validate(const Spec& s) { return ValidateLinearCrossEntropySpec(s); }
  static std::vector<Spec> ModelOps(const ModelShape& m, DType dtype);
};

}  // namespace kjit::ops
