// The fused linear + cross-entropy's trial (ops/common/tuning/trial.h): hidden states, the lm_head
// weight and targets made on the device, each config checked against the unfused path on the same
// bytes (cuBLASLt's logits, kjit's cross-entropy in place, cuBLASLt's gradients: the path the GPU
// suite holds to the fp64 reference), then its forward+backward timed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kjit/device_buffer.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/trial.h"

namespace kjit::ops {

class LinearCrossEntropyTrial {
 public:
  // Every target valid; logits of deviation about 2. Runs the unfused path once (rows x vocab of
  // logits, freed before returning) and keeps its loss and sampled rows of d_hidden and d_weight.
  static absl::StatusOr<std::unique_ptr<LinearCrossEntropyTrial>> Create(
      const Runtime& rt, const LinearCrossEntropySpec& spec, int64_t rows);
  // Runs ForwardBackward (the one pass) and compares the loss (1e-3 relative) and the sampled rows
  // of d_hidden and d_weight (4 bf16 roundings relative plus 2^-8 of the rows' RMS) with the
  // unfused path's.
  absl::Status Check(const LinearCrossEntropy& op, Pass pass);
  absl::StatusOr<TimedWork> Work(const LinearCrossEntropy& op, Pass pass);
  // The fewest bytes: the inputs read, the gradients written (the op is GEMM-bound: kjit bench
  // quotes TFLOP/s against the GEMMs alone too).
  double Bytes(Pass pass) const;
  int64_t rows() const { return rows_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  LinearCrossEntropyTrial() = default;
  LinearCrossEntropyArgs Args(const LinearCrossEntropy& op) const;

  LinearCrossEntropySpec spec_;
  int64_t rows_ = 0, workspace_bytes_ = 0;
  std::vector<DeviceBuffer> buffers_;  // h, w, targets, loss, d_hidden, d_weight, workspace
  std::vector<int64_t> sampled_rows_, sampled_vocab_rows_;
  double loss_ = 0;
  std::vector<double> d_hidden_rows_, d_weight_rows_;
};

}  // namespace kjit::ops
