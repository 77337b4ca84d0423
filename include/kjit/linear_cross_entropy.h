// LinearCrossEntropy: the lm_head and the cross-entropy loss fused, from hidden states to the loss
// and the gradients of the hidden states, the weight and the bias, in memory that does not grow
// with the rows. The rows go through in chunks (a batch whose logits fit the memory the chunks
// and the fp32 weight-gradient accumulator would take goes as one chunk, in their place): per
// chunk, cuBLASLt computes the logits (h Wᵀ + b) into a chunk buffer, kjit's fused cross-entropy
// turns them into their gradient in place, and cuBLASLt computes d_hidden = dlogits · W and adds
// dlogitsᵀ · h to the weight's gradient (and the column sums to the bias's). The loss is exactly
// kjit::CrossEntropy's on the logits rounded to the spec's dtype (kjit/cross_entropy.h has the
// formulas); for the mean, a count kernel over every target divides the upstream gradient by the
// valid rows on the device first, so each chunk's gradient is final.
//
// Memory beyond the arguments (WorkspaceBytes(rows)), with C = chunk rows (all the rows when they
// are at most the config's whole_rows), V = vocab, H = hidden, e = the dtype's size and s = the
// config's streams (1 or 2; 1 when the rows make one chunk):
//   s * C * round_up(V, 16 / e) * e        the chunks' logits (16-byte aligned rows)
//   + 32 MiB                               cuBLASLt's workspace
//   + V * H * 4                            the fp32 weight-gradient accumulator, only with
//                                          WeightGradAccumulation::kFloat32, a d_weight that is
//                                          not fp32 itself, and more than one chunk
//   + V * 4 (bias) + C * e + C * 4         the bias gradient's accumulator and ones, the chunk
//   + O(rows / C)                          loss's per-row losses, the counters and chunk losses
// The heuristic (V = 128256, H = 4096, bf16): C = 1920, 0.49 GiB plus the 2 GiB accumulator, at
// most 2.49 GiB whatever the row count; up to whole_rows = 10112 rows the rows' logits take the
// accumulator's place instead (2.03 GiB at 8192 rows, 1.03 GiB at 4096), so that each gradient GEMM
// runs once over all rows and no accumulator is read and rewritten per chunk.
//
// Launches are graph-safe (no host synchronization, no allocation: the mean's divisor lives on the
// device) and bit-for-bit repeatable: cuBLASLt's algorithms are chosen once per shape, the GEMMs
// accumulate the weight gradient chunk after chunk in a fixed order, and the loss is reduced in a
// fixed order. With two streams the op forks onto an internal stream and joins back, as CUDA graph
// capture allows; one launch at a time per op object (a mutex orders concurrent callers).
//
//   KJIT_ASSIGN_OR_RETURN(kjit::LinearCrossEntropy lce, rt.LinearCrossEntropy({
//       .vocab = 128256, .hidden = 4096, .dtype = DType::kBF16}));
//   KJIT_RETURN_IF_ERROR(lce.ForwardBackward(stream, {
//       .hidden_states = h, .weight = w, .targets = t, .loss = loss,
//       .d_hidden = dh, .d_weight = dw,
//       .workspace = ws, .workspace_bytes = lce.WorkspaceBytes(rows)}));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kjit/cross_entropy.h"
#include "kjit/runtime.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"

