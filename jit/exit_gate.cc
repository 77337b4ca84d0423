#include "jit/exit_gate.h"

#include <pthread.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace kjit::jit {

namespace {

struct GateState {
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  bool exiting = false;
  std::thread::id exiting_thread;
};

// The passes this thread holds (the exiting thread waits only for the others').
thread_local int held_here = 0;

GateState& State();

// fork() copies the count of passes but not the threads that hold them: without this, a child
// forked while another thread compiles (Python's multiprocessing, a data loader) would wait
// kMaxWait at its exit for passes that nobody will give back. The lock is held across the fork so
// that the child's copy is not locked by a thread it does not have.
void BeforeFork() { State().mu.lock(); }
void AfterForkInParent() { State().mu.unlock(); }
void AfterForkInChild() {
  GateState& s = State();
  s.in_flight = held_here;  // the forking thread's own, which the child still has
  s.mu.unlock();
}

// Never destroyed: the handler and the passes use it while the process's destructors run.
GateState& State() {
  static GateState* state = [] {
    auto* s = new GateState;
    ::pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild);
    return s;
  }();
  return *state;
}

// The process is exiting under this thread: it waits for the end (exit_group ends every thread).
[[noreturn]] void WaitForTheEnd() {
  for (;;) ::pause();
}

bool HeldBack(const GateState& s) {
  return s.exiting && s.exiting_thread != std::this_thread::get_id();
}

void OnExit() {
  GateState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.exiting) return;  // an earlier registration's run
  s.exiting = true;
  s.exiting_thread = std::this_thread::get_id();
  const int own = held_here;
  s.cv.wait_for(lock, ExitGate::kMaxWait, [&] { return s.in_flight <= own; });
}

}  // namespace

ExitGate::Pass::Pass() {
  GateState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  if (HeldBack(s)) {
    lock.unlock();
    WaitForTheEnd();
  }
  ++s.in_flight;
  ++held_here;
}

ExitGate::Pass::~Pass() {
  GateState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  --s.in_flight;
  --held_here;
  s.cv.notify_all();
  if (HeldBack(s)) {
    lock.unlock();
    WaitForTheEnd();
  }
}

void ExitGate::Arm() { std::atexit(OnExit); }

bool ExitGate::exiting() {
  GateState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.exiting;
}

}  // namespace kjit::jit
