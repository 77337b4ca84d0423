#include "jit/exit_gate.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace kjit::jit {

namespace {

// The counts are atomics so that a C API call (a launch among them) takes and gives back a pass
// without a lock; the lock and the condition are the exiting thread's, to wait on.
struct GateState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> in_flight{0};  // threads holding an outermost pass
  std::atomic<int> starting{0};   // threads in a Startup
  std::atomic<bool> exiting{false};
  std::thread::id exiting_thread;  // set before `exiting`, read after it
};

// This thread's passes, nested ones and an Inherited's included.
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
  s.in_flight = held_here > 0 ? 1 : 0;  // the forking thread's own, which the child still has
  s.starting = 0;                       // NVRTC does not fork: no Startup forks with it
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
  return s.exiting.load() && s.exiting_thread != std::this_thread::get_id();
}

// An outermost pass given back; the exiting thread is told once it is exiting. The order (count,
// then the flag; the handler: the flag, then the count under the lock) makes sure that one of the
// two sees the other: no wake-up is lost.
void Leave(GateState& s) {
  s.in_flight.fetch_sub(1);
  if (s.exiting.load()) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.cv.notify_all();
  }
}

void OnExit() {
  GateState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.exiting.load()) return;  // an earlier registration's run
  s.exiting_thread = std::this_thread::get_id();
  s.exiting.store(true);
  const int own = held_here > 0 ? 1 : 0;
  s.cv.wait_for(lock, ExitGate::kMaxWait, [&] { return s.in_flight.load() <= own; });
}

// Run by glibc's exit() on the exiting thread before any exit handler (its thread_local
// destructors come first), and by a thread that ends: waits for the Startups in flight.
struct StartupWatch {
  ~StartupWatch() {
    GateState& s = State();
    if (s.starting.load() == 0) return;
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait_for(lock, ExitGate::kMaxWait, [&] { return s.starting.load() == 0; });
  }
};

// The watch is constructed on first use in each thread.
void WatchThisThread() {
  static thread_local StartupWatch watch;
  (void)&watch;
}

// The thread that loads kjit (a program's main thread; Python's, at import) may call exit()
// without ever calling kjit.
[[maybe_unused]] const bool kLoadingThreadWatched = (WatchThisThread(), true);

}  // namespace

ExitGate::Pass::Pass() {
  if (held_here++ > 0) return;  // nested: the outermost one counts
  WatchThisThread();
  GateState& s = State();
  s.in_flight.fetch_add(1);
  if (HeldBack(s)) {
    --held_here;
    Leave(s);
    WaitForTheEnd();
  }
}

ExitGate::Pass::~Pass() {
  if (--held_here > 0) return;
  GateState& s = State();
  Leave(s);
  if (HeldBack(s)) WaitForTheEnd();
}

ExitGate::Startup::Startup() {
  WatchThisThread();
  State().starting.fetch_add(1);
}

ExitGate::Startup::~Startup() {
  GateState& s = State();
  s.starting.fetch_sub(1);
  std::lock_guard<std::mutex> lock(s.mu);
  s.cv.notify_all();
}

ExitGate::Inherited::Inherited(bool held) : held_(held) {
  if (held_) ++held_here;
}

ExitGate::Inherited::~Inherited() {
  if (held_) --held_here;
}

bool ExitGate::held() { return held_here > 0; }

void ExitGate::Arm() { std::atexit(OnExit); }

bool ExitGate::exiting() { return State().exiting.load(); }

}  // namespace kjit::jit
