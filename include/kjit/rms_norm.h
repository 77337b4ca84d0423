// RmsNorm: the RMSNorm op, forward and backward, JIT-specialized for one hidden size and dtype.
//
// y = x * rsqrt(mean(x^2) + eps) * (weight_offset + w), in fp32, with rstd saved for the backward.
// Casting kLlama rounds the normalized x to the dtype before the weight multiply (Hugging Face
// LlamaRMSNorm); kGemma stays in fp32 until the store; kNone computes in the dtype itself, rounding
// where `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w` does in eager PyTorch
// (RmsNormCasting states the points). fused_residual computes h = x + residual (rounded to the
// dtype) first, writes h to residual_out and normalizes h. The backward writes dx (in place into dy
// if dx.data == dy.data) and dw, reduced in a fixed order through a caller-provided workspace (no
// allocation and no host synchronization in a launch, so both are CUDA-graph capturable).
//
//   KJIT_ASSIGN_OR_RETURN(kjit::RmsNorm norm, rt.RmsNorm({.hidden = 4096, .dtype = DType::kBF16}));
//   KJIT_RETURN_IF_ERROR(norm.Forward(stream, {.x = x, .weight = w, .y = y, .rstd = rstd}));
//   KJIT_RETURN_IF_ERROR(norm.Backward(stream, {.dy = dy, .x = x, .weight = w, .rstd = rstd,
//                                               .dx = dx, .dw = dw, .workspace = ws,
//                                               .workspace_bytes =
//                                               norm.BackwardWorkspaceBytes(rows)}));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kjit/runtime.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"

