#include "ops/registry.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "ops/common/json_fields.h"
#include "runtime/runtime_state.h"
#include "runtime/tuned_configs.h"

namespace kjit::ops {

namespace {

template <typename Spec>
using TraitOf = OpTrait<std::decay_t<Spec>>;

// Calls f(OpTrait<S>{}, S{}) for the alternative whose name is `name`; false when none is.
template <typename F, size_t I = 0>
bool ForOpNamed(std::string_view name, F&& f) {
  if constexpr (I == std::variant_size_v<OpSpec>) {
    return false;
  } else {
    using Spec = std::variant_alternative_t<I, OpSpec>;
    if (OpTrait<Spec>::kName == name) {
      f(OpTrait<Spec>{}, Spec{});
      return true;
    }
    return ForOpNamed<F, I + 1>(name, std::forward<F>(f));
  }
}

absl::Status UnknownOp(std::string_view name) {
  return absl::InvalidArgumentError(
      fmt::format("op: {} is not one of {}", jit::Quoted(name), fmt::join(OpNames(), ", ")));
}

template <typename Spec>
class TrialOf : public AnyTrial {
 public:
  using Trait = OpTrait<Spec>;
  TrialOf(const Runtime& rt, const Spec& spec, int64_t rows,
          std::unique_ptr<typename Trait::Trial> trial)
      : rt_(rt), spec_(spec), rows_(rows), trial_(std::move(trial)) {}

  absl::Status Check(const OpSpec& op, Pass pass) override {
    const Spec* s = std::get_if<Spec>(&op);
    if (s == nullptr) return absl::InvalidArgumentError("op: not this trial's op");
    op_.reset();
    KJIT_ASSIGN_OR_RETURN(typename Trait::Op made, Trait::Create(rt_, *s));
    op_.emplace(std::move(made));
    absl::Status checked = trial_->Check(*op_, pass);
    if (!checked.ok()) op_.reset();
    return checked;
  }
  absl::StatusOr<TimedWork> Work(Pass pass) override {
    if (!op_) return absl::FailedPreconditionError("trial: Work before a successful Check");
    return trial_->Work(*op_, pass);
  }
  std::string ConfigUsed(Pass pass) const override {
    return op_ ? Trait::ConfigUsed(*op_, *trial_, pass).ToString() : "";
  }
  std::string OpConfig() const override { return op_ ? op_->config().ToString() : ""; }
  double Bytes(Pass pass) const override { return trial_->Bytes(pass); }
  std::vector<Pass> BenchPasses() const override { return Trait::BenchPasses(); }
  nlohmann::json BenchFields() const override { return Trait::BenchFields(spec_, *trial_, rows_); }

 private:
  const Runtime& rt_;
  Spec spec_;
  int64_t rows_;
  std::unique_ptr<typename Trait::Trial> trial_;
  std::optional<typename Trait::Op> op_;
};

}  // namespace

namespace {

// Calls f(OpTrait<S>{}) for every alternative S of OpSpec, in order.
template <typename F>
void ForEachOp(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f(OpTrait<std::variant_alternative_t<I, OpSpec>>{}), ...);
  }
  (std::make_index_sequence<std::variant_size_v<OpSpec>>{});
}

}  // namespace

std::vector<std::string> OpNames() {
  std::vector<std::string> names;
  ForEachOp([&](auto trait) { names.emplace_back(decltype(trait)::kName); });
  return names;
}

std::string OpName(const OpSpec& op) {
  return std::visit([](const auto& s) { return std::string(TraitOf<decltype(s)>::kName); }, op);
}
std::string TuningOp(const OpSpec& op) {
  return std::visit([](const auto& s) { return TraitOf<decltype(s)>::TuningOp(s); }, op);
}
std::string TuningShape(const OpSpec& op) {
  return std::visit([](const auto& s) { return TraitOf<decltype(s)>::TuningShape(s); }, op);
}
DType OpDType(const OpSpec& op) {
  return std::visit([](const auto& s) { return s.dtype; }, op);
}

