#include "jit/nvrtc.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "jit/exit_gate.h"
#include "jit/status_helpers.h"

namespace kjit::jit {

namespace {

// How Load's error starts when no candidate loads; DynLib's "could not load ..." follows.
constexpr std::string_view kNotLoaded = "NVRTC (libnvrtc) is not available: ";
// What Load says when no candidate loads: kNotLoaded, the reason, the fix.
constexpr DynLib::Missing kNoNvrtc{
    absl::StatusCode::kNotFound,
    "NVRTC (libnvrtc) is not available: {}\nfix: install the CUDA toolkit's NVRTC (e.g. the "
    "cuda-nvrtc-13-0 package, or pip's nvidia-cuda-nvrtc) or point KJIT_NVRTC_PATH at libnvrtc.so"};
static_assert(kNoNvrtc.message.starts_with(kNotLoaded));

// KJIT_NVRTC_PATH, or nullptr when unset or empty.
const char* NvrtcPathVariable() {
  const char* env = std::getenv("KJIT_NVRTC_PATH");
  return env != nullptr && *env != '\0' ? env : nullptr;
}

// The builtins library that the libnvrtc at `nvrtc_path` dlopens by name at its first compile:
// libnvrtc-builtins.so.13.0 for NVRTC 13.0, libnvrtc-builtins.alt.so.13.0 for libnvrtc.alt.so.13.
std::string BuiltinsName(const std::string& nvrtc_path, NvrtcVersion version) {
  const bool alt =
      std::filesystem::path(nvrtc_path).filename().string().starts_with("libnvrtc.alt.");
  return fmt::format("libnvrtc-builtins{}.so.{}", alt ? ".alt" : "", version.ToString());
}

// Opens the builtins beside libnvrtc, else wherever the loader finds them. libnvrtc has no RUNPATH
// (neither the toolkit's nor pip's nvidia-cuda-nvrtc), so its own dlopen by name finds a copy
// beside it only through LD_LIBRARY_PATH or ldconfig; once this one is loaded, the loader answers
// that dlopen with it (it matches loaded libraries by soname).
absl::StatusOr<DynLib> LoadBuiltins(const std::string& nvrtc_path, NvrtcVersion version) {
  const std::string name = BuiltinsName(nvrtc_path, version);
  const std::filesystem::path dir = std::filesystem::path(nvrtc_path).parent_path();
  std::vector<std::string> candidates{name};
  if (!dir.empty()) candidates.insert(candidates.begin(), (dir / name).string());
  auto builtins = DynLib::Open(candidates);
  if (builtins.ok()) return builtins;
  return absl::FailedPreconditionError(fmt::format(
      "{} (NVRTC {}) cannot compile without {}, found neither beside it nor on the loader's path "
      "({}); fix: install the libnvrtc-builtins of the same CUDA version beside it (pip's "
      "nvidia-cuda-nvrtc and the toolkit's cuda-nvrtc package ship both), or point "
      "KJIT_NVRTC_PATH at a libnvrtc that has them",
      nvrtc_path, version.ToString(), name, ToStd(builtins.status().message())));
}

}  // namespace

std::vector<std::string> DefaultNvrtcCandidates() {
  // A path the user named is the only one tried: falling back to another NVRTC would hide the
  // mistake and compile with a version they did not choose.
  if (const char* env = NvrtcPathVariable()) return {env};
  std::vector<std::string> out;
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) out.push_back(name);
  for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"}) {
    out.push_back(fmt::format("{}/libnvrtc.so", dir));
  }
  return out;
}