namespace kjit {

// How the op is scheduled; `kjit-tune` measures the best per shape.
struct LinearCrossEntropyConfig {
  int64_t chunk_rows = 1024;  // rows whose logits exist at once
  // A launch of at most this many rows runs as one chunk, however large: with fp32 weight-gradient
  // accumulation the heuristic sets it to the rows whose logits fit the memory the accumulator and
  // the chunks would take. 0: chunks of chunk_rows only.
  int64_t whole_rows = 0;
  // 1: everything in order on the caller's stream. 2: each chunk's loss kernel runs on a second
  // stream beside the next chunk's logits GEMM (two chunk buffers), joined before the op returns.
  int streams = 1;
  // The i-th of cuBLASLt's heuristic algorithms for each GEMM (0: its first choice); an index past
  // the ones offered for a shape falls back to 0. kOwnGemm (written "kjit"): kjit's own Hopper GEMM
  // (bf16/fp16 on sm_90, rows 16-byte aligned, no bias), and cuBLASLt's first choice with a
  // warning where it does not apply. Never the heuristic's yet: it has not been measured on a GPU.
  static constexpr int kOwnGemm = -1;
  int logits_algo = 0;
  int d_hidden_algo = 0;
  int d_weight_algo = 0;
  // "chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=kjit d_weight_algo=0"
  std::string ToString() const;
  bool operator==(const LinearCrossEntropyConfig&) const = default;
};

// The inverse of LinearCrossEntropyConfig::ToString(), for a config given as text (a tuning
// database record, the C API's and Python's `config`, `kjit bench --config`): all six fields, in
// any order; chunk 1 to 65536 rows, whole 0 to 65536, streams 1 or 2, each algorithm an index from
// 0 to 63 or "kjit". InvalidArgument naming the field and the text.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::LinearCrossEntropyConfig c, kjit::ParseLinearCrossEntropyConfig(
//       "chunk=1024 whole=0 streams=2 logits_algo=0 d_hidden_algo=kjit d_weight_algo=0"));
//   // c.d_hidden_algo == kjit::LinearCrossEntropyConfig::kOwnGemm
absl::StatusOr<LinearCrossEntropyConfig> ParseLinearCrossEntropyConfig(std::string_view text);

// How the weight gradient adds up over the chunks.
enum class WeightGradAccumulation {
  // In an fp32 accumulator (the workspace's, or d_weight itself when it is fp32), rounded into
  // d_weight once at the end. The default: bf16 sums over many chunks lose the small updates.
  kFloat32,
  // Straight into d_weight in its own dtype, each chunk's product rounded as it is added: no
  // accumulator, for when memory matters more.
  kOutputDtype,
};
const char* Name(WeightGradAccumulation a);  // "fp32", "output_dtype"

struct LinearCrossEntropySpec {
  int64_t vocab = 0;                       // 2 .. 1,048,576
  int64_t hidden = 0;                      // 1 .. 65536
  DType dtype = DType::kBF16;              // hidden states, weight, bias, d_hidden
  std::optional<DType> weight_grad_dtype;  // d_weight and d_bias: dtype (default) or fp32
  bool bias = false;                       // logits = h Wᵀ + b
  LossOptions loss;                        // as kjit::CrossEntropySpec's
  WeightGradAccumulation weight_grad_accumulation = WeightGradAccumulation::kFloat32;
  // Overrides the tuning database and the heuristic.
  std::optional<LinearCrossEntropyConfig> config;

