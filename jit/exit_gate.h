// Process exit against NVRTC work in flight on other threads.
//
// exit() runs every library's static destructors, NVRTC's (its LLVM) among them, while the
// process's other threads keep running: a compile in flight on one of them then uses freed state
// ("double free or corruption", "LLVM ERROR: out of memory", SIGSEGV). Every use of an NVRTC
// program holds an ExitGate::Pass. An atexit handler, registered once NVRTC is loaded and again
// once its first compile has registered the destructors it registers lazily, so that it runs
// before any of them, waits for the passes that other threads hold to end (a compile takes seconds;
// the wait stops at kMaxWait, for an NVRTC that hangs). From then on a thread that asks for a pass,
// or gives one back, waits for the process to end rather than running on into state being
// destroyed. The exiting thread itself is never held.
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

  // Registers the handler (again): call it after loading a library whose static destructors a
  // pass protects, and after a first use that registers more of them. Cheap; it runs once.
  static void Arm();
  // Whether the process has begun to exit (the handler has run); for tests.
  static bool exiting();
};

}  // namespace kjit::jit
