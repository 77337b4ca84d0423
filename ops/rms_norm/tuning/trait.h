// RMSNorm as the tuner, `kjit compile`, `kjit bench` and doctor see it (ops/op_trait.h).
//
//   using T = OpTrait<RmsNormSpec>;
//   T::TuningShape({.hidden = 3584, .casting = RmsNormCasting::kGemma});   // "hidden=3584 gemma"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/rms_norm.h"
#include "ops/common/spec_flags.h"
#include "ops/common/tuning/search_space.h"
#include "ops/op_trait.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/tuning/trial.h"
#include "ops/rms_norm/tuning_key.h"

namespace kjit::ops {

template <>
struct OpTrait<RmsNormSpec> {
  using Spec = RmsNormSpec;
  using Config = RmsNormConfig;
  using Op = RmsNorm;
  using Trial = RmsNormTrial;
  static constexpr std::string_view kName = kRmsNormName;

  // ops/rms_norm/tuning_key.h: "rms_norm+residual", "hidden=3584 gemma", the spec JSON.
  static std::string TuningOp(const Spec& s) { return RmsNormTuningOp(s); }
  static std::string TuningShape(const Spec& s) { return RmsNormTuningShape(s); }
  static std::optional<Spec> FromTuningKey(std::string_view op, const TuningShapeWords& shape,
                                           DType dtype) {
    return RmsNormFromTuningKey(op, shape, dtype);
  }
  static nlohmann::json ToJson(const Spec& s) { return RmsNormToJson(s); }
  static absl::StatusOr<Spec> FromJson(const nlohmann::json& j) { return RmsNormFromJson(j); }
  static absl::StatusOr<Config> ParseConfig(std::string_view text) {
    return ParseRmsNormConfig(text);
  }
  static absl::StatusOr<Op> Create(const Runtime& rt, const Spec& s) { return rt.RmsNorm(s); }

  // Forward and backward are separate kernels, searched apart: each forward shape with the
  // heuristic's backward, timed forward, and each backward shape with its forward, timed backward;
  // the fastest of each then make one config, timed forward + backward.
  static std::vector<TunedPass> TunedPasses(const Spec& s);
  static std::vector<Candidate<Config>> SearchSpace(const Spec& s, const Config& heuristic,
                                                    int arch);
  static std::vector<Pass> PassesToTime(const Config& c, const Config& heuristic, Pass tuned);
  static std::optional<Config> Combine(const Config& heuristic, const Config& fastest_forward,
                                       const Config& fastest_backward);
  static Config ConfigUsed(const Op& op, const Trial& t, Pass) { return op.ConfigFor(t.rows()); }

  static constexpr std::string_view kSizeName = "hidden";  // the size BenchSpec takes
  static std::vector<Pass> BenchPasses() {
    return {Pass::kForward, Pass::kBackward, Pass::kForwardBackward};
  }
  static Spec BenchSpec(int64_t hidden, DType dtype) { return {.hidden = hidden, .dtype = dtype}; }
  static std::vector<std::pair<int64_t, int64_t>> BenchShapes() {
    return {{4096, 16384}, {1024, 16384}, {4096, 256}, {8192, 16384}};
  }
  static nlohmann::json BenchFields(const Spec& s, const Trial&, int64_t rows) {
    return {{"hidden", s.hidden}, {"rows", rows}};
  }

  // The op's flags for `kjit compile`, `kjit bench` and `kjit-tune` (ops/common/spec_flags.h),
  // its spec's checks, and the specs a model's fine-tuning runs (what `kjit-tune --model` tunes).
  static std::vector<SpecFlag<Spec>> Flags();
  static absl::Status Validate(const Spec& s) { return ValidateRmsNormSpec(s); }
  static std::vector<Spec> ModelOps(const ModelShape& m, DType dtype);
};

}  // namespace kjit::ops