  DType weight_grad() const { return weight_grad_dtype.value_or(dtype); }
  // The cross-entropy each chunk runs (sum over the chunk; none for reduction none).
  CrossEntropySpec ChunkLoss() const;
};

struct LinearCrossEntropyArgs {
  TensorView hidden_states;  // [rows, hidden], any row_stride >= hidden
  TensorView weight;         // [vocab, hidden], the lm_head's
  TensorView bias;           // [vocab] (one row); iff spec.bias
  IndexView targets;         // [rows]
  TensorView loss;           // fp32: [rows] for reduction none, else [1]
  TensorView lse;            // optional fp32 [rows]
  IndexView argmax;          // [rows] in loss.target_type; required iff spec.loss.argmax
  TensorView class_weight;   // [vocab] (1 row) in spec.loss.class_weight_dtype; iff that is set
  TensorView grad_output;    // optional fp32 upstream gradient: [1] (sum, mean) or [rows] (none)
  // ForwardBackward's outputs; each may be left empty to skip it (the GEMM is not run).
  TensorView d_hidden;  // [rows, hidden] in dtype
  TensorView d_weight;  // [vocab, hidden] in weight_grad()
  TensorView d_bias;    // [vocab] in weight_grad(); only with spec.bias
  // false: d_weight and d_bias are overwritten; true: the gradients are added to what they hold
  // (gradient accumulation over micro-batches). d_hidden is always overwritten.
  bool accumulate = false;
  void* workspace = nullptr;    // device memory, 256-byte aligned
  int64_t workspace_bytes = 0;  // >= WorkspaceBytes(rows)
  // The per-row extras as kjit::CrossEntropyArgs has them: entropy iff spec.loss.entropy, the
  // target's log-probability optional; fp32 [rows].
  TensorView entropy, target_logprob;
};

// Gradients that ForwardBackward computed for upstream gradient `applied` (empty: 1) become, in
// place, the gradients for `grad_output`: each element round(x * fp32(g / a)), one IEEE division,
// one multiply and one rounding to the gradient's dtype. Where g == a (compared as floats on the
// device) nothing is read or written, so the usual case, a framework's backward handing back the
// upstream gradient the forward was told, costs one launch of empty blocks per gradient instead
// of a pass over d_weight. For sum and mean only (reduction none's per-row upstream gradients do
// not scale d_weight: run ForwardBackward with them), and not for gradients ForwardBackward added
// into (accumulate = true): what they held would be scaled too.
struct LinearCrossEntropyRescaleArgs {
  TensorView d_hidden;     // [rows, hidden] in dtype; each of the three may be empty
  TensorView d_weight;     // [vocab, hidden] in weight_grad()
  TensorView d_bias;       // [vocab] in weight_grad(); only with spec.bias
  TensorView grad_output;  // fp32 [1]
  TensorView applied;      // fp32 [1]; empty: 1
};

// Checks a spec without a GPU; InvalidArgument names the bad field.
absl::Status ValidateLinearCrossEntropySpec(const LinearCrossEntropySpec& spec);

namespace internal {
struct RuntimeState;
struct LinearCrossEntropyState;
}  // namespace internal

class LinearCrossEntropy {
 public:
  const LinearCrossEntropySpec& spec() const;
  // The spec's config, else the heuristic's.
  const LinearCrossEntropyConfig& config() const;
  // The config a launch of `rows` uses: the spec's, else the tuning database's (kjit-tune's) for
  // the nearest tuned row count, else config(). A launch never tunes this op (KJIT_AUTOTUNE
  // leaves it alone: a tuning run takes minutes).
  LinearCrossEntropyConfig ConfigFor(int64_t rows) const;

  // The loss (and lse, argmax) alone: the gradient outputs must be empty.
  absl::Status Forward(CUstream stream, const LinearCrossEntropyArgs& args) const;
  // The loss and the gradients asked for, in one pass over the chunks.
  absl::Status ForwardBackward(CUstream stream, const LinearCrossEntropyArgs& args) const;
  // See LinearCrossEntropyRescaleArgs. Its kernels are a program of their own, built on first use.
  absl::Status RescaleGradients(CUstream stream, const LinearCrossEntropyRescaleArgs& args) const;

  // Device memory a launch of `rows` needs (see the header comment), for ConfigFor(rows).
  int64_t WorkspaceBytes(int64_t rows) const;
  // The bytes of that which the fp32 weight-gradient accumulator takes at `rows` (0 without one:
  // output-dtype accumulation, an fp32 d_weight, or rows that fit one chunk).
  int64_t AccumulatorBytes(int64_t rows) const;
  // After a launch, the first 8 bytes of the workspace hold the valid and out-of-range target
  // counts of the whole batch (kjit::CrossEntropyCounters' first two fields).

  // Compiles (or finds in the caches) the op's own kernels, RescaleGradients' and the chunk loss's
  // programs that it launches (BuildInfo::programs lists them, its own first); works
  // compile-only.
  absl::StatusOr<BuildInfo> Build() const;

 private:
  friend class Runtime;
  LinearCrossEntropy(std::shared_ptr<internal::RuntimeState> rt,
                     std::shared_ptr<internal::LinearCrossEntropyState> op)
      : rt_(std::move(rt)), op_(std::move(op)) {}
  absl::Status Run(CUstream stream, const LinearCrossEntropyArgs& args, bool gradient) const;
  std::shared_ptr<internal::RuntimeState> rt_;
  std::shared_ptr<internal::LinearCrossEntropyState> op_;
};

}  // namespace kjit
