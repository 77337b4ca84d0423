// `kjit compile`: render, compile (or find in the cache) one op's kernels and say where they lie.
#include <algorithm>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/json_text.h"
#include "jit/source.h"
#include "jit/status_helpers.h"
#include "kjit/kjit.h"
#include "ops/common/json_fields.h"
#include "ops/registry.h"
#include "ops/rms_norm/config.h"
#include "tools/commands.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct CompileFlags {
  std::string op;
  int64_t hidden = 0;
  int64_t vocab = 0;
  std::string dtype = "bf16";
  std::string weight_dtype;
  std::string casting = "llama";
  bool residual = false;
  // The loss ops' flags (AddLossFlags): the options, and those given as text.
  LossOptions loss;
  std::string target_type = "int64";
  std::string reduction = "mean";
  std::string class_weights;  // a dtype; empty: none
  std::string arch = "auto";
  bool json = false;
};

// The flags of one op each (the others apply to every op). Given with another --op such a flag is a
// usage error, like a missing size; `field` is the spec field the op's own checks name in their
// errors ("label_smoothing: 1 must be in [0, 1)"), so that the error names the flag instead.
struct OpFlag {
  std::string_view flag;
  std::vector<std::string_view> ops;
  std::string_view field;
  bool AppliesTo(std::string_view op) const {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  }
};
// The ops whose spec holds the loss options (kjit/loss_options.h): the loss flags apply to them.
std::vector<std::string_view> LossOps() {
  std::vector<std::string_view> names;
  [&]<size_t... I>(std::index_sequence<I...>) {
    auto add = [&]<typename Spec>(const Spec*) {
      if constexpr (requires(const Spec& s) { s.loss; }) names.push_back(ops::OpTrait<Spec>::kName);
    };
    (add(static_cast<const std::variant_alternative_t<I, ops::OpSpec>*>(nullptr)), ...);
  }
  (std::make_index_sequence<std::variant_size_v<ops::OpSpec>>{});
  return names;
}

const std::vector<OpFlag>& OpFlags() {
  static const std::vector<OpFlag> flags = [] {
    std::vector<OpFlag> f = {
        {"--hidden", {"rms_norm", "linear_cross_entropy"}, "hidden"},
        {"--weight-dtype", {"rms_norm"}, "weight_dtype"},
        {"--casting", {"rms_norm"}, ""},
        {"--residual", {"rms_norm"}, ""},
        {"--vocab", {"cross_entropy", "linear_cross_entropy"}, "vocab"},
    };
    // Each loss option's flag is its name with dashes, but class_weight_dtype's.
    for (auto [flag, field] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
             {"--target-type", ""},
             {"--reduction", ""},
             {"--label-smoothing", "label_smoothing"},
             {"--z-loss", "z_loss"},
             {"--softcap", "softcap"},
             {"--argmax", ""},
             {"--entropy", ""},
             {"--class-weights", "class_weight_dtype"}}) {
      f.push_back({flag, LossOps(), field});
    }
    return f;
  }();
  return flags;
}

// The loss options the flags give (unvalidated: the op's spec checks them).
absl::StatusOr<LossOptions> LossFromFlags(const CompileFlags& f) {
  LossOptions loss = f.loss;
  loss.target_type = f.target_type == "int32" ? IndexType::kInt32 : IndexType::kInt64;
  loss.reduction = f.reduction == "none"  ? Reduction::kNone
                   : f.reduction == "sum" ? Reduction::kSum
                                          : Reduction::kMean;
  if (!f.class_weights.empty()) {
    KJIT_ASSIGN_OR_RETURN(loss.class_weight_dtype, ParseDType(f.class_weights));
  }
  return loss;
}

absl::StatusOr<ops::OpSpec> RmsNormFromFlags(const CompileFlags& f, DType dtype) {
  RmsNormSpec spec{.hidden = f.hidden, .dtype = dtype};
  if (!f.weight_dtype.empty()) {
    KJIT_ASSIGN_OR_RETURN(spec.weight_dtype, ParseDType(f.weight_dtype));
  }
  KJIT_ASSIGN_OR_RETURN(spec.casting, ops::ParseRmsNormCasting(f.casting));
  spec.fused_residual = f.residual;
  KJIT_RETURN_IF_ERROR(ValidateRmsNormSpec(spec));
  return spec;
}

