// The RL heads as the tools see them (ops/op_trait.h): `kjit compile --op log_probs`, `kjit bench
// --op log_probs` (forward + backward, and forward only) and the spec JSON. The op reads no tuning
// database yet: it tunes no pass, and `kjit-tune --model` leaves it out.
//
//   using T = OpTrait<LogProbsSpec>;
//   T::TuningShape({.vocab = 151936, .entropy = true});   // "vocab=151936 entropy"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/log_probs.h"
#include "ops/common/spec_flags.h"
#include "ops/common/tuning/search_space.h"
#include "ops/log_probs/tuning/trial.h"
#include "ops/log_probs/tuning_key.h"
#include "ops/op_trait.h"

namespace kjit::ops {

template <>
struct OpTrait<LogProbsSpec> {
  using Spec = LogProbsSpec;
  using Config = CrossEntropyConfig;
  using Op = LogProbs;
  using Trial = LogProbsTrial;
  static constexpr std::string_view kName = kLogProbsName;

  static std::string TuningOp(const Spec& s) { return LogProbsTuningOp(s); }
  static std::string TuningShape(const Spec& s) { return LogProbsTuningShape(s); }
  static std::optional<Spec> FromTuningKey(std::string_view op, const TuningShapeWords& shape,
                                           DType dtype) {
    return LogProbsFromTuningKey(op, shape, dtype);
  }
  static nlohmann::json ToJson(const Spec& s) { return LogProbsToJson(s); }
  static absl::StatusOr<Spec> FromJson(const nlohmann::json& j) { return LogProbsFromJson(j); }
  static absl::StatusOr<Config> ParseConfig(std::string_view text) {
    return ParseCrossEntropyConfig(text);
  }
  static absl::StatusOr<Op> Create(const Runtime& rt, const Spec& s) { return rt.LogProbs(s); }

  // No tuned pass: a launch uses the spec's config or the heuristic.
  static std::vector<TunedPass> TunedPasses(const Spec&) { return {}; }
  // The streaming configs of cross-entropy's space (`kjit bench --sweep`).
  static std::vector<Candidate<Config>> SearchSpace(const Spec& s, const Config& heuristic,
                                                    int arch);
  static std::vector<Pass> PassesToTime(const Config&, const Config&, Pass tuned) {
    return {tuned};
  }
  static std::optional<Config> Combine(const Config&, const Config&, const Config&) {
    return std::nullopt;
  }
  static Config ConfigUsed(const Op& op, const Trial&, Pass) { return op.config(); }

  static constexpr std::string_view kSizeName = "vocab";
  static std::vector<Pass> BenchPasses() { return {Pass::kForwardBackward, Pass::kForward}; }
  static Spec BenchSpec(int64_t vocab, DType dtype) {
    return {.vocab = vocab, .dtype = dtype, .temperature = 0.7f, .entropy = true};
  }
  // Issue 47's shape (Qwen 2's vocab at 16384 tokens), then LLaMA 3's.
  static std::vector<std::pair<int64_t, int64_t>> BenchShapes() {
    return {{151936, 16384}, {128256, 4096}};
  }
  static nlohmann::json BenchFields(const Spec& s, const Trial& t, int64_t rows) {
    return {{"vocab", s.vocab},
            {"rows", rows},
            {"temperature", s.temperature},
            {"entropy", s.entropy},
            {"checked_rows", t.checked_rows()}};
  }

  static std::vector<SpecFlag<Spec>> Flags();
  static absl::Status Validate(const Spec& s) { return ValidateLogProbsSpec(s); }
  static std::vector<Spec> ModelOps(const ModelShape&, DType) { return {}; }
};

}  // namespace kjit::ops
