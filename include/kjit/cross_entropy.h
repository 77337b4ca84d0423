// CrossEntropy: the fused cross-entropy op over a large vocabulary, JIT-specialized for one vocab
// size, dtype and option set. Loss, lse, argmax and the gradient come from the logits without any
// [rows x vocab] temporary; the gradient can overwrite the logits (in place).
//
// Per row i with target t (capped logits x = cap * tanh(raw / cap) when softcap > 0):
//   lse  = log sum_j exp(x_j)
//   loss = (1 - eps)(lse - x_t) + eps (lse - mean_j x_j) + z lse^2
//   grad = scale * (softmax(x) (1 + 2 z lse) - eps / V - (1 - eps) onehot(t)) [* (1 - tanh^2)]
// with scale the upstream gradient (grad_output; 1 when absent), divided by the number of valid
// rows for the mean. Everything is computed in fp32; the gradient is rounded once, to the logits'
// dtype.
//
// With class weights w (spec.loss.class_weight_dtype set; torch.nn.functional.cross_entropy's
// `weight`, whose definition, label smoothing included, this follows; z-loss is kjit's and weighs
// w_t):
//   loss = w_t ((1 - eps)(lse - x_t) + z lse^2) + eps / V * sum_j w_j (lse - x_j)
//   grad = scale * (softmax(x) (A + 2 z w_t lse) - eps w / V - (1 - eps) w_t onehot(t)) [* ...]
//          with A = (1 - eps) w_t + eps / V * sum_j w_j,
// and the mean divides by the sum of w_t over the valid rows instead of their count. Weights are
// used as given, as PyTorch does: negative ones count as negative, a zero sum makes the mean's
// loss and gradient NaN (inf * 0), and a NaN weight makes NaN what it enters: its row when it is
// the target's weight (and through the mean's divisor every valid row and the loss), every valid
// row with label smoothing. Checking the values would cost a host synchronization.
//
// Rows whose target is ignore_index get loss 0 and a zero gradient (which is written), and do not
// count for the mean. A target outside [0, vocab) that is not ignore_index is never used as an
// index: its row is treated as ignored and counted in CrossEntropyCounters::out_of_range_rows at
// the start of the workspace (read it with a copy after the op; a non-zero count means bad labels).
// The mean over no valid rows is NaN with a zero gradient, as PyTorch gives. lse and argmax (the
// first index of the largest raw logit, a NaN counting as largest, like torch.argmax) are written
// for every row, ignored ones included, and so is the entropy when asked (spec.loss.entropy):
//   entropy = -sum_j p_j ln p_j  (p = softmax(x), the capped logits; NaN for a row all -inf)
// target_logprob (optional, no spec flag) is x_t - lse for a valid row (-loss without label
// smoothing, z-loss or class weights) and 0 for an ignored one. NaN or +Inf in a row makes that
// row's loss, lse and gradient NaN (so the summed loss too) and leaves other rows alone; -Inf
// logits (masked classes) get probability 0.
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

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kjit/loss_options.h"
#include "kjit/runtime.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"

namespace kjit {

// How the kernels are launched; `kjit-tune` measures the best one per shape. The forward and
// backward kernels stream a row with one block: `threads` threads read it in vectors of `vec`
// elements (16 bytes at most, lowered by the alignment of the actual views), each thread issuing
// `unroll` vector loads before it uses them. The fused forward+backward keeps the row in the
// registers of `cluster` blocks of `threads` (a thread-block cluster when more than one, sm_90 and
// newer), so it reads each logit once; cluster 0 makes it stream the row twice instead. `staged`
// keeps the row in the cluster's shared memory instead of registers (sm_90 and newer, 16-byte
// vectors), copied in and out by bulk copies, so that an SM holds several blocks in different
// phases.
struct CrossEntropyConfig {
  int vec = 1;        // elements per vector access; a power of two, at most 16 bytes
  int threads = 256;  // per row (one row per block): a multiple of 32, at most 1024
  int unroll = 4;     // vector loads in flight per thread: 1, 2, 4 or 8
  int cluster = 0;    // blocks holding one row in the fused op, 1 to 8; 0 streams it twice
  int staged = 0;     // 1: the fused op holds the row in shared memory, 0: in registers
  std::string ToString() const;  // "vec=8 threads=256 unroll=4 cluster=6 staged=1"
  bool operator==(const CrossEntropyConfig&) const = default;
};

// The inverse of CrossEntropyConfig::ToString(), for a config given as text (a tuning database
// record, the C API's and Python's `config`): all five fields, in any order, within the ranges
// above (staged 1 only with a cluster). Whether the config suits a vocab and GPU is not checked
// here. InvalidArgument naming the field and the text.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::CrossEntropyConfig c, kjit::ParseCrossEntropyConfig(
//       "vec=8 threads=256 unroll=4 cluster=6 staged=1"));
//   // with threads=100 instead, InvalidArgument cross-entropy config "...": threads=100:
//   // expected a multiple of 32 from 32 to 1024
absl::StatusOr<CrossEntropyConfig> ParseCrossEntropyConfig(std::string_view text);

struct CrossEntropySpec {
  int64_t vocab = 0;           // 2 .. 1,048,576
  DType dtype = DType::kBF16;  // logits and gradient
  LossOptions loss;            // kjit/loss_options.h
  // Overrides the heuristic (e.g. a tuned config); its vec is an upper bound lowered by alignment.
  std::optional<CrossEntropyConfig> config;
};

struct CrossEntropyArgs {
  TensorView logits;  // [rows, vocab], any row_stride >= vocab
  IndexView targets;  // [rows]
  TensorView loss;    // fp32: [rows] for reduction none, else [1]
  TensorView lse;     // optional fp32 [rows]
  IndexView argmax;   // [rows] in loss.target_type; required iff spec.loss.argmax

