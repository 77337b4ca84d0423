// The cross-entropy trial (ops/common/tuning/trial.h): logits and targets made on the device, and
// the passes the tuner and `kjit bench` time, each checked on sampled rows.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kjit/device_buffer.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/trial.h"
#include "ops/cross_entropy/tuning/reference.h"

namespace kjit::ops {

// Cross-entropy with the gradient in place into the logits (the fused op's main use) and the
// forward alone. The spec's reduction, options and target type are used as given; every target
// is valid; class weights, when the spec has them, are uniform in [0.5, 1.5). Checked on sampled
// rows: the first and last 16 and 32 spread between.
class CrossEntropyTrial {
 public:
  static absl::StatusOr<std::unique_ptr<CrossEntropyTrial>> Create(const Runtime& rt,
                                                                   const CrossEntropySpec& spec,
                                                                   int64_t rows);
  // Runs `pass` (the fused forward+backward, or the forward alone) and compares lse and, with the
  // backward, the sampled gradient rows.
  absl::Status Check(const CrossEntropy& op, Pass pass);
  // kForwardBackward restores the logits (untimed) before every launch; kForward reads them.
  absl::StatusOr<TimedWork> Work(const CrossEntropy& op, Pass pass);
  // The fewest bytes a pass must move: the logits read, and for the gradient written.
  double Bytes(Pass pass) const;
  int64_t rows() const { return rows_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  int64_t checked_rows() const { return static_cast<int64_t>(sample_.size()); }
  // The logits every pass launches on ([rows, vocab], contiguous).
  TensorView logits() const { return Args(/*gradient=*/false).logits; }

 private:
  CrossEntropyTrial(DeviceBuffer pristine, DeviceBuffer work, DeviceBuffer targets,
                    DeviceBuffer loss, DeviceBuffer lse, DeviceBuffer workspace)
      : pristine_(std::move(pristine)),
        work_(std::move(work)),
        targets_(std::move(targets)),
        loss_(std::move(loss)),
        lse_(std::move(lse)),
        workspace_(std::move(workspace)) {}
  absl::Status Restore() const;
  CrossEntropyArgs Args(bool gradient) const;

  CrossEntropySpec spec_;
  int64_t rows_ = 0;
  int64_t workspace_bytes_ = 0;
  DeviceBuffer pristine_, work_, targets_, loss_, lse_, workspace_;
  std::optional<DeviceBuffer> class_weight_;
  std::vector<int64_t> sample_;
  CrossEntropyMath math_;
  CrossEntropyResult ref_;
};

}  // namespace kjit::ops
