// The RL heads' trial (ops/common/tuning/trial.h): logits, targets and both upstream gradients made
// on the device; the forward, the backward (in place, from the forward's lse and entropy) and the
// two in sequence, each checked on sampled rows against the fp64 reference before it is timed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kjit/device_buffer.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/trial.h"
#include "ops/log_probs/tuning/reference.h"

namespace kjit::ops {

// The spec's temperature, target type and entropy are used as given; every target is valid; the
// upstream gradients are uniform in [-1, 1), both given (the entropy's only with spec.entropy).
class LogProbsTrial {
 public:
  static absl::StatusOr<std::unique_ptr<LogProbsTrial>> Create(const Runtime& rt,
                                                               const LogProbsSpec& spec,
                                                               int64_t rows);
  // kForward: log-prob, entropy and lse; kBackward: the gradient (after an untimed forward);
  // kForwardBackward: both. The sampled rows are compared with the reference.
  absl::Status Check(const LogProbs& op, Pass pass);
  // The backward passes restore the logits (untimed) before every launch.
  absl::StatusOr<TimedWork> Work(const LogProbs& op, Pass pass);
  // The fewest bytes a pass moves: the logits read (forward), read and written (backward).
  double Bytes(Pass pass) const;
  int64_t rows() const { return rows_; }
  int64_t checked_rows() const { return static_cast<int64_t>(sample_.size()); }

 private:
  LogProbsTrial() = default;
  LogProbsArgs ForwardArgs(const DeviceBuffer& logits) const;
  LogProbsBackwardArgs BackwardArgs() const;
  absl::Status Forward(const LogProbs& op, const DeviceBuffer& logits) const;

  LogProbsSpec spec_;
  int64_t rows_ = 0;
  std::vector<DeviceBuffer> buffers_;  // pristine, work, targets, logprob, entropy, lse, g_lp, g_h
  std::vector<int64_t> sample_;
  LogProbsResult ref_;  // of the sampled rows
};

}  // namespace kjit::ops
