/* Issue 34, defect 2: exit() while other threads compile. Two threads each build cross-entropy ops
 * (compile-only, no disk cache: every build runs NVRTC) one after another; once both have begun a
 * build, the main thread sleeps argv[1] milliseconds and calls exit(0). The process must exit 0:
 * before the fix NVRTC's static destructors ran under the compiles (SIGSEGV, "double free or
 * corruption", "LLVM ERROR: out of memory"). The program's own first exit handler, which runs
 * after every library's destructors, lingers 300 ms as a larger program's would (Python's
 * finalization takes longer still), so that a compile left running on freed state shows.
 *
 *
 * With "fork" after the delay, the main thread first forks a child that exits at once: the child
 * has no compiling thread, so its exit must not wait for one (it waited ExitGate::kMaxWait, 60 s,
 * before the fork handler); the program exits 5 when the child took over 10 s.
 *
 * Issue 45, defect 1: with "fork-build" the child builds an op of its own before it exits (before
 * the fix it hung in nvrtcCompileProgram on a lock a parent's compile held at the fork); five
 * forks, each child given 30 s, else the program exits 7.
 *
 * Issue 45, defect 2: with "term" or "int" the main thread sends the process SIGTERM or SIGINT
 * after the delay instead, from the start of the first build (NVRTC's first compile installs
 * handlers of its own that call exit()); the process must die of the signal at once. The program
 * exits 8 when it is still alive 20 s later.
 *
 *   kjit_exit_while_compiling 400
 *   kjit_exit_while_compiling 400 fork
 *   kjit_exit_while_compiling 100 fork-build
 *   kjit_exit_while_compiling 12 term */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kjit/kjit_c.h"

enum { kThreads = 2 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int building = 0;

static void die(const char* what) {
  fprintf(stderr, "%s: %s\n", what, kjit_last_error());
  exit(3);
}

static kjit_runtime* compile_only_runtime(void) {
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.target = "sm_90";
  o.compile_only = 1;
  o.disk_cache = 0;
  kjit_runtime* rt = NULL;
  if (kjit_runtime_create(&o, &rt) != KJIT_OK) die("kjit_runtime_create");
  return rt;
}

/* Builds the cross-entropy op of `vocab` classes (nothing is found built: no disk cache). */
static void build(kjit_runtime* rt, long vocab, int count_it) {
  kjit_cross_entropy_spec s;
  kjit_cross_entropy_spec_init(&s);
  s.vocab = vocab;
  kjit_cross_entropy* ce = NULL;
  if (kjit_cross_entropy_create(rt, &s, &ce) != KJIT_OK) die("kjit_cross_entropy_create");
  if (count_it) {
    pthread_mutex_lock(&mu);
    ++building;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
  }
  char* json = NULL;
  if (kjit_cross_entropy_build(ce, &json) != KJIT_OK) die("kjit_cross_entropy_build");
  kjit_free(json);
  kjit_cross_entropy_destroy(ce);
}

static void* build_forever(void* arg) {
  const long seed = (long)arg;
  kjit_runtime* rt = compile_only_runtime();
  for (long i = 0;; ++i) build(rt, 1000 + 16 * i + seed, 1);
  return NULL;
}

static void sleep_ms(long ms) {
  const struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* A child that builds an op while the parent's threads compile; 0 when each child did in 30 s. */
static int fork_and_build(void) {
  for (int round = 0; round < 5; ++round) {
    const pid_t child = fork();
    if (child == 0) {
      build(compile_only_runtime(), 999, 0);
      _exit(0);
    }
    int status = 0;
    int waited_ms = 0;
    while (child > 0 && waitpid(child, &status, WNOHANG) == 0 && waited_ms < 30000) {
      sleep_ms(10);
      waited_ms += 10;
    }
    if (child < 0) return 4;
    if (waited_ms >= 30000) {
      fprintf(stderr, "the forked child still builds after 30 s\n");
      kill(child, SIGKILL);
      return 7;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 6;
    sleep_ms(50);
  }
  return 0;
}

static void linger(void) { sleep_ms(300); }

int main(int argc, char** argv) {
  const long delay_ms = argc > 1 ? atol(argv[1]) : 300;
  const char* mode = argc > 2 ? argv[2] : "";
  const int signal_number = strcmp(mode, "term") == 0  ? SIGTERM
                            : strcmp(mode, "int") == 0 ? SIGINT
                                                       : 0;
  atexit(linger);
  for (long i = 0; i < kThreads; ++i) {
    pthread_t t;
    if (pthread_create(&t, NULL, build_forever, (void*)i) != 0) return 4;
  }
  pthread_mutex_lock(&mu);
  while (building < kThreads) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  sleep_ms(delay_ms);
  if (signal_number != 0) {
    kill(getpid(), signal_number);
    sleep_ms(20000);
    return 8;
  }
  if (strcmp(mode, "fork-build") == 0) return fork_and_build();
  if (strcmp(mode, "fork") == 0) {
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    const pid_t child = fork();
    if (child == 0) exit(0);
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child) return 4;
    clock_gettime(CLOCK_MONOTONIC, &end);
    if (end.tv_sec - start.tv_sec > 10) {
      fprintf(stderr, "the forked child took %ld s to exit\n", (long)(end.tv_sec - start.tv_sec));
      return 5;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 6;
  }
  exit(0);
}
