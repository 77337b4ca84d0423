// The process's default tuner (kjit/runtime.h): set by kjit_launch_tuner's static initializer or
// by the program, read by each runtime when it tunes.
#include <memory>
#include <mutex>
#include <utility>

#include "kjit/runtime.h"

namespace kjit {
namespace {

struct DefaultTunerSlot {
  std::mutex mu;
  std::shared_ptr<Tuner> tuner;
};

// Made on first use (a static initializer of another file may set it) and never destroyed.
DefaultTunerSlot& Slot() {
  static auto* slot = new DefaultTunerSlot;
  return *slot;
}

}  // namespace

void SetDefaultTuner(std::shared_ptr<Tuner> tuner) {
  std::lock_guard<std::mutex> lock(Slot().mu);
  Slot().tuner = std::move(tuner);
}

std::shared_ptr<Tuner> DefaultTuner() {
  std::lock_guard<std::mutex> lock(Slot().mu);
  return Slot().tuner;
}

}  // namespace kjit
