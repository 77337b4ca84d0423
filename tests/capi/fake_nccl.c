/* A stand-in for libnccl.so.2 (KJIT_NCCL_LIBRARY) that counts the collectives issued through it
 * and issues none: issue 45's tests check that no all-reduce starts before every argument and the
 * runtime were checked (a real NCCL dereferences a bogus communicator and crashes). */
#include <stddef.h>

typedef struct {
  char internal[128];
} ncclUniqueId;

static int all_reduces = 0;

/* What the tests read back (dlsym on the handle kjit opened). */
int fake_nccl_all_reduces(void) { return all_reduces; }

int ncclGetVersion(int* version) {
  *version = 22703;
  return 0;
}
int ncclGetUniqueId(ncclUniqueId* id) {
  (void)id;
  return 0;
}
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  (void)nranks;
  (void)id;
  (void)rank;
  *comm = NULL;
  return 5; /* ncclInvalidUsage: this fake makes no communicators */
}
int ncclCommDestroy(void* comm) {
  (void)comm;
  return 0;
}
int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, void* comm,
                  void* stream) {
  (void)send;
  (void)recv;
  (void)count;
  (void)type;
  (void)op;
  (void)comm;
  (void)stream;
  ++all_reduces;
  return 0;
}
const char* ncclGetErrorString(int result) { return result == 0 ? "no error" : "fake error"; }
const char* ncclGetLastError(void* comm) {
  (void)comm;
  return "";
}
