#include "ops/linear_cross_entropy/cublaslt.h"

#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {

// What the loader says when no candidate loads.
constexpr jit::DynLib::Missing kNoCublasLt{
    absl::StatusCode::kFailedPrecondition,
    "no cuBLASLt (the fused linear + cross-entropy op's GEMMs): {}\nfix: install the CUDA "
    "toolkit's cuBLAS or the nvidia-cublas wheel PyTorch uses and put its lib directory on "
    "LD_LIBRARY_PATH, or set KJIT_CUBLASLT_PATH to libcublasLt.so's path"};

namespace {

cudaDataType_t LtType(DType t) {
  switch (t) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    case DType::kF32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

// The largest power of two up to 256 (cuBLASLt's default assumption) dividing every address.
int CommonAlignment(std::initializer_list<const void*> pointers) {
  int alignment = 256;
  for (const void* p : pointers) {
    if (p == nullptr) continue;
    while (reinterpret_cast<uintptr_t>(p) % alignment != 0) alignment /= 2;
  }
  return alignment;
}

}  // namespace

std::vector<std::string> CublasLt::DefaultCandidates() {
  return jit::CandidatesFor("KJIT_CUBLASLT_PATH",
                            {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                             "/usr/local/cuda/lib64/libcublasLt.so"});
}

absl::StatusOr<CublasLt> CublasLt::Load(const std::vector<std::string>& candidates) {
  KJIT_ASSIGN_OR_RETURN(jit::DynLib lib, jit::DynLib::Open(candidates, kNoCublasLt));
  CublasLt lt(std::move(lib));
  jit::SymbolResolver symbols(lt.lib_);
#define KJIT_LT_LOAD(name) symbols.Resolve(lt.name, #name)
  KJIT_LT_LOAD(cublasLtCreate);
  KJIT_LT_LOAD(cublasLtDestroy);
  KJIT_LT_LOAD(cublasLtGetVersion);
  KJIT_LT_LOAD(cublasLtGetCudartVersion);
  KJIT_LT_LOAD(cublasLtGetStatusName);
  KJIT_LT_LOAD(cublasLtGetStatusString);
  KJIT_LT_LOAD(cublasLtMatmulDescCreate);
  KJIT_LT_LOAD(cublasLtMatmulDescDestroy);
  KJIT_LT_LOAD(cublasLtMatmulDescSetAttribute);
  KJIT_LT_LOAD(cublasLtMatrixLayoutCreate);
  KJIT_LT_LOAD(cublasLtMatrixLayoutDestroy);
  KJIT_LT_LOAD(cublasLtMatmulPreferenceCreate);
  KJIT_LT_LOAD(cublasLtMatmulPreferenceDestroy);
  KJIT_LT_LOAD(cublasLtMatmulPreferenceSetAttribute);
  KJIT_LT_LOAD(cublasLtMatmulAlgoGetHeuristic);
  KJIT_LT_LOAD(cublasLtMatmul);
#undef KJIT_LT_LOAD
  KJIT_RETURN_IF_ERROR(symbols.Check("cuBLASLt 12 or newer is needed"));
  lt.version_ = lt.cublasLtGetVersion();
  lt.cudart_version_ = lt.cublasLtGetCudartVersion();
  return lt;
}

absl::StatusOr<const CublasLt*> CublasLt::Get() {
  return jit::LoadedOnce<CublasLt>(+[] { return Load(DefaultCandidates()); });
}

absl::Status CublasLt::Check(cublasStatus_t s, const char* call) const {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(fmt::format("{} failed: {} ({})", call, cublasLtGetStatusName(s),
                                         cublasLtGetStatusString(s)));
}

// Descriptors of one shape and cuBLASLt's heuristic list for it.
struct LtGemm::Plan {
  const CublasLt* lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  // cuBLASLt's operands: the first is b, the second a (see PlanFor).
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;
  ~Plan() {
    if (desc) lt->cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {first, second, out}) {
      if (l) lt->cublasLtMatrixLayoutDestroy(l);
    }
  }
};

absl::StatusOr<std::unique_ptr<LtGemm>> LtGemm::Create(const CublasLt& lt) {
  cublasLtHandle_t handle = nullptr;
  KJIT_RETURN_IF_ERROR(lt.Check(lt.cublasLtCreate(&handle), "cublasLtCreate"));
  return std::unique_ptr<LtGemm>(new LtGemm(lt, handle));
}

LtGemm::LtGemm(const CublasLt& lt, cublasLtHandle_t handle) : lt_(lt), handle_(handle) {}

LtGemm::~LtGemm() {
  plans_.clear();
  lt_.cublasLtDestroy(handle_);
}

absl::StatusOr<LtGemm::Key> LtGemm::KeyOf(const GemmArgs& g) const {
  KJIT_ASSIGN_OR_RETURN(const GemmShape s, ShapeOf(g));
  const auto [m, n, k] = s;
  return Key{g.transpose_a,
             g.transpose_b,
             m,
             n,
             k,
             g.a.row_stride,
             g.b.row_stride,
             g.out.row_stride,
             static_cast<int>(g.a.dtype),
             static_cast<int>(g.out.dtype),
             !g.bias.empty(),
             g.beta != 0,
             CommonAlignment({g.a.data, g.b.data, g.out.data, g.bias.data})};
}

