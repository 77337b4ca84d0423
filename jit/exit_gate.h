// Process exit against kjit work in flight on other threads.
//
// exit() runs every library's static destructors, NVRTC's (its LLVM) among them, while the
// process's other threads keep running: a compile in flight on one of them then uses freed state
// ("double free or corruption", "LLVM ERROR: out of memory", SIGSEGV). Every C API call and every
// use of an NVRTC program holds an ExitGate::Pass. An atexit handler, registered once NVRTC is
// loaded and again once its first compile has registered the destructors it registers lazily, so
// that it runs before any of them, waits for the threads holding passes to give back their
// outermost one (a compile takes seconds; the wait stops at kMaxWait, for an NVRTC that hangs).
// From then on a thread that takes an outermost pass, or gives one back, waits for the process to
// end rather than running on into state being destroyed. The exiting thread itself is never held,
// and passes nested in another (or in a thread started for one: Inherited) never hold a thread,
// so that a call waiting for its own workers is waited for, not deadlocked.
//
// fork() waits for the compiles in flight (NvrtcUse) and holds new ones back until it returns.
//
// NVRTC's own start (its load, and its first compile, when it registers more destructors) is a
// window that handler cannot cover: what NVRTC registers then runs before the handler. Those run
// in a Startup instead, and exit() waits for them before any exit handler runs: glibc's exit()
// first runs the exiting thread's thread_local destructors, and every thread that loads kjit or
// calls it holds one whose destructor waits for the Startups in flight (at most tens of
// milliseconds, once per process; a thread that merely ends during one waits for it too). NVRTC's
// first compile also installs SIGINT and SIGTERM handlers that call exit(): an exit from one of
// them ends the process by the signal instead.
//
//   {
//     ExitGate::Pass pass;                       // exit() waits for it
//     nvrtc.nvrtcCompileProgram(prog, n, opts);
//   }
#pragma once

#include <chrono>

namespace kjit::jit {

class ExitGate {
 public:
  static constexpr std::chrono::seconds kMaxWait{60};

  class Pass {
   public:
    Pass();
    ~Pass();
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
  };

  // On a thread started to work for a call that holds a pass (Jit::BuildAll's workers), with
  // `held` = held() on the starting thread: this thread's passes are then nested in that one.
  class Inherited {
   public:
    explicit Inherited(bool held);
    ~Inherited();
    Inherited(const Inherited&) = delete;
    Inherited& operator=(const Inherited&) = delete;

   private:
    bool held_;
  };

  // NVRTC's load and its first compile: exit() on another thread waits for it to end before any
  // exit handler (NVRTC's destructors among them) runs. Not nested in a Pass.
  class Startup {
   public:
    Startup();
    ~Startup();
    Startup(const Startup&) = delete;
    Startup& operator=(const Startup&) = delete;
  };

  // Around every use of an NVRTC program (a compile): fork() waits for those in flight on other
  // threads (up to kMaxWait) and holds new ones back until it returns, since its child would find
  // NVRTC's locks held by threads it does not have (its first compile hung).
  class NvrtcUse {
   public:
    NvrtcUse();
    ~NvrtcUse();
    NvrtcUse(const NvrtcUse&) = delete;
    NvrtcUse& operator=(const NvrtcUse&) = delete;
  };
  // Whether this process was forked while another thread compiled for longer than the fork
  // waited: NVRTC must not be used in it.
  static bool nvrtc_unusable();

  // Whether this thread holds a pass.
  static bool held();
  // Registers the handler (again): call it after loading a library whose static destructors a
  // pass protects, and after a first use that registers more of them. Cheap; it runs once.
  static void Arm();
  // Whether the process has begun to exit (the handler has run); for tests.
  static bool exiting();
};

}  // namespace kjit::jit
