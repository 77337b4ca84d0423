#include "jit/compiler.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <absl/strings/cord.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "jit/exit_gate.h"

namespace kjit::jit {

std::vector<std::string> CompileOptions(const Target& target) {
  // Not -minimal (NVRTC 12.4+): it saved 4-6 ms a program, but with it LeakSanitizer's tracer
  // crashed at the exit of a test that compiles the lm_head op's programs, every time under ctest
  // (never run directly), and the saving is within the noise of a 0.2 s compile.
  return {target.GpuArchitectureOption(), "--std=c++17", "--fmad=true", "--device-int128"};
}

namespace {

std::string ProgramLog(const Nvrtc& nvrtc, nvrtcProgram prog) {
  size_t size = 0;
  if (nvrtc.nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1) return "";
  std::string log(size, '\0');
  if (nvrtc.nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) return "";
  // The log ends in a NUL, and ptxas's part brings one of its own: none may reach a message, where
  // a C caller would see it cut and JSON would hold \u0000.
  std::erase(log, '\0');
  return log;
}

// NVRTC registers a few static destructors of its own only at its first compile, after
// ExitGate's handler (registered when NVRTC was loaded), so those would run first at exit. The
// first compile with each loaded NVRTC is therefore preceded by a trivial one (tens of
// milliseconds, once per process), after which the handler is registered again and runs before
// them all. Other threads' first compiles wait for it, and so does exit() (ExitGate::Startup).
void WarmUp(const Nvrtc& nvrtc, const std::vector<const char*>& options) {
  static std::mutex mu;
  static auto* warmed = new std::map<const void*, bool>();
  std::lock_guard<std::mutex> lock(mu);
  bool& done = (*warmed)[reinterpret_cast<const void*>(nvrtc.nvrtcCompileProgram)];
  if (done) return;
  done = true;
  const ExitGate::Startup startup;  // until the handler is registered again, below
  nvrtcProgram prog = nullptr;
  if (nvrtc.nvrtcCreateProgram(&prog, "extern \"C\" __global__ void kjit_warm_up() {}",
                               "kjit_warm_up.cu", 0, nullptr, nullptr) == NVRTC_SUCCESS) {
    nvrtc.nvrtcCompileProgram(prog, static_cast<int>(options.size()), options.data());
    nvrtc.nvrtcDestroyProgram(&prog);
  }
  ExitGate::Arm();
}

}  // namespace

absl::StatusOr<Binary> Compile(const Nvrtc& nvrtc, const Source& source, const Target& target) {
  KJIT_RETURN_IF_ERROR(CheckNvrtcSupports(target, nvrtc.supported_archs()));
  // exit() on another thread waits for this pass before NVRTC's destructors run, and fork() for
  // the use (exit_gate.h).
  ExitGate::Pass pass;
  ExitGate::NvrtcUse use;
  if (ExitGate::nvrtc_unusable()) {
    return absl::FailedPreconditionError(fmt::format(
        "cannot compile '{}': this process was forked while another thread of its parent "
        "compiled for over {} s, and NVRTC's locks stayed with that thread; build the kernels "
        "before forking, or start workers with spawn instead of fork",
        source.name, ExitGate::kMaxWait.count()));
  }
  std::vector<const char*> header_texts, header_names;
  for (const auto& [name, text] : source.headers) {
    header_names.push_back(name.c_str());
    header_texts.push_back(text.c_str());
  }
  nvrtcProgram prog = nullptr;
  KJIT_RETURN_IF_ERROR(nvrtc.Check(
      nvrtc.nvrtcCreateProgram(&prog, source.text.c_str(), (source.name + ".cu").c_str(),
                               static_cast<int>(header_texts.size()), header_texts.data(),
                               header_names.data()),
      "nvrtcCreateProgram"));
  auto destroy = [&nvrtc](nvrtcProgram* p) { nvrtc.nvrtcDestroyProgram(p); };
  std::unique_ptr<nvrtcProgram, decltype(destroy)> guard(&prog, destroy);

  for (const std::string& expr : source.name_expressions) {
    KJIT_RETURN_IF_ERROR(
        nvrtc.Check(nvrtc.nvrtcAddNameExpression(prog, expr.c_str()), "nvrtcAddNameExpression"));
  }
  const std::vector<std::string> options = CompileOptions(target);
  std::vector<const char*> option_ptrs;
  for (const std::string& o : options) option_ptrs.push_back(o.c_str());
  WarmUp(nvrtc, option_ptrs);

  nvrtcResult compiled =
      nvrtc.nvrtcCompileProgram(prog, static_cast<int>(option_ptrs.size()), option_ptrs.data());
  std::string log = ProgramLog(nvrtc, prog);
  if (compiled != NVRTC_SUCCESS) {
    absl::Status err = absl::InternalError(fmt::format(
        "NVRTC failed to compile '{}' for {}: {}\n  params: {}\n  options: {}\n  NVRTC {} ({})\n"
        "--- log ---\n{}",
        source.name, target.ToString(), nvrtc.nvrtcGetErrorString(compiled),
        FormatParams(source.params), fmt::join(options, " "), nvrtc.version().ToString(),
        nvrtc.path(), log));
    err.SetPayload(kCompileLogPayload, absl::Cord(log));
    return err;
  }

  Binary bin;
  bin.target = target;
  size_t size = 0;
  if (target.kind == Target::Kind::kCubin) {
    KJIT_RETURN_IF_ERROR(nvrtc.Check(nvrtc.nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize"));
    // NVRTC reports success with size 0 when the target was virtual; never cache an empty CUBIN.
    if (size == 0) {
      return absl::InternalError(fmt::format("NVRTC produced an empty CUBIN for {} ('{}')",
                                             target.ToString(), source.name));
    }
    bin.code.resize(size);
    KJIT_RETURN_IF_ERROR(nvrtc.Check(nvrtc.nvrtcGetCUBIN(prog, bin.code.data()), "nvrtcGetCUBIN"));
  } else {
    KJIT_RETURN_IF_ERROR(nvrtc.Check(nvrtc.nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize"));
    if (size <= 1) {
      return absl::InternalError(
          fmt::format("NVRTC produced empty PTX for {} ('{}')", target.ToString(), source.name));
    }
    bin.code.resize(size);
    KJIT_RETURN_IF_ERROR(nvrtc.Check(nvrtc.nvrtcGetPTX(prog, bin.code.data()), "nvrtcGetPTX"));
  }
  for (const std::string& expr : source.name_expressions) {
    const char* lowered = nullptr;
    KJIT_RETURN_IF_ERROR(nvrtc.Check(nvrtc.nvrtcGetLoweredName(prog, expr.c_str(), &lowered),
                                     "nvrtcGetLoweredName"));
    bin.lowered_names[expr] = lowered;
  }
  bin.nvrtc_version = nvrtc.version().ToString();
  bin.options = options;
  bin.params = source.params;
  bin.program_name = source.name;
  bin.created_unix = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  bin.log = std::move(log);
  return bin;
}

}  // namespace kjit::jit