absl::StatusOr<ops::OpSpec> CrossEntropyFromFlags(const CompileFlags& f, DType dtype) {
  CrossEntropySpec spec{.vocab = f.vocab, .dtype = dtype};
  KJIT_ASSIGN_OR_RETURN(spec.loss, LossFromFlags(f));
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(spec));
  return spec;
}

absl::StatusOr<ops::OpSpec> LinearCrossEntropyFromFlags(const CompileFlags& f, DType dtype) {
  LinearCrossEntropySpec spec{.vocab = f.vocab, .hidden = f.hidden, .dtype = dtype};
  KJIT_ASSIGN_OR_RETURN(spec.loss, LossFromFlags(f));
  KJIT_RETURN_IF_ERROR(ValidateLinearCrossEntropySpec(spec));
  return spec;
}

// The op the flags describe (its config left to the op: the tuned or heuristic one). One entry
// per op with flags of its own: an op missing here is an error, never another op's spec.
absl::StatusOr<ops::OpSpec> SpecFromFlags(const CompileFlags& f) {
  using FromFlags = absl::StatusOr<ops::OpSpec> (*)(const CompileFlags&, DType);
  static const std::map<std::string_view, FromFlags> kFromFlags = {
      {"rms_norm", RmsNormFromFlags},
      {"cross_entropy", CrossEntropyFromFlags},
      {"linear_cross_entropy", LinearCrossEntropyFromFlags}};
  KJIT_ASSIGN_OR_RETURN(DType dtype, ParseDType(f.dtype));
  const auto it = kFromFlags.find(f.op);
  if (it == kFromFlags.end()) {
    return absl::UnimplementedError(fmt::format("--op {}: kjit compile has no flags for it", f.op));
  }
  return it->second(f, dtype);
}

// What CLI11 cannot check once it has parsed the flags: that each belongs to --op, that the op's
// size is given, that its dtypes compile for the targets, and that the op accepts the values (its
// spec validates).
absl::Status CheckCompileFlags(const CompileFlags& f, const CLI::App& cmd) {
  std::vector<std::string_view> others;
  for (const OpFlag& o : OpFlags()) {
    if (!o.AppliesTo(f.op) && cmd.count(std::string(o.flag)) > 0) others.push_back(o.flag);
  }
  if (!others.empty()) {
    return absl::InvalidArgumentError(fmt::format("{} {} not apply to --op {}",
                                                  fmt::join(others, ", "),
                                                  others.size() == 1 ? "does" : "do", f.op));
  }
  // The size is the one BenchSpec takes: the op's only required flag.
  const std::string size = "--" + ops::BenchSizeName(f.op);
  if (cmd.count(size) == 0) {
    return absl::InvalidArgumentError(fmt::format("{} is required for --op {}", size, f.op));
  }
  KJIT_RETURN_IF_ERROR(CheckDTypesForArch(f.arch, {{"--dtype", f.dtype},
                                                   {"--weight-dtype", f.weight_dtype},
                                                   {"--class-weights", f.class_weights}}));
  const absl::Status spec = SpecFromFlags(f).status();
  for (const OpFlag& o : OpFlags()) {
    if (!o.field.empty() && ToStd(spec.message()).starts_with(fmt::format("{}: ", o.field))) {
      return ops::Renamed(spec, o.flag);
    }
  }
  return spec;
}

// The loss options' flags, shared by every loss op (LossOps()).
void AddLossFlags(CLI::App* cmd, CompileFlags& f) {
  const std::string ops = fmt::format("{}", fmt::join(LossOps(), ", "));
  cmd->add_option("--target-type", f.target_type, fmt::format("Targets: int32 or int64 ({})", ops))
      ->check(CLI::IsMember({"int32", "int64"}))
      ->capture_default_str();
  cmd->add_option("--reduction", f.reduction, fmt::format("none, sum or mean ({})", ops))
      ->check(CLI::IsMember({"none", "sum", "mean"}))
      ->capture_default_str();
  cmd->add_option("--label-smoothing", f.loss.label_smoothing,
                  fmt::format("Label smoothing in [0, 1) ({})", ops));
  cmd->add_option("--z-loss", f.loss.z_loss,
                  fmt::format("The z-loss coefficient: adds z_loss * lse^2 per row ({})", ops));
  cmd->add_option("--softcap", f.loss.softcap, fmt::format("Logit soft-cap, 0 = off ({})", ops));
  cmd->add_flag("--argmax", f.loss.argmax,
                fmt::format("Also write the predicted token per row ({})", ops));
  cmd->add_flag("--entropy", f.loss.entropy,
                fmt::format("Also write the softmax's entropy per row ({})", ops));
  cmd->add_option("--class-weights", f.class_weights,
                  fmt::format("Per-class weights of this dtype, fp32 or --dtype's ({}; the "
                              "weights themselves are a launch argument)",
                              ops))
      ->check(DTypeValidator());
}

