// `kjit compile`: render, compile (or find in the cache) one op's kernels and say where they lie.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/kjit.h"
#include "tools/commands.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct CompileFlags {
  std::string op;
  int64_t hidden = 0;
  std::string dtype = "bf16";
  std::string weight_dtype;
  std::string casting = "llama";
  bool residual = false;
  std::string arch = "auto";
  bool json = false;
};

int RunCompile(const CompileFlags& f) {
  auto dtype = ParseDType(f.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  RmsNormSpec spec{.hidden = f.hidden, .dtype = *dtype};
  if (!f.weight_dtype.empty()) {
    auto w = ParseDType(f.weight_dtype);
    if (!w.ok()) return Fail(w.status());
    spec.weight_dtype = *w;
  }
  spec.casting = f.casting == "gemma" ? RmsNormCasting::kGemma : RmsNormCasting::kLlama;
  spec.fused_residual = f.residual;

  auto runtimes = RuntimesForArch(f.arch);
  if (!runtimes.ok()) return Fail(runtimes.status());
  nlohmann::json report = nlohmann::json::array();
  int failures = 0;
  for (const Runtime& rt : *runtimes) {
    auto built = [&]() -> absl::StatusOr<jit::Jit::Built> {
      KJIT_ASSIGN_OR_RETURN(RmsNorm norm, rt.RmsNorm(spec));
      return norm.Build();
    }();
    if (!built.ok()) {
      ++failures;
      fmt::print(stderr, "kjit compile: {}: {}\n", rt.target().ToString(),
                 ToStd(built.status().message()));
      report.push_back({{"target", rt.target().ToString()},
                        {"error", std::string(ToStd(built.status().message()))}});
      continue;
    }
    const jit::Binary& bin = *built->binary;
    const std::string config = bin.params.count("config") ? bin.params.at("config") : "";
    if (f.json) {
      report.push_back({{"op", f.op},
                        {"target", bin.target.ToString()},
                        {"key", built->key},
                        {"config", config},
                        {"origin", jit::OriginName(built->origin)},
                        {"path", built->path},
                        {"bytes", bin.code.size()},
                        {"params", bin.params},
                        {"nvrtc", bin.nvrtc_version}});
    } else {
      fmt::print("{} {} -> {}\n  key     {}\n  config  {}\n  from    {}\n  path    {}\n  size    {} bytes\n",
                 f.op, jit::FormatParams(bin.params), bin.target.ToString(), built->key, config,
                 jit::OriginName(built->origin), built->path.empty() ? "(memory only)" : built->path,
                 bin.code.size());
    }
  }
  if (f.json) fmt::print("{}\n", report.dump(2));
  return failures == 0 ? 0 : 1;
}

}  // namespace

Command AddCompileCommand(CLI::App& app) {
  auto f = std::make_shared<CompileFlags>();
  CLI::App* cmd = app.add_subcommand(
      "compile", "Render and compile one op's kernels (or find them in the cache); no GPU needed");
  cmd->add_option("--op", f->op, "The op")->required()->check(CLI::IsMember({"rms_norm"}));
  cmd->add_option("--hidden", f->hidden, "Hidden size (rms_norm)")->required()->check(CLI::Range(1, 65536));
  cmd->add_option("--dtype", f->dtype, "fp32, fp16 or bf16")->capture_default_str();
  cmd->add_option("--weight-dtype", f->weight_dtype, "Weight dtype (default: --dtype)");
  cmd->add_option("--casting", f->casting, "llama or gemma")
      ->check(CLI::IsMember({"llama", "gemma"}))
      ->capture_default_str();
  cmd->add_flag("--residual", f->residual, "Fuse the residual add");
  cmd->add_option("--arch", f->arch,
                  "auto (the GPU present, else sm_90 and sm_100) or a list: sm_90,sm_100,compute_90")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print a JSON report");
  return [f] { return RunCompile(*f); };
}

}  // namespace kjit::tools