absl::StatusOr<Nvrtc> Nvrtc::Load(const std::vector<std::string>& candidates) {
  // Loading runs NVRTC's static constructors, which register its destructors before the handler.
  const ExitGate::Startup startup;
  KJIT_ASSIGN_OR_RETURN(DynLib lib, DynLib::Open(candidates, kNoNvrtc));
  // Its static destructors are registered now: exit must wait for a compile before they run.
  ExitGate::Arm();
  Nvrtc n(std::move(lib));
  SymbolResolver symbols(n.lib_);
#define KJIT_NVRTC_LOAD(name) symbols.Resolve(n.name, #name)
  KJIT_NVRTC_LOAD(nvrtcGetErrorString);
  KJIT_NVRTC_LOAD(nvrtcVersion);
  KJIT_NVRTC_LOAD(nvrtcGetNumSupportedArchs);
  KJIT_NVRTC_LOAD(nvrtcGetSupportedArchs);
  KJIT_NVRTC_LOAD(nvrtcCreateProgram);
  KJIT_NVRTC_LOAD(nvrtcDestroyProgram);
  KJIT_NVRTC_LOAD(nvrtcCompileProgram);
  KJIT_NVRTC_LOAD(nvrtcGetProgramLogSize);
  KJIT_NVRTC_LOAD(nvrtcGetProgramLog);
  KJIT_NVRTC_LOAD(nvrtcGetPTXSize);
  KJIT_NVRTC_LOAD(nvrtcGetPTX);
  KJIT_NVRTC_LOAD(nvrtcGetCUBINSize);
  KJIT_NVRTC_LOAD(nvrtcGetCUBIN);
  KJIT_NVRTC_LOAD(nvrtcAddNameExpression);
  KJIT_NVRTC_LOAD(nvrtcGetLoweredName);
#undef KJIT_NVRTC_LOAD
  KJIT_RETURN_IF_ERROR(
      symbols.Check("kjit needs NVRTC 11.2 or newer (CUDA 12.8+ for Blackwell); fix: install a "
                    "newer CUDA toolkit or set KJIT_NVRTC_PATH"));
  KJIT_RETURN_IF_ERROR(
      n.Check(n.nvrtcVersion(&n.version_.major, &n.version_.minor), "nvrtcVersion"));
  int count = 0;
  KJIT_RETURN_IF_ERROR(n.Check(n.nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs"));
  n.archs_.resize(count);
  if (count > 0) {
    KJIT_RETURN_IF_ERROR(
        n.Check(n.nvrtcGetSupportedArchs(n.archs_.data()), "nvrtcGetSupportedArchs"));
  }
  KJIT_ASSIGN_OR_RETURN(DynLib builtins, LoadBuiltins(n.path(), n.version_));
  n.builtins_.emplace(std::move(builtins));
  return n;
}

absl::StatusOr<Nvrtc> Nvrtc::LoadDefault() {
  const char* env = NvrtcPathVariable();
  if (env == nullptr) return Load(DefaultNvrtcCandidates());
  absl::StatusOr<Nvrtc> n = Load({env});
  if (n.ok()) return n;
  // Load words its errors for a search, with a fix of its own; this one is about the variable.
  std::string_view why = ToStd(n.status().message());
  why = why.substr(0, std::min(why.find('\n'), why.find("; fix: ")));
  if (why.starts_with(kNotLoaded)) why.remove_prefix(kNotLoaded.size());
  return absl::Status(
      n.status().code(),
      fmt::format("KJIT_NVRTC_PATH={} cannot be used as NVRTC: {}\nfix: point KJIT_NVRTC_PATH at "
                  "the libnvrtc.so of a CUDA toolkit (e.g. /usr/local/cuda/lib64/libnvrtc.so), or "
                  "unset it to search the default places",
                  env, why));
}

absl::StatusOr<const Nvrtc*> Nvrtc::Get() { return LoadedOnce<Nvrtc>(&Nvrtc::LoadDefault); }

absl::Status Nvrtc::Check(nvrtcResult result, const char* call) const {
  if (result == NVRTC_SUCCESS) return absl::OkStatus();
  return absl::InternalError(fmt::format("{} failed: {} ({})", call, nvrtcGetErrorString(result),
                                         static_cast<int>(result)));
}

}  // namespace kjit::jit
