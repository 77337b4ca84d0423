#include "jit/dynlib.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>

#include <fmt/format.h>

namespace kjit::jit {

absl::StatusOr<DynLib> DynLib::Open(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", why ? why : name + ": not found");
      continue;
    }
    std::string path = name;
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
        map->l_name[0] != '\0') {
      path = map->l_name;
    }
    return DynLib(handle, std::move(path));
  }
  return absl::NotFoundError(fmt::format("could not load {}", tried));
}

absl::StatusOr<DynLib> DynLib::Open(const std::vector<std::string>& candidates,
                                    const Missing& missing) {
  absl::StatusOr<DynLib> lib = Open(candidates);
  if (lib.ok()) return lib;
  const absl::string_view why = lib.status().message();
  return absl::Status(missing.code, fmt::format(fmt::runtime(missing.message),
                                                std::string_view(why.data(), why.size())));
}

std::vector<std::string> CandidatesFor(const char* env_var, std::vector<std::string> defaults) {
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') return {env};
  return defaults;
}

absl::Status SymbolResolver::Check(std::string_view requirement) const {
  if (missing_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      fmt::format("{} lacks{}: {}", lib_.path(), missing_, requirement));
}

DynLib::DynLib(DynLib&& other) noexcept : handle_(other.handle_), path_(std::move(other.path_)) {
  other.handle_ = nullptr;
}

DynLib& DynLib::operator=(DynLib&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = other.handle_;
    path_ = std::move(other.path_);
    other.handle_ = nullptr;
  }
  return *this;
}

DynLib::~DynLib() {
  if (handle_ != nullptr) dlclose(handle_);
}

void* DynLib::Symbol(const char* name) const { return dlsym(handle_, name); }

}  // namespace kjit::jit
