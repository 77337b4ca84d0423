// `kjit compile`: render, compile (or find in the cache) one op's kernels and say where they lie.
#include <algorithm>
#include <map>
#include <string>
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
  std::string target_type = "int64";
  std::string reduction = "mean";
  float label_smoothing = 0;
  float z_loss = 0;
  float softcap = 0;
  bool argmax = false;
  bool entropy = false;
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
const OpFlag kOpFlags[] = {
    {"--hidden", {"rms_norm", "linear_cross_entropy"}, "hidden"},
    {"--weight-dtype", {"rms_norm"}, "weight_dtype"},
    {"--casting", {"rms_norm"}, ""},
    {"--residual", {"rms_norm"}, ""},
    {"--vocab", {"cross_entropy", "linear_cross_entropy"}, "vocab"},
    {"--target-type", {"cross_entropy", "linear_cross_entropy"}, ""},
    {"--reduction", {"cross_entropy", "linear_cross_entropy"}, ""},
    {"--label-smoothing", {"cross_entropy", "linear_cross_entropy"}, "label_smoothing"},
    {"--z-loss", {"cross_entropy", "linear_cross_entropy"}, "lse_square_scale"},
    {"--softcap", {"cross_entropy", "linear_cross_entropy"}, "softcap"},
    {"--argmax", {"cross_entropy", "linear_cross_entropy"}, ""},
    {"--entropy", {"cross_entropy", "linear_cross_entropy"}, ""},
    {"--class-weights", {"cross_entropy", "linear_cross_entropy"}, "class_weight_dtype"},
};

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
  spec.target_type = f.target_type == "int32" ? IndexType::kInt32 : IndexType::kInt64;
  spec.reduction = f.reduction == "none"  ? Reduction::kNone
                   : f.reduction == "sum" ? Reduction::kSum
                                          : Reduction::kMean;
  spec.label_smoothing = f.label_smoothing;
  spec.lse_square_scale = f.z_loss;
  spec.softcap = f.softcap;
  spec.argmax = f.argmax;
  spec.entropy = f.entropy;
  if (!f.class_weights.empty()) {
    KJIT_ASSIGN_OR_RETURN(spec.class_weight_dtype, ParseDType(f.class_weights));
  }
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(spec));
  return spec;
}

// The loss's flags as the cross-entropy reads them, with the lm_head's hidden size.
absl::StatusOr<ops::OpSpec> LinearCrossEntropyFromFlags(const CompileFlags& f, DType dtype) {
  KJIT_ASSIGN_OR_RETURN(const ops::OpSpec loss, CrossEntropyFromFlags(f, dtype));
  const auto& ce = std::get<CrossEntropySpec>(loss);
  LinearCrossEntropySpec spec{.vocab = ce.vocab,
                              .hidden = f.hidden,
                              .dtype = dtype,
                              .target_type = ce.target_type,
                              .reduction = ce.reduction,
                              .label_smoothing = ce.label_smoothing,
                              .lse_square_scale = ce.lse_square_scale,
                              .softcap = ce.softcap,
                              .argmax = ce.argmax,
                              .entropy = ce.entropy,
                              .class_weight_dtype = ce.class_weight_dtype};
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
  for (const OpFlag& o : kOpFlags) {
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
  for (const OpFlag& o : kOpFlags) {
    if (!o.field.empty() && ToStd(spec.message()).starts_with(fmt::format("{}: ", o.field))) {
      return ops::Renamed(spec, o.flag);
    }
  }
  return spec;
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
  cmd->add_option("--target-type", f->target_type, "Targets: int32 or int64 (cross_entropy)")
      ->check(CLI::IsMember({"int32", "int64"}))
      ->capture_default_str();
  cmd->add_option("--reduction", f->reduction, "none, sum or mean (cross_entropy)")
      ->check(CLI::IsMember({"none", "sum", "mean"}))
      ->capture_default_str();
  cmd->add_option("--label-smoothing", f->label_smoothing,
                  "Label smoothing in [0, 1) (cross_entropy)");
  cmd->add_option("--z-loss", f->z_loss,
                  "lse_square_scale, the z-loss coefficient (cross_entropy)");
  cmd->add_option("--softcap", f->softcap, "Logit soft-cap, 0 = off (cross_entropy)");
  cmd->add_flag("--argmax", f->argmax, "Also write the predicted token per row (cross_entropy)");
  cmd->add_flag("--entropy", f->entropy,
                "Also write the softmax's entropy per row (cross_entropy)");
  cmd->add_option("--class-weights", f->class_weights,
                  "Per-class weights of this dtype, fp32 or --dtype's (cross_entropy; the "
                  "weights themselves are a launch argument)")
      ->check(DTypeValidator());
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
