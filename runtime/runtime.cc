#include "kjit/runtime.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "jit/nvrtc.h"
#include "jit/status_helpers.h"
#include "jit/trace.h"
#include "jit/warnings.h"
#include "runtime/op_kernels.h"
#include "runtime/runtime_state.h"
#include "runtime/tuned_configs.h"

namespace kjit {
namespace internal {

RuntimeState::~RuntimeState() {
  jit.reset();  // unloads modules while the context is alive
  if (driver != nullptr && ctx != nullptr) driver->cuDevicePrimaryCtxRelease(cu_device);
}

absl::Status RuntimeState::MakeCurrent() const {
  CUcontext current = nullptr;
  KJIT_RETURN_IF_ERROR(driver->Check(driver->cuCtxGetCurrent(&current), "cuCtxGetCurrent"));
  if (current == ctx) return absl::OkStatus();
  return driver->Check(driver->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

absl::Status RuntimeState::NeedsDevice() const {
  if (compile_only) {
    return absl::FailedPreconditionError(
        "this runtime is compile-only (no GPU): kernels can be built but not launched");
  }
  return absl::OkStatus();
}

absl::Status RuntimeState::Launch(CUfunction fn, int64_t grid, int block, CUstream stream,
                                  void* params, int cluster, int shared_bytes,
                                  bool overlap_previous) const {
  if (grid < 1 || grid > 0x7fffffff) {
    return absl::InvalidArgumentError(
        fmt::format("rows: {} blocks are outside the grid limit (1 to 2^31-1)", grid));
  }
  KJIT_RETURN_IF_ERROR(MakeCurrent());
  static const auto* kLaunch = new std::string("launch");  // never destroyed: launches at exit
  const jit::NvtxRange nvtx(*kLaunch);
  if (jit::Tracer::Global().launches()) {
    jit::Tracer::Global().Instant("launch", "launch",
                                  {{"function", fmt::format("{}", static_cast<void*>(fn))},
                                   {"grid", std::to_string(grid)},
                                   {"block", std::to_string(block)},
                                   {"cluster", std::to_string(cluster)}});
  }
  void* args[] = {params};
  CUlaunchConfig config{};
  config.gridDimX = static_cast<unsigned>(grid);
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = static_cast<unsigned>(block);
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  config.sharedMemBytes = static_cast<unsigned>(shared_bytes);
  CUlaunchAttribute attributes[2]{};
  config.attrs = attributes;
  if (cluster > 1) {
    CUlaunchAttribute& a = attributes[config.numAttrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim.x = static_cast<unsigned>(cluster);
    a.value.clusterDim.y = a.value.clusterDim.z = 1;
  }
  if (overlap_previous && target.arch >= 90) {
    CUlaunchAttribute& a = attributes[config.numAttrs++];
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
  }
  return driver->Check(driver->cuLaunchKernelEx(&config, fn, args, nullptr), "cuLaunchKernelEx");
}

absl::Status RuntimeState::AllowSharedBytes(CUfunction fn, int shared_bytes) const {
  KJIT_RETURN_IF_ERROR(MakeCurrent());
  return driver->Check(
      driver->cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes),
      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

std::shared_ptr<const TuningDb> RuntimeState::Tuning() const {
  std::lock_guard<std::mutex> lock(tuning_mu);
  return tuning;
}

bool RuntimeState::Capturing(CUstream stream) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // An error (a stream of another context, say) counts as capturing: then nothing is tuned.
  if (driver->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace internal

namespace {

// A bad database must not stop a training job: the ops fall back to their heuristics, and the
// user hears about it through the warning sink (`kjit-tune` rebuilds a corrupt file).
std::shared_ptr<const internal::TuningDb> LoadTuningDb(const std::string& path,
                                                       const WarningSink& warn) {
  if (path.empty()) return nullptr;
  auto db = internal::TuningDb::Load(path);
  if (!db.ok()) {
    warn(fmt::format("ignoring the tuning database: {}", ToStd(db.status().message())));
    return nullptr;
  }
  if (db->records().empty()) return nullptr;
  return std::make_shared<const internal::TuningDb>(std::move(*db));
}

// One tuning at a time per GPU, whichever runtime asks: tunings at once would time each other.
std::mutex& TuningLockFor(int device) {
  static std::mutex mu;
  static auto* locks = new std::map<int, std::mutex>();  // never destroyed, as the threads may run
  std::lock_guard<std::mutex> lock(mu);
  return (*locks)[device];
}

}  // namespace

void internal::RuntimeState::TuneNow(const std::string& spec_json, int64_t rows) const {
  const std::shared_ptr<Tuner> tuner = DefaultTuner();
  if (tuner == nullptr) {
    std::call_once(no_tuner_warned, [this] {
      Warn(
          "KJIT_AUTOTUNE is set but no tuner is installed (link kjit_launch_tuner, or call "
          "kjit::SetDefaultTuner); launching untuned");
    });
    return;
  }
  absl::Status tuned;
  {
    std::lock_guard<std::mutex> one_at_a_time(TuningLockFor(device.ordinal));
    tuned = tuner->Tune({.spec_json = spec_json,
                         .rows = rows,
                         .tuning_db = tuning_path,
                         .device = device.ordinal,
                         .warnings = warnings});
  }
  if (!tuned.ok()) Warn(fmt::format("{}; launching untuned", ToStd(tuned.message())));
  std::shared_ptr<const internal::TuningDb> db = LoadTuningDb(tuning_path, warnings);
  std::lock_guard<std::mutex> lock(tuning_mu);
  tuning = std::move(db);
}

absl::StatusOr<Runtime> Runtime::Create(const RuntimeOptions& options) {
  auto state = std::make_shared<internal::RuntimeState>();
  state->warnings = options.warnings ? options.warnings : jit::WarnOnceToStderr;
  jit::Jit::Options jit_options{.use_disk_cache = options.disk_cache, .warn = state->warnings};
  if (!options.cache_dir.empty())
    jit_options.cache = jit::DiskCache::Options{.dir = options.cache_dir};
  KJIT_ASSIGN_OR_RETURN(state->jit, jit::Jit::Create(jit_options));
  state->compile_only = options.compile_only;
  if (options.compile_only) {
    if (options.target.empty()) {
      return absl::InvalidArgumentError(
          "target: a compile-only runtime needs an explicit target such as sm_90 or sm_100");
    }
    KJIT_ASSIGN_OR_RETURN(state->target, jit::ParseTarget(options.target));
    return Runtime(std::move(state));
  }
  KJIT_ASSIGN_OR_RETURN(state->driver, jit::Driver::Get());
  const jit::Driver& cu = *state->driver;
  KJIT_ASSIGN_OR_RETURN(state->device, jit::QueryDevice(cu, options.device));
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuDeviceGet(&state->cu_device, options.device), "cuDeviceGet"));
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuDevicePrimaryCtxRetain(&state->ctx, state->cu_device),
                                "cuDevicePrimaryCtxRetain"));
  KJIT_RETURN_IF_ERROR(state->MakeCurrent());
  if (options.target.empty()) {
    KJIT_ASSIGN_OR_RETURN(const jit::Nvrtc* nvrtc, jit::Nvrtc::Get());
    const int nvrtc_version = nvrtc->version().major * 1000 + nvrtc->version().minor * 10;
    KJIT_ASSIGN_OR_RETURN(
        state->target,
        jit::SelectTargetForDevice(state->device.compute_capability(), nvrtc->supported_archs(),
                                   nvrtc_version, cu.version()));
  } else {
    KJIT_ASSIGN_OR_RETURN(state->target, jit::ParseTarget(options.target));
  }
  if (options.tuning_db != "off") {
    state->tuning_path =
        options.tuning_db.empty() ? internal::TuningDb::DefaultPath() : options.tuning_db;
  }
  state->tuning = LoadTuningDb(state->tuning_path, state->warnings);
  const char* env = std::getenv("KJIT_AUTOTUNE");
  state->autotune = !state->tuning_path.empty() &&
                    (options.autotune || (env != nullptr && std::string_view(env) == "1"));
  return Runtime(std::move(state));
}

absl::Status Runtime::CheckToolchain(bool compile_only) {
  absl::Status s = compile_only ? absl::OkStatus() : jit::Driver::Get().status();
  if (s.ok()) s = jit::Nvrtc::Get().status();
  return s.ok() ? s : absl::UnavailableError(s.message());
}

std::string Runtime::target() const { return state_->target.ToString(); }
int Runtime::arch() const { return state_->target.arch; }
bool Runtime::compile_only() const { return state_->compile_only; }
const DeviceInfo& Runtime::device() const { return state_->device; }

absl::StatusOr<internal::LoadedProgram> internal::LoadProgram(const RuntimeState& rt,
                                                              const jit::Source& source) {
  return LoadProgram(rt, source, rt.target);
}

absl::StatusOr<internal::LoadedProgram> internal::LoadProgram(const RuntimeState& rt,
                                                              const jit::Source& source,
                                                              const jit::Target& target) {
  LoadedProgram p;
  KJIT_ASSIGN_OR_RETURN(p.module, rt.jit->Load(source, target, *rt.driver, rt.ctx));
  for (const std::string& expr : source.name_expressions) {
    KJIT_ASSIGN_OR_RETURN(CUfunction f, p.module->Function(expr));
    p.functions.push_back(f);
  }
  return p;
}

absl::StatusOr<std::vector<internal::LoadedProgram>> internal::LoadPrograms(
    const RuntimeState& rt, const std::vector<jit::Source>& sources) {
  // Built first, all at once; each Load below then finds its binary in memory.
  if (sources.size() > 1) KJIT_RETURN_IF_ERROR(rt.jit->BuildAll(sources, rt.target).status());
  std::vector<LoadedProgram> programs;
  for (const jit::Source& source : sources) {
    KJIT_ASSIGN_OR_RETURN(LoadedProgram program, LoadProgram(rt, source));
    programs.push_back(std::move(program));
  }
  return programs;
}

internal::TuningKey internal::TuningKeyFor(const RuntimeState& rt, const std::string& op,
                                           const std::string& shape, DType dtype, int64_t rows) {
  TuningKey k{.op = op, .dtype = Name(dtype), .shape = shape, .rows_bucket = RowsBucket(rows)};
  if (rt.compile_only) return k;
  k.device = rt.device.name;
  k.arch = rt.target.arch;
  k.driver = rt.driver->version();
  if (auto nvrtc = jit::Nvrtc::Get(); nvrtc.ok()) {
    k.nvrtc = (*nvrtc)->version().major * 1000 + (*nvrtc)->version().minor * 10;
  }
  return k;
}

BuildInfo internal::ToBuildInfo(const jit::Jit::Built& built) {
  BuildInfo info{.key = built.key,
                 .program = built.binary->program_name,
                 .target = built.binary->target.ToString(),
                 .origin = jit::OriginName(built.origin),
                 .path = built.path,
                 .bytes = built.binary->code.size(),
                 .nvrtc = built.binary->nvrtc_version,
                 .params = built.binary->params};
  for (const auto& [expr, lowered] : built.binary->lowered_names) info.kernels.push_back(lowered);
  info.programs.push_back(info);
  return info;
}

BuildInfo internal::ToBuildInfo(const std::vector<jit::Jit::Built>& programs) {
  if (programs.empty()) return {};
  BuildInfo info = ToBuildInfo(programs[0]);
  info.programs.clear();
  info.kernels.clear();
  info.bytes = 0;
  // The origin that cost the most: compiled, then read from disk, then found in memory.
  auto rank = [](jit::Jit::Origin o) {
    return o == jit::Jit::Origin::kCompiled ? 2 : o == jit::Jit::Origin::kDisk ? 1 : 0;
  };
  jit::Jit::Origin origin = programs[0].origin;
  for (const jit::Jit::Built& built : programs) {
    BuildInfo one = ToBuildInfo(built);
    one.programs.clear();
    if (rank(built.origin) > rank(origin)) origin = built.origin;
    if (built.path.empty()) info.path.clear();
    info.bytes += one.bytes;
    info.kernels.insert(info.kernels.end(), one.kernels.begin(), one.kernels.end());
    info.programs.push_back(std::move(one));
  }
  info.origin = jit::OriginName(origin);
  return info;
}

}  // namespace kjit
