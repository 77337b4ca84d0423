// Cross-entropy as the tuner, `kjit compile`, `kjit bench` and doctor see it (ops/op_trait.h).
//
//   using T = OpTrait<CrossEntropySpec>;
//   T::TuningShape({.vocab = 256000, .loss = {.softcap = 30}});   // "vocab=256000 softcap"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/cross_entropy.h"
#include "ops/common/spec_flags.h"
#include "ops/common/tuning/search_space.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/tuning/trial.h"
#include "ops/cross_entropy/tuning_key.h"
#include "ops/op_trait.h"

namespace kjit::ops {

template <>
struct OpTrait<CrossEntropySpec> {
  using Spec = CrossEntropySpec;
  using Config = CrossEntropyConfig;
  using Op = CrossEntropy;
  using Trial = CrossEntropyTrial;
  static constexpr std::string_view kName = kCrossEntropyName;

  // ops/cross_entropy/tuning_key.h: "cross_entropy" (and "cross_entropy.forward" for the
  // streaming launches), "vocab=256000 softcap", the spec JSON.
  static std::string TuningOp(const Spec& s) { return CrossEntropyTuningOp(s); }
  static std::string TuningShape(const Spec& s) { return CrossEntropyTuningShape(s); }
  static std::string StreamingTuningOp(const Spec& s) { return CrossEntropyStreamingTuningOp(s); }
  static std::optional<Spec> FromTuningKey(std::string_view op, const TuningShapeWords& shape,
                                           DType dtype) {
    return CrossEntropyFromTuningKey(op, shape, dtype);
  }
  static nlohmann::json ToJson(const Spec& s) { return CrossEntropyToJson(s); }
  static absl::StatusOr<Spec> FromJson(const nlohmann::json& j) { return CrossEntropyFromJson(j); }
  static absl::StatusOr<Config> ParseConfig(std::string_view text) {
    return ParseCrossEntropyConfig(text);
  }
  static absl::StatusOr<Op> Create(const Runtime& rt, const Spec& s) { return rt.CrossEntropy(s); }

  static std::vector<TunedPass> TunedPasses(const Spec& s) {
    return {{Pass::kForwardBackward, TuningOp(s)}, {Pass::kForward, StreamingTuningOp(s)}};
  }
  static std::vector<Candidate<Config>> SearchSpace(const Spec& s, const Config& heuristic,
                                                    int arch);
  static std::vector<Pass> PassesToTime(const Config&, const Config&, Pass tuned) {
    return {tuned};
  }
  static std::optional<Config> Combine(const Config&, const Config&, const Config&) {
    return std::nullopt;
  }
  static Config ConfigUsed(const Op& op, const Trial& t, Pass pass) {
    return op.ConfigFor(t.logits(), /*fused=*/pass == Pass::kForwardBackward);
  }

  static constexpr std::string_view kSizeName = "vocab";  // the size BenchSpec takes
  // The fused loss and gradient (mean, gradient in place) and the forward alone.
  static std::vector<Pass> BenchPasses() { return {Pass::kForwardBackward, Pass::kForward}; }
  static Spec BenchSpec(int64_t vocab, DType dtype) {
    return {.vocab = vocab,
            .dtype = dtype,
            .loss = {.target_type = IndexType::kInt64, .reduction = Reduction::kMean}};
  }
  // LLaMA 3's vocab at three token counts, then Gemma 2's, Qwen 2's and GPT-2's.
  static std::vector<std::pair<int64_t, int64_t>> BenchShapes() {
    return {{128256, 16384}, {128256, 4096}, {128256, 256},
            {256000, 8192},  {151936, 8192}, {50257, 16384}};
  }
  static nlohmann::json BenchFields(const Spec& s, const Trial& t, int64_t rows) {
    return {{"vocab", s.vocab},
            {"rows", rows},
            {"extra_device_bytes", t.workspace_bytes()},
            {"checked_rows", t.checked_rows()}};
  }

  // The op's flags for `kjit compile`, `kjit bench` and `kjit-tune` (ops/common/spec_flags.h),
  // its spec's checks, and the specs a model's fine-tuning runs (what `kjit-tune --model` tunes).
  static std::vector<SpecFlag<Spec>> Flags();
  static absl::Status Validate(const Spec& s) { return ValidateCrossEntropySpec(s); }
  static std::vector<Spec> ModelOps(const ModelShape& m, DType dtype);
};

}  // namespace kjit::ops
