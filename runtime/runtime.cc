#include "runtime/runtime.h"

#include <mutex>
#include <set>

#include <fmt/format.h>

#include "jit/trace.h"
#include "runtime/runtime_state.h"

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
                                  void* params, int cluster) const {
  if (grid < 1 || grid > 0x7fffffff) {
    return absl::InvalidArgumentError(
        fmt::format("rows: {} blocks are outside the grid limit (1 to 2^31-1)", grid));
  }
  KJIT_RETURN_IF_ERROR(MakeCurrent());
  static const std::string kLaunch = "launch";
  const jit::NvtxRange nvtx(kLaunch);
  if (jit::Tracer::Global().launches()) {
    jit::Tracer::Global().Instant("launch", "launch",
                                  {{"function", fmt::format("{}", static_cast<void*>(fn))},
                                   {"grid", std::to_string(grid)}, {"block", std::to_string(block)},
                                   {"cluster", std::to_string(cluster)}});
  }
  void* args[] = {params};
  CUlaunchConfig config{};
  config.gridDimX = static_cast<unsigned>(grid);
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = static_cast<unsigned>(block);
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  CUlaunchAttribute attribute{};
  if (cluster > 1) {
    attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attribute.value.clusterDim.x = static_cast<unsigned>(cluster);
    attribute.value.clusterDim.y = attribute.value.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return driver->Check(driver->cuLaunchKernelEx(&config, fn, args, nullptr), "cuLaunchKernelEx");
}

}  // namespace internal

namespace {

// A bad database must not stop a training job: the ops fall back to their heuristics, and the
// user hears about it once per path (`kjit-tune` rebuilds a corrupt file).
std::shared_ptr<const autotune::TuningDb> LoadTuningDb(const std::string& option) {
  if (option == "off") return nullptr;
  const std::string path = option.empty() ? autotune::TuningDb::DefaultPath() : option;
  if (path.empty()) return nullptr;
  auto db = autotune::TuningDb::Load(path);
  if (!db.ok()) {
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(path).second) {
      fmt::print(stderr, "kjit: warning: ignoring the tuning database: {}\n",
                 ToStd(db.status().message()));
    }
    return nullptr;
  }
  if (db->records().empty()) return nullptr;
  return std::make_shared<const autotune::TuningDb>(std::move(*db));
}

}  // namespace

absl::StatusOr<Runtime> Runtime::Create(const RuntimeOptions& options) {
  auto state = std::make_shared<internal::RuntimeState>();
  KJIT_ASSIGN_OR_RETURN(state->jit, jit::Jit::Create(options.jit));
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
    KJIT_ASSIGN_OR_RETURN(state->target,
                          jit::SelectTargetForDevice(state->device.compute_capability(),
                                                     nvrtc->supported_archs(), nvrtc_version,
                                                     cu.version()));
  } else {
    KJIT_ASSIGN_OR_RETURN(state->target, jit::ParseTarget(options.target));
  }
  state->tuning = LoadTuningDb(options.tuning_db);
  return Runtime(std::move(state));
}

const jit::Target& Runtime::target() const { return state_->target; }
bool Runtime::compile_only() const { return state_->compile_only; }
const jit::DeviceInfo& Runtime::device() const { return state_->device; }
jit::Jit& Runtime::jit() const { return *state_->jit; }
const jit::Driver* Runtime::driver() const { return state_->driver; }
CUcontext Runtime::context() const { return state_->ctx; }
const autotune::TuningDb* Runtime::tuning_db() const { return state_->tuning.get(); }

}  // namespace kjit