absl::StatusOr<const LtGemm::Plan*> LtGemm::PlanFor(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  const auto [transpose_a, transpose_b, m, n, k, lda, ldb, ldd, in_type, out_type, bias, beta,
              alignment] = key;
  const cudaDataType_t in = LtType(static_cast<DType>(in_type));
  const cudaDataType_t out = LtType(static_cast<DType>(out_type));
  const auto check = [this](cublasStatus_t s, const char* call) { return lt_.Check(s, call); };
  // cuBLASLt is column-major, where a row-major matrix reads as its transpose: out = op(a) op(b)
  // is outᵀ = op(b)ᵀ op(a)ᵀ, so cuBLASLt's first operand is b and its second is a.
  auto plan = std::make_unique<Plan>();
  plan->lt = &lt_;
  KJIT_RETURN_IF_ERROR(
      check(lt_.cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            "cublasLtMatmulDescCreate"));
  const cublasOperation_t op_first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  for (const auto& [attr, value, size] :
       {std::tuple<cublasLtMatmulDescAttributes_t, const void*, size_t>{
            CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)},
        {CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)},
        {CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)}}) {
    KJIT_RETURN_IF_ERROR(check(lt_.cublasLtMatmulDescSetAttribute(plan->desc, attr, value, size),
                               "cublasLtMatmulDescSetAttribute"));
  }
  // Stored shapes (before op), column-major: a row-major [r, c] is a column-major [c, r].
  const uint64_t b_rows = transpose_b ? k : n, b_cols = transpose_b ? n : k;
  const uint64_t a_rows = transpose_a ? m : k, a_cols = transpose_a ? k : m;
  KJIT_RETURN_IF_ERROR(check(lt_.cublasLtMatrixLayoutCreate(&plan->first, in, b_rows, b_cols, ldb),
                             "cublasLtMatrixLayoutCreate"));
  KJIT_RETURN_IF_ERROR(check(lt_.cublasLtMatrixLayoutCreate(&plan->second, in, a_rows, a_cols, lda),
                             "cublasLtMatrixLayoutCreate"));
  KJIT_RETURN_IF_ERROR(check(lt_.cublasLtMatrixLayoutCreate(&plan->out, out, n, m, ldd),
                             "cublasLtMatrixLayoutCreate"));

  cublasLtMatmulPreference_t pref = nullptr;
  KJIT_RETURN_IF_ERROR(
      check(lt_.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t max_workspace = kWorkspaceBytes;
  const uint32_t align = static_cast<uint32_t>(alignment);
  cublasStatus_t s = lt_.cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = lt_.cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    }
  }
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos] = {};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = lt_.cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->first, plan->second,
                                           plan->out, plan->out, pref, kMaxAlgos, results, &found);
  }
  lt_.cublasLtMatmulPreferenceDestroy(pref);
  KJIT_RETURN_IF_ERROR(check(s, "cublasLtMatmulAlgoGetHeuristic"));
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->algos.push_back(results[i].algo);
  }
  if (plan->algos.empty()) {
    return absl::NotFoundError(
        fmt::format("cuBLASLt has no algorithm for m={} n={} k={} (transpose a={} b={}, "
                    "{}-byte aligned)",
                    m, n, k, transpose_a, transpose_b, alignment));
  }
  return (plans_[key] = std::move(plan)).get();
}

absl::StatusOr<int> LtGemm::AlgoCount(const GemmArgs& args) {
  KJIT_ASSIGN_OR_RETURN(const Key key, KeyOf(args));
  std::lock_guard<std::mutex> lock(mu_);
  KJIT_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(key));
  return static_cast<int>(plan->algos.size());
}

absl::Status LtGemm::Run(const GemmArgs& g, void* workspace, CUstream stream) {
  KJIT_ASSIGN_OR_RETURN(const Key key, KeyOf(g));
  // Held through the launch: the bias pointer is an attribute of the plan's shared descriptor.
  std::lock_guard<std::mutex> lock(mu_);
  KJIT_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(key));
  if (!g.bias.empty()) {
    const void* bias = g.bias.data;
    KJIT_RETURN_IF_ERROR(
        lt_.Check(lt_.cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)),
                  "cublasLtMatmulDescSetAttribute"));
  }
  const cublasLtMatmulAlgo_t& algo =
      plan->algos[g.algo >= 0 && g.algo < static_cast<int>(plan->algos.size()) ? g.algo : 0];
  const float alpha = 1.0f, beta = g.beta;
  return lt_.Check(lt_.cublasLtMatmul(handle_, plan->desc, &alpha, g.b.data, plan->first, g.a.data,
                                      plan->second, &beta, g.out.data, plan->out, g.out.data,
                                      plan->out, &algo, workspace, kWorkspaceBytes, stream),
                   "cublasLtMatmul");
}

}  // namespace kjit::ops
