// libFuzzer target for the sharded cross-entropy's C API argument structs (kjit/kjit_c.h): a spec
// and the arguments of every step, each field from the input, on a compile-only runtime, whose
// steps check everything and launch nothing. Pointers are picked, not read from the input: NULL,
// host blocks (16-byte aligned or not) and an address that nothing may dereference (a
// compile-only runtime reads no tensor). combine_stats gets arrays of a few shards and a count of
// any size (issue 45, defect 10: reading past them is an ASan report).
//
// Invariants: every call returns a kjit_status, with a message when it fails; no step succeeds
// (nothing can be launched), and none reaches NCCL: KJIT_NCCL_LIBRARY names a file that is not
// there, so a step that looked for NCCL before refusing fails with a message that starts "no
// NCCL" (issue 45, defect 3: a real NCCL crashed on the bogus communicator; other messages start
// with what they name, and may quote the input anywhere after it).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/kjit_c.h"

namespace {

kjit_runtime* runtime = nullptr;

// Aborts unless `status` is a failure (or a success where `may_succeed`) with its message.
void Expect(kjit_status status, bool may_succeed) {
  if (status < KJIT_OK || status > KJIT_UNAUTHENTICATED) std::abort();
  if (status == KJIT_OK) {
    if (!may_succeed) std::abort();
    return;
  }
  const std::string_view message = kjit_last_error();
  if (message.empty() || message.starts_with("no NCCL")) std::abort();
}

// The pointers a field may hold; the blocks outlive the input.
class Pointers {
 public:
  Pointers() : blocks_(4096) {}
  void* Pick(FuzzedDataProvider& in) {
    char* base = reinterpret_cast<char*>(blocks_.data());
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: return nullptr;
      case 1: return base;
      case 2: return base + in.ConsumeIntegralInRange<int>(1, 15);
      case 3: return base + 16 * in.ConsumeIntegralInRange<int>(1, 1023);
      default: return reinterpret_cast<void*>(uintptr_t{0x7f0000000000});  // never dereferenced
    }
  }

 private:
  struct alignas(16) Block {
    char bytes[16];
  };
  std::vector<Block> blocks_;
};

int64_t Count(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: return in.ConsumeIntegralInRange<int64_t>(-2, 8);
    case 1: return in.ConsumeIntegralInRange<int64_t>(0, 1 << 21);
    default: return in.ConsumeIntegral<int64_t>();
  }
}

kjit_tensor Tensor(FuzzedDataProvider& in, Pointers& p) {
  return {p.Pick(in), in.ConsumeIntegralInRange<int32_t>(-1, 3), Count(in), Count(in), Count(in)};
}

kjit_sharded_cross_entropy_spec Spec(FuzzedDataProvider& in, std::string& config) {
  kjit_sharded_cross_entropy_spec s;
  kjit_sharded_cross_entropy_spec_init(&s);
  s.vocab = Count(in);
  s.shard_start = Count(in);
  s.shard_end = Count(in);
  s.dtype = in.ConsumeIntegralInRange<int32_t>(-1, 3);
  s.loss.target_type = in.ConsumeIntegralInRange<int32_t>(-1, 2);
  s.loss.reduction = in.ConsumeIntegralInRange<int32_t>(-1, 3);
  s.loss.ignore_index = in.ConsumeIntegral<int64_t>();
  s.loss.label_smoothing = in.ConsumeFloatingPoint<float>();
  s.loss.z_loss = in.ConsumeFloatingPoint<float>();
  s.loss.softcap = in.ConsumeFloatingPoint<float>();
  s.loss.argmax = in.ConsumeIntegralInRange<int32_t>(0, 1);
  s.loss.class_weight_dtype = in.ConsumeIntegralInRange<int32_t>(-2, 3);
  config = in.ConsumeRandomLengthString(64);
  s.config = in.ConsumeBool() ? config.c_str() : nullptr;
  if (in.ConsumeBool()) s.struct_size = in.ConsumeIntegral<uint32_t>();
  return s;
}

kjit_sharded_cross_entropy_args Args(FuzzedDataProvider& in, Pointers& p) {
  kjit_sharded_cross_entropy_args a;
  kjit_sharded_cross_entropy_args_init(&a);
  a.logits = Tensor(in, p);
  a.targets = {p.Pick(in), in.ConsumeIntegralInRange<int32_t>(-1, 2), Count(in)};
  a.loss = Tensor(in, p);
  for (kjit_tensor* optional : {&a.lse, &a.grad, &a.grad_output, &a.class_weight}) {
    if (in.ConsumeBool()) *optional = Tensor(in, p);
  }
  a.workspace = p.Pick(in);
  a.workspace_bytes = Count(in);
  if (in.ConsumeBool()) a.struct_size = in.ConsumeIntegral<uint32_t>();
  return a;
}

// Each step of `op` with the input's arguments; none may succeed but the queries.
void Steps(FuzzedDataProvider& in, Pointers& p, const kjit_sharded_cross_entropy* op) {
  const kjit_sharded_cross_entropy_args a = Args(in, p);
  void* comm = p.Pick(in);
  const int64_t rows = Count(in);
  Expect(kjit_sharded_cross_entropy_compute_stats(op, nullptr, &a), false);
  Expect(kjit_sharded_cross_entropy_finish(op, nullptr, &a), false);
  Expect(kjit_sharded_cross_entropy_run(op, nullptr, &a, comm), false);
  Expect(kjit_sharded_cross_entropy_all_reduce_stats(op, nullptr, a.workspace, rows, comm), false);
  Expect(kjit_sharded_cross_entropy_rescale_stats(op, nullptr, a.workspace, rows), false);
  float* max = nullptr;
  float* sums = nullptr;
  Expect(kjit_sharded_cross_entropy_stats_of(op, a.workspace, rows, &max, &sums), true);
  int64_t bytes = 0;
  Expect(kjit_sharded_cross_entropy_workspace_bytes(op, rows, &bytes), true);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("KJIT_NCCL_LIBRARY", "/nonexistent/kjit-fuzz/libnccl.so.2", 1);
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.target = "sm_90";
  o.compile_only = 1;
  o.disk_cache = 0;
  if (kjit_runtime_create(&o, &runtime) != KJIT_OK) std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static Pointers pointers;
  std::vector<std::string> configs(3);
  std::vector<kjit_sharded_cross_entropy*> ops;
  std::vector<void*> workspaces;
  for (std::string& config : configs) {
    const kjit_sharded_cross_entropy_spec spec = Spec(in, config);
    kjit_sharded_cross_entropy* op = nullptr;
    Expect(kjit_sharded_cross_entropy_create(runtime, &spec, &op), true);
    if (op == nullptr) break;
    ops.push_back(op);
    workspaces.push_back(pointers.Pick(in));
    Steps(in, pointers, op);
  }
  const size_t made = ops.size();
  if (made > 0) {
    for (size_t i = made; i < 32; ++i) {
      ops.push_back(ops[i % made]);
      workspaces.push_back(workspaces[i % made]);
    }
    const int32_t count =
        in.ConsumeBool() ? static_cast<int32_t>(made) : in.ConsumeIntegral<int32_t>();
    Expect(kjit_sharded_cross_entropy_combine_stats(nullptr, ops.data(), workspaces.data(), count,
                                                    Count(in)),
           false);
  }
  for (size_t i = 0; i < made; ++i) kjit_sharded_cross_entropy_destroy(ops[i]);
  return 0;
}
