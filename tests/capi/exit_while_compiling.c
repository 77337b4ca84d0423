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
 *   kjit_exit_while_compiling 400
 *   kjit_exit_while_compiling 400 fork */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
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

static void* build_forever(void* arg) {
  const long seed = (long)arg;
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.target = "sm_90";
  o.compile_only = 1;
  o.disk_cache = 0;
  kjit_runtime* rt = NULL;
  if (kjit_runtime_create(&o, &rt) != KJIT_OK) die("kjit_runtime_create");
  for (long i = 0;; ++i) {
    kjit_cross_entropy_spec s;
    kjit_cross_entropy_spec_init(&s);
    s.vocab = 1000 + 16 * i + seed; /* a new program each time: nothing is found built */
    kjit_cross_entropy* ce = NULL;
    if (kjit_cross_entropy_create(rt, &s, &ce) != KJIT_OK) die("kjit_cross_entropy_create");
    pthread_mutex_lock(&mu);
    ++building;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    char* json = NULL;
    if (kjit_cross_entropy_build(ce, &json) != KJIT_OK) die("kjit_cross_entropy_build");
    kjit_free(json);
    kjit_cross_entropy_destroy(ce);
  }
  return NULL;
}

static void linger(void) {
  const struct timespec t = {0, 300 * 1000000L};
  nanosleep(&t, NULL);
}

int main(int argc, char** argv) {
  const long delay_ms = argc > 1 ? atol(argv[1]) : 300;
  atexit(linger);
  for (long i = 0; i < kThreads; ++i) {
    pthread_t t;
    if (pthread_create(&t, NULL, build_forever, (void*)i) != 0) return 4;
  }
  pthread_mutex_lock(&mu);
  while (building < kThreads) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  const struct timespec delay = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
  nanosleep(&delay, NULL);
  if (argc > 2 && strcmp(argv[2], "fork") == 0) {
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
