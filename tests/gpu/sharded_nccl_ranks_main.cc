// The vocab-parallel cross-entropy over NCCL with one process per GPU: the launcher starts N
// ranks, rank 0 makes the NCCL unique id and shares it through a file, and each rank computes its
// shard of vocab 128256 (even split) and of 50257 (uneven: the last shard is shorter), all-reduces
// the statistics with ShardedCrossEntropy::Run, and checks its loss and its gradient columns
// against the fp64 reference. NCCL is opened with dlopen (KJIT_NCCL_LIBRARY, else the loader's
// path). Exit 0: every rank passed; 1: a rank failed; 77: skipped (fewer GPUs than ranks, or no
// NCCL), saying why.
//
//   NCCL_NVLS_ENABLE=0 kjit_sharded_nccl_ranks --ranks 4
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/random_values.h"
#include "ops/cross_entropy/nccl.h"
#include "ops/cross_entropy/tuning/reference.h"
#include "runtime/runtime_state.h"

namespace kjit {
namespace {

constexpr int kSkip = 77;
constexpr int64_t kRows = 64;

absl::StatusOr<NcclUniqueId> ShareId(const Nccl& nccl, int rank, const std::string& dir) {
  const std::string path = dir + "/nccl-id";
  NcclUniqueId id{};
  if (rank == 0) {
    KJIT_ASSIGN_OR_RETURN(id, nccl.GetUniqueId());
    std::ofstream(path + ".tmp", std::ios::binary).write(id.internal, sizeof(id.internal));
    std::filesystem::rename(path + ".tmp", path);  // readers see all of it or nothing
    return id;
  }
  for (int waited_ms = 0; waited_ms < 120000; waited_ms += 10) {
    std::ifstream in(path, std::ios::binary);
    if (in.read(id.internal, sizeof(id.internal))) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError(fmt::format("no NCCL id from rank 0 in {} after 120 s", path));
}

// One shard of one problem, checked: the loss, and this rank's gradient columns (the other
// columns are filled with the reference's own values, so the check covers the shard alone).
absl::Status CheckShard(const Runtime& rt, NcclComm comm, int rank, int ranks, int64_t vocab,
                        float smoothing) {
  const int64_t per = (vocab + ranks - 1) / ranks;
  const int64_t start = rank * per, end = std::min(vocab, start + per);
  KJIT_ASSIGN_OR_RETURN(ShardedCrossEntropy ce,
                        rt.ShardedCrossEntropy({.vocab = vocab,
                                                .shard_start = start,
                                                .shard_end = end,
                                                .loss = {.label_smoothing = smoothing}}));
  std::mt19937_64 gen(vocab);  // every rank draws the same problem
  const std::vector<double> logits = ops::RandomValues(gen, kRows * vocab, 2.0, 0, DType::kBF16);
  std::vector<int64_t> targets(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    targets[r] = r % 5 == 4 ? -100
                 : r % 2    ? static_cast<int64_t>(gen() % vocab)
                            : (r / 2 * per) % vocab;
  }
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_logits, UploadValues(rt, logits, DType::kBF16));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_targets, DeviceBuffer::Create(rt, kRows * 8));
  KJIT_RETURN_IF_ERROR(d_targets.Upload(targets.data(), kRows * 8));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_loss, DeviceBuffer::Create(rt, 4));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_ws, DeviceBuffer::Create(rt, ce.WorkspaceBytes(kRows)));
  const TensorView shard = TensorView::Matrix(static_cast<char*>(d_logits.data()) + start * 2,
                                              DType::kBF16, kRows, end - start, vocab);
  KJIT_RETURN_IF_ERROR(ce.Run(nullptr,
                              {.logits = shard,
                               .targets = IndexView::Of(d_targets.data(), IndexType::kInt64, kRows),
                               .loss = TensorView::Vector(d_loss.data(), DType::kF32, 1),
                               .grad = shard,  // in place
                               .workspace = d_ws.data(),
                               .workspace_bytes = ce.WorkspaceBytes(kRows)},
                              comm));
  KJIT_RETURN_IF_ERROR(kjit::internal::StateOf(rt).driver->Check(
      kjit::internal::StateOf(rt).driver->cuCtxSynchronize(), "cuCtxSynchronize"));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> loss, DownloadValues(d_loss, DType::kF32));
  KJIT_ASSIGN_OR_RETURN(std::vector<double> grad, DownloadValues(d_logits, DType::kBF16));
  const ops::CrossEntropyMath math{
      .vocab = vocab, .dtype = DType::kBF16, .loss = {.label_smoothing = smoothing}};
  const auto ref = ops::CrossEntropyReference(math, kRows, logits, targets, nullptr, true);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < vocab; ++c) {
      if (c < start || c >= end) grad[r * vocab + c] = ref.grad[r * vocab + c];
    }
  }
  std::string problems;
  for (const auto& [name, res] :
       ops::CheckCrossEntropy(math, {.loss = &loss, .grad = &grad}, ref)) {
    if (!res.ok) problems += "\n  " + res.Describe(name);
  }
  fmt::print("rank {}/{}: vocab {} shard [{}, {}) loss {:.6f} (reference {:.6f}){}\n", rank, ranks,
             vocab, start, end, loss[0], ref.loss[0], problems.empty() ? ": ok" : problems);
  return problems.empty() ? absl::OkStatus() : absl::InternalError("wrong results");
}

