// The ops kjit has, and the operations on "any op" that the tuner, its workers, `kjit compile`,
// `kjit bench` and doctor use. Each dispatches on the spec's type to that op's OpTrait
// (ops/op_trait.h), so no code branches on an op's name and an op without a complete trait does
// not compile.
//
// Adding an op: its folder under ops/ with a tuning/trait.h, and its spec in OpSpec below; the
// CLI's flags, kjit-tune's model ops, `kjit bench`'s shapes and the spec JSON follow from its trait
// (docs/ADDING_AN_OP.md).
//
//   KJIT_ASSIGN_OR_RETURN(OpSpec op, SpecFromJson(R"({"op": "rms_norm", ...})"));
//   std::string shape = TuningShape(op);                         // "hidden=4096"
//   KJIT_ASSIGN_OR_RETURN(BuildInfo b, Build(rt, op));            // its heuristic config
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/kjit.h"
#include "ops/common/spec_flags.h"
#include "ops/cross_entropy/tuning/trait.h"
#include "ops/linear_cross_entropy/tuning/trait.h"
#include "ops/log_probs/tuning/trait.h"
#include "ops/rms_norm/tuning/trait.h"
#include "runtime/tuning_db.h"

namespace kjit::ops {

// The registry: one alternative per op.
using OpSpec = std::variant<RmsNormSpec, CrossEntropySpec, LinearCrossEntropySpec, LogProbsSpec>;

// The ops' names ("rms_norm", "cross_entropy", "linear_cross_entropy"), in OpSpec's order.
std::vector<std::string> OpNames();

std::string OpName(const OpSpec& op);
// The tuning database's key fields (OpTrait::TuningOp, TuningShape) and the op's dtype.
std::string TuningOp(const OpSpec& op);
std::string TuningShape(const OpSpec& op);
DType OpDType(const OpSpec& op);

// The tuning database's key for the op's records at `rows` on the runtime's GPU; `record_op`
// replaces TuningOp (a TunedPass's record_op, e.g. "cross_entropy.forward").
internal::TuningKey TuningKeyFor(const Runtime& rt, const OpSpec& op, int64_t rows,
                                 const std::string& record_op = "");

// An op spec as JSON (its config left out) and back, validated: how KJIT_AUTOTUNE hands an op to
// `kjit-tune --spec` and the tuner hands it to its workers. InvalidArgument names the bad field.
std::string SpecToJson(const OpSpec& op);
absl::StatusOr<OpSpec> SpecFromJson(std::string_view text);

// What a runtime does with each of `records` at launch on a GPU of the record's arch
// (TunedConfigs): OK when its op, shape and dtype name an op kjit has and its config parses and
// fits that op there; else why the runtime ignores the record: NotFound when it names no op kjit
// has, the parser's or the op's own error otherwise. Unavailable when it cannot be told here (no
// NVRTC that knows the record's arch). For `kjit doctor`.
std::vector<absl::Status> CheckTuningRecords(const std::vector<internal::TuningRecord>& records);

// The spec with its config set from text, as the config's ToString() prints it.
absl::StatusOr<OpSpec> WithConfig(const OpSpec& op, const std::string& config);
// The config the op runs without tuning for a runtime's target (it builds nothing).
absl::StatusOr<std::string> HeuristicConfig(const Runtime& rt, const OpSpec& op);
// Compiles (or finds in the caches) the op's program for its config, else the heuristic's.
absl::StatusOr<BuildInfo> Build(const Runtime& rt, const OpSpec& op);

// What the tuner chooses per row bucket.
std::vector<TunedPass> TunedPasses(const OpSpec& op);
// Every config of the op's search space for the heuristic's vector width on `arch`:
// (config, why it is pruned or "").
std::vector<std::pair<std::string, std::string>> SearchSpace(const OpSpec& op,
                                                             const std::string& heuristic,
                                                             int arch);
// The passes a candidate is timed on when the tuned pass is `tuned`.
std::vector<Pass> PassesToTime(const OpSpec& op, const std::string& config,
                               const std::string& heuristic, Pass tuned);
// For ops whose passes are searched apart: the config made of the fastest of each, else nullopt.
std::optional<std::string> Combine(const OpSpec& op, const std::string& heuristic,
                                   const std::string& fastest_forward,
                                   const std::string& fastest_backward);

// One problem's inputs on the GPU for any op (ops/common/tuning/trial.h), for the tuner's GPU
// worker and `kjit bench`: the op for a config is made, checked against the fp64 reference, then
// timed.
class AnyTrial {
 public:
  virtual ~AnyTrial() = default;
  // Makes the op for `op` (this trial's op and shape, any config) and checks the outputs of `pass`
  // (the kernels it launches); the op is kept for Work and ConfigUsed until the next Check.
  virtual absl::Status Check(const OpSpec& op, Pass pass) = 0;
  virtual absl::StatusOr<TimedWork> Work(Pass pass) = 0;
  // The config the checked op launches a pass of this trial's rows with (tuned or heuristic),
  // and its own config (the spec's, else the heuristic's).
  virtual std::string ConfigUsed(Pass pass) const = 0;
  virtual std::string OpConfig() const = 0;
  virtual double Bytes(Pass pass) const = 0;
  virtual std::vector<Pass> BenchPasses() const = 0;
  // `kjit bench`'s fields for this problem (its size, rows and what the op needs besides).
  virtual nlohmann::json BenchFields() const = 0;
};
absl::StatusOr<std::unique_ptr<AnyTrial>> MakeTrial(const Runtime& rt, const OpSpec& op,
                                                    int64_t rows);

// A flag of one command as the tools offer it: the first declaring op's FlagInfo, its help's
// "{ops}" replaced by the ops that declare it ("cross_entropy, linear_cross_entropy").
struct CommandFlag {
  FlagInfo info;
  std::vector<std::string> ops;  // in OpSpec's order
  bool DeclaredBy(std::string_view op) const;
};
// Every op's flags of `command`, each name once, in OpSpec's order and each op's.
std::vector<CommandFlag> CommandFlags(FlagCommand command);

// The op named `name` with `dtype` and its spec's defaults elsewhere, for the flags to set.
absl::StatusOr<OpSpec> DefaultSpec(std::string_view name, DType dtype);
// Sets the op's spec from a flag of `command` its op declares: InvalidArgument "--flag does not
// apply to --op name" when it declares none. Unvalidated: ValidateSpec checks the whole.
absl::Status ApplyFlag(OpSpec& op, FlagCommand command, std::string_view flag,
                       const FlagValue& value);
// The op's spec checks (Validate<Op>Spec): InvalidArgument naming the field.
absl::Status ValidateSpec(const OpSpec& op);

// The ops a model's fine-tuning runs, every op's ModelOps in OpSpec's order, with kjit-tune's
// flags `given` (name -> value) applied to the ops that declare them; an op whose flag has no
// apply (ops/common/spec_flags.h) is left out when it is given.
absl::StatusOr<std::vector<OpSpec>> ModelOps(const ModelShape& model, DType dtype,
                                             const std::map<std::string, FlagValue>& given);

// `kjit bench`: the op named `name` at `size` (its hidden size or vocab), with its default shapes.
absl::StatusOr<OpSpec> BenchSpec(std::string_view name, int64_t size, DType dtype);
// What that size is for the op ("hidden", "vocab"); "" for an unknown op.
std::string BenchSizeName(std::string_view name);
// (size, rows) pairs `kjit bench --op name` runs without a shape.
std::vector<std::pair<int64_t, int64_t>> BenchShapes(std::string_view name);

}  // namespace kjit::ops
