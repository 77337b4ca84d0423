// A dlopen()ed shared library that closes itself.
//
// kjit links neither libcuda nor libnvrtc so that every program starts on a machine without them;
// the driver and NVRTC wrappers open them through this.
//
//   KJIT_ASSIGN_OR_RETURN(DynLib lib, DynLib::Open({"libnvrtc.so.13", "libnvrtc.so"}));
//   void* fn = lib.Symbol("nvrtcVersion");
#pragma once

#include <string>
#include <vector>

#include "kjit/status.h"

namespace kjit::jit {

class DynLib {
 public:
  // Tries each candidate in order; the error lists every attempt and dlerror()'s reason.
  static absl::StatusOr<DynLib> Open(const std::vector<std::string>& candidates);

  DynLib(DynLib&& other) noexcept;
  DynLib& operator=(DynLib&& other) noexcept;
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;
  ~DynLib();

  // nullptr when the symbol is absent.
  void* Symbol(const char* name) const;
  // The file the dynamic loader actually opened.
  const std::string& path() const { return path_; }

 private:
  DynLib(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace kjit::jit
