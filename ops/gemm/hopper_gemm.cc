#include "ops/gemm/hopper_gemm.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include <fmt/format.h>

#include "jit/instantiation.h"
#include "templates/gemm_sm90_params.h"

namespace kjit::ops {

namespace {

// Why the copy engine cannot read `v` as a 2-D tensor of 16-bit elements, or "".
std::string TensorMapProblem(const TensorView& v) {
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) return "its address is not 16-byte aligned";
  if (v.row_stride * 2 % 16 != 0) {
    return fmt::format("its row stride ({} bytes) is not a multiple of 16", v.row_stride * 2);
  }
  if (v.rows > INT32_MAX || v.cols > INT32_MAX) return "it has 2^31 or more rows or columns";
  return "";
}

// A 2-D map over the row-major view `v`: the contiguous dimension first, boxes of 64 elements (128
// bytes, the swizzle's span) by box_rows, out-of-range elements read as zero.
absl::Status EncodeTensorMap(const jit::Driver& cu, const TensorView& v, int box_rows,
                             GemmTensorMap* map) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(v.cols), static_cast<cuuint64_t>(v.rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(v.row_stride) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return cu.Check(cu.cuTensorMapEncodeTiled(
                      reinterpret_cast<CUtensorMap*>(map),
                      v.dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                      2, v.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                  "cuTensorMapEncodeTiled");
}

}  // namespace

std::string GemmKernelSpec::NameExpression() const {
  // The majors are ints in the template (kAMajorMN, kBMajorMN).
  return jit::Instantiate("kjit::gemm_sm90", dtype, out, config.tile_m, config.tile_n,
                          config.stages, int{a_major_mn}, int{b_major_mn}, config.group,
                          config.along_n, accumulate);
}

GemmKernelSpec KernelSpecOf(const GemmArgs& args, const GemmConfig& config) {
  return {.dtype = args.a.dtype,
          .out = args.out.dtype,
          .a_major_mn = args.transpose_a,
          .b_major_mn = !args.transpose_b,
          .accumulate = args.beta != 0,
          .config = config};
}

absl::StatusOr<jit::Source> RenderGemm(const GemmKernelSpec& spec) {
  KJIT_RETURN_IF_ERROR(ValidateGemmConfig(spec.config));
  return jit::RenderSource("gemm_sm90", {"common.cuh", "gemm_sm90_params.h", "gemm_sm90.cuh"},
                           {spec.NameExpression()},
                           {{"dtype", Name(spec.dtype)},
                            {"out", Name(spec.out)},
                            {"a_major", spec.a_major_mn ? "mn" : "k"},
                            {"b_major", spec.b_major_mn ? "mn" : "k"},
                            {"accumulate", spec.accumulate ? "1" : "0"},
                            {"config", spec.config.ToString()}});
}

jit::Target GemmTarget() {
  return jit::Target{.kind = jit::Target::Kind::kCubin, .arch = 90, .arch_specific = true};
}

absl::Status HopperGemm::Supports(const GemmArgs& args, const jit::Target& target) {
  KJIT_RETURN_IF_ERROR(ShapeOf(args).status());
  auto no = [](std::string why) {
    return absl::FailedPreconditionError("kjit's GEMM does not apply: " + why);
  };
  if (target.arch != 90)
    return no(fmt::format("it is for sm_90, the target is {}", target.ToString()));
  if (args.a.dtype == DType::kF32) return no("fp32 inputs (it takes bf16 and fp16)");
  if (!args.bias.empty()) return no("a bias");
  if (args.beta != 0 && args.beta != 1) return no(fmt::format("beta {} (0 or 1)", args.beta));
  for (const auto& [name, v] :
       {std::pair<const char*, const TensorView*>{"a", &args.a}, {"b", &args.b}}) {
    if (std::string problem = TensorMapProblem(*v); !problem.empty()) {
      return no(fmt::format("{}: {}", name, problem));
    }
  }
  if (reinterpret_cast<uintptr_t>(args.out.data) % 16 != 0 || args.out.row_stride % 2 != 0 ||
      args.out.rows > INT32_MAX || args.out.cols > INT32_MAX) {
    return no(
        "out: its address must be 16-byte aligned, its row stride even and its sides under 2^31");
  }
  return absl::OkStatus();
}

absl::StatusOr<CUfunction> HopperGemm::Function(const GemmKernelSpec& spec) {
  const std::string name = spec.NameExpression();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = loaded_.find(name); it != loaded_.end()) return it->second.functions[0];
  KJIT_ASSIGN_OR_RETURN(const jit::Source source, RenderGemm(spec));
  KJIT_ASSIGN_OR_RETURN(internal::LoadedProgram program,
                        internal::LoadProgram(rt_, source, GemmTarget()));
  const CUfunction fn = program.functions[0];
  KJIT_RETURN_IF_ERROR(rt_.AllowSharedBytes(fn, GemmSharedBytes(spec.config)));
  loaded_.emplace(name, std::move(program));
  return fn;
}

absl::Status HopperGemm::Run(const GemmArgs& args, const GemmConfig& config, CUstream stream) {
  KJIT_RETURN_IF_ERROR(Supports(args, rt_.target));
  KJIT_RETURN_IF_ERROR(ValidateGemmConfig(config));
  KJIT_RETURN_IF_ERROR(rt_.NeedsDevice());
  const GemmKernelSpec spec = KernelSpecOf(args, config);
  KJIT_ASSIGN_OR_RETURN(const CUfunction fn, Function(spec));
  const GemmShape s = *ShapeOf(args);
  GemmParams p{};
  KJIT_RETURN_IF_ERROR(
      EncodeTensorMap(*rt_.driver, args.a, spec.a_major_mn ? kGemmBK : config.tile_m, &p.a));
  KJIT_RETURN_IF_ERROR(
      EncodeTensorMap(*rt_.driver, args.b, spec.b_major_mn ? kGemmBK : config.tile_n, &p.b));
  p.c = args.out.data;
  p.ldc = args.out.row_stride;
  p.m = static_cast<int>(s.m);
  p.n = static_cast<int>(s.n);
  p.k = static_cast<int>(s.k);
  const int64_t tiles =
      ((s.m + config.tile_m - 1) / config.tile_m) * ((s.n + config.tile_n - 1) / config.tile_n);
  const int64_t grid = std::min<int64_t>(tiles, std::max(rt_.device.sm_count, 1));
  return rt_.Launch(fn, grid, 128 * (1 + config.tile_m / 64), stream, &p, 1,
                    GemmSharedBytes(config));
}

}  // namespace kjit::ops
