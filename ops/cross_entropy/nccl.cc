#include "ops/cross_entropy/nccl.h"

#include <type_traits>

#include <fmt/format.h>

// Where the toolkit ships nccl.h, hold the declarations in nccl.h of this file to it.
#if __has_include(<nccl.h>)
#include <nccl.h>
static_assert(std::is_same_v<ncclComm_t, kjit::NcclComm>);
static_assert(sizeof(ncclUniqueId) == sizeof(kjit::NcclUniqueId));
static_assert(static_cast<int>(ncclSum) == static_cast<int>(kjit::NcclOp::kSum));
static_assert(static_cast<int>(ncclMax) == static_cast<int>(kjit::NcclOp::kMax));
static_assert(ncclFloat32 == 7 && ncclSuccess == 0);
#endif

namespace kjit {

namespace {
constexpr int kNcclFloat32 = 7;  // ncclDataType_t

// What the loader says when no candidate loads.
constexpr jit::DynLib::Missing kNoNccl{
    absl::StatusCode::kFailedPrecondition,
    "no NCCL: {}\nfix: install NCCL (e.g. the nvidia-nccl-cu13 wheel PyTorch uses) and put its lib "
    "directory on LD_LIBRARY_PATH, or set KJIT_NCCL_LIBRARY to libnccl.so.2's path"};
}  // namespace

absl::StatusOr<Nccl> Nccl::Load() {
  const std::vector<std::string> candidates =
      jit::CandidatesFor("KJIT_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"});
  KJIT_ASSIGN_OR_RETURN(jit::DynLib lib, jit::DynLib::Open(candidates, kNoNccl));
  Nccl n(std::move(lib));
  jit::SymbolResolver symbols(n.lib_);
  symbols.Resolve(n.get_version_, "ncclGetVersion");
  symbols.Resolve(n.get_unique_id_, "ncclGetUniqueId");
  symbols.Resolve(n.comm_init_rank_, "ncclCommInitRank");
  symbols.Resolve(n.comm_destroy_, "ncclCommDestroy");
  symbols.Resolve(n.all_reduce_, "ncclAllReduce");
  symbols.Resolve(n.get_error_string_, "ncclGetErrorString");
  symbols.Resolve(n.get_last_error_, "ncclGetLastError");
  KJIT_RETURN_IF_ERROR(symbols.Check("NCCL 2.13 or newer is needed"));
  KJIT_RETURN_IF_ERROR(n.Check(n.get_version_(&n.version_), "ncclGetVersion"));
  return n;
}

absl::StatusOr<const Nccl*> Nccl::Get() { return jit::LoadedOnce<Nccl>(&Nccl::Load); }

absl::Status Nccl::Check(Result r, const char* call, NcclComm comm) const {
  if (r == 0) return absl::OkStatus();
  const char* last = get_last_error_ != nullptr ? get_last_error_(comm) : nullptr;
  return absl::InternalError(
      fmt::format("{} failed: {} (NCCL error {}){}{}; NCCL_DEBUG=WARN prints NCCL's own log", call,
                  get_error_string_ != nullptr ? get_error_string_(r) : "?", r,
                  last != nullptr && *last != '\0' ? ": " : "", last != nullptr ? last : ""));
}

absl::StatusOr<NcclUniqueId> Nccl::GetUniqueId() const {
  NcclUniqueId id{};
  KJIT_RETURN_IF_ERROR(Check(get_unique_id_(&id), "ncclGetUniqueId"));
  return id;
}

absl::StatusOr<NcclComm> Nccl::CommInitRank(int nranks, const NcclUniqueId& id, int rank) const {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(
        fmt::format("rank: {} must be in [0, nranks = {})", rank, nranks));
  }
  NcclComm comm = nullptr;
  KJIT_RETURN_IF_ERROR(Check(comm_init_rank_(&comm, nranks, id, rank), "ncclCommInitRank"));
  return comm;
}

absl::Status Nccl::CommDestroy(NcclComm comm) const {
  return Check(comm_destroy_(comm), "ncclCommDestroy", comm);
}

absl::Status Nccl::AllReduce(float* data, size_t count, NcclOp op, NcclComm comm,
                             CUstream stream) const {
  if (comm == nullptr) return absl::InvalidArgumentError("comm: null NCCL communicator");
  return Check(all_reduce_(data, data, count, kNcclFloat32, static_cast<int>(op), comm, stream),
               "ncclAllReduce", comm);
}

}  // namespace kjit
