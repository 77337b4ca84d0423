// The default tuner of KJIT_AUTOTUNE (kjit/runtime.h's Tuner): `kjit-tune --spec` for the one op
// and row bucket, in a child process ($KJIT_TUNE_BIN, else kjit-tune on PATH), so that a candidate
// that crashes or hangs takes the child down, not the training job. The launch waits for it, at
// most $KJIT_AUTOTUNE_TIMEOUT seconds (default 900): then the child is killed with its process
// group (it runs in one of its own, so kjit-tune's workers go with it) and the launch goes on
// untuned, with a warning. A terminal's Ctrl-C therefore reaches the program, not a tuning under
// way: that kjit-tune finishes on its own.
//
// Linking the kjit_launch_tuner library installs it as kjit::DefaultTuner() before main: its link
// interface names kjit_launch_tuner_installed as undefined (-Wl,--undefined=...), which keeps the
// object and its static initializer in the program. kjit's link interface (and kjit.pc) carries
// it, so every program that links kjit autotunes this way unless it sets another tuner.
//
//   kjit::SetDefaultTuner(std::make_shared<kjit::autotune::ChildProcessTuner>());   // done for you
#pragma once

#include "kjit/runtime.h"

namespace kjit::autotune {

class ChildProcessTuner : public Tuner {
 public:
  // Runs `<kjit-tune> --spec <json> --tokens <rows> --db <path> --device <n>`, its report
  // discarded and its progress on stderr. NotFound when there is no kjit-tune to run; Internal
  // when it cannot start or exits non-zero, naming the binary and its status; DeadlineExceeded
  // when it was killed at the timeout; InvalidArgument for a bad KJIT_AUTOTUNE_TIMEOUT.
  absl::Status Tune(const TuneRequest& request) override;
};

}  // namespace kjit::autotune

// 1 once the static initializer has installed the ChildProcessTuner; what -Wl,--undefined names.
extern "C" int kjit_launch_tuner_installed;