int RunRank(int rank, int ranks, const std::string& dir) {
  const absl::Status s = [&]() -> absl::Status {
    KJIT_ASSIGN_OR_RETURN(const Nccl* nccl, Nccl::Get());
    KJIT_ASSIGN_OR_RETURN(Runtime rt, Runtime::Create({.device = rank}));
    KJIT_RETURN_IF_ERROR(kjit::internal::StateOf(rt).driver->Check(
        kjit::internal::StateOf(rt).driver->cuCtxSetCurrent(kjit::internal::StateOf(rt).ctx),
        "cuCtxSetCurrent"));
    KJIT_ASSIGN_OR_RETURN(NcclUniqueId id, ShareId(*nccl, rank, dir));
    KJIT_ASSIGN_OR_RETURN(NcclComm comm, nccl->CommInitRank(ranks, id, rank));
    absl::Status checked = CheckShard(rt, comm, rank, ranks, 128256, 0.0f);
    if (checked.ok()) checked = CheckShard(rt, comm, rank, ranks, 50257, 0.1f);
    (void)nccl->CommDestroy(comm);
    return checked;
  }();
  if (!s.ok()) fmt::print(stderr, "rank {}: {}\n", rank, ToStd(s.message()));
  return s.ok() ? 0 : 1;
}

int Launch(int ranks) {
  auto cu = jit::Driver::Get();
  int gpus = 0;
  if (cu.ok()) (*cu)->cuDeviceGetCount(&gpus);
  if (gpus < ranks) {
    fmt::print("SKIPPED: needs {} GPUs, found {}{}\n", ranks, gpus,
               cu.ok() ? "" : fmt::format(" ({})", ToStd(cu.status().message())));
    return kSkip;
  }
  if (auto nccl = Nccl::Get(); !nccl.ok()) {
    fmt::print("SKIPPED: {}\n", ToStd(nccl.status().message()));
    return kSkip;
  }
  char tmpl[] = "/tmp/kjit-nccl-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {  // exec: a fresh process, untouched by the launcher's CUDA state
      const std::string rank = std::to_string(r), n = std::to_string(ranks);
      execl("/proc/self/exe", "kjit_sharded_nccl_ranks", "--ranks", n.c_str(), "--rank",
            rank.c_str(), "--dir", tmpl, static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  fmt::print("{} ranks: {}\n", ranks, failed == 0 ? "PASSED" : fmt::format("{} FAILED", failed));
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kjit

int main(int argc, char** argv) {
  int ranks = 2, rank = -1;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks")
      ranks = std::atoi(argv[i + 1]);
    else if (flag == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (flag == "--dir")
      dir = argv[i + 1];
  }
  if (ranks < 1 || ranks > 64) {
    fmt::print(stderr, "usage: {} --ranks N (1 to 64)\n", argv[0]);
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink multicast stays off: it can take shared GPUs down
  return rank < 0 ? kjit::Launch(ranks) : kjit::RunRank(rank, ranks, dir);
}
