#include "bench/finetune_step/step.h"

#include <random>

#include "kjit/host_convert.h"
#include "runtime/runtime_state.h"

namespace finetune {

using kjit::DType;
using kjit::TensorView;

absl::StatusOr<SharedInputs> MakeSharedInputs(const kjit::Runtime& rt, const Problem& p,
                                              const EagerKernels& kernels, DevicePool& pool) {
  SharedInputs in;
  KJIT_ASSIGN_OR_RETURN(in.hidden,
                        pool.NewTensor("hidden states", DType::kBF16, p.tokens(), p.hidden));
  KJIT_ASSIGN_OR_RETURN(in.norm_weight, pool.NewTensor("norm weight", DType::kBF16, 1, p.hidden));
  KJIT_ASSIGN_OR_RETURN(in.lm_head,
                        pool.NewTensor("lm_head weight", DType::kBF16, p.vocab, p.hidden));
  KJIT_RETURN_IF_ERROR(kernels.FillNormal(in.hidden.view, /*seed=*/1, 0.0f, 1.0f));
  KJIT_RETURN_IF_ERROR(kernels.FillNormal(in.norm_weight.view, /*seed=*/2, 1.0f, 0.1f));
  KJIT_RETURN_IF_ERROR(kernels.FillNormal(in.lm_head.view, /*seed=*/3, 0.0f, 0.02f));

  // Random tokens; the target of a position is the next token of its sequence.
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<int64_t> token(0, p.vocab - 1);
  std::vector<int64_t> tokens(p.tokens());
  for (int64_t& t : tokens) t = token(rng);
  in.host_targets.resize(p.tokens());
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq; ++s) {
      const int64_t i = b * p.seq + s;
      in.host_targets[i] = s + 1 < p.seq ? tokens[i + 1] : kIgnoreIndex;
    }
  }
  in.valid_targets = p.batch * (p.seq - 1);
  const size_t target_bytes = in.host_targets.size() * sizeof(int64_t);
  KJIT_ASSIGN_OR_RETURN(in.targets, pool.Allocate("targets", target_bytes));
  const kjit::jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(in.targets.data()),
                                                in.host_targets.data(), target_bytes),
                                "cuMemcpyHtoD"));
  return in;
}

absl::Status Path::AllocateCommon() {
  const Problem& p = problem_;
  KJIT_ASSIGN_OR_RETURN(
      dx_, pool_.NewTensor("grad of hidden states", DType::kBF16, p.tokens(), p.hidden));
  KJIT_ASSIGN_OR_RETURN(dnorm_weight_,
                        pool_.NewTensor("grad of norm weight", DType::kBF16, 1, p.hidden));
  KJIT_ASSIGN_OR_RETURN(dlm_head_,
                        pool_.NewTensor("grad of lm_head", DType::kBF16, p.vocab, p.hidden));
  return absl::OkStatus();
}

absl::Status Path::AllocateMatmul() {
  KJIT_ASSIGN_OR_RETURN(matmul_workspace_,
                        pool_.Allocate("cuBLASLt workspace", LtMatmul::kWorkspaceBytes));
  KJIT_ASSIGN_OR_RETURN(matmul_,
                        LtMatmul::Create(matmul_workspace_.data(), matmul_workspace_.bytes()));
  return absl::OkStatus();
}

TensorView Rows(const TensorView& v, int64_t first, int64_t count) {
  TensorView r = v;
  r.data = static_cast<char*>(v.data) +
           first * v.row_stride * static_cast<int64_t>(kjit::SizeOf(v.dtype));
  r.rows = count;
  return r;
}

absl::StatusOr<std::vector<double>> Download(const kjit::Runtime& rt, const TensorView& v) {
  if (v.row_stride != v.cols)
    return absl::InvalidArgumentError("Download: needs a contiguous view");
  std::vector<unsigned char> raw(v.rows * v.cols * kjit::SizeOf(v.dtype));
  const kjit::jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  // The kernels that write v were queued on the default stream.
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize"));
  KJIT_RETURN_IF_ERROR(
      cu.Check(cu.cuMemcpyDtoH(raw.data(), reinterpret_cast<CUdeviceptr>(v.data), raw.size()),
               "cuMemcpyDtoH"));
  return Decode(raw, v.dtype);
}

}  // namespace finetune
