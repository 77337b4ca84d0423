// A dlopen()ed shared library that closes itself, and the skeleton every loader of one shares.
//
// kjit links none of libcuda, libnvrtc, libnccl and libcublasLt, so that every program starts on a
// machine without them; their wrappers (jit/driver.h, jit/nvrtc.h, ops/cross_entropy/nccl.h,
// ops/linear_cross_entropy/cublaslt.h) load them through this, each the same way: candidates (an
// environment variable's path alone, else the usual names), an error that says how to fix a missing
// library, every function resolved or the missing ones named, and one instance per process.
//
//   absl::StatusOr<Nccl> Nccl::Load() {
//     KJIT_ASSIGN_OR_RETURN(DynLib lib, DynLib::Open(CandidatesFor("KJIT_NCCL_LIBRARY",
//         {"libnccl.so.2"}), {absl::StatusCode::kFailedPrecondition, "no NCCL: {}; fix: ..."}));
//     Nccl n(std::move(lib));
//     SymbolResolver symbols(n.lib_);
//     symbols.Resolve(n.all_reduce_, "ncclAllReduce");
//     KJIT_RETURN_IF_ERROR(symbols.Check("NCCL 2.13 or newer is needed"));
//     return n;
//   }
//   absl::StatusOr<const Nccl*> Nccl::Get() { return LoadedOnce<Nccl>(&Nccl::Load); }
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kjit/status.h"

namespace kjit::jit {

class DynLib {
 public:
  // Tries each candidate in order; the error lists every attempt and dlerror()'s reason.
  static absl::StatusOr<DynLib> Open(const std::vector<std::string>& candidates);
  // What a loader says when no candidate loads: its code, and a message with one "{}" for the
  // reason above, saying what is missing and how to fix it.
  struct Missing {
    absl::StatusCode code;
    std::string_view message;
  };
  // The same, with `missing`'s error.
  static absl::StatusOr<DynLib> Open(const std::vector<std::string>& candidates,
                                     const Missing& missing);

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

// A loader's member for the library's function `name`: its exact type, null until resolved.
//   KJIT_DYNLIB_FN(cuInit);   // decltype(&::cuInit) cuInit = nullptr;
#define KJIT_DYNLIB_FN(name) decltype(&::name) name = nullptr

// What a loader tries: the path in $env_var alone when it is set and not empty (falling back to
// another copy would hide the user's mistake), else `defaults`.
std::vector<std::string> CandidatesFor(const char* env_var, std::vector<std::string> defaults);

// Resolves a library's functions into typed pointers, remembering the names it does not find.
class SymbolResolver {
 public:
  explicit SymbolResolver(const DynLib& lib) : lib_(lib) {}

  template <typename Fn>
  void Resolve(Fn*& fn, const char* name) {
    fn = reinterpret_cast<Fn*>(lib_.Symbol(name));
    if (fn == nullptr) missing_ += std::string(" ") + name;
  }
  // OK when every name resolved, else FailedPrecondition "<path> lacks <names>: <requirement>".
  absl::Status Check(std::string_view requirement) const;

 private:
  const DynLib& lib_;
  std::string missing_;
};

// The process's one instance of `Library`, loaded by the first call's `load`, or the error it
// failed with, remembered. One loader per Library type: later calls get the first one's result.
template <typename Library>
absl::StatusOr<const Library*> LoadedOnce(absl::StatusOr<Library> (*load)()) {
  static const auto* loaded = new absl::StatusOr<Library>(load());  // never destroyed: used at exit
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace kjit::jit
