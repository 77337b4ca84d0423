// The RMSNorm trial (ops/common/tuning/trial.h): inputs made on the device, forward and backward
// checked against the fp64 reference, and the passes the tuner and `kjit bench` time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kjit/device_buffer.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/trial.h"
#include "ops/rms_norm/tuning/reference.h"

namespace kjit::ops {

// RMSNorm forward (with the fused residual when the spec has it) and backward on inputs made on
// the device; the per-row outputs are checked on sampled rows as for cross-entropy, the weight
// gradient (a sum over every row) whole.
class RmsNormTrial {
 public:
  static absl::StatusOr<std::unique_ptr<RmsNormTrial>> Create(const Runtime& rt,
                                                              const RmsNormSpec& spec,
                                                              int64_t rows);
  ~RmsNormTrial();
  // Runs the forward and, unless `pass` is the forward alone, the backward, and compares their
  // outputs on the sampled rows (dw whole).
  absl::Status Check(const RmsNorm& op, Pass pass);
  absl::StatusOr<TimedWork> Work(const RmsNorm& op, Pass pass);
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
  // Casting none: the sampled rows' inputs and the weight, for y with the kernel's rstd, and the
  // reference's rstd of every row, for the backward.
  struct NoneCheck {
    std::vector<double> x, residual, w;
    std::vector<float> rstd;
  };
  std::optional<NoneCheck> none_;
};

}  // namespace kjit::ops
