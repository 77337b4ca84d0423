// The C API's library and runtime entry points (kjit_version, kjit_last_error, kjit_free,
// kjit_runtime_*): the runtime options converted to the C++ ones, and the runtime's description
// as JSON. Each op family's entry points are in its own capi/*_capi.cc.
#include "capi/capi_common.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "jit/json_text.h"

namespace kjit::capi {

template <>
constexpr const char* kStructName<kjit_runtime_options> = "kjit_runtime_options";

namespace {

constexpr const char* kStatusNames[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

absl::StatusOr<RuntimeOptions> ToOptions(const kjit_runtime_options& o) {
  Fields f;
  RuntimeOptions cpp{.device = o.device,
                     .target = o.target != nullptr ? o.target : "",
                     .compile_only = f.Flag("compile_only", o.compile_only),
                     .disk_cache = f.Flag("disk_cache", o.disk_cache),
                     .cache_dir = o.cache_dir != nullptr ? o.cache_dir : "",
                     .tuning_db = o.tuning_db != nullptr ? o.tuning_db : "",
                     .autotune = f.Flag("autotune", o.autotune)};
  KJIT_RETURN_IF_ERROR(f.status());
  if (o.warning != nullptr) {
    cpp.warnings = [warn = o.warning, data = o.warning_user_data](std::string_view message) {
      warn(std::string(message).c_str(), data);
    };
  }
  return cpp;
}

}  // namespace

}  // namespace kjit::capi

// ---- Library ----------------------------------------------------------------------------------

uint32_t kjit_abi_version(void) { return KJIT_C_ABI_VERSION; }

const char* kjit_version(void) { return KJIT_VERSION; }

kjit_status kjit_full_version(char** out) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::Output(fn, "out", out));
    return kjit::capi::Return(kjit::FullVersionString(), out);
  });
}

const char* kjit_last_error(void) { return kjit::capi::last_error.c_str(); }

const char* kjit_status_name(kjit_status status) {
  const int code = static_cast<int>(status);
  return code >= 0 && code < std::ssize(kjit::capi::kStatusNames) ? kjit::capi::kStatusNames[code]
                                                                  : "";
}

void kjit_free(void* p) { std::free(p); }

// ---- Runtime ----------------------------------------------------------------------------------

void kjit_runtime_options_init(kjit_runtime_options* options) {
  if (options == nullptr) return;
  const kjit::RuntimeOptions d;
  *options = {.struct_size = sizeof(*options),
              .device = d.device,
              .target = nullptr,
              .compile_only = d.compile_only,
              .disk_cache = d.disk_cache,
              .cache_dir = nullptr,
              .tuning_db = nullptr,
              .autotune = d.autotune,
              .warning = nullptr,
              .warning_user_data = nullptr};
}

kjit_status kjit_runtime_create(const kjit_runtime_options* options, kjit_runtime** out) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::Output(fn, "out", out));
    kjit_runtime_options defaults;
    kjit_runtime_options_init(&defaults);
    const kjit_runtime_options& o = options != nullptr ? *options : defaults;
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckSize(fn, "options", o));
    KJIT_ASSIGN_OR_RETURN(const kjit::RuntimeOptions cpp, kjit::capi::ToOptions(o));
    KJIT_RETURN_IF_ERROR(kjit::Runtime::CheckToolchain(cpp.compile_only));
    KJIT_ASSIGN_OR_RETURN(kjit::Runtime rt, kjit::Runtime::Create(cpp));
    *out = new kjit_runtime{.rt = std::move(rt)};
    return absl::OkStatus();
  });
}

void kjit_runtime_destroy(kjit_runtime* runtime) { kjit::capi::DestroyHandle(__func__, runtime); }

kjit_status kjit_runtime_info(const kjit_runtime* runtime, char** json_out) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::Output(fn, "json_out", json_out));
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckHandle(fn, "runtime", runtime));
    const kjit::Runtime& rt = runtime->rt;
    nlohmann::json info = {{"target", rt.target()},
                           {"arch", rt.arch()},
                           {"compile_only", rt.compile_only()},
                           {"device", nullptr}};
    if (!rt.compile_only()) {
      const kjit::DeviceInfo& d = rt.device();
      info["device"] = {{"ordinal", d.ordinal},
                        {"name", d.name},
                        {"compute_capability", d.compute_capability()},
                        {"sm_count", d.sm_count},
                        {"total_memory", d.total_memory}};
    }
    return kjit::capi::Return(kjit::jit::JsonText(info), json_out);
  });
}
