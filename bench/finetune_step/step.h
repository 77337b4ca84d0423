// The last layers of a LLaMA-style fine-tuning step, and the two ways the example runs it: the
// final RMSNorm, the lm_head matmul, cross-entropy over shifted targets, and the backward through
// all three. Both paths read the same inputs (made once on the device) and write the same
// gradients, each from its own counted DevicePool.
//
//   KJIT_ASSIGN_OR_RETURN(SharedInputs in, MakeSharedInputs(rt, problem, kernels, shared_pool));
//   KJIT_ASSIGN_OR_RETURN(auto path, MakeKjitPath(rt, problem, in, /*chunk_rows=*/1024));
//   KJIT_RETURN_IF_ERROR(path->Step());
//   KJIT_ASSIGN_OR_RETURN(double loss, path->Loss());
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/finetune_step/device_pool.h"
#include "bench/finetune_step/eager_kernels.h"
#include "bench/finetune_step/lt_matmul.h"
#include "kjit/kjit.h"

namespace finetune {

inline constexpr int64_t kIgnoreIndex = -100;

struct Problem {
  std::string model;
  int64_t batch = 0, seq = 0, hidden = 0, vocab = 0;
  float eps = 1e-5f;
  int64_t tokens() const { return batch * seq; }
};

// What both paths read. Random, from fixed seeds: hidden states ~ N(0, 1), norm weight ~ N(1, 0.1),
// lm_head ~ N(0, 0.02) (LLaMA's initializer range), targets uniform over the vocab.
struct SharedInputs {
  Tensor hidden;       // [tokens, hidden] bf16: the last decoder layer's output
  Tensor norm_weight;  // [1, hidden] bf16
  Tensor lm_head;      // [vocab, hidden] bf16
  // [tokens] int64: the next token of each position, ignore_index at the last position of each
  // sequence, which has none.
  Buffer targets;
  std::vector<int64_t> host_targets;
  int64_t valid_targets = 0;
};

absl::StatusOr<SharedInputs> MakeSharedInputs(const kjit::Runtime& rt, const Problem& problem,
                                              const EagerKernels& kernels, DevicePool& pool);

// One way of running the step. A path owns its pool: everything it allocates is counted there.
class Path {
 public:
  virtual ~Path() = default;
  const std::string& name() const { return pool_.name(); }
  // One forward and backward, queued on the default stream; no host synchronization.
  virtual absl::Status Step() = 0;
  // The mean loss over the valid targets of the last step (waits for it).
  virtual absl::StatusOr<double> Loss() const = 0;

  // The gradients of the last step: hidden states, norm weight, lm_head weight.
  const Tensor& dx() const { return dx_; }
  const Tensor& dnorm_weight() const { return dnorm_weight_; }
  const Tensor& dlm_head() const { return dlm_head_; }
  const DevicePool& pool() const { return pool_; }

 protected:
  Path(const kjit::Runtime& rt, const Problem& problem, const SharedInputs& in, std::string name)
      : rt_(rt), problem_(problem), in_(in), pool_(rt, std::move(name)) {}
  // The gradients, which every path has.
  absl::Status AllocateCommon();
  // The baseline's matmul, with its workspace.
  absl::Status AllocateMatmul();

  const kjit::Runtime& rt_;
  const Problem problem_;
  const SharedInputs& in_;
  DevicePool pool_;  // before every buffer, which must return to it
  Tensor dx_, dnorm_weight_, dlm_head_;
  Buffer matmul_workspace_;
  std::unique_ptr<LtMatmul> matmul_;
};

// What an eager framework runs: Hugging Face's LlamaRMSNorm op by op, the logits up-cast to fp32,
// log_softmax and nll_loss with every intermediate and gradient materialized.
absl::StatusOr<std::unique_ptr<Path>> MakeBaselinePath(const kjit::Runtime& rt,
                                                       const Problem& problem,
                                                       const SharedInputs& in,
                                                       const EagerKernels& kernels);

// kjit's RMSNorm and its fused lm_head + cross-entropy (kjit::LinearCrossEntropy). With
// chunk_rows < tokens the logits never exist in full; chunk_rows >= tokens is one chunk.
absl::StatusOr<std::unique_ptr<Path>> MakeKjitPath(const kjit::Runtime& rt, const Problem& problem,
                                                   const SharedInputs& in, int64_t chunk_rows,
                                                   std::string name);

// Rows [first, first + count) of a matrix.
kjit::TensorView Rows(const kjit::TensorView& v, int64_t first, int64_t count);
// A contiguous view's values, decoded.
absl::StatusOr<std::vector<double>> Download(const kjit::Runtime& rt, const kjit::TensorView& v);

}  // namespace finetune