internal::TuningKey TuningKeyFor(const Runtime& rt, const OpSpec& op, int64_t rows,
                                 const std::string& record_op) {
  return internal::TuningKeyFor(internal::StateOf(rt), record_op.empty() ? TuningOp(op) : record_op,
                                TuningShape(op), OpDType(op), rows);
}

std::string SpecToJson(const OpSpec& op) {
  return std::visit([](const auto& s) { return TraitOf<decltype(s)>::ToJson(s).dump(); }, op);
}

absl::StatusOr<OpSpec> SpecFromJson(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("op spec: {}", e.what()));
  }
  // The fields are read through JsonFields, which names each in its errors and throws nothing.
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  KJIT_ASSIGN_OR_RETURN(const std::string name, in.String("op"));
  absl::StatusOr<OpSpec> out = UnknownOp(name);
  ForOpNamed(name, [&](auto trait, auto) {
    auto spec = decltype(trait)::FromJson(j);
    out = spec.ok() ? absl::StatusOr<OpSpec>(*spec) : absl::StatusOr<OpSpec>(spec.status());
  });
  return out;
}

absl::StatusOr<OpSpec> WithConfig(const OpSpec& op, const std::string& config) {
  return std::visit(
      [&](auto s) -> absl::StatusOr<OpSpec> {
        KJIT_ASSIGN_OR_RETURN(s.config, TraitOf<decltype(s)>::ParseConfig(config));
        return s;
      },
      op);
}

namespace {

// The op whose TuningOp (or a TunedPass's record_op) and TuningShape are the key's: read back by
// its trait's FromTuningKey and checked by the round trip, so that any word the trait does not
// know, or a value out of place, matches no op.
template <size_t I = 0>
std::optional<OpSpec> SpecForTuningKey(const internal::TuningKey& key, DType dtype,
                                       const TuningShapeWords& words) {
  if constexpr (I == std::variant_size_v<OpSpec>) {
    return std::nullopt;
  } else {
    using Trait = OpTrait<std::variant_alternative_t<I, OpSpec>>;
    if (auto s = Trait::FromTuningKey(key.op, words, dtype);
        s && Trait::TuningShape(*s) == key.shape) {
      for (const TunedPass& p : Trait::TunedPasses(*s)) {
        if (p.record_op == key.op) return OpSpec(*s);
      }
    }
    return SpecForTuningKey<I + 1>(key, dtype, words);
  }
}

absl::Status CheckTuningRecord(const internal::TuningRecord& r,
                               std::map<int, absl::StatusOr<Runtime>>& twins) {
  const absl::StatusOr<DType> dtype = ParseDType(r.key.dtype);
  std::optional<OpSpec> spec;
  if (dtype.ok()) spec = SpecForTuningKey(r.key, *dtype, TuningShapeWords::Parse(r.key.shape));
  if (!spec) {
    return absl::NotFoundError(fmt::format(
        "op {} with shape {} and dtype {} is none of kjit's ops ({})", jit::Quoted(r.key.op),
        jit::Quoted(r.key.shape), jit::Quoted(r.key.dtype), fmt::join(OpNames(), ", ")));
  }
  KJIT_ASSIGN_OR_RETURN(const OpSpec with_config, WithConfig(*spec, r.config));
  auto twin = twins.find(r.key.arch);
  if (twin == twins.end()) {
    // A compile-only twin for the record's arch: making an op validates its config as a launch
    // validates a tuned one, and builds nothing.
    twin = twins
               .emplace(r.key.arch, Runtime::Create({.target = fmt::format("sm_{}", r.key.arch),
                                                     .compile_only = true,
                                                     .disk_cache = false,
                                                     .tuning_db = "off"}))
               .first;
  }
  if (!twin->second.ok()) {
    return absl::UnavailableError(
        fmt::format("cannot check it here: {}", ToStd(twin->second.status().message())));
  }
  return std::visit(
      [&](const auto& s) { return TraitOf<decltype(s)>::Create(*twin->second, s).status(); },
      with_config);
}

}  // namespace

