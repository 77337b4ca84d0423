// HopperGemm: kjit's own GEMM for sm_90 GPUs (H100, H200). templates/gemm_sm90.cuh is rendered for
// the dtypes, each operand's major-ness and the launch config, compiled for sm_90a through the JIT
// (wgmma and setmaxnreg exist only there), and launched persistent: one block per SM, reading A and
// B through tensor maps encoded at each call (a host-only driver call, no sync). Where it does not
// apply (Supports says why) the caller runs cuBLASLt's LtGemm instead.
//
//   HopperGemm gemm(rt);
//   if (HopperGemm::Supports(args, rt.target).ok()) {
//     KJIT_ASSIGN_OR_RETURN(GemmShape s, ShapeOf(args));
//     KJIT_RETURN_IF_ERROR(gemm.Run(args, DefaultGemmConfig(s.m, s.n, s.k), stream));
//   }
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "jit/source.h"
#include "jit/target.h"
#include "kjit/stream.h"
#include "ops/gemm/config.h"
#include "ops/gemm/gemm_args.h"
#include "runtime/op_kernels.h"

namespace kjit::ops {

// One instantiation of gemm_sm90: what a GEMM's arguments and config fix at compile time.
struct GemmKernelSpec {
  DType dtype = DType::kBF16;  // a and b
  DType out = DType::kBF16;    // dtype or fp32
  bool a_major_mn = false;     // a stored [K][M] (GemmArgs::transpose_a)
  bool b_major_mn = false;     // b stored [K][N] (not GemmArgs::transpose_b)
  bool accumulate = false;     // out += (beta 1)
  GemmConfig config;

  // "kjit::gemm_sm90<kjit::bf16, kjit::bf16, 128, 256, 4, 0, 0, 8, false, false>"
  std::string NameExpression() const;
};
// The kernel spec that runs `args` with `config`; Supports(args) must hold.
GemmKernelSpec KernelSpecOf(const GemmArgs& args, const GemmConfig& config);
absl::StatusOr<jit::Source> RenderGemm(const GemmKernelSpec& spec);
// The target HopperGemm compiles for: the arch-specific sm_90a.
jit::Target GemmTarget();

class HopperGemm {
 public:
  explicit HopperGemm(const internal::RuntimeState& rt) : rt_(rt) {}

  // OK when kjit's GEMM can run `args` on `target`; otherwise FailedPrecondition saying why
  // (another arch, fp32 inputs, a bias, beta other than 0 or 1, a view whose address or row
  // stride in bytes is not a multiple of 16, which the tensor maps need). Checks shapes first
  // (InvalidArgument as ShapeOf).
  static absl::Status Supports(const GemmArgs& args, const jit::Target& target);

  // Enqueues on `stream`; no synchronization. The first call of a kernel spec compiles or loads
  // it. The context must be current.
  absl::Status Run(const GemmArgs& args, const GemmConfig& config, CUstream stream);

 private:
  absl::StatusOr<CUfunction> Function(const GemmKernelSpec& spec);

  const internal::RuntimeState& rt_;
  std::mutex mu_;
  std::map<std::string, internal::LoadedProgram> loaded_;  // by name expression
};

}  // namespace kjit::ops
