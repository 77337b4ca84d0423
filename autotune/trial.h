// Trials: one problem's inputs on the GPU (an op, its shape and a row count), on which candidate
// configs are checked against the fp64 reference and then timed. `kjit bench` and the autotuner
// both run their measurements through these, so a config is never timed unchecked.
//
// The inputs are made once per trial, and every config of the op is checked and timed on the same
// bytes. Cross-entropy logits are generated on the device (gigabytes at 16384 rows); the checked
// rows are downloaded and compared with the reference computed from exactly those values.
//
//   KJIT_ASSIGN_OR_RETURN(auto trial, CrossEntropyTrial::Create(rt, spec, /*rows=*/4096));
//   KJIT_ASSIGN_OR_RETURN(CrossEntropy ce, rt.CrossEntropy(spec_with_config));
//   KJIT_RETURN_IF_ERROR(trial->Check(ce));                  // wrong results: Internal, with why
//   KJIT_ASSIGN_OR_RETURN(Timing t, trial->Time(ce, Pass::kForwardBackward, timer, 20));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autotune/cross_entropy_reference.h"
#include "autotune/gpu_timer.h"
#include "autotune/rms_norm_reference.h"
#include "runtime/device_buffer.h"
#include "runtime/kjit.h"

namespace kjit::autotune {

enum class Pass { kForward, kBackward, kForwardBackward };
const char* Name(Pass p);  // "forward", "backward", "forward_backward"

// Fills rows x cols elements (row_stride apart) of `dtype` with uniform values in [lo, hi) from
// `seed`, on the device; synchronizes.
absl::Status RandomFill(const Runtime& rt, void* data, DType dtype, int64_t rows, int64_t cols,
                        int64_t row_stride, uint64_t seed, float lo, float hi);

// The bandwidth every measurement is quoted against: a device-to-device copy of `bytes` (read
// and written: 2 * bytes move), timed like the kernels.
constexpr size_t kCopyBytes = size_t{1} << 30;
absl::StatusOr<Timing> TimeDeviceCopy(const Runtime& rt, GpuTimer& timer, size_t bytes,
                                      int repeats);

// Cross-entropy with the gradient in place into the logits (the fused op's main use) and the
// forward alone. The spec's reduction, options and target type are used as given; every target
// is valid. Checked on sampled rows: the first and last 16 and 32 spread between.
class CrossEntropyTrial {
 public:
  static absl::StatusOr<std::unique_ptr<CrossEntropyTrial>> Create(const Runtime& rt,
                                                                    const CrossEntropySpec& spec,
                                                                    int64_t rows);
  // Runs the fused forward+backward and compares lse, loss and the sampled gradient rows.
  absl::Status Check(const CrossEntropy& op);
  // kForwardBackward restores the logits (untimed) before every repeat; kForward reads them.
  absl::StatusOr<Timing> Time(const CrossEntropy& op, Pass pass, GpuTimer& timer, int repeats);
  // The fewest bytes a pass must move: the logits read, and for the gradient written.
  double Bytes(Pass pass) const;
  int64_t rows() const { return rows_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  int64_t checked_rows() const { return static_cast<int64_t>(sample_.size()); }

 private:
  CrossEntropyTrial(const Runtime& rt, DeviceBuffer pristine, DeviceBuffer work,
                    DeviceBuffer targets, DeviceBuffer loss, DeviceBuffer lse,
                    DeviceBuffer workspace)
      : rt_(rt), pristine_(std::move(pristine)), work_(std::move(work)),
        targets_(std::move(targets)), loss_(std::move(loss)), lse_(std::move(lse)),
        workspace_(std::move(workspace)) {}
  absl::Status Restore() const;
  CrossEntropyArgs Args(bool gradient) const;

  const Runtime& rt_;
  CrossEntropySpec spec_;
  int64_t rows_ = 0;
  int64_t workspace_bytes_ = 0;
  DeviceBuffer pristine_, work_, targets_, loss_, lse_, workspace_;
  std::vector<int64_t> sample_;
  CrossEntropyMath math_;
  CrossEntropyResult ref_;
};

// RMSNorm forward (with the fused residual when the spec has it) and backward on inputs made on
// the device; the per-row outputs are checked on sampled rows as for cross-entropy, the weight
// gradient (a sum over every row) whole.
class RmsNormTrial {
 public:
  static absl::StatusOr<std::unique_ptr<RmsNormTrial>> Create(const Runtime& rt,
                                                              const RmsNormSpec& spec,
                                                              int64_t rows);
  ~RmsNormTrial();
  absl::Status Check(const RmsNorm& op);
  absl::StatusOr<Timing> Time(const RmsNorm& op, Pass pass, GpuTimer& timer, int repeats);
  double Bytes(Pass pass) const;
  int64_t rows() const { return rows_; }

 private:
  struct Buffers;
  explicit RmsNormTrial(const Runtime& rt);
  absl::StatusOr<RmsNormForwardArgs> ForwardArgs() const;
  absl::StatusOr<RmsNormBackwardArgs> BackwardArgs(const RmsNorm& op);

  const Runtime& rt_;
  RmsNormSpec spec_;
  int64_t rows_ = 0;
  std::unique_ptr<Buffers> b_;
  std::vector<int64_t> sample_;
  RmsNormMath math_;
  RmsNormForwardResult ref_f_;
  RmsNormBackwardResult ref_b_;
};

}  // namespace kjit::autotune
