#include "jit/exit_gate.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>

#include "jit/glibc_compat.h"

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
  // SIGINT's and SIGTERM's handlers when the Startups in flight began (kInterrupts' order).
  struct sigaction before_startup[2] = {};
  int compiling = 0;            // threads in an NvrtcUse; under mu
  bool forking = false;         // a fork waits for them; under mu
  bool nvrtc_unusable = false;  // forked while one was in flight on another thread
};

constexpr int kInterrupts[2] = {SIGINT, SIGTERM};

// This thread's passes, nested ones and an Inherited's included; its Startups and NvrtcUses.
thread_local int held_here = 0;
thread_local int starting_here = 0;
thread_local int compiling_here = 0;

GateState& State();

// fork() copies the count of passes but not the threads that hold them: without this, a child
// forked while another thread compiles (Python's multiprocessing, a data loader) would wait
// kMaxWait at its exit for passes that nobody will give back. Nor does it copy the threads that
// hold NVRTC's own locks: the fork waits for the compiles in flight (NvrtcUse) and holds new ones
// back. The lock is held across the fork so that the child's copy is not locked by a thread it
// does not have; the child's condition is made anew (the parent's waiters are not in it).
void BeforeFork() {
  GateState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  s.forking = true;
  const int own = compiling_here > 0 ? 1 : 0;
  s.cv.wait_for(lock, ExitGate::kMaxWait, [&] { return s.compiling <= own; });
  lock.release();
}
void AfterForkInParent() {
  GateState& s = State();
  s.forking = false;
  s.cv.notify_all();
  s.mu.unlock();
}
void AfterForkInChild() {
  GateState& s = State();
  s.in_flight = held_here > 0 ? 1 : 0;  // the forking thread's own, which the child still has
  s.starting = 0;                       // NVRTC does not fork: no Startup forks with it
  const int own = compiling_here > 0 ? 1 : 0;
  s.nvrtc_unusable = s.nvrtc_unusable || s.compiling > own;  // the wait above timed out
  s.compiling = own;
  s.forking = false;
  new (&s.cv) std::condition_variable;
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

// NVRTC's first compile installs SIGINT and SIGTERM handlers of its own that call exit(), and
// puts the process's back when it ends. A process interrupted then would exit with NVRTC's status
// after waiting for the compile: when this exit comes from such a handler (a Startup is in flight,
// the signal is blocked on this thread as it is while its handler runs, and its handler is not the
// one the Startup began with), the process dies of the signal instead, as it would have without
// NVRTC (143 or 130 in a shell).
void DieOfAnInterruptInNvrtcsStart(const GateState& s) {
  sigset_t blocked;
  if (s.starting.load() == 0 || ::pthread_sigmask(SIG_BLOCK, nullptr, &blocked) != 0) return;
  for (int i = 0; i < 2; ++i) {
    const int sig = kInterrupts[i];
    struct sigaction now = {};
    if (sigismember(&blocked, sig) != 1 || ::sigaction(sig, nullptr, &now) != 0 ||
        now.sa_handler == s.before_startup[i].sa_handler) {
      continue;
    }
    ::signal(sig, SIG_DFL);
    ::raise(sig);  // pending until unblocked, below
    sigset_t just;
    sigemptyset(&just);
    sigaddset(&just, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &just, nullptr);
  }
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
  DieOfAnInterruptInNvrtcsStart(s);
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.exiting.load()) return;  // an earlier registration's run
  s.exiting_thread = std::this_thread::get_id();
  s.exiting.store(true);
  const int own = held_here > 0 ? 1 : 0;
  s.cv.wait_for(lock, ExitGate::kMaxWait, [&] { return s.in_flight.load() <= own; });
}

// Run by glibc's exit() on the exiting thread before any exit handler (its thread_local
// destructors come first), and by a thread that ends: waits for the Startups in flight on other
// threads.
struct StartupWatch {
  ~StartupWatch() {
    GateState& s = State();
    if (s.starting.load() == 0) return;
    DieOfAnInterruptInNvrtcsStart(s);
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait_for(lock, ExitGate::kMaxWait, [&] { return s.starting.load() <= starting_here; });
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
  GateState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.starting.load() == 0) {
    for (int i = 0; i < 2; ++i) ::sigaction(kInterrupts[i], nullptr, &s.before_startup[i]);
  }
  s.starting.fetch_add(1);
  ++starting_here;
}

ExitGate::Startup::~Startup() {
  GateState& s = State();
  --starting_here;
  s.starting.fetch_sub(1);
  std::lock_guard<std::mutex> lock(s.mu);
  s.cv.notify_all();
}

ExitGate::NvrtcUse::NvrtcUse() {
  if (compiling_here++ > 0) return;
  GateState& s = State();
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return !s.forking; });
  ++s.compiling;
}

ExitGate::NvrtcUse::~NvrtcUse() {
  if (--compiling_here > 0) return;
  GateState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  --s.compiling;
  s.cv.notify_all();
}

bool ExitGate::nvrtc_unusable() {
  GateState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.nvrtc_unusable;
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
