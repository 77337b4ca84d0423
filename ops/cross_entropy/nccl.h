// Nccl: the few NCCL calls the vocab-parallel cross-entropy needs, from libnccl.so.2 opened with
// dlopen on first use, so that kjit neither links NCCL nor needs it for anything else.
//
// The types are declared here rather than taken from nccl.h, which is not part of every CUDA
// install: NcclComm is NCCL's own ncclComm_t (a pointer to the opaque struct ncclComm), so a
// communicator made by the caller's NCCL (or PyTorch's) passes straight in. nccl.cc checks these
// declarations against nccl.h where the toolkit has it. $KJIT_NCCL_LIBRARY names the library to
// open; without it the loader's search path is tried (libnccl.so.2, then libnccl.so).
//
//   KJIT_ASSIGN_OR_RETURN(const kjit::Nccl* nccl, kjit::Nccl::Get());
//   KJIT_ASSIGN_OR_RETURN(kjit::NcclUniqueId id, nccl->GetUniqueId());        // rank 0, then share
//   KJIT_ASSIGN_OR_RETURN(kjit::NcclComm comm, nccl->CommInitRank(nranks, id, rank));
//   KJIT_RETURN_IF_ERROR(nccl->AllReduce(data, count, kjit::NcclOp::kMax, comm, stream));
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "jit/dynlib.h"
#include "kjit/status.h"

struct ncclComm;  // NCCL's communicator, opaque

namespace kjit {

using NcclComm = ::ncclComm*;

// ncclUniqueId: what rank 0 makes and every rank passes to CommInitRank.
struct NcclUniqueId {
  char internal[128];
};

// The reductions used, with NCCL's values (ncclRedOp_t).
enum class NcclOp { kSum = 0, kMax = 2 };

class Nccl {
 public:
  // Opened once per process; the failure (no libnccl, a symbol missing) is remembered and returned
  // as FailedPrecondition naming what was tried.
  static absl::StatusOr<const Nccl*> Get();

  const std::string& path() const { return lib_.path(); }
  int version() const { return version_; }  // NCCL's code, e.g. 22803 for 2.28.3

  absl::StatusOr<NcclUniqueId> GetUniqueId() const;
  // The CUDA context of the rank's GPU must be current on the calling thread (a kjit Runtime's:
  // cuCtxSetCurrent(rt.context())); NCCL binds the communicator to its device.
  absl::StatusOr<NcclComm> CommInitRank(int nranks, const NcclUniqueId& id, int rank) const;
  absl::Status CommDestroy(NcclComm comm) const;
  // In place over `count` fp32 values, enqueued on `stream`; no synchronization.
  absl::Status AllReduce(float* data, size_t count, NcclOp op, NcclComm comm,
                         CUstream stream) const;

 private:
  using Result = int;  // ncclResult_t; 0 is ncclSuccess
  explicit Nccl(jit::DynLib lib) : lib_(std::move(lib)) {}
  static absl::StatusOr<Nccl> Load();
  absl::Status Check(Result r, const char* call, NcclComm comm = nullptr) const;

  jit::DynLib lib_;
  int version_ = 0;
  Result (*get_version_)(int*) = nullptr;
  Result (*get_unique_id_)(NcclUniqueId*) = nullptr;
  Result (*comm_init_rank_)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  Result (*comm_destroy_)(NcclComm) = nullptr;
  Result (*all_reduce_)(const void*, void*, size_t, int, int, NcclComm, CUstream) = nullptr;
  const char* (*get_error_string_)(Result) = nullptr;
  const char* (*get_last_error_)(NcclComm) = nullptr;
};

}  // namespace kjit
