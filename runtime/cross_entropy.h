// CrossEntropy: the fused cross-entropy op over a large vocabulary, JIT-specialized for one vocab
// size, dtype and option set. Loss, lse, argmax and the gradient come from the logits without any
// [rows x vocab] temporary; the gradient can overwrite the logits (in place).
//
// Per row i with target t (capped logits x = cap * tanh(raw / cap) when softcap > 0):
//   lse  = log sum_j exp(x_j)
//   loss = (1 - eps)(lse - x_t) + eps (lse - mean_j x_j) + z lse^2
//   grad = scale * (softmax(x) (1 + 2 z lse) - eps / V - (1 - eps) onehot(t)) [* (1 - tanh^2)]
// with scale the upstream gradient (grad_output; 1 when absent), divided by the number of valid rows
// for the mean. Everything is computed in fp32; the gradient is rounded once, to the logits' dtype.
//
// Rows whose target is ignore_index get loss 0 and a zero gradient (which is written), and do not
// count for the mean. A target outside [0, vocab) that is not ignore_index is never used as an index:
// its row is treated as ignored and counted in CrossEntropyCounters::out_of_range_rows at the start
// of the workspace (read it with a copy after the op; a non-zero count means bad labels). The mean
// over no valid rows is NaN with a zero gradient, as PyTorch gives. lse and argmax (the first index
// of the largest raw logit, a NaN counting as largest, like torch.argmax) are written for every row,
// ignored ones included. NaN or +Inf in a row makes that row's loss, lse and gradient NaN (so the
// summed loss too) and leaves other rows alone; -Inf logits (masked classes) get probability 0.
//
// A launch sequence is a count kernel (targets only), the row kernel and, for sum and mean, a
// reduce kernel that adds the per-row losses in a fixed order: no host synchronization, no
// allocation (the caller passes WorkspaceBytes(rows) of device memory), no floating-point atomics,
// so launches are CUDA-graph capturable and bit-for-bit repeatable.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::CrossEntropy ce, rt.CrossEntropy({.vocab = 128256,
//                                                                 .dtype = DType::kBF16}));
//   KJIT_RETURN_IF_ERROR(ce.ForwardBackward(stream, {
//       .logits = logits, .targets = targets, .loss = loss, .grad = logits,   // in place
//       .workspace = ws, .workspace_bytes = ce.WorkspaceBytes(rows)}));
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "autotune/cross_entropy_config.h"
#include "jit/dtype.h"
#include "jit/jit.h"
#include "jit/source.h"
#include "runtime/tensor.h"
#include "templates/cross_entropy_params.h"

namespace kjit {

enum class IndexType { kInt32, kInt64 };
const char* Name(IndexType t);  // "int32", "int64"
size_t SizeOf(IndexType t);

// A contiguous vector of integers in device memory: targets, argmax.
struct IndexView {
  void* data = nullptr;
  IndexType type = IndexType::kInt64;
  int64_t size = 0;
  static IndexView Of(void* data, IndexType type, int64_t size) { return {data, type, size}; }
  bool empty() const { return data == nullptr; }
};

struct CrossEntropySpec {
  int64_t vocab = 0;                          // 2 .. 1,048,576
  DType dtype = DType::kBF16;                 // logits and gradient
  IndexType target_type = IndexType::kInt64;  // targets (and argmax)
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  float label_smoothing = 0;                  // eps, in [0, 1)
  float lse_square_scale = 0;                 // z-loss coefficient, >= 0
  float softcap = 0;                          // 0: off; else > 0, logits become cap * tanh(x / cap)
  bool argmax = false;                        // forward writes the predicted token per row
  // Overrides the heuristic (e.g. a tuned config); its vec is an upper bound lowered by alignment.
  std::optional<autotune::CrossEntropyConfig> config;
};

struct CrossEntropyArgs {
  TensorView logits;       // [rows, vocab], any row_stride >= vocab
  IndexView targets;       // [rows]
  TensorView loss;         // fp32: [rows] for reduction none, else [1]
  TensorView lse;          // optional fp32 [rows]
  IndexView argmax;        // [rows] in target_type; required iff spec.argmax
  TensorView grad;         // ForwardBackward: [rows, vocab], dtype; may be logits itself (in place)
  TensorView grad_output;  // optional fp32 upstream gradient: [1] (sum, mean) or [rows] (none)
  void* workspace = nullptr;    // device memory, 16-byte aligned
  int64_t workspace_bytes = 0;  // >= WorkspaceBytes(rows)
};

struct CrossEntropyBackwardArgs {
  TensorView logits;       // [rows, vocab]
  IndexView targets;       // [rows]
  TensorView lse;          // fp32 [rows], saved by a forward
  TensorView grad_output;  // optional, as for ForwardBackward
  TensorView grad;         // [rows, vocab]; may be logits itself (in place)
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Checks a spec without a GPU; InvalidArgument names the bad field.
absl::Status ValidateCrossEntropySpec(const CrossEntropySpec& spec);

// Renders the program (count, forward, forward+backward, backward, and the loss reduce for sum and
// mean) for a spec and config. No GPU needed.
absl::StatusOr<jit::Source> RenderCrossEntropy(const CrossEntropySpec& spec,
                                               const autotune::CrossEntropyConfig& config);

namespace internal {
struct RuntimeState;
struct CrossEntropyState;
}  // namespace internal

class CrossEntropy {
 public:
  const CrossEntropySpec& spec() const;
  // The spec's config, else the heuristic's, for the widest vectors.
  const autotune::CrossEntropyConfig& config() const;
  // The config a launch of `rows` uses when pointers allow the widest vectors: the spec's, else
  // the tuning database's for the nearest tuned row count (runtime/tuning.h; for Forward and
  // Backward, fused = false, the record of StreamingTuningOp), else config(). Never tunes (with
  // KJIT_AUTOTUNE a launch does).
  autotune::CrossEntropyConfig ConfigFor(int64_t rows, bool fused = true) const;

  // Loss (and lse, argmax). args.grad must be empty.
  absl::Status Forward(CUstream stream, const CrossEntropyArgs& args) const;
  // Loss and gradient in one launch sequence (and lse, argmax).
  absl::Status ForwardBackward(CUstream stream, const CrossEntropyArgs& args) const;
  // The gradient from the lse a forward saved.
  absl::Status Backward(CUstream stream, const CrossEntropyBackwardArgs& args) const;

  // The counters (16 bytes), then for sum and mean one fp32 loss per row. O(rows).
  int64_t WorkspaceBytes(int64_t rows) const;

  // Compiles (or finds in the caches) the program for the widest config; works compile-only.
  absl::StatusOr<jit::Jit::Built> Build() const;

 private:
  friend class Runtime;
  CrossEntropy(std::shared_ptr<internal::RuntimeState> rt,
               std::shared_ptr<internal::CrossEntropyState> op)
      : rt_(std::move(rt)), op_(std::move(op)) {}
  absl::Status Run(CUstream stream, const CrossEntropyArgs& args, bool gradient) const;
  std::shared_ptr<internal::RuntimeState> rt_;
  std::shared_ptr<internal::CrossEntropyState> op_;
};

}  // namespace kjit
