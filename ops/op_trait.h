// OpTrait<Spec>: what the rest of kjit needs to know about one op, so that the tuner, its
// workers, `kjit compile`, `kjit bench` and doctor handle every op the same way (ops/registry.h
// dispatches on the spec's type; nothing branches on an op's name). Each op's folder specializes
// it in its tuning/trait.h; a specialization holds:
//
//   using Spec, Config, Op, Trial;          // kjit/<op>.h's spec, config and op; tuning/trial.h
//   static constexpr std::string_view kName;       // "rms_norm": JSON, CLI and report name
//   static std::string TuningOp(const Spec&);      // the tuning database's op and shape fields
//   static std::string TuningShape(const Spec&);
//   static std::optional<Spec> FromTuningKey(std::string_view op, const TuningShapeWords& shape,
//                                            DType);  // a spec with that op and shape, if any
//   static nlohmann::json ToJson(const Spec&);     // its config left out; FromJson validates
//   static absl::StatusOr<Spec> FromJson(const nlohmann::json&);   // may throw nlohmann's errors
//   static absl::StatusOr<Config> ParseConfig(std::string_view);
//   static absl::StatusOr<Op> Create(const Runtime&, const Spec&);
//   static std::vector<TunedPass> TunedPasses(const Spec&);         // one record each per bucket
//   static std::vector<Candidate<Config>> SearchSpace(const Spec&, const Config& heuristic,
//                                                     int arch);
//   static std::vector<Pass> PassesToTime(const Config& candidate, const Config& heuristic,
//                                         Pass tuned_pass);
//   static std::optional<Config> Combine(const Config& heuristic, const Config& fastest_forward,
//                                        const Config& fastest_backward);   // nullopt: n/a
//   static Config ConfigUsed(const Op&, const Trial&, Pass);   // what a launch on it picks
//   static constexpr std::string_view kSizeName;   // "hidden": what BenchSpec's size is
//   static std::vector<Pass> BenchPasses();
//   static Spec BenchSpec(int64_t size, DType);                       // size: hidden or vocab
//   static std::vector<std::pair<int64_t, int64_t>> BenchShapes();   // (size, rows)
//   static nlohmann::json BenchFields(const Spec&, const Trial&, int64_t rows);
//   static std::vector<SpecFlag<Spec>> Flags();    // its CLI flags (ops/common/spec_flags.h)
//   static absl::Status Validate(const Spec&);     // its spec's checks, naming the field
//   static std::vector<Spec> ModelOps(const ModelShape&, DType);   // what `kjit-tune --model`
//                                                  // tunes of it; {} for none
//
// docs/ADDING_AN_OP.md walks through a new op.
#pragma once

#include <string>

#include "ops/common/tuning/trial.h"
#include "ops/common/tuning_shape_words.h"

namespace kjit::ops {

template <typename Spec>
struct OpTrait;

// One config the tuner chooses per row bucket: the pass it is timed on and the database record's
// op it is stored under (cross-entropy keeps its fused and its streaming launches apart).
struct TunedPass {
  Pass pass = Pass::kForwardBackward;
  std::string record_op;
};

}  // namespace kjit::ops
