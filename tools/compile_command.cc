// `kjit compile`: render, compile (or find in the cache) one op's kernels and say where they lie.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/json_text.h"
#include "jit/printable.h"
#include "jit/source.h"
#include "jit/status_helpers.h"
#include "kjit/kjit.h"
#include "ops/common/json_fields.h"
#include "ops/registry.h"
#include "runtime/build_info_json.h"
#include "tools/commands.h"
#include "tools/op_flags.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct CompileFlags {
  std::string op;
  std::string dtype = "bf16";
  // The ops' own flags (--hidden, --vocab, --casting, --z-loss, ...: OpTrait::Flags).
  OpFlagOptions op_flags{ops::FlagCommand::kCompile};
  std::string arch = "auto";
  bool json = false;
};

// The op the flags describe (its config left to the op: the tuned or heuristic one): the op's
// defaults with each of its flags given applied, validated.
absl::StatusOr<ops::OpSpec> SpecFromFlags(const CompileFlags& f) {
  KJIT_ASSIGN_OR_RETURN(DType dtype, ParseDType(f.dtype));
  KJIT_ASSIGN_OR_RETURN(ops::OpSpec spec, ops::DefaultSpec(f.op, dtype));
  for (const auto& [flag, value] : f.op_flags.given()) {
    KJIT_RETURN_IF_ERROR(ops::ApplyFlag(spec, ops::FlagCommand::kCompile, flag, value));
  }
  KJIT_RETURN_IF_ERROR(ops::ValidateSpec(spec));
  return spec;
}

// The spec's error about o's field, naming o's flag instead; for a number, with the text given
// beside the float it became ("--label-smoothing: \"0.9999999999\" (1 as a float) must be in
// [0, 1)").
absl::Status FlagError(const absl::Status& spec, const ops::CommandFlag& o, const CLI::App& cmd) {
  const absl::Status renamed = ops::Renamed(spec, o.info.name);
  const CLI::Option* option = cmd.get_option_no_throw(o.info.name);
  if (o.info.kind != ops::FlagKind::kFloat || option == nullptr || option->results().empty()) {
    return renamed;
  }
  const std::string& given = option->results().back();
  const std::string_view problem = ops::WithoutField(ToStd(spec.message()));
  const size_t space = problem.find(' ');
  const std::string_view value = problem.substr(0, space);
  if (space == std::string_view::npos || given == value) return renamed;
  return absl::Status(
      spec.code(), fmt::format("{}: {} ({} as a float) {}", o.info.name, jit::Quoted(given), value,
                               problem.substr(space + 1)));
}

// What CLI11 cannot check once it has parsed the flags: that each belongs to --op, that the op's
// size is given, that its dtypes compile for the targets, and that the op accepts the values (its
// spec validates; an error naming a spec field names the flag that sets it instead, e.g.
// "--label-smoothing: 1 must be in [0, 1)").
absl::Status CheckCompileFlags(const CompileFlags& f, const CLI::App& cmd) {
  std::vector<std::string_view> others;
  for (const ops::CommandFlag& o : f.op_flags.flags()) {
    if (!o.DeclaredBy(f.op) && cmd.count(o.info.name) > 0) others.push_back(o.info.name);
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
  std::vector<std::pair<std::string, std::string>> dtypes = {{"--dtype", f.dtype}};
  for (auto& d : f.op_flags.DTypeFlags()) dtypes.push_back(std::move(d));
  KJIT_RETURN_IF_ERROR(CheckDTypesForArch(f.arch, dtypes));
  const absl::Status spec = SpecFromFlags(f).status();
  for (const ops::CommandFlag& o : f.op_flags.flags()) {
    if (!o.info.field.empty() &&
        ToStd(spec.message()).starts_with(fmt::format("{}: ", o.info.field))) {
      return FlagError(spec, o, cmd);
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
                        {"programs", internal::ProgramsJson(*built)}});
    } else {
      fmt::print(
          "{} {} -> {}\n  key     {}\n  config  {}\n  from    {}\n  path    {}\n  size    {} "
          "bytes\n",
          f.op, jit::FormatParams(built->params), built->target, built->key, config, built->origin,
          built->path.empty() ? "(memory only)" : jit::Printable(built->path), built->bytes);
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
  // The sizes (the ops' integer flags) first, then --dtype, then the rest of the ops' flags.
  const auto is_size = [](const ops::FlagInfo& i) { return i.kind == ops::FlagKind::kInt; };
  f->op_flags.AddOptions(cmd, is_size);
  cmd->add_option("--dtype", f->dtype, "fp32, fp16 or bf16")
      ->check(DTypeValidator())
      ->capture_default_str();
  f->op_flags.AddOptions(cmd, [&](const ops::FlagInfo& i) { return !is_size(i); });
  cmd->add_option(
         "--arch", f->arch,
         "auto (the GPU present, else sm_90 and sm_100) or a list: sm_90,sm_100,compute_90")
      ->check(ArchValidator())
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print a JSON report");
  cmd->final_callback([f, cmd] {
    f->op_flags.Record(*cmd);
    ThrowIfUsageError(CheckCompileFlags(*f, *cmd));
  });
  return [f] { return RunCompile(*f); };
}

}  // namespace kjit::tools