int RunCompile(const CompileFlags& f) {
  auto spec = SpecFromFlags(f);  // checked by CheckCompileFlags
  if (!spec.ok()) return Fail(spec.status());

  auto runtimes = RuntimesForArch(f.arch);
  if (!runtimes.ok()) return Fail(runtimes.status());
  nlohmann::json report = nlohmann::json::array();
  int failures = 0;
  for (const Runtime& rt : *runtimes) {
    auto built = ops::Build(rt, *spec);
    if (!built.ok()) {
      ++failures;
      fmt::print(stderr, "kjit compile: {}: {}\n", rt.target(), ToStd(built.status().message()));
      report.push_back(
          {{"target", rt.target()}, {"error", std::string(ToStd(built.status().message()))}});
      continue;
    }
    const std::string config = built->params.count("config") ? built->params.at("config") : "";
    // Compiled but kept in memory (a read-only cache, a full disk): the next run compiles it again,
    // which is what `kjit compile` is run to spare; a failure, as in kjit-tune.
    const bool stored = !built->path.empty();
    if (!stored) {
      ++failures;
      fmt::print(stderr,
                 "kjit compile: {}: compiled but not stored in the kernel cache, kept in memory "
                 "only (the warnings above say why)\n",
                 rt.target());
    }
    if (f.json) {
      report.push_back({{"op", f.op},
                        {"target", built->target},
                        {"key", built->key},
                        {"config", config},
                        {"origin", built->origin},
                        {"path", built->path},
                        {"stored", stored},
                        {"bytes", built->bytes},
                        {"params", built->params},
                        {"nvrtc", built->nvrtc},
                        // Every program the op's launches load (cross-entropy compiles each
                        // kernel apart).
                        {"programs", ops::ProgramsJson(*built)}});
    } else {
      fmt::print(
          "{} {} -> {}\n  key     {}\n  config  {}\n  from    {}\n  path    {}\n  size    {} "
          "bytes\n",
          f.op, jit::FormatParams(built->params), built->target, built->key, config, built->origin,
          built->path.empty() ? "(memory only)" : built->path, built->bytes);
      if (built->programs.size() > 1) {
        for (const BuildInfo& p : built->programs) {
          fmt::print("  program {} {} ({}, {} bytes)\n", p.program, p.key, p.origin, p.bytes);
        }
      }
    }
  }
  if (f.json) fmt::print("{}\n", jit::JsonText(report, 2));
  return failures == 0 ? 0 : 1;
}

}  // namespace

Command AddCompileCommand(CLI::App& app) {
  auto f = std::make_shared<CompileFlags>();
  CLI::App* cmd = app.add_subcommand(
      "compile", "Render and compile one op's kernels (or find them in the cache); no GPU needed");
  cmd->add_option("--op", f->op, "The op")->required()->check(CLI::IsMember(ops::OpNames()));
  cmd->add_option("--hidden", f->hidden, "Hidden size (rms_norm, linear_cross_entropy; required)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--vocab", f->vocab, "Vocab size (cross_entropy, linear_cross_entropy; required)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--dtype", f->dtype, "fp32, fp16 or bf16")
      ->check(DTypeValidator())
      ->capture_default_str();
  cmd->add_option("--weight-dtype", f->weight_dtype, "Weight dtype (default: --dtype; rms_norm)")
      ->check(DTypeValidator());
  cmd->add_option("--casting", f->casting,
                  "llama, gemma or none: where rms_norm rounds to the dtype (kjit/rms_norm.h; none "
                  "computes in the dtype, as eager PyTorch would, and needs the weight in it)")
      ->check(CLI::IsMember({"llama", "gemma", "none"}))
      ->capture_default_str();
  cmd->add_flag("--residual", f->residual, "Fuse the residual add (rms_norm)");
  AddLossFlags(cmd, *f);
  cmd->add_option(
         "--arch", f->arch,
         "auto (the GPU present, else sm_90 and sm_100) or a list: sm_90,sm_100,compute_90")
      ->check(ArchValidator())
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print a JSON report");
  cmd->final_callback([f, cmd] { ThrowIfUsageError(CheckCompileFlags(*f, *cmd)); });
  return [f] { return RunCompile(*f); };
}

}  // namespace kjit::tools
