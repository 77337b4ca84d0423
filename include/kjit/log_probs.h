// LogProbs: the reinforcement-learning heads of a policy's logits over a large vocabulary, JIT-
// specialized for one vocab, dtype, target type and temperature. Per row with logits z, target t
// and temperature T (p = softmax(z / T), computed in fp32 with 1 / T applied as each logit is
// read: no scaled copy of the logits):
//   logprob = log p_t = z_t / T - lse(z / T)        (TRL's and verl's per-token log-probs)
//   entropy = -sum_j p_j ln p_j                     (when spec.entropy)
// both fp32 [rows] and 0 for a row whose target is ignore_index or outside [0, vocab). The backward
// takes per-row upstream gradients of both outputs at once, either absent (its term left out):
//   d z_j = (g_lp (1[j = t] - p_j) - g_H p_j (ln p_j + H)) / T,   zeros for an ignored row,
// from the lse (and entropy) the forward saved, rounded once to the logits' dtype, written in place
// over the logits or into another buffer. A forward writes nothing but the per-row outputs (an old
// or reference policy's pass). NaN or +Inf in a row makes its outputs and gradient NaN; -Inf
// logits (masked classes) get probability 0 and a zero gradient.
//
// Each launch is one kernel, one block per row, streaming the row once (cross-entropy's streaming
// kernels' layout and statistics: any vocab at any address by whole 16-byte vectors after the
// row's first boundary); no workspace, no host synchronization, no floating-point atomics: CUDA-
// graph capturable and bit-for-bit repeatable.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::LogProbs lp, rt.LogProbs({.vocab = 151936, .dtype = DType::kBF16,
//                                                         .temperature = 0.7f, .entropy = true}));
//   KJIT_RETURN_IF_ERROR(lp.Forward(stream, {.logits = logits, .targets = targets,
//                                            .logprob = logprob, .entropy = entropy, .lse = lse}));
//   KJIT_RETURN_IF_ERROR(lp.Backward(stream, {.logits = logits, .targets = targets, .lse = lse,
//       .entropy = entropy, .grad_logprob = d_logprob, .grad_entropy = d_entropy,
//       .grad = logits}));                                                        // in place
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "kjit/cross_entropy.h"
#include "kjit/runtime.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"

namespace kjit {

struct LogProbsSpec {
  int64_t vocab = 0;           // 2 .. 1,048,576
  DType dtype = DType::kBF16;  // logits and gradient
  IndexType target_type = IndexType::kInt64;
  int64_t ignore_index = -100;  // must fit target_type
  float temperature = 1.0f;     // T: finite, > 0
  bool entropy = false;         // Forward writes args.entropy (a program of its own)
  // Overrides the heuristic; only its streaming fields are used (vec, an upper bound lowered by
  // the views' alignment, threads, unroll); cluster and staged must be 0.
  std::optional<CrossEntropyConfig> config;
};

struct LogProbsArgs {
  TensorView logits;   // [rows, vocab], any row_stride >= vocab
  IndexView targets;   // [rows]
  TensorView logprob;  // fp32 [rows]
  TensorView entropy;  // fp32 [rows]: required iff spec.entropy
  TensorView lse;      // optional fp32 [rows]: lse(z / T), what Backward needs
};

struct LogProbsBackwardArgs {
  TensorView logits;        // [rows, vocab], as the forward read them
  IndexView targets;        // [rows]
  TensorView lse;           // fp32 [rows], the forward's
  TensorView entropy;       // fp32 [rows], the forward's: required iff grad_entropy is given
  TensorView grad_logprob;  // optional fp32 [rows]: d loss / d logprob
  TensorView grad_entropy;  // optional fp32 [rows]: d loss / d entropy
  TensorView grad;          // [rows, vocab] in spec.dtype; may be logits itself (in place)
};

// Checks a spec without a GPU; InvalidArgument names the bad field.
absl::Status ValidateLogProbsSpec(const LogProbsSpec& spec);

namespace internal {
struct RuntimeState;
struct LogProbsState;
}  // namespace internal

class LogProbs {
 public:
  const LogProbsSpec& spec() const;
  // The spec's config, else the heuristic's (cross-entropy's streaming fields), for the widest
  // vectors.
  const CrossEntropyConfig& config() const;
  // The per-row outputs; reads an ignored row only when args.lse is given.
  absl::Status Forward(CUstream stream, const LogProbsArgs& args) const;
  // The gradient from the forward's lse (and entropy), for the upstream gradients given; with
  // neither, zeros.
  absl::Status Backward(CUstream stream, const LogProbsBackwardArgs& args) const;
  // Compiles (or finds in the caches) the forward's and the backward's programs for the widest
  // config; works compile-only.
  absl::StatusOr<BuildInfo> Build() const;

 private:
  friend class Runtime;
  LogProbs(std::shared_ptr<internal::RuntimeState> rt, std::shared_ptr<internal::LogProbsState> op)
      : rt_(std::move(rt)), op_(std::move(op)) {}
  std::shared_ptr<internal::RuntimeState> rt_;
  std::shared_ptr<internal::LogProbsState> op_;
};

}  // namespace kjit