namespace kjit {

// Where the forward rounds to the dtype T (round() below); every other operation is fp32. In all
// modes the fused residual sum h = round(x + residual) is rounded, and rstd is saved as fp32.
//   kLlama: rstd = rsqrt(mean(h^2) + eps); y = round(round(h * rstd) * (weight_offset + w)).
//   kGemma: rstd as kLlama; y = round(h * rstd * (weight_offset + w)).
//   kNone:  the whole computation in T, as eager PyTorch computes
//           `h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (weight_offset + w)` for a
//           bf16/fp16 h: each op's result is rounded to T, a reduction accumulates in fp32:
//             s_i  = round(h_i * h_i)
//             m    = round(sum_i(s_i) / hidden)        (the sum in fp32, in an unspecified order)
//             a    = round(m + eps)                    (eps as the fp32 spec.eps)
//             rstd = round(rsqrt(a))                   (saved: a value of T, stored as fp32)
//             n_i  = round(h_i * rstd)
//             y_i  = round(n_i * round(weight_offset + w_i))   (round(w_i) = w_i at offset 0)
//           The weight must have the dtype (weight_dtype unset or equal to dtype). With fp32 the
//           roundings vanish and kNone equals kLlama and kGemma up to fp32 rounding. Where the
//           fp32 sum of s_i (or rsqrtf) falls within its own rounding error of a tie of T, rstd may
//           differ from PyTorch's (and from an exact sum's) by one unit in the last place of T.
// The backward is the same in every mode: the fp32 gradient of the forward with its roundings
// other than rstd's taken as the identity, using the saved rstd (for kNone the rounded one):
//   xhat = h * rstd, g = dy * (weight_offset + w),
//   dx = round(rstd * (g - xhat * mean(g * xhat)) [+ dresidual]), dw = round_W(sum over rows of
//   dy * xhat), accumulated in fp32; dx is rounded once to T, dw once to the weight dtype.
enum class RmsNormCasting { kLlama = 0, kGemma = 1, kNone = 2 };

const char* Name(RmsNormCasting casting);  // "llama", "gemma", "none"

// How the kernels are launched. A config fixes the vector width (elements per access, lowered by
// the alignment of the actual views), how many threads share one row and how many rows a block
// holds, separately for forward and backward: the backward wants fewer, wider blocks because each
// row group writes a partial weight-gradient row. `kjit-tune` measures the best one per shape.
struct RowShape {
  int threads_per_row = 32;  // a power of two <= 32, or a multiple of 32 <= 1024
  int rows_per_block = 1;    // 1 when threads_per_row > 32
  // Backward only (0 in a forward shape): 0 runs the double-buffered kernel; 2 to 4 runs the ring
  // kernel, which keeps that many rows of dy and x in registers, loads ring - 1 rows ahead of the
  // one it computes and needs the row share of a thread to fit (2 x 128 bytes at most). Written
  // "512x1r3" in a config's text.
  int ring = 0;
  int block_threads() const { return threads_per_row * rows_per_block; }
  bool operator==(const RowShape&) const = default;
};

struct RmsNormConfig {
  int vec = 1;  // elements per vector access; divides hidden
  RowShape forward;
  RowShape backward;
  std::string ToString()
      const;  // "vec=8 fwd=128x1 bwd=512x1" (or bwd=512x1r3), as kjit-tune prints it
  bool operator==(const RmsNormConfig&) const = default;
};

// The inverse of RmsNormConfig::ToString(), for a config given as text (a tuning database record,
// the C API's and Python's `config`): all three fields, in any order; vec a power of two up to 16,
// and each row shape as RowShape states with at most 1024 threads per block. Whether vec divides a
// hidden size is not checked here. InvalidArgument naming the field and the text.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::RmsNormConfig c,
//                         kjit::ParseRmsNormConfig("vec=8 fwd=256x1 bwd=512x1r2"));
//   // c.ToString() == "vec=8 fwd=256x1 bwd=512x1r2"; with vec=3 instead, InvalidArgument
//   // RMSNorm config "...": vec=3: expected a power of two from 1 to 16
absl::StatusOr<RmsNormConfig> ParseRmsNormConfig(std::string_view text);

struct RmsNormSpec {
  int64_t hidden = 0;                 // 1 .. 65536
  DType dtype = DType::kBF16;         // x, y, residual, dy, dx
  std::optional<DType> weight_dtype;  // default: dtype; must be dtype with casting kNone
  float eps = 1e-6f;
  float weight_offset = 0.0f;  // 1 for Gemma's (1 + w)
  RmsNormCasting casting = RmsNormCasting::kLlama;
  bool fused_residual = false;
  // Overrides the heuristic (e.g. a tuned config); its vec is an upper bound lowered by alignment.
  std::optional<RmsNormConfig> config;
};

struct RmsNormForwardArgs {
  TensorView x;             // [rows, hidden]
  TensorView weight;        // [hidden]
  TensorView y;             // [rows, hidden]; may be x itself
  TensorView rstd;          // [rows] fp32; optional (empty: not written)
  TensorView residual;      // [rows, hidden]; required iff fused_residual
  TensorView residual_out;  // [rows, hidden]; required iff fused_residual; may be residual itself
};

struct RmsNormBackwardArgs {
  TensorView dy;         // [rows, hidden]
  TensorView x;          // the input the forward normalized (its residual_out when fused)
  TensorView weight;     // [hidden]
  TensorView rstd;       // [rows] fp32, from the forward
  TensorView dx;         // [rows, hidden]; may be dy itself (in place)
  TensorView dw;         // [hidden], weight dtype
  TensorView dresidual;  // optional: gradient reaching residual_out, added into dx
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;  // >= BackwardWorkspaceBytes(rows)
};

// Checks a spec without a GPU; InvalidArgument names the bad field.
absl::Status ValidateRmsNormSpec(const RmsNormSpec& spec);

// The spec as JSON without its config, as `kjit-tune --spec` and the C API's kjit_op_create take
// it:
// {"op": "rms_norm", "hidden": 4096, "dtype": "bf16", ...}. RmsNormSpecFromJson needs every field
// but weight_dtype and validates the spec; InvalidArgument names the field.
std::string ToJson(const RmsNormSpec& spec);
absl::StatusOr<RmsNormSpec> RmsNormSpecFromJson(std::string_view json);

namespace internal {
struct RuntimeState;
struct RmsNormState;
}  // namespace internal

class RmsNorm {
 public:
  const RmsNormSpec& spec() const;
  // The spec's config, else the heuristic's, for the widest vectors.
  const RmsNormConfig& config() const;
  // The config a launch of `rows` uses when pointers allow the widest vectors: the spec's, else
  // the tuning database's for the nearest tuned row count (kjit-tune's database), else config().
  // Never tunes (with KJIT_AUTOTUNE a launch does).
  RmsNormConfig ConfigFor(int64_t rows) const;

  absl::Status Forward(CUstream stream, const RmsNormForwardArgs& args) const;
  absl::Status Backward(CUstream stream, const RmsNormBackwardArgs& args) const;
  // fp32 workspace for the weight-gradient partials.
  int64_t BackwardWorkspaceBytes(int64_t rows) const;

  // Compiles (or finds in the caches) the program for the widest config; works compile-only.
  absl::StatusOr<BuildInfo> Build() const;

 private:
  friend class Runtime;
  RmsNorm(std::shared_ptr<internal::RuntimeState> rt, std::shared_ptr<internal::RmsNormState> op)
      : rt_(std::move(rt)), op_(std::move(op)) {}
  std::shared_ptr<internal::RuntimeState> rt_;
  std::shared_ptr<internal::RmsNormState> op_;
};

}  // namespace kjit
