// CublasLt: the cuBLASLt calls the fused linear + cross-entropy op makes, from libcublasLt opened
// with dlopen on first use (like libcuda, libnvrtc and NCCL), so that nothing else in kjit needs
// it. $KJIT_CUBLASLT_PATH names the library; without it libcublasLt.so.13, .so.12 and .so are
// tried on the loader's path (a process that imported torch already has one loaded), then the
// toolkit's /usr/local/cuda/lib64/libcublasLt.so.
//
// LtGemm states a GEMM on row-major views, as a framework would, and keeps one plan (descriptors
// and cuBLASLt's heuristic list of algorithms) per shape, so a launch makes no host-side search:
//
//   KJIT_ASSIGN_OR_RETURN(const CublasLt* lt, CublasLt::Get());
//   KJIT_ASSIGN_OR_RETURN(std::unique_ptr<LtGemm> gemm, LtGemm::Create(*lt));
//   // logits = h · Wᵀ (+ bias), the heuristic's first algorithm:
//   KJIT_RETURN_IF_ERROR(gemm->Run({.a = h, .b = w, .transpose_b = true, .out = logits},
//                                  workspace, stream));     // kWorkspaceBytes of device memory
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "jit/dynlib.h"
#include "kjit/status.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"
#include "ops/gemm/gemm_args.h"

namespace kjit::ops {

class CublasLt {
 public:
  // Opened once per process; a failure (no library, a symbol missing) is remembered and returned
  // as FailedPrecondition naming what was tried and KJIT_CUBLASLT_PATH.
  static absl::StatusOr<const CublasLt*> Get();
  // What Get() tries: $KJIT_CUBLASLT_PATH alone when set, else the default names above.
  static std::vector<std::string> DefaultCandidates();
  // Opens the first of `candidates` that loads, anew each time (kjit doctor's probe; ops use
  // Get()). The error names what was tried and how to fix it.
  static absl::StatusOr<CublasLt> Load(const std::vector<std::string>& candidates);

  const std::string& path() const { return lib_.path(); }
  size_t version() const { return version_; }  // e.g. 130100 for cuBLAS 13.1.0
  // The CUDA runtime it was built with, as the driver encodes versions (13000 for CUDA 13.0): a
  // driver of an older CUDA major cannot run it.
  size_t cudart_version() const { return cudart_version_; }
  absl::Status Check(cublasStatus_t s, const char* call) const;

  KJIT_DYNLIB_FN(cublasLtCreate);
  KJIT_DYNLIB_FN(cublasLtDestroy);
  KJIT_DYNLIB_FN(cublasLtGetVersion);
  KJIT_DYNLIB_FN(cublasLtGetCudartVersion);
  KJIT_DYNLIB_FN(cublasLtGetStatusName);
  KJIT_DYNLIB_FN(cublasLtGetStatusString);
  KJIT_DYNLIB_FN(cublasLtMatmulDescCreate);
  KJIT_DYNLIB_FN(cublasLtMatmulDescDestroy);
  KJIT_DYNLIB_FN(cublasLtMatmulDescSetAttribute);
  KJIT_DYNLIB_FN(cublasLtMatrixLayoutCreate);
  KJIT_DYNLIB_FN(cublasLtMatrixLayoutDestroy);
  KJIT_DYNLIB_FN(cublasLtMatmulPreferenceCreate);
  KJIT_DYNLIB_FN(cublasLtMatmulPreferenceDestroy);
  KJIT_DYNLIB_FN(cublasLtMatmulPreferenceSetAttribute);
  KJIT_DYNLIB_FN(cublasLtMatmulAlgoGetHeuristic);
  KJIT_DYNLIB_FN(cublasLtMatmul);

 private:
  explicit CublasLt(jit::DynLib lib) : lib_(std::move(lib)) {}
  jit::DynLib lib_;
  size_t version_ = 0;
  size_t cudart_version_ = 0;
};

class LtGemm {
 public:
  // At most this many algorithms are asked of cuBLASLt's heuristic per shape.
  static constexpr int kMaxAlgos = 16;
  // cuBLASLt's recommended workspace on Hopper and Blackwell.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // The handle binds to the CUDA context current on the calling thread.
  static absl::StatusOr<std::unique_ptr<LtGemm>> Create(const CublasLt& lt);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues on `stream` with `workspace` (kWorkspaceBytes of device memory, the caller's so that
  // it is counted; GEMMs sharing one must be ordered); no synchronization. InvalidArgument names
  // the argument whose shape or dtype does not fit. The context must be current.
  absl::Status Run(const GemmArgs& args, void* workspace, CUstream stream);
  // How many algorithms cuBLASLt offers for this shape (the range of GemmArgs::algo).
  absl::StatusOr<int> AlgoCount(const GemmArgs& args);

 private:
  struct Plan;
  // transposes, m, n, k, leading dimensions, dtypes of a and out, bias, beta != 0, alignment.
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                         bool, bool, int>;
  LtGemm(const CublasLt& lt, cublasLtHandle_t handle);
  absl::StatusOr<Key> KeyOf(const GemmArgs& args) const;
  absl::StatusOr<const Plan*> PlanFor(const Key& key);

  const CublasLt& lt_;
  cublasLtHandle_t handle_;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace kjit::ops