  // The per-row extras, fp32 [rows] (kjit/cross_entropy.h's header says what they hold):
  TensorView entropy;         // required iff spec.loss.entropy, else empty
  TensorView target_logprob;  // optional

  TensorView grad;         // ForwardBackward: [rows, vocab], dtype; may be logits itself (in place)
  TensorView grad_output;  // optional fp32 upstream gradient: [1] (sum, mean) or [rows] (none)
  TensorView class_weight;      // [vocab] (1 row) in spec.loss.class_weight_dtype; iff that is set
  void* workspace = nullptr;    // device memory, 16-byte aligned
  int64_t workspace_bytes = 0;  // >= WorkspaceBytes(rows)
};

struct CrossEntropyBackwardArgs {
  TensorView logits;        // [rows, vocab]
  IndexView targets;        // [rows]
  TensorView lse;           // fp32 [rows], saved by a forward
  TensorView grad_output;   // optional, as for ForwardBackward
  TensorView grad;          // [rows, vocab]; may be logits itself (in place)
  TensorView class_weight;  // as for ForwardBackward (the forward's weights)
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// For an autograd backward, which learns the upstream gradient only after ForwardBackward wrote the
// gradient: grad, computed with grad_output = `applied`, becomes the gradient for `grad_output`.
// Per row r, with g = grad_output[r] (or [0]) and a = applied[r] (or [0], or 1 when empty): if
// g == a the row is not read or written, so the usual case (both 1, or both the same loss scale)
// costs one small launch, not a pass over the gradient; otherwise each element becomes
// round(x * fp32(g / a)) (a NaN g makes the row NaN). Zero rows is a no-op.
struct CrossEntropyRescaleArgs {
  TensorView grad;         // [rows, vocab], as ForwardBackward wrote it
  TensorView grad_output;  // fp32 [1] or [rows]: the upstream gradient
  TensorView applied;      // fp32, grad_output's shape: what ForwardBackward used; empty: 1
};

// Checks a spec without a GPU; InvalidArgument names the bad field.
absl::Status ValidateCrossEntropySpec(const CrossEntropySpec& spec);

namespace internal {
struct RuntimeState;
struct CrossEntropyState;
}  // namespace internal

class CrossEntropy {
 public:
  const CrossEntropySpec& spec() const;
  // The spec's config, else the heuristic's, for the widest vectors.
  const CrossEntropyConfig& config() const;
  // The config a launch of `rows` uses when pointers allow the widest vectors: the spec's, else
  // the tuning database's for the nearest tuned row count (kjit-tune's database; for Forward and
  // Backward, fused = false, the "cross_entropy.forward" record), else config(). Never tunes (with
  // KJIT_AUTOTUNE a launch does).
  CrossEntropyConfig ConfigFor(int64_t rows, bool fused = true) const;
  // The config a launch on these logits (and a gradient aligned as they are) uses: as above, with
  // narrower vectors where their address or row stride allows no wider ones (a contiguous bf16
  // [rows, 50257] has rows 2-byte aligned: scalar accesses).
  CrossEntropyConfig ConfigFor(const TensorView& logits, bool fused = true) const;

  // Loss (and lse, argmax). args.grad must be empty.
  absl::Status Forward(CUstream stream, const CrossEntropyArgs& args) const;
  // Loss and gradient in one launch sequence (and lse, argmax).
  absl::Status ForwardBackward(CUstream stream, const CrossEntropyArgs& args) const;
  // The gradient from the lse a forward saved.
  absl::Status Backward(CUstream stream, const CrossEntropyBackwardArgs& args) const;
  // See CrossEntropyRescaleArgs.
  absl::Status RescaleGradient(CUstream stream, const CrossEntropyRescaleArgs& args) const;

  // The counters (16 bytes), then for sum and mean one fp32 loss per row. O(rows); rows outside
  // 1 .. 2^31 - 1 (what a launch takes) count as the nearer.
  int64_t WorkspaceBytes(int64_t rows) const;

  // Compiles (or finds in the caches) the programs for the widest config, each a cache entry of
  // its own: all that any launch may load (a launch compiles only those of the kernels it runs,
  // on first use; the op, when made on a GPU, the forward+backward's). Works compile-only.
  absl::StatusOr<BuildInfo> Build() const;

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