std::vector<absl::Status> CheckTuningRecords(const std::vector<internal::TuningRecord>& records) {
  std::map<int, absl::StatusOr<Runtime>> twins;  // by arch
  // Records of one op, shape and config differ by rows bucket only: each is checked once (a
  // database may hold tens of thousands).
  std::map<std::tuple<std::string, std::string, std::string, int, std::string>, absl::Status> seen;
  std::vector<absl::Status> out;
  for (const internal::TuningRecord& r : records) {
    auto [it, fresh] = seen.try_emplace({r.key.op, r.key.shape, r.key.dtype, r.key.arch, r.config});
    if (fresh) it->second = CheckTuningRecord(r, twins);
    out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<std::string> HeuristicConfig(const Runtime& rt, const OpSpec& op) {
  // Asked of a compile-only twin: an op on a GPU runtime would load its kernels.
  KJIT_ASSIGN_OR_RETURN(
      const Runtime twin,
      Runtime::Create({.target = rt.target(), .compile_only = true, .tuning_db = "off"}));
  return std::visit(
      [&](auto s) -> absl::StatusOr<std::string> {
        s.config.reset();
        KJIT_ASSIGN_OR_RETURN(auto made, TraitOf<decltype(s)>::Create(twin, s));
        return made.config().ToString();
      },
      op);
}

absl::StatusOr<BuildInfo> Build(const Runtime& rt, const OpSpec& op) {
  return std::visit(
      [&](const auto& s) -> absl::StatusOr<BuildInfo> {
        KJIT_ASSIGN_OR_RETURN(auto made, TraitOf<decltype(s)>::Create(rt, s));
        return made.Build();
      },
      op);
}

std::vector<TunedPass> TunedPasses(const OpSpec& op) {
  return std::visit([](const auto& s) { return TraitOf<decltype(s)>::TunedPasses(s); }, op);
}

std::vector<std::pair<std::string, std::string>> SearchSpace(const OpSpec& op,
                                                             const std::string& heuristic,
                                                             int arch) {
  return std::visit(
      [&](const auto& s) {
        using Trait = TraitOf<decltype(s)>;
        std::vector<std::pair<std::string, std::string>> out;
        const auto h = Trait::ParseConfig(heuristic);
        if (!h.ok()) return out;
        for (const auto& c : Trait::SearchSpace(s, *h, arch)) {
          out.emplace_back(c.config.ToString(), c.pruned);
        }
        return out;
      },
      op);
}

std::vector<Pass> PassesToTime(const OpSpec& op, const std::string& config,
                               const std::string& heuristic, Pass tuned) {
  return std::visit(
      [&](const auto& s) -> std::vector<Pass> {
        using Trait = TraitOf<decltype(s)>;
        const auto c = Trait::ParseConfig(config), h = Trait::ParseConfig(heuristic);
        if (!c.ok() || !h.ok()) return {tuned};
        return Trait::PassesToTime(*c, *h, tuned);
      },
      op);
}

std::optional<std::string> Combine(const OpSpec& op, const std::string& heuristic,
                                   const std::string& fastest_forward,
                                   const std::string& fastest_backward) {
  return std::visit(
      [&](const auto& s) -> std::optional<std::string> {
        using Trait = TraitOf<decltype(s)>;
        const auto h = Trait::ParseConfig(heuristic), f = Trait::ParseConfig(fastest_forward),
                   b = Trait::ParseConfig(fastest_backward);
        if (!h.ok() || !f.ok() || !b.ok()) return std::nullopt;
        const auto combined = Trait::Combine(*h, *f, *b);
        if (!combined) return std::nullopt;
        return combined->ToString();
      },
      op);
}

absl::StatusOr<std::unique_ptr<AnyTrial>> MakeTrial(const Runtime& rt, const OpSpec& op,
                                                    int64_t rows) {
  return std::visit(
      [&](const auto& s) -> absl::StatusOr<std::unique_ptr<AnyTrial>> {
        using Spec = std::decay_t<decltype(s)>;
        KJIT_ASSIGN_OR_RETURN(auto trial, OpTrait<Spec>::Trial::Create(rt, s, rows));
        return std::unique_ptr<AnyTrial>(new TrialOf<Spec>(rt, s, rows, std::move(trial)));
      },
      op);
}

bool CommandFlag::DeclaredBy(std::string_view op) const {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

std::vector<CommandFlag> CommandFlags(FlagCommand command) {
  std::vector<CommandFlag> flags;
  ForEachOp([&](auto trait) {
    using Trait = decltype(trait);
    for (const auto& f : Trait::Flags()) {
      if (f.info.command != command) continue;
      auto same = std::find_if(flags.begin(), flags.end(),
                               [&](const CommandFlag& c) { return c.info.name == f.info.name; });
      if (same == flags.end()) same = flags.insert(flags.end(), {f.info, {}});
      if (!same->DeclaredBy(Trait::kName)) same->ops.emplace_back(Trait::kName);
    }
  });
  for (CommandFlag& f : flags) {
    if (const size_t at = f.info.help.find("{ops}"); at != std::string::npos) {
      f.info.help.replace(at, 5, fmt::format("{}", fmt::join(f.ops, ", ")));
    }
  }
  return flags;
}

absl::StatusOr<OpSpec> DefaultSpec(std::string_view name, DType dtype) {
  absl::StatusOr<OpSpec> out = UnknownOp(name);
  ForOpNamed(name, [&](auto, auto spec) {
    spec.dtype = dtype;
    out = OpSpec(spec);
  });
  return out;
}

absl::Status ApplyFlag(OpSpec& op, FlagCommand command, std::string_view flag,
                       const FlagValue& value) {
  return std::visit(
      [&](auto& s) -> absl::Status {
        using Trait = TraitOf<decltype(s)>;
        for (const auto& f : Trait::Flags()) {
          if (f.info.command == command && f.info.name == flag && f.apply) {
            return f.apply(s, value);
          }
        }
        return absl::InvalidArgumentError(
            fmt::format("{} does not apply to --op {}", flag, Trait::kName));
      },
      op);
}

absl::Status ValidateSpec(const OpSpec& op) {
  return std::visit([](const auto& s) { return TraitOf<decltype(s)>::Validate(s); }, op);
}

absl::StatusOr<std::vector<OpSpec>> ModelOps(const ModelShape& model, DType dtype,
                                             const std::map<std::string, FlagValue>& given) {
  std::vector<OpSpec> out;
  absl::Status status;
  ForEachOp([&](auto trait) {
    using Trait = decltype(trait);
    const auto flags = Trait::Flags();
    for (auto spec : Trait::ModelOps(model, dtype)) {
      bool left_out = false;
      for (const auto& f : flags) {
        const auto value = given.find(f.info.name);
        if (f.info.command != FlagCommand::kTune || value == given.end()) continue;
        if (!f.apply) {
          left_out = true;
        } else if (status.ok()) {
          status = f.apply(spec, value->second);
        }
      }
      if (!left_out) out.push_back(spec);
    }
  });
  KJIT_RETURN_IF_ERROR(status);
  return out;
}

absl::StatusOr<OpSpec> BenchSpec(std::string_view name, int64_t size, DType dtype) {
  absl::StatusOr<OpSpec> out = UnknownOp(name);
  ForOpNamed(name,
             [&](auto trait, auto) { out = OpSpec(decltype(trait)::BenchSpec(size, dtype)); });
  return out;
}

std::string BenchSizeName(std::string_view name) {
  std::string out;
  ForOpNamed(name, [&](auto trait, auto) { out = decltype(trait)::kSizeName; });
  return out;
}

std::vector<std::pair<int64_t, int64_t>> BenchShapes(std::string_view name) {
  std::vector<std::pair<int64_t, int64_t>> out;
  ForOpNamed(name, [&](auto trait, auto) { out = decltype(trait)::BenchShapes(); });
  return out;
}

}  // namespace kjit::ops
