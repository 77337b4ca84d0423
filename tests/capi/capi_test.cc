// The C API (kjit/kjit_c.h) on a machine without a GPU, through libkjit_c.so and its header only:
// what it exports, the defaults of the *_init functions (against the C++ structs' defaults, whose
// headers are read for their values and link nothing), NULL arguments, struct sizes and enum
// fields, the thread-local last error, a runtime without a driver or with the stub driver, and a
// compile-only runtime that builds the ops, checks their arguments (class weights included),
// refuses launches and reports warnings.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kjit/cross_entropy.h"
#include "kjit/kjit_c.h"
#include "kjit/linear_cross_entropy.h"
#include "kjit/log_probs.h"
#include "kjit/rms_norm.h"
#include "kjit/runtime.h"
#include "kjit/sharded_cross_entropy.h"
#include "tests/capi/take_string.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kjit {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What a failed call left: its code and this thread's message.
struct Result {
  kjit_status status;
  std::string message;
};
Result Last(kjit_status status) { return {status, kjit_last_error()}; }

void ExpectInvalid(const Result& r, const std::string& message_start) {
  EXPECT_EQ(r.status, KJIT_INVALID_ARGUMENT) << kjit_status_name(r.status) << ": " << r.message;
  EXPECT_THAT(r.message, StartsWith(message_start));
}

// ---- the library ------------------------------------------------------------------------------

// The functions the header declares.
std::set<std::string> DeclaredFunctions() {
  std::ifstream in(std::string(KJIT_SOURCE_DIR) + "/include/kjit/kjit_c.h");
  std::stringstream text;
  text << in.rdbuf();
  const std::string header = text.str();
  static const std::regex declared(R"(KJIT_C_EXPORT[^;]*?\b(kjit_\w+)\s*\()");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(header.begin(), header.end(), declared);
       it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1].str());
  }
  return names;
}

TEST(CapiLibrary, ExportsExactlyTheFunctionsOfTheHeader) {
  const std::set<std::string> declared = DeclaredFunctions();
  ASSERT_GT(declared.size(), 30u);
  FILE* nm = ::popen("nm -D --defined-only '" KJIT_C_LIBRARY "'", "r");
  ASSERT_NE(nm, nullptr);
  std::map<std::string, std::string> exported;  // name -> nm's type letter
  std::array<char, 1024> line;
  while (std::fgets(line.data(), line.size(), nm) != nullptr) {
    std::istringstream fields(line.data());
    std::string address, type, name;
    if (fields >> address >> type >> name) exported[name] = type;
  }
  ASSERT_EQ(::pclose(nm), 0) << "nm -D failed on " << KJIT_C_LIBRARY;
  std::set<std::string> names;
  for (const auto& [name, type] : exported) {
    names.insert(name);
    EXPECT_EQ(type, "T") << name << " is exported, but not as a function";
  }
  EXPECT_EQ(names, declared) << "libkjit_c.so must export the header's functions and nothing else";
}

TEST(CapiLibrary, Versions) {
  EXPECT_EQ(kjit_abi_version(), uint32_t{KJIT_C_ABI_VERSION});
  EXPECT_STREQ(kjit_version(), KJIT_EXPECTED_VERSION);
  char* full = nullptr;
  ASSERT_EQ(kjit_full_version(&full), KJIT_OK) << kjit_last_error();
  EXPECT_THAT(Take(full), StartsWith(std::string("kjit ") + KJIT_EXPECTED_VERSION + " (NVRTC "));
  kjit_free(nullptr);
}

TEST(CapiLibrary, StatusNamesAreAbslsAndEachCodeHasOne) {
  EXPECT_STREQ(kjit_status_name(KJIT_OK), "OK");
  EXPECT_STREQ(kjit_status_name(KJIT_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(kjit_status_name(KJIT_FAILED_PRECONDITION), "FAILED_PRECONDITION");
  EXPECT_STREQ(kjit_status_name(KJIT_UNAVAILABLE), "UNAVAILABLE");
  EXPECT_STREQ(kjit_status_name(KJIT_UNAUTHENTICATED), "UNAUTHENTICATED");
  std::set<std::string> names;
  for (int s = KJIT_OK; s <= KJIT_UNAUTHENTICATED; ++s) {
    names.insert(kjit_status_name(static_cast<kjit_status>(s)));
  }
  EXPECT_EQ(names.size(), 17u);
  EXPECT_EQ(names.count(""), 0u);
  EXPECT_STREQ(kjit_status_name(static_cast<kjit_status>(17)), "");
}

// ---- the *_init functions ---------------------------------------------------------------------

// What a *_init function makes of a struct full of garbage; its struct_size must be sizeof.
template <class T>
T Initialized(void (*init)(T*)) {
  T v;
  std::memset(&v, 0xAB, sizeof(v));
  init(&v);
  EXPECT_EQ(v.struct_size, sizeof(v));
  init(nullptr);  // does nothing
  return v;
}

TEST(CapiInit, DefaultsAreTheCppDefaults) {
  const kjit_runtime_options o = Initialized(kjit_runtime_options_init);
  const RuntimeOptions ro;
  EXPECT_EQ(o.device, ro.device);
  EXPECT_EQ(o.target, nullptr);
  EXPECT_EQ(o.compile_only, ro.compile_only);
  EXPECT_EQ(o.disk_cache, ro.disk_cache);
  EXPECT_EQ(o.cache_dir, nullptr);
  EXPECT_EQ(o.tuning_db, nullptr);
  EXPECT_EQ(o.autotune, ro.autotune);
  EXPECT_EQ(o.warning, nullptr);
  EXPECT_EQ(o.warning_user_data, nullptr);

  const kjit_rms_norm_spec n = Initialized(kjit_rms_norm_spec_init);
  const RmsNormSpec rn;
  EXPECT_EQ(n.hidden, rn.hidden);
  EXPECT_EQ(n.dtype, static_cast<int32_t>(rn.dtype));
  EXPECT_EQ(n.weight_dtype, -1);
  EXPECT_FALSE(rn.weight_dtype.has_value());
  EXPECT_EQ(n.eps, rn.eps);
  EXPECT_EQ(n.weight_offset, rn.weight_offset);
  EXPECT_EQ(n.casting, static_cast<int32_t>(rn.casting));
  EXPECT_EQ(n.fused_residual, rn.fused_residual);
  EXPECT_EQ(n.config, nullptr);

  const kjit_cross_entropy_spec c = Initialized(kjit_cross_entropy_spec_init);
  const CrossEntropySpec rc;
  EXPECT_EQ(c.vocab, rc.vocab);
  EXPECT_EQ(c.dtype, static_cast<int32_t>(rc.dtype));
  EXPECT_EQ(c.loss.target_type, static_cast<int32_t>(rc.loss.target_type));
  EXPECT_EQ(c.loss.ignore_index, rc.loss.ignore_index);
  EXPECT_EQ(c.loss.reduction, static_cast<int32_t>(rc.loss.reduction));
  EXPECT_EQ(c.loss.label_smoothing, rc.loss.label_smoothing);
  EXPECT_EQ(c.loss.z_loss, rc.loss.z_loss);
  EXPECT_EQ(c.loss.softcap, rc.loss.softcap);
  EXPECT_EQ(c.loss.argmax, rc.loss.argmax);
  EXPECT_EQ(c.config, nullptr);
  EXPECT_EQ(c.loss.class_weight_dtype, -1);
  EXPECT_FALSE(rc.loss.class_weight_dtype.has_value());

  const kjit_linear_cross_entropy_spec l = Initialized(kjit_linear_cross_entropy_spec_init);
  const LinearCrossEntropySpec rl;
  EXPECT_EQ(l.vocab, rl.vocab);
  EXPECT_EQ(l.hidden, rl.hidden);
  EXPECT_EQ(l.dtype, static_cast<int32_t>(rl.dtype));
  EXPECT_EQ(l.weight_grad_dtype, -1);
  EXPECT_FALSE(rl.weight_grad_dtype.has_value());
  EXPECT_EQ(l.bias, rl.bias);
  EXPECT_EQ(l.loss.target_type, static_cast<int32_t>(rl.loss.target_type));
  EXPECT_EQ(l.loss.ignore_index, rl.loss.ignore_index);
  EXPECT_EQ(l.loss.reduction, static_cast<int32_t>(rl.loss.reduction));
  EXPECT_EQ(l.loss.label_smoothing, rl.loss.label_smoothing);
  EXPECT_EQ(l.loss.z_loss, rl.loss.z_loss);
  EXPECT_EQ(l.loss.softcap, rl.loss.softcap);
  EXPECT_EQ(l.loss.argmax, rl.loss.argmax);
  EXPECT_EQ(l.weight_grad_accumulation, static_cast<int32_t>(rl.weight_grad_accumulation));
  EXPECT_EQ(l.weight_grad_accumulation, KJIT_WEIGHT_GRAD_ACCUMULATION_FP32);
  EXPECT_EQ(l.config, nullptr);
  EXPECT_FALSE(rl.config.has_value());
}

// No view given: every field zero.
void ExpectEmpty(std::initializer_list<const kjit_tensor*> views,
                 std::initializer_list<const kjit_index*> indices = {}) {
  for (const kjit_tensor* t : views) {
    EXPECT_TRUE(t->data == nullptr && t->dtype == 0 && t->rows == 0 && t->cols == 0 &&
                t->row_stride == 0);
  }
  for (const kjit_index* i : indices)
    EXPECT_TRUE(i->data == nullptr && i->type == 0 && i->size == 0);
}

TEST(CapiInit, ArgumentsStartEmpty) {
  const auto f = Initialized(kjit_rms_norm_forward_args_init);
  ExpectEmpty({&f.x, &f.weight, &f.y, &f.rstd, &f.residual, &f.residual_out});
  const auto b = Initialized(kjit_rms_norm_backward_args_init);
  ExpectEmpty({&b.dy, &b.x, &b.weight, &b.rstd, &b.dx, &b.dw, &b.dresidual});
  EXPECT_TRUE(b.workspace == nullptr && b.workspace_bytes == 0);
  const auto a = Initialized(kjit_cross_entropy_args_init);
  ExpectEmpty({&a.logits, &a.loss, &a.lse, &a.grad, &a.grad_output, &a.class_weight},
              {&a.targets, &a.argmax});
  EXPECT_TRUE(a.workspace == nullptr && a.workspace_bytes == 0);
  const auto cb = Initialized(kjit_cross_entropy_backward_args_init);
  ExpectEmpty({&cb.logits, &cb.lse, &cb.grad_output, &cb.grad, &cb.class_weight}, {&cb.targets});
  EXPECT_TRUE(cb.workspace == nullptr && cb.workspace_bytes == 0);
  const auto r = Initialized(kjit_cross_entropy_rescale_args_init);
  ExpectEmpty({&r.grad, &r.grad_output, &r.applied});
  const auto l = Initialized(kjit_linear_cross_entropy_args_init);
  ExpectEmpty({&l.hidden_states, &l.weight, &l.bias, &l.loss, &l.lse, &l.grad_output, &l.d_hidden,
               &l.d_weight, &l.d_bias},
              {&l.targets, &l.argmax});
  EXPECT_TRUE(l.accumulate == 0 && l.workspace == nullptr && l.workspace_bytes == 0);
  const auto lr = Initialized(kjit_linear_cross_entropy_rescale_args_init);
  ExpectEmpty({&lr.d_hidden, &lr.d_weight, &lr.d_bias, &lr.grad_output, &lr.applied});
  const auto lp = Initialized(kjit_log_probs_args_init);
  ExpectEmpty({&lp.logits, &lp.logprob, &lp.entropy, &lp.lse}, {&lp.targets});
  const auto lpb = Initialized(kjit_log_probs_backward_args_init);
  ExpectEmpty(
      {&lpb.logits, &lpb.lse, &lpb.entropy, &lpb.grad_logprob, &lpb.grad_entropy, &lpb.grad},
      {&lpb.targets});
}

// ---- runtimes without a GPU -------------------------------------------------------------------

// kjit_runtime_create(NULL, ...) from a C program whose driver is `libcuda`.
testing::CliResult CreateWithDriver(const std::string& libcuda) {
  testing::TempDir scratch("kjit_capi_test");
  return testing::RunProgram(KJIT_C_HEADER_TEST, {"runtime_create"},
                             {{"KJIT_LIBCUDA_PATH", libcuda}}, scratch.path());
}

TEST(CapiRuntime, WithoutADriverIsUnavailableAndSaysWhy) {
  const testing::CliResult r = CreateWithDriver("/nonexistent/libcuda.so.1");
  EXPECT_EQ(r.exit_code, KJIT_UNAVAILABLE) << r.Describe();
  EXPECT_THAT(r.out, StartsWith("UNAVAILABLE: no CUDA driver")) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/libcuda.so.1")) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("fix: install the NVIDIA driver")) << r.Describe();
}

TEST(CapiRuntime, WithTheStubDriverIsUnavailableAndSaysWhy) {
  const testing::CliResult r = CreateWithDriver(testing::StubLibcuda());
  EXPECT_EQ(r.exit_code, KJIT_UNAVAILABLE) << r.Describe();
  EXPECT_THAT(r.out, StartsWith("UNAVAILABLE: ")) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("CUDA_ERROR_STUB_LIBRARY, 34")) << r.Describe();
  EXPECT_THAT(r.out, HasSubstr("LD_LIBRARY_PATH")) << r.Describe();
}

// Issue 34, defect 2: exit() on one thread while two others compile (a real NVRTC compile; no GPU
// needed). Before the fix NVRTC's static destructors ran under the compiles and every run died
// (SIGSEGV, "double free or corruption", "LLVM ERROR: out of memory"); six runs at delays spread
// over a compile's length must all exit 0.
// kjit_exit_while_compiling with `args`, in a scratch directory of its own.
testing::CliResult ExitWhileCompiling(const std::vector<std::string>& args) {
  testing::TempDir scratch("kjit_capi_exit");
  return testing::RunProgram(KJIT_EXIT_WHILE_COMPILING, args,
                             {{"KJIT_CACHE_DIR", scratch.path() + "/cache"}}, scratch.path());
}

TEST(CapiRuntime, ExitWhileOtherThreadsCompileDoesNotCrash) {
  for (int run = 0; run < 6; ++run) {
    const std::string delay_ms = std::to_string(150 + 250 * (run % 4));
    const auto start = std::chrono::steady_clock::now();
    const testing::CliResult r = ExitWhileCompiling({delay_ms});
    EXPECT_EQ(r.exit_code, 0) << "exit after " << delay_ms << " ms: " << r.Describe();
    EXPECT_EQ(r.signal, 0) << "exit after " << delay_ms << " ms: " << r.Describe();
    // Exit waits for the builds in flight (a build's length), never for the gate's 60 s limit.
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << delay_ms;
  }
}

// Exits within NVRTC's start (its load and first compile, the first ~60 ms of the first build),
// when what NVRTC registers would run before the exit gate's handler: before ExitGate::Startup,
// 6 of 40 such exits at 0-90 ms crashed (SIGSEGV at 10-22 ms), none of 100 at 0-40 ms after it.
TEST(CapiRuntime, ExitWhileNvrtcStartsDoesNotCrash) {
  for (int delay = 8; delay < 24; ++delay) {
    const testing::CliResult r = ExitWhileCompiling({std::to_string(delay)});
    EXPECT_EQ(r.exit_code, 0) << "exit after " << delay << " ms: " << r.Describe();
    EXPECT_EQ(r.signal, 0) << "exit after " << delay << " ms: " << r.Describe();
  }
}

// clang 14's ASan and TSan do not lock their allocator across fork(): the child of a process that
// allocates on another thread can hang in their own exit-time checks.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KJIT_FORK_UNSAFE_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KJIT_FORK_UNSAFE_ALLOCATOR 1
#endif
#endif
// TSan delivers a signal itself and runs the handler with every signal blocked, so the exit gate
// cannot tell NVRTC's SIGTERM handler from its SIGINT one (a SIGTERM ended the process by SIGINT),
// and it reports NVRTC's handler, which calls exit(), as signal-unsafe (CI, 2026-12-07).
#if defined(__SANITIZE_THREAD__)
#define KJIT_TSAN_DELIVERS_SIGNALS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KJIT_TSAN_DELIVERS_SIGNALS 1
#endif
#endif

// A child forked while another thread compiles has no such thread: its exit must not wait for it
// (before the gate's fork handler it waited the gate's 60 s).
TEST(CapiRuntime, AChildForkedWhileAThreadCompilesExitsAtOnce) {
#ifdef KJIT_FORK_UNSAFE_ALLOCATOR
  GTEST_SKIP() << "the sanitizer's allocator is not fork-safe (see KJIT_FORK_UNSAFE_ALLOCATOR)";
#endif
  const testing::CliResult r = ExitWhileCompiling({"300", "fork"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

// Issue 45, defect 1: a child forked while other threads compile builds kernels of its own (it hung
// in nvrtcCompileProgram on a lock held by a parent's thread it does not have).
TEST(CapiRuntime, AChildForkedWhileAThreadCompilesCanCompile) {
#ifdef KJIT_FORK_UNSAFE_ALLOCATOR
  GTEST_SKIP() << "the sanitizer's allocator is not fork-safe (see KJIT_FORK_UNSAFE_ALLOCATOR)";
#endif
  const testing::CliResult r = ExitWhileCompiling({"100", "fork-build"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

// Issue 45, defect 2: SIGTERM or SIGINT within NVRTC's first compile, whose handlers call exit(),
// must end the process by the signal (143 / 130 in a shell) at once; the exiting thread waited
// 60 s for its own compile, then exited with NVRTC's status.
TEST(CapiRuntime, ASignalWhileNvrtcStartsEndsTheProcessByIt) {
#ifdef KJIT_TSAN_DELIVERS_SIGNALS
  GTEST_SKIP() << "TSan runs signal handlers its own way (see KJIT_TSAN_DELIVERS_SIGNALS)";
#endif
  for (const auto& [mode, number] : {std::pair{"term", SIGTERM}, std::pair{"int", SIGINT}}) {
    for (int delay = 0; delay < 40; delay += 3) {
      const auto start = std::chrono::steady_clock::now();
      const testing::CliResult r = ExitWhileCompiling({std::to_string(delay), mode});
      EXPECT_EQ(r.signal, number) << mode << " after " << delay << " ms: " << r.Describe();
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
          << mode << " after " << delay << " ms";
    }
  }
}

TEST(CapiRuntime, CompileOnlyNeedsATarget) {
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.compile_only = 1;
  kjit_runtime* rt = reinterpret_cast<kjit_runtime*>(&o);  // overwritten with NULL on failure
  ExpectInvalid(Last(kjit_runtime_create(&o, &rt)), "target: a compile-only runtime needs");
  EXPECT_EQ(rt, nullptr);
}

// Collects the warnings a runtime reports through its callback.
void Collect(const char* message, void* user_data) {
  static_cast<std::vector<std::string>*>(user_data)->push_back(message);
}

TEST(CapiRuntime, WarningsReachTheCallback) {
  // /proc/self/fdinfo is ours and refuses new files even to root: an unwritable cache directory,
  // which the runtime reports as a warning and uses read-only.
  std::vector<std::string> warnings;
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.target = "sm_90";
  o.compile_only = 1;
  o.cache_dir = "/proc/self/fdinfo";
  o.warning = Collect;
  o.warning_user_data = &warnings;
  kjit_runtime* rt = nullptr;
  ASSERT_EQ(kjit_runtime_create(&o, &rt), KJIT_OK) << kjit_last_error();
  kjit_runtime_destroy(rt);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("/proc/self/fdinfo is not writable"));
}

// A compile-only runtime for sm_90 whose disk cache lies in a fresh directory named with a byte
// that is not UTF-8 (cache paths are bytes), so that the JSON answers must cope with it.
class CapiCompileOnly : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    rt_ = CompileOnlyRuntime();
    ASSERT_NE(rt_, nullptr);
    kjit_rms_norm_spec_init(&norm_spec_);
    norm_spec_.hidden = 4096;
    kjit_cross_entropy_spec_init(&ce_spec_);
    ce_spec_.vocab = 32000;
    kjit_linear_cross_entropy_spec_init(&lce_spec_);
    lce_spec_.vocab = 1000;
    lce_spec_.hidden = 64;
  }
  void TearDown() override { kjit_runtime_destroy(rt_); }

  // A compile-only sm_90 runtime on the fixture's cache; the caller destroys it.
  kjit_runtime* CompileOnlyRuntime() {
    kjit_runtime_options o;
    kjit_runtime_options_init(&o);
    o.target = "sm_90";
    o.compile_only = 1;
    o.cache_dir = cache_.c_str();
    kjit_runtime* rt = nullptr;
    EXPECT_EQ(kjit_runtime_create(&o, &rt), KJIT_OK) << kjit_last_error();
    return rt;
  }

  kjit_rms_norm* Norm(const kjit_rms_norm_spec& spec) {
    kjit_rms_norm* op = nullptr;
    EXPECT_EQ(kjit_rms_norm_create(rt_, &spec, &op), KJIT_OK) << kjit_last_error();
    norms_.emplace_back(op, kjit_rms_norm_destroy);
    return op;
  }
  kjit_cross_entropy* Ce(const kjit_cross_entropy_spec& spec) {
    kjit_cross_entropy* op = nullptr;
    EXPECT_EQ(kjit_cross_entropy_create(rt_, &spec, &op), KJIT_OK) << kjit_last_error();
    ces_.emplace_back(op, kjit_cross_entropy_destroy);
    return op;
  }
  kjit_linear_cross_entropy* Lce(const kjit_linear_cross_entropy_spec& spec) {
    kjit_linear_cross_entropy* op = nullptr;
    EXPECT_EQ(kjit_linear_cross_entropy_create(rt_, &spec, &op), KJIT_OK) << kjit_last_error();
    lces_.emplace_back(op, kjit_linear_cross_entropy_destroy);
    return op;
  }

  testing::TempDir tmp_{"kjit_capi_test"};
  std::string cache_ = tmp_.path() + "/caf\xe9";
  kjit_runtime* rt_ = nullptr;
  kjit_rms_norm_spec norm_spec_;
  kjit_cross_entropy_spec ce_spec_;
  kjit_linear_cross_entropy_spec lce_spec_;
  std::vector<std::unique_ptr<kjit_rms_norm, decltype(&kjit_rms_norm_destroy)>> norms_;
  std::vector<std::unique_ptr<kjit_cross_entropy, decltype(&kjit_cross_entropy_destroy)>> ces_;
  std::vector<
      std::unique_ptr<kjit_linear_cross_entropy, decltype(&kjit_linear_cross_entropy_destroy)>>
      lces_;
};

TEST_F(CapiCompileOnly, RuntimeInfo) {
  char* text = nullptr;
  ASSERT_EQ(kjit_runtime_info(rt_, &text), KJIT_OK) << kjit_last_error();
  const nlohmann::json info = nlohmann::json::parse(Take(text));
  EXPECT_EQ(info["target"], "sm_90");
  EXPECT_EQ(info["arch"], 90);
  EXPECT_EQ(info["compile_only"], true);
  EXPECT_TRUE(info["device"].is_null()) << info.dump();
}

// kjit_*_build twice: compiled into the cache, then from memory.
template <class Op>
void ExpectBuilds(Op* op, kjit_status (*build)(const Op*, char**), const std::string& cache) {
  for (const char* origin : {"compiled", "memory"}) {
    char* text = nullptr;
    ASSERT_EQ(build(op, &text), KJIT_OK) << kjit_last_error();
    EXPECT_STREQ(kjit_last_error(), "");
    const std::string json = Take(text);
    const nlohmann::json b = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(b.is_discarded()) << json;
    EXPECT_EQ(b["origin"], origin) << json;
    EXPECT_EQ(b["target"], "sm_90");
    EXPECT_EQ(b["key"].get<std::string>().size(), 32u) << json;
    EXPECT_GT(b["bytes"].get<int64_t>(), 0);
    EXPECT_FALSE(b["nvrtc"].get<std::string>().empty());
    EXPECT_TRUE(b["params"].is_object() && !b["params"].empty()) << json;
    EXPECT_TRUE(b["kernels"].is_array() && !b["kernels"].empty()) << json;
    // The directory's byte 0xE9 comes back as U+FFFD rather than as JSON that does not parse.
    const std::string ascii = cache.substr(0, cache.size() - 1);
    EXPECT_THAT(b["path"].get<std::string>(), StartsWith(ascii + "\xEF\xBF\xBD/")) << json;
  }
}

TEST_F(CapiCompileOnly, BuildsEveryOp) {
  ExpectBuilds(Norm(norm_spec_), kjit_rms_norm_build, cache_);
  ExpectBuilds(Ce(ce_spec_), kjit_cross_entropy_build, cache_);
  ExpectBuilds(Lce(lce_spec_), kjit_linear_cross_entropy_build, cache_);
}

// Issue 34: a handle of one kind passed where another is expected was used as that type (UB; an
// RMSNorm handle taken for a runtime returned OK). Each is refused, naming both kinds; a destroy
// given the wrong kind leaves the handle alone.
TEST_F(CapiCompileOnly, AHandleOfAnotherKindIsRefused) {
  kjit_rms_norm* norm = Norm(norm_spec_);
  kjit_cross_entropy* ce = Ce(ce_spec_);
  kjit_linear_cross_entropy* lce = Lce(lce_spec_);
  auto* norm_as_runtime = reinterpret_cast<kjit_runtime*>(norm);
  kjit_rms_norm* op = nullptr;
  ExpectInvalid(Last(kjit_rms_norm_create(norm_as_runtime, &norm_spec_, &op)),
                "kjit_rms_norm_create: runtime is a kjit_rms_norm handle; expected a kjit_runtime");
  EXPECT_EQ(op, nullptr);
  char* text = nullptr;
  ExpectInvalid(Last(kjit_runtime_info(reinterpret_cast<kjit_runtime*>(ce), &text)),
                "kjit_runtime_info: runtime is a kjit_cross_entropy handle; expected a "
                "kjit_runtime");
  EXPECT_EQ(text, nullptr);
  ExpectInvalid(Last(kjit_cross_entropy_build(reinterpret_cast<kjit_cross_entropy*>(norm), &text)),
                "kjit_cross_entropy_build: op is a kjit_rms_norm handle; expected a "
                "kjit_cross_entropy");
  ExpectInvalid(Last(kjit_rms_norm_config_for(reinterpret_cast<kjit_rms_norm*>(rt_), 16, &text)),
                "kjit_rms_norm_config_for: op is a kjit_runtime handle; expected a kjit_rms_norm");
  int64_t bytes = -1;
  ExpectInvalid(
      Last(kjit_linear_cross_entropy_workspace_bytes(
          reinterpret_cast<kjit_linear_cross_entropy*>(ce), 16, &bytes)),
      "kjit_linear_cross_entropy_workspace_bytes: op is a kjit_cross_entropy handle; expected a "
      "kjit_linear_cross_entropy");
  EXPECT_EQ(bytes, 0);
  kjit_cross_entropy_args args;
  kjit_cross_entropy_args_init(&args);
  ExpectInvalid(
      Last(kjit_cross_entropy_forward(reinterpret_cast<kjit_cross_entropy*>(lce), nullptr, &args)),
      "kjit_cross_entropy_forward: op is a kjit_linear_cross_entropy handle");
  // Memory that is no handle at all (zeroes, as a destroyed handle's kind is).
  alignas(16) unsigned char junk[256] = {};
  ExpectInvalid(
      Last(kjit_cross_entropy_create(reinterpret_cast<kjit_runtime*>(junk), &ce_spec_, &ce)),
      "kjit_cross_entropy_create: runtime is not a live kjit_runtime handle");
  // Destroying through the wrong type frees nothing: the op still works.
  kjit_runtime_destroy(norm_as_runtime);
  EXPECT_THAT(kjit_last_error(), StartsWith("kjit_runtime_destroy: handle is a kjit_rms_norm"));
  kjit_cross_entropy_destroy(reinterpret_cast<kjit_cross_entropy*>(rt_));
  EXPECT_THAT(kjit_last_error(),
              StartsWith("kjit_cross_entropy_destroy: handle is a kjit_runtime"));
  ASSERT_EQ(kjit_rms_norm_config_for(norm, 16, &text), KJIT_OK) << kjit_last_error();
  EXPECT_FALSE(Take(text).empty());
  ASSERT_EQ(kjit_runtime_info(rt_, &text), KJIT_OK) << kjit_last_error();
  Take(text);
}

// 16-byte aligned host memory standing in for device buffers: a compile-only runtime checks the
// arguments, then refuses the launch before anything is read.
struct alignas(16) Block {
  unsigned char bytes[16];
};
void* Host(std::vector<std::vector<Block>>& keep, size_t bytes) {
  return keep.emplace_back((bytes + 15) / 16).data();
}
kjit_tensor View(void* data, kjit_dtype dtype, int64_t rows, int64_t cols) {
  return {data, dtype, rows, cols, cols};
}
// Fused cross-entropy arguments on host blocks for `rows` rows of ce's vocab, gradient in place.
kjit_cross_entropy_args CeArgs(std::vector<std::vector<Block>>& mem, kjit_cross_entropy* ce,
                               int64_t rows, int64_t vocab) {
  kjit_cross_entropy_args a;
  kjit_cross_entropy_args_init(&a);
  a.logits = View(Host(mem, rows * vocab * 2), KJIT_BF16, rows, vocab);
  a.targets = {Host(mem, rows * 8), KJIT_INT64, rows};
  a.loss = View(Host(mem, 4), KJIT_F32, 1, 1);
  a.grad = a.logits;
  EXPECT_EQ(kjit_cross_entropy_workspace_bytes(ce, rows, &a.workspace_bytes), KJIT_OK);
  a.workspace = Host(mem, a.workspace_bytes);
  return a;
}

TEST_F(CapiCompileOnly, LaunchesAreAFailedPrecondition) {
  std::vector<std::vector<Block>> mem;
  const int64_t rows = 3, hidden = norm_spec_.hidden, vocab = ce_spec_.vocab;
  kjit_rms_norm* norm = Norm(norm_spec_);
  kjit_rms_norm_forward_args f;
  kjit_rms_norm_forward_args_init(&f);
  f.x = View(Host(mem, rows * hidden * 2), KJIT_BF16, rows, hidden);
  f.weight = View(Host(mem, hidden * 2), KJIT_BF16, 1, hidden);
  f.y = View(Host(mem, rows * hidden * 2), KJIT_BF16, rows, hidden);
  const Result forward = Last(kjit_rms_norm_forward(norm, nullptr, &f));
  EXPECT_EQ(forward.status, KJIT_FAILED_PRECONDITION) << forward.message;
  EXPECT_THAT(forward.message, HasSubstr("compile-only"));

  kjit_cross_entropy* ce = Ce(ce_spec_);
  kjit_cross_entropy_args a = CeArgs(mem, ce, rows, vocab);
  const Result fused = Last(kjit_cross_entropy_forward_backward(ce, nullptr, &a));
  EXPECT_EQ(fused.status, KJIT_FAILED_PRECONDITION) << fused.message;
  EXPECT_THAT(fused.message, HasSubstr("compile-only"));

  // The C++ layer's argument checks come first, and their messages pass through.
  ExpectInvalid(Last(kjit_cross_entropy_forward(ce, nullptr, &a)), "grad: given to Forward");
  a.grad = {};
  EXPECT_EQ(kjit_cross_entropy_forward(ce, nullptr, &a), KJIT_FAILED_PRECONDITION);
  a.loss.cols = 2;
  ExpectInvalid(Last(kjit_cross_entropy_forward(ce, nullptr, &a)), "loss:");
}

// The RL heads (ABI 5): the C++ defaults, a build, launches checked then refused compile-only,
// and a spec's checks named by field.
TEST_F(CapiCompileOnly, LogProbsBuildsAndChecksItsLaunches) {
  kjit_log_probs_spec spec = Initialized(kjit_log_probs_spec_init);
  const LogProbsSpec d;
  EXPECT_EQ(spec.vocab, d.vocab);
  EXPECT_EQ(spec.dtype, static_cast<int32_t>(d.dtype));
  EXPECT_EQ(spec.target_type, static_cast<int32_t>(d.target_type));
  EXPECT_EQ(spec.ignore_index, d.ignore_index);
  EXPECT_EQ(spec.temperature, d.temperature);
  EXPECT_EQ(spec.entropy, d.entropy);
  EXPECT_EQ(spec.config, nullptr);
  spec.vocab = 32000;
  spec.temperature = 0.7f;
  spec.entropy = 1;
  kjit_log_probs* op = nullptr;
  ASSERT_EQ(kjit_log_probs_create(rt_, &spec, &op), KJIT_OK) << kjit_last_error();
  std::unique_ptr<kjit_log_probs, decltype(&kjit_log_probs_destroy)> owned(op,
                                                                           kjit_log_probs_destroy);
  ExpectBuilds(op, kjit_log_probs_build, cache_);
  char* config = nullptr;
  ASSERT_EQ(kjit_log_probs_config(op, &config), KJIT_OK) << kjit_last_error();
  EXPECT_THAT(Take(config), HasSubstr("cluster=0 staged=0"));

  std::vector<std::vector<Block>> mem;
  const int64_t rows = 3, vocab = spec.vocab;
  kjit_log_probs_args a = Initialized(kjit_log_probs_args_init);
  a.logits = View(Host(mem, rows * vocab * 2), KJIT_BF16, rows, vocab);
  a.targets = {Host(mem, rows * 8), KJIT_INT64, rows};
  a.logprob = View(Host(mem, rows * 4), KJIT_F32, 1, rows);
  a.entropy = View(Host(mem, rows * 4), KJIT_F32, 1, rows);
  a.lse = View(Host(mem, rows * 4), KJIT_F32, 1, rows);
  EXPECT_EQ(kjit_log_probs_forward(op, nullptr, &a), KJIT_FAILED_PRECONDITION);
  kjit_log_probs_backward_args b = Initialized(kjit_log_probs_backward_args_init);
  b.logits = a.logits;
  b.targets = a.targets;
  b.lse = a.lse;
  b.entropy = a.entropy;
  b.grad_entropy = View(Host(mem, rows * 4), KJIT_F32, 1, rows);
  b.grad = a.logits;  // in place
  EXPECT_EQ(kjit_log_probs_backward(op, nullptr, &b), KJIT_FAILED_PRECONDITION);
  b.entropy = {};
  ExpectInvalid(Last(kjit_log_probs_backward(op, nullptr, &b)), "entropy: null");
  a.entropy = {};
  ExpectInvalid(Last(kjit_log_probs_forward(op, nullptr, &a)), "entropy: null");

  spec.temperature = 0;
  kjit_log_probs* bad = nullptr;
  ExpectInvalid(Last(kjit_log_probs_create(rt_, &spec, &bad)), "temperature: 0 must be");
  EXPECT_EQ(bad, nullptr);
}

// Class weights: an op made with class_weight_dtype takes class_weight in every launch (checked by
// the C++ layer, whose messages name the C field), and an op made without refuses one.
TEST_F(CapiCompileOnly, ClassWeightsAreTakenByEveryLaunch) {
  std::vector<std::vector<Block>> mem;
  const int64_t rows = 3, vocab = ce_spec_.vocab;
  kjit_cross_entropy_spec c = ce_spec_;
  c.loss.class_weight_dtype = KJIT_F32;
  kjit_cross_entropy* weighted = Ce(c);
  kjit_cross_entropy_args a = CeArgs(mem, weighted, rows, vocab);
  kjit_cross_entropy_backward_args b;
  kjit_cross_entropy_backward_args_init(&b);
  b.logits = a.logits;
  b.targets = a.targets;
  b.lse = View(Host(mem, rows * 4), KJIT_F32, 1, rows);
  b.grad = View(Host(mem, rows * vocab * 2), KJIT_BF16, rows, vocab);
  b.workspace = a.workspace;
  b.workspace_bytes = a.workspace_bytes;

  ExpectInvalid(Last(kjit_cross_entropy_forward_backward(weighted, nullptr, &a)),
                "class_weight: null");
  ExpectInvalid(Last(kjit_cross_entropy_backward(weighted, nullptr, &b)), "class_weight: null");
  const kjit_tensor weight = View(Host(mem, vocab * 4), KJIT_F32, 1, vocab);
  a.class_weight = weight;
  a.class_weight.cols = vocab - 1;
  ExpectInvalid(Last(kjit_cross_entropy_forward_backward(weighted, nullptr, &a)),
                "class_weight: cols is 31999, expected 32000");
  a.class_weight = weight;
  a.class_weight.dtype = KJIT_BF16;
  ExpectInvalid(Last(kjit_cross_entropy_forward_backward(weighted, nullptr, &a)),
                "class_weight: dtype is bf16, expected fp32");
  a.class_weight.dtype = 7;
  ExpectInvalid(Last(kjit_cross_entropy_forward_backward(weighted, nullptr, &a)),
                "class_weight.dtype: 7 is out of range; expected 0 (KJIT_F32)");
  // Given and right: every launch passes the checks and reaches the (absent) device.
  a.class_weight = weight;
  b.class_weight = weight;
  EXPECT_EQ(kjit_cross_entropy_forward_backward(weighted, nullptr, &a), KJIT_FAILED_PRECONDITION)
      << kjit_last_error();
  EXPECT_EQ(kjit_cross_entropy_backward(weighted, nullptr, &b), KJIT_FAILED_PRECONDITION)
      << kjit_last_error();
  kjit_cross_entropy_args f = a;
  f.grad = {};
  EXPECT_EQ(kjit_cross_entropy_forward(weighted, nullptr, &f), KJIT_FAILED_PRECONDITION)
      << kjit_last_error();

  // The op made without class weights refuses them rather than ignoring them.
  kjit_cross_entropy* plain = Ce(ce_spec_);
  for (const Result& r : {Last(kjit_cross_entropy_forward(plain, nullptr, &f)),
                          Last(kjit_cross_entropy_forward_backward(plain, nullptr, &a)),
                          Last(kjit_cross_entropy_backward(plain, nullptr, &b))}) {
    ExpectInvalid(r, "class_weight: given, but the op was created without class weights");
  }
  // Weights in the logits' dtype.
  c.loss.class_weight_dtype = KJIT_BF16;
  ExpectInvalid(Last(kjit_cross_entropy_forward(Ce(c), nullptr, &f)),
                "class_weight: dtype is fp32, expected bf16");
}

// Linear + cross-entropy arguments on host blocks (a 256-byte aligned workspace) for `rows` rows:
// every output of forward_backward, bias included when the spec has one.
kjit_linear_cross_entropy_args LceArgs(std::vector<std::vector<Block>>& mem,
                                       kjit_linear_cross_entropy* op,
                                       const kjit_linear_cross_entropy_spec& s, int64_t rows) {
  const auto e = static_cast<int64_t>(s.dtype == KJIT_F32 ? 4 : 2);
  kjit_linear_cross_entropy_args a;
  kjit_linear_cross_entropy_args_init(&a);
  a.hidden_states = View(Host(mem, rows * s.hidden * e), kjit_dtype(s.dtype), rows, s.hidden);
  a.weight = View(Host(mem, s.vocab * s.hidden * e), kjit_dtype(s.dtype), s.vocab, s.hidden);
  a.targets = {Host(mem, rows * 8), KJIT_INT64, rows};
  a.loss = View(Host(mem, 4), KJIT_F32, 1, 1);
  a.d_hidden = View(Host(mem, rows * s.hidden * e), kjit_dtype(s.dtype), rows, s.hidden);
  a.d_weight = View(Host(mem, s.vocab * s.hidden * e), kjit_dtype(s.dtype), s.vocab, s.hidden);
  if (s.bias) {
    a.bias = View(Host(mem, s.vocab * e), kjit_dtype(s.dtype), 1, s.vocab);
    a.d_bias = View(Host(mem, s.vocab * e), kjit_dtype(s.dtype), 1, s.vocab);
  }
  EXPECT_EQ(kjit_linear_cross_entropy_workspace_bytes(op, rows, &a.workspace_bytes), KJIT_OK)
      << kjit_last_error();
  auto* base = static_cast<unsigned char*>(Host(mem, a.workspace_bytes + 256));
  a.workspace = base + (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
  return a;
}

// The linear + cross-entropy's launches: the C++ layer's checks (each message names the C field)
// come before the compile-only runtime refuses the launch.
TEST_F(CapiCompileOnly, LinearCrossEntropyLaunchesCheckTheirArguments) {
  std::vector<std::vector<Block>> mem;
  const int64_t rows = 5;
  kjit_linear_cross_entropy_spec s = lce_spec_;
  s.bias = 1;
  kjit_linear_cross_entropy* op = Lce(s);
  const kjit_linear_cross_entropy_args good = LceArgs(mem, op, s, rows);
  const Result fused = Last(kjit_linear_cross_entropy_forward_backward(op, nullptr, &good));
  EXPECT_EQ(fused.status, KJIT_FAILED_PRECONDITION) << fused.message;
  EXPECT_THAT(fused.message, HasSubstr("compile-only"));
  kjit_linear_cross_entropy_args a = good;
  a.accumulate = 1;
  a.grad_output = View(Host(mem, 4), KJIT_F32, 1, 1);
  EXPECT_EQ(kjit_linear_cross_entropy_forward_backward(op, nullptr, &a), KJIT_FAILED_PRECONDITION)
      << kjit_last_error();

  ExpectInvalid(Last(kjit_linear_cross_entropy_forward(op, nullptr, &good)),
                "d_hidden: given to Forward, which computes no gradient");
  kjit_linear_cross_entropy_args f = good;
  f.d_hidden = f.d_weight = f.d_bias = {};
  EXPECT_EQ(kjit_linear_cross_entropy_forward(op, nullptr, &f), KJIT_FAILED_PRECONDITION)
      << kjit_last_error();

  const std::vector<std::pair<std::function<void(kjit_linear_cross_entropy_args&)>, std::string>>
      cases = {
          {[](auto& x) { x.hidden_states.cols = 63; }, "hidden_states: cols is 63, expected 64"},
          {[](auto& x) { x.hidden_states.dtype = KJIT_F16; },
           "hidden_states: dtype is fp16, expected bf16"},
          {[](auto& x) { x.weight.rows = 999; }, "weight: rows is 999, expected 1000"},
          {[](auto& x) { x.bias = {}; }, "bias: null pointer"},
          {[](auto& x) { x.targets.size = 4; }, "targets:"},
          {[](auto& x) { x.loss.cols = 5; }, "loss: cols is 5, expected 1"},
          {[](auto& x) { x.lse = View(x.loss.data, KJIT_F32, 1, 4); },
           "lse: cols is 4, expected 5"},
          {[](auto& x) { x.argmax = x.targets; }, "argmax: given, but the op was created without"},
          {[](auto& x) { x.d_hidden.rows = 4; }, "d_hidden: rows is 4, expected 5"},
          {[](auto& x) { x.d_weight.dtype = KJIT_F32; }, "d_weight: dtype is fp32, expected bf16"},
          {[](auto& x) { x.d_bias.cols = 999; }, "d_bias: cols is 999, expected 1000"},
          {[](auto& x) { x.workspace_bytes -= 1; }, "workspace_bytes: "},
          {[](auto& x) { x.workspace = static_cast<char*>(x.workspace) + 16; },
           "workspace: must be 256-byte aligned"},
          {[](auto& x) { x.d_hidden = x.hidden_states; }, "d_hidden: must not alias hidden_states"},
          // The C layer's own: enum fields and flags.
          {[](auto& x) { x.accumulate = 2; }, "accumulate: 2 is out of range; expected 0 (off)"},
          {[](auto& x) { x.d_weight.dtype = 9; }, "d_weight.dtype: 9 is out of range"},
          {[](auto& x) { x.argmax.type = -1; }, "argmax.type: -1 is out of range"},
      };
  for (const auto& [change, message] : cases) {
    kjit_linear_cross_entropy_args bad = good;
    change(bad);
    ExpectInvalid(Last(kjit_linear_cross_entropy_forward_backward(op, nullptr, &bad)), message);
  }
  // An op made without a bias refuses one rather than ignoring it.
  kjit_linear_cross_entropy* plain = Lce(lce_spec_);
  kjit_linear_cross_entropy_args b = LceArgs(mem, plain, lce_spec_, rows);
  b.d_bias = good.d_bias;
  ExpectInvalid(Last(kjit_linear_cross_entropy_forward_backward(plain, nullptr, &b)),
                "d_bias: given, but the op was created without a bias");
}

TEST_F(CapiCompileOnly, InvalidSpecsNameTheField) {
  kjit_rms_norm* norm = reinterpret_cast<kjit_rms_norm*>(this);
  kjit_rms_norm_spec n = norm_spec_;
  n.hidden = 0;
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)), "hidden:");
  EXPECT_EQ(norm, nullptr) << "a failed create leaves NULL in *out";
  n = norm_spec_;
  n.eps = -1;
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)), "eps:");
  n = norm_spec_;
  n.config = "vec=8 fwd=128x1";
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)), "config: ");
  n.config = "vec=3 fwd=128x1 bwd=512x1";
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)), "config: ");

  kjit_cross_entropy* ce = nullptr;
  kjit_cross_entropy_spec c = ce_spec_;
  c.vocab = 0;
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)), "vocab:");
  c = ce_spec_;
  c.loss.label_smoothing = 1;
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)), "label_smoothing:");
  c = ce_spec_;
  c.loss.class_weight_dtype = KJIT_F16;  // neither fp32 nor the logits' bf16
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                "class_weight_dtype: fp16 must be fp32 or the logits' dtype (bf16)");
  c = ce_spec_;
  c.config = "banana";
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)), "config: ");
  // Text that parses into a config the op cannot run: the op's own check names the field.
  c.config = "vec=16 threads=256 unroll=4 cluster=0 staged=0";  // 32-byte bf16 vectors
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)), "config.vec:");
  c.config = "";  // as NULL: the heuristic's
  EXPECT_NE(Ce(c), nullptr);

  kjit_linear_cross_entropy* lce = reinterpret_cast<kjit_linear_cross_entropy*>(this);
  const std::vector<std::pair<std::function<void(kjit_linear_cross_entropy_spec&)>, std::string>>
      lce_cases = {
          {[](auto& x) { x.hidden = 0; }, "hidden: 0 is out of range, expected 1 to 65536"},
          {[](auto& x) { x.hidden = 65537; }, "hidden: 65537 is out of range"},
          {[](auto& x) { x.vocab = 1; }, "vocab:"},
          {[](auto& x) { x.weight_grad_dtype = KJIT_F16; },
           "weight_grad_dtype: fp16 must be bf16 or fp32"},
          {[](auto& x) { x.loss.label_smoothing = 1; }, "label_smoothing:"},
          {[](auto& x) { x.loss.z_loss = -1; }, "z_loss:"},
          {[](auto& x) { x.loss.softcap = -1; }, "softcap:"},
          {[](auto& x) { x.config = "banana"; }, "config: "},
          {[](auto& x) {
             x.config = "chunk=0 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0";
           },
           "config: "},
          {[](auto& x) {
             x.config = "chunk=64 whole=0 streams=3 logits_algo=0 d_hidden_algo=0 d_weight_algo=0";
           },
           "config: "},
      };
  for (const auto& [change, message] : lce_cases) {
    kjit_linear_cross_entropy_spec l = lce_spec_;
    change(l);
    ExpectInvalid(Last(kjit_linear_cross_entropy_create(rt_, &l, &lce)), message);
    EXPECT_EQ(lce, nullptr) << "a failed create leaves NULL in *out";
  }
  kjit_linear_cross_entropy_spec l = lce_spec_;
  l.config = "";  // as NULL: the heuristic's
  l.weight_grad_dtype = KJIT_F32;
  EXPECT_NE(Lce(l), nullptr);
}

// config_for's text, given back as the spec's config, makes an op with that same config.
TEST_F(CapiCompileOnly, ConfigForRoundTrips) {
  char* text = nullptr;
  ASSERT_EQ(kjit_rms_norm_config_for(Norm(norm_spec_), 4096, &text), KJIT_OK) << kjit_last_error();
  const std::string norm_config = Take(text);
  EXPECT_THAT(norm_config, StartsWith("vec="));
  kjit_rms_norm_spec n = norm_spec_;
  n.config = norm_config.c_str();
  ASSERT_EQ(kjit_rms_norm_config_for(Norm(n), 1, &text), KJIT_OK) << kjit_last_error();
  EXPECT_EQ(Take(text), norm_config);

  for (int32_t fused : {0, 1}) {
    ASSERT_EQ(kjit_cross_entropy_config_for(Ce(ce_spec_), 4096, fused, &text), KJIT_OK)
        << kjit_last_error();
    const std::string ce_config = Take(text);
    EXPECT_THAT(ce_config, StartsWith("vec="));
    kjit_cross_entropy_spec c = ce_spec_;
    c.config = ce_config.c_str();
    ASSERT_EQ(kjit_cross_entropy_config_for(Ce(c), 1, fused, &text), KJIT_OK) << kjit_last_error();
    EXPECT_EQ(Take(text), ce_config);
  }

  ASSERT_EQ(kjit_linear_cross_entropy_config_for(Lce(lce_spec_), 4096, &text), KJIT_OK)
      << kjit_last_error();
  EXPECT_THAT(Take(text), StartsWith("chunk="));
  const std::string lce_config =
      "chunk=32 whole=0 streams=2 logits_algo=1 d_hidden_algo=2 d_weight_algo=3";
  kjit_linear_cross_entropy_spec l = lce_spec_;
  l.config = lce_config.c_str();
  ASSERT_EQ(kjit_linear_cross_entropy_config_for(Lce(l), 1, &text), KJIT_OK) << kjit_last_error();
  EXPECT_EQ(Take(text), lce_config);
}

TEST_F(CapiCompileOnly, WorkspaceBytes) {
  // Cross-entropy (kjit/cross_entropy.h): 16 bytes of counters, then for sum and mean one fp32 loss
  // per row (at least one), in 16-byte units.
  kjit_cross_entropy* mean = Ce(ce_spec_);
  kjit_cross_entropy_spec c = ce_spec_;
  c.loss.reduction = KJIT_REDUCTION_NONE;
  kjit_cross_entropy* none = Ce(c);
  for (const auto& [rows, mean_bytes] : std::map<int64_t, int64_t>{{0, 32}, {7, 48}, {8, 48}}) {
    int64_t bytes = -1;
    ASSERT_EQ(kjit_cross_entropy_workspace_bytes(mean, rows, &bytes), KJIT_OK);
    EXPECT_EQ(bytes, mean_bytes) << rows << " rows";
    ASSERT_EQ(kjit_cross_entropy_workspace_bytes(none, rows, &bytes), KJIT_OK);
    EXPECT_EQ(bytes, 16) << rows << " rows";
  }
  // RMSNorm (ops/rms_norm/rms_norm.cc): a compile-only runtime counts one SM, so the partial rows
  // are the floor of 128, of hidden fp32 values each.
  int64_t bytes = -1;
  ASSERT_EQ(kjit_rms_norm_backward_workspace_bytes(Norm(norm_spec_), 7, &bytes), KJIT_OK);
  EXPECT_EQ(bytes, 128 * norm_spec_.hidden * 4);

  // Linear + cross-entropy: the fp32 weight-gradient accumulator (vocab x hidden x 4 bytes) only
  // for fp32 accumulation into a d_weight that is not fp32, and the workspace holds it.
  const int64_t vh4 = lce_spec_.vocab * lce_spec_.hidden * 4;
  kjit_linear_cross_entropy_spec l = lce_spec_;
  l.config =
      "chunk=32 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0";  // 4 chunks
  const auto accumulator = [&](const kjit_linear_cross_entropy_spec& spec) {
    kjit_linear_cross_entropy* op = Lce(spec);
    int64_t acc = -1, ws = -1;
    EXPECT_EQ(kjit_linear_cross_entropy_accumulator_bytes(op, 100, &acc), KJIT_OK)
        << kjit_last_error();
    EXPECT_EQ(kjit_linear_cross_entropy_workspace_bytes(op, 100, &ws), KJIT_OK);
    EXPECT_GE(ws, acc + (int64_t{32} << 20)) << "cuBLASLt's 32 MiB and the accumulator";
    return std::pair(acc, ws);
  };
  const auto [acc_bf16, ws_bf16] = accumulator(l);
  EXPECT_EQ(acc_bf16, vh4);
  l.weight_grad_accumulation = KJIT_WEIGHT_GRAD_ACCUMULATION_OUTPUT_DTYPE;
  const auto [acc_out, ws_out] = accumulator(l);
  EXPECT_EQ(acc_out, 0);
  EXPECT_EQ(ws_bf16 - ws_out, vh4);
  l.weight_grad_accumulation = KJIT_WEIGHT_GRAD_ACCUMULATION_FP32;
  l.weight_grad_dtype = KJIT_F32;  // d_weight is the accumulator
  EXPECT_EQ(accumulator(l).first, 0);
  ExpectInvalid(Last(kjit_linear_cross_entropy_workspace_bytes(Lce(lce_spec_), -1, &bytes)),
                "rows: -1");

  ExpectInvalid(Last(kjit_cross_entropy_workspace_bytes(mean, -1, &bytes)), "rows: -1");
  EXPECT_EQ(bytes, 0) << "a failed call clears its output";
  ExpectInvalid(
      Last(kjit_rms_norm_backward_workspace_bytes(Norm(norm_spec_), int64_t{1} << 40, &bytes)),
      "rows: 1099511627776 is out of range");
}

// ---- errors -----------------------------------------------------------------------------------

TEST_F(CapiCompileOnly, NullArgumentsAreNamed) {
  kjit_rms_norm* norm = Norm(norm_spec_);
  kjit_cross_entropy* ce = Ce(ce_spec_);
  kjit_rms_norm_forward_args f;
  kjit_rms_norm_forward_args_init(&f);
  kjit_cross_entropy_backward_args b;
  kjit_cross_entropy_backward_args_init(&b);
  char* text = reinterpret_cast<char*>(&f);  // each failed call leaves NULL (or 0) in its output
  int64_t bytes = 1;
  kjit_rms_norm* created = norm;
  kjit_cross_entropy* ce_created = ce;
  kjit_linear_cross_entropy* lce = Lce(lce_spec_);
  kjit_linear_cross_entropy* lce_created = lce;
  int64_t acc_bytes = 1;
  kjit_linear_cross_entropy_args l;
  kjit_linear_cross_entropy_args_init(&l);
  const std::vector<std::pair<Result, std::string>> cases = {
      {Last(kjit_full_version(nullptr)), "kjit_full_version: out is NULL"},
      {Last(kjit_runtime_create(nullptr, nullptr)), "kjit_runtime_create: out is NULL"},
      {Last(kjit_runtime_info(nullptr, &text)), "kjit_runtime_info: runtime is NULL"},
      {Last(kjit_runtime_info(rt_, nullptr)), "kjit_runtime_info: json_out is NULL"},
      {Last(kjit_rms_norm_create(nullptr, &norm_spec_, &created)),
       "kjit_rms_norm_create: runtime is NULL"},
      {Last(kjit_cross_entropy_create(rt_, nullptr, &ce_created)),
       "kjit_cross_entropy_create: spec is NULL"},
      {Last(kjit_cross_entropy_create(rt_, &ce_spec_, nullptr)),
       "kjit_cross_entropy_create: out is NULL"},
      {Last(kjit_rms_norm_forward(nullptr, nullptr, &f)), "kjit_rms_norm_forward: op is NULL"},
      {Last(kjit_rms_norm_backward(norm, nullptr, nullptr)),
       "kjit_rms_norm_backward: args is NULL"},
      {Last(kjit_cross_entropy_backward(nullptr, nullptr, &b)),
       "kjit_cross_entropy_backward: op is NULL"},
      {Last(kjit_cross_entropy_rescale_gradient(ce, nullptr, nullptr)),
       "kjit_cross_entropy_rescale_gradient: args is NULL"},
      {Last(kjit_cross_entropy_workspace_bytes(ce, 1, nullptr)),
       "kjit_cross_entropy_workspace_bytes: bytes is NULL"},
      {Last(kjit_rms_norm_backward_workspace_bytes(nullptr, 1, &bytes)),
       "kjit_rms_norm_backward_workspace_bytes: op is NULL"},
      {Last(kjit_rms_norm_config_for(norm, 1, nullptr)),
       "kjit_rms_norm_config_for: config_out is NULL"},
      {Last(kjit_cross_entropy_build(nullptr, &text)), "kjit_cross_entropy_build: op is NULL"},
      {Last(kjit_linear_cross_entropy_create(nullptr, &lce_spec_, &lce_created)),
       "kjit_linear_cross_entropy_create: runtime is NULL"},
      {Last(kjit_linear_cross_entropy_create(rt_, nullptr, &lce_created)),
       "kjit_linear_cross_entropy_create: spec is NULL"},
      {Last(kjit_linear_cross_entropy_forward(nullptr, nullptr, &l)),
       "kjit_linear_cross_entropy_forward: op is NULL"},
      {Last(kjit_linear_cross_entropy_forward_backward(lce, nullptr, nullptr)),
       "kjit_linear_cross_entropy_forward_backward: args is NULL"},
      {Last(kjit_linear_cross_entropy_rescale_gradients(lce, nullptr, nullptr)),
       "kjit_linear_cross_entropy_rescale_gradients: args is NULL"},
      {Last(kjit_linear_cross_entropy_workspace_bytes(lce, 1, nullptr)),
       "kjit_linear_cross_entropy_workspace_bytes: bytes is NULL"},
      {Last(kjit_linear_cross_entropy_accumulator_bytes(nullptr, 100, &acc_bytes)),
       "kjit_linear_cross_entropy_accumulator_bytes: op is NULL"},
      {Last(kjit_linear_cross_entropy_config_for(lce, 1, nullptr)),
       "kjit_linear_cross_entropy_config_for: config_out is NULL"},
      {Last(kjit_linear_cross_entropy_build(nullptr, &text)),
       "kjit_linear_cross_entropy_build: op is NULL"},
  };
  for (const auto& [result, message] : cases) {
    EXPECT_EQ(result.status, KJIT_INVALID_ARGUMENT) << message;
    EXPECT_EQ(result.message, message);
  }
  EXPECT_EQ(text, nullptr);
  EXPECT_EQ(bytes, 0);
  EXPECT_EQ(created, nullptr);
  EXPECT_EQ(ce_created, nullptr);
  EXPECT_EQ(lce_created, nullptr);
  EXPECT_EQ(acc_bytes, 0);
  kjit_runtime_destroy(nullptr);
  kjit_rms_norm_destroy(nullptr);
  kjit_cross_entropy_destroy(nullptr);
  kjit_linear_cross_entropy_destroy(nullptr);
}

TEST_F(CapiCompileOnly, StructSizesMustBeThisLibrarys) {
  const std::string kAbiText = "kjit C ABI version " + std::to_string(KJIT_C_ABI_VERSION);
  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.struct_size -= 8;
  kjit_runtime* rt = nullptr;
  const Result options = Last(kjit_runtime_create(&o, &rt));
  ExpectInvalid(options, "kjit_runtime_create: options->struct_size is " +
                             std::to_string(sizeof(o) - 8) + ", but kjit_runtime_options is " +
                             std::to_string(sizeof(o)) + " bytes in this library");
  EXPECT_THAT(options.message, HasSubstr(kAbiText));
  EXPECT_THAT(options.message, HasSubstr("kjit_runtime_options_init"));

  kjit_cross_entropy_spec c = ce_spec_;
  c.struct_size = 0;
  kjit_cross_entropy* ce = nullptr;
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                "kjit_cross_entropy_create: spec->struct_size is 0, but kjit_cross_entropy_spec");
  // A version 1 binding's structs (each ended where version 2 appended its class weights):
  // refused, rather than read with a garbage tail.
  c.struct_size = offsetof(kjit_cross_entropy_spec, loss.class_weight_dtype);
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                "kjit_cross_entropy_create: spec->struct_size is " + std::to_string(c.struct_size) +
                    ", but kjit_cross_entropy_spec is " + std::to_string(sizeof(c)) +
                    " bytes in this library (" + kAbiText + ")");
  // A version 2 binding's (version 3 appended entropy): refused too.
  c.struct_size = offsetof(kjit_cross_entropy_spec, loss.entropy);
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                "kjit_cross_entropy_create: spec->struct_size is " + std::to_string(c.struct_size) +
                    ", but kjit_cross_entropy_spec is " + std::to_string(sizeof(c)) + " bytes");
  kjit_cross_entropy_args a;
  kjit_cross_entropy_args_init(&a);
  a.struct_size = offsetof(kjit_cross_entropy_args, class_weight);
  ExpectInvalid(Last(kjit_cross_entropy_forward(Ce(ce_spec_), nullptr, &a)),
                "kjit_cross_entropy_forward: args->struct_size is " +
                    std::to_string(a.struct_size) + ", but kjit_cross_entropy_args is");
  kjit_cross_entropy_backward_args cb;
  kjit_cross_entropy_backward_args_init(&cb);
  cb.struct_size = offsetof(kjit_cross_entropy_backward_args, class_weight);
  ExpectInvalid(Last(kjit_cross_entropy_backward(Ce(ce_spec_), nullptr, &cb)),
                "kjit_cross_entropy_backward: args->struct_size is " +
                    std::to_string(cb.struct_size) + ", but kjit_cross_entropy_backward_args is");

  kjit_linear_cross_entropy_spec l = lce_spec_;
  l.struct_size -= 8;
  kjit_linear_cross_entropy* lce = nullptr;
  ExpectInvalid(Last(kjit_linear_cross_entropy_create(rt_, &l, &lce)),
                "kjit_linear_cross_entropy_create: spec->struct_size is " +
                    std::to_string(sizeof(l) - 8) + ", but kjit_linear_cross_entropy_spec is " +
                    std::to_string(sizeof(l)) + " bytes in this library (" + kAbiText +
                    "); set it with kjit_linear_cross_entropy_spec_init");
  kjit_linear_cross_entropy_args la;
  kjit_linear_cross_entropy_args_init(&la);
  la.struct_size = 0;
  ExpectInvalid(Last(kjit_linear_cross_entropy_forward_backward(Lce(lce_spec_), nullptr, &la)),
                "kjit_linear_cross_entropy_forward_backward: args->struct_size is 0, but "
                "kjit_linear_cross_entropy_args is " +
                    std::to_string(sizeof(la)) + " bytes");

  kjit_rms_norm_backward_args b;
  kjit_rms_norm_backward_args_init(&b);
  b.struct_size += 8;
  ExpectInvalid(Last(kjit_rms_norm_backward(Norm(norm_spec_), nullptr, &b)),
                "kjit_rms_norm_backward: args->struct_size is " + std::to_string(sizeof(b) + 8) +
                    ", but kjit_rms_norm_backward_args is " + std::to_string(sizeof(b)) + " bytes");
}

TEST_F(CapiCompileOnly, EnumFieldsAreRangeChecked) {
  kjit_rms_norm* norm = nullptr;
  kjit_rms_norm_spec n = norm_spec_;
  n.dtype = 3;
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)),
                "dtype: 3 is out of range; expected 0 (KJIT_F32), 1 (KJIT_F16) or 2 (KJIT_BF16)");
  n = norm_spec_;
  n.weight_dtype = -2;
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)),
                "weight_dtype: -2 is out of range; expected -1 (dtype's), 0 (KJIT_F32),");
  n = norm_spec_;
  n.casting = 3;
  ExpectInvalid(
      Last(kjit_rms_norm_create(rt_, &n, &norm)),
      "casting: 3 is out of range; expected 0 (KJIT_CASTING_LLAMA), 1 (KJIT_CASTING_GEMMA) "
      "or 2 (KJIT_CASTING_NONE)");
  n = norm_spec_;
  n.casting = KJIT_CASTING_NONE;
  n.weight_dtype = KJIT_F32;
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)), "weight_dtype: fp32 must be the dtype");
  n = norm_spec_;
  n.fused_residual = 2;
  ExpectInvalid(Last(kjit_rms_norm_create(rt_, &n, &norm)),
                "fused_residual: 2 is out of range; expected 0 (off) or 1 (on)");

  kjit_cross_entropy* ce = nullptr;
  kjit_cross_entropy_spec c = ce_spec_;
  c.loss.target_type = 2;
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                "loss.target_type: 2 is out of range");
  c = ce_spec_;
  c.loss.reduction = -1;
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                "loss.reduction: -1 is out of range; expected 0 (KJIT_REDUCTION_NONE), 1 "
                "(KJIT_REDUCTION_SUM) or 2 (KJIT_REDUCTION_MEAN)");
  c = ce_spec_;
  c.loss.argmax = -1;
  ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)), "loss.argmax: -1 is out of range");
  for (int32_t bad : {-2, 3}) {
    c = ce_spec_;
    c.loss.class_weight_dtype = bad;
    ExpectInvalid(Last(kjit_cross_entropy_create(rt_, &c, &ce)),
                  "loss.class_weight_dtype: " + std::to_string(bad) +
                      " is out of range; expected -1 (none), 0 (KJIT_F32), 1 (KJIT_F16) or 2 "
                      "(KJIT_BF16)");
  }

  kjit_linear_cross_entropy* lce = nullptr;
  const std::vector<std::pair<std::function<void(kjit_linear_cross_entropy_spec&)>, std::string>>
      lce_cases = {
          {[](auto& x) { x.dtype = -1; }, "dtype: -1 is out of range; expected 0 (KJIT_F32)"},
          {[](auto& x) { x.weight_grad_dtype = 3; },
           "weight_grad_dtype: 3 is out of range; expected -1 (dtype's), 0 (KJIT_F32), 1 "
           "(KJIT_F16) or 2 (KJIT_BF16)"},
          {[](auto& x) { x.bias = 2; }, "bias: 2 is out of range; expected 0 (off) or 1 (on)"},
          {[](auto& x) { x.loss.target_type = 2; }, "loss.target_type: 2 is out of range"},
          {[](auto& x) { x.loss.reduction = 3; }, "loss.reduction: 3 is out of range"},
          {[](auto& x) { x.loss.argmax = -1; }, "loss.argmax: -1 is out of range"},
          {[](auto& x) { x.weight_grad_accumulation = 2; },
           "weight_grad_accumulation: 2 is out of range; expected 0 "
           "(KJIT_WEIGHT_GRAD_ACCUMULATION_FP32) or 1 "
           "(KJIT_WEIGHT_GRAD_ACCUMULATION_OUTPUT_DTYPE)"},
      };
  for (const auto& [change, message] : lce_cases) {
    kjit_linear_cross_entropy_spec l = lce_spec_;
    change(l);
    ExpectInvalid(Last(kjit_linear_cross_entropy_create(rt_, &l, &lce)), message);
  }

  kjit_runtime_options o;
  kjit_runtime_options_init(&o);
  o.disk_cache = 7;
  kjit_runtime* rt = nullptr;
  ExpectInvalid(Last(kjit_runtime_create(&o, &rt)), "disk_cache: 7 is out of range");

  // The views' dtypes and the index vectors' types, named by the argument.
  kjit_rms_norm_forward_args f;
  kjit_rms_norm_forward_args_init(&f);
  f.residual_out.dtype = 9;
  ExpectInvalid(Last(kjit_rms_norm_forward(Norm(norm_spec_), nullptr, &f)),
                "residual_out.dtype: 9 is out of range; expected 0 (KJIT_F32)");
  kjit_cross_entropy_backward_args b;
  kjit_cross_entropy_backward_args_init(&b);
  b.targets.type = 2;
  ExpectInvalid(Last(kjit_cross_entropy_backward(Ce(ce_spec_), nullptr, &b)),
                "targets.type: 2 is out of range; expected 0 (KJIT_INT32) or 1 (KJIT_INT64)");
  char* text = nullptr;
  ExpectInvalid(Last(kjit_cross_entropy_config_for(Ce(ce_spec_), 1, 2, &text)),
                "fused: 2 is out of range");
}

TEST(CapiErrors, TheLastErrorIsPerThreadAndClearedBySuccess) {
  ASSERT_EQ(kjit_full_version(nullptr), KJIT_INVALID_ARGUMENT);
  const std::string mine = kjit_last_error();
  EXPECT_EQ(mine, "kjit_full_version: out is NULL");
  std::string before, after;
  std::thread([&] {
    before = kjit_last_error();
    EXPECT_EQ(kjit_runtime_create(nullptr, nullptr), KJIT_INVALID_ARGUMENT);
    after = kjit_last_error();
  }).join();
  EXPECT_EQ(before, "") << "another thread's failure is not this one's";
  EXPECT_EQ(after, "kjit_runtime_create: out is NULL");
  EXPECT_EQ(kjit_last_error(), mine);

  char* full = nullptr;
  ASSERT_EQ(kjit_full_version(&full), KJIT_OK);
  kjit_free(full);
  EXPECT_STREQ(kjit_last_error(), "");
}

// ---- the vocab-parallel cross-entropy (issue 37) ----------------------------------------------

TEST(CapiInit, ShardedCrossEntropyDefaultsAreTheCppDefaults) {
  const kjit_sharded_cross_entropy_spec s = Initialized(kjit_sharded_cross_entropy_spec_init);
  const ShardedCrossEntropySpec r;
  EXPECT_EQ(s.vocab, r.vocab);
  EXPECT_EQ(s.shard_start, r.shard_start);
  EXPECT_EQ(s.shard_end, r.shard_end);
  EXPECT_EQ(s.dtype, static_cast<int32_t>(r.dtype));
  EXPECT_EQ(s.loss.target_type, static_cast<int32_t>(r.loss.target_type));
  EXPECT_EQ(s.loss.ignore_index, r.loss.ignore_index);
  EXPECT_EQ(s.loss.reduction, static_cast<int32_t>(r.loss.reduction));
  EXPECT_EQ(s.loss.label_smoothing, r.loss.label_smoothing);
  EXPECT_EQ(s.loss.z_loss, r.loss.z_loss);
  EXPECT_EQ(s.loss.softcap, r.loss.softcap);
  EXPECT_EQ(s.config, nullptr);
  EXPECT_FALSE(r.config.has_value());
  EXPECT_EQ(s.loss.class_weight_dtype, -1);
  EXPECT_FALSE(r.loss.class_weight_dtype.has_value());
  const auto a = Initialized(kjit_sharded_cross_entropy_args_init);
  ExpectEmpty({&a.logits, &a.loss, &a.lse, &a.grad, &a.grad_output, &a.class_weight}, {&a.targets});
  EXPECT_TRUE(a.workspace == nullptr && a.workspace_bytes == 0);
}

// The all-reduces kjit asked the fake NCCL (KJIT_FAKE_NCCL) for in this process.
int AllReducesIssued() {
  void* lib = ::dlopen(KJIT_FAKE_NCCL, RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return 0;  // never opened: nothing issued
  const auto count = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_nccl_all_reduces"));
  const int issued = count != nullptr ? count() : -1;
  ::dlclose(lib);
  return issued;
}

// A compile-only runtime with the second of two shards of a 1000-class vocab; NCCL is the fake,
// which counts collectives and issues none.
class CapiSharded : public CapiCompileOnly {
 protected:
  void SetUp() override {
    ::setenv("KJIT_NCCL_LIBRARY", KJIT_FAKE_NCCL, 1);
    CapiCompileOnly::SetUp();
    kjit_sharded_cross_entropy_spec_init(&spec_);
    spec_.vocab = 1000;
    spec_.shard_start = 500;
    spec_.shard_end = 1000;
  }
  kjit_sharded_cross_entropy* Sharded(const kjit_sharded_cross_entropy_spec& spec) {
    kjit_sharded_cross_entropy* op = nullptr;
    EXPECT_EQ(kjit_sharded_cross_entropy_create(rt_, &spec, &op), KJIT_OK) << kjit_last_error();
    sharded_.emplace_back(op, kjit_sharded_cross_entropy_destroy);
    return op;
  }
  // Arguments on host blocks for `rows` rows of the shard, gradient in place.
  kjit_sharded_cross_entropy_args Args(kjit_sharded_cross_entropy* op, int64_t rows) {
    const int64_t width = spec_.shard_end - spec_.shard_start;
    kjit_sharded_cross_entropy_args a;
    kjit_sharded_cross_entropy_args_init(&a);
    a.logits = View(Host(mem_, rows * width * 2), KJIT_BF16, rows, width);
    a.targets = {Host(mem_, rows * 8), KJIT_INT64, rows};
    a.loss = View(Host(mem_, 4), KJIT_F32, 1, 1);
    a.grad = a.logits;
    EXPECT_EQ(kjit_sharded_cross_entropy_workspace_bytes(op, rows, &a.workspace_bytes), KJIT_OK)
        << kjit_last_error();
    a.workspace = Host(mem_, a.workspace_bytes);
    return a;
  }

  kjit_sharded_cross_entropy_spec spec_;
  std::vector<std::vector<Block>> mem_;
  std::vector<
      std::unique_ptr<kjit_sharded_cross_entropy, decltype(&kjit_sharded_cross_entropy_destroy)>>
      sharded_;
};

TEST_F(CapiSharded, BuildsAndAnswersItsQueries) {
  kjit_sharded_cross_entropy* op = Sharded(spec_);
  ExpectBuilds(op, kjit_sharded_cross_entropy_build, cache_);
  char* text = nullptr;
  ASSERT_EQ(kjit_sharded_cross_entropy_config(op, &text), KJIT_OK) << kjit_last_error();
  const std::string config = Take(text);
  EXPECT_THAT(config, HasSubstr("cluster=0"));
  // The config text makes an op with that same config.
  kjit_sharded_cross_entropy_spec again = spec_;
  again.config = config.c_str();
  ASSERT_EQ(kjit_sharded_cross_entropy_config(Sharded(again), &text), KJIT_OK);
  EXPECT_EQ(Take(text), config);

  // As the C++ op's: the counters, 5 floats a row and, for the mean, one loss a row.
  int64_t bytes = 0;
  ASSERT_EQ(kjit_sharded_cross_entropy_workspace_bytes(op, 100, &bytes), KJIT_OK);
  EXPECT_GE(bytes, 100 * 6 * 4);
  EXPECT_EQ(bytes % 16, 0);
  ExpectInvalid(Last(kjit_sharded_cross_entropy_workspace_bytes(op, -1, &bytes)), "rows: -1");
  EXPECT_EQ(bytes, 0);

  // stats_of: rows floats of max, then 3 * rows floats of sums right after, in the workspace.
  const int64_t rows = 100;
  ASSERT_EQ(kjit_sharded_cross_entropy_workspace_bytes(op, rows, &bytes), KJIT_OK);
  auto* ws = static_cast<unsigned char*>(Host(mem_, bytes));
  float* max = nullptr;
  float* sums = nullptr;
  ASSERT_EQ(kjit_sharded_cross_entropy_stats_of(op, ws, rows, &max, &sums), KJIT_OK)
      << kjit_last_error();
  const auto at = [&](const float* p) { return reinterpret_cast<const unsigned char*>(p) - ws; };
  EXPECT_EQ(sums - max, rows);
  EXPECT_GE(at(max), 0);
  EXPECT_LE(at(sums + 3 * rows), bytes);
  ExpectInvalid(Last(kjit_sharded_cross_entropy_stats_of(op, ws, -2, &max, &sums)), "rows: -2");
  EXPECT_EQ(max, nullptr);
  EXPECT_EQ(sums, nullptr);
}

TEST_F(CapiSharded, InvalidSpecsNameTheField) {
  kjit_sharded_cross_entropy* op = reinterpret_cast<kjit_sharded_cross_entropy*>(this);
  const std::vector<std::pair<std::function<void(kjit_sharded_cross_entropy_spec&)>, std::string>>
      cases = {
          {[](auto& x) { x.vocab = 1; }, "vocab:"},
          {[](auto& x) { x.shard_start = -1; }, "shard_start: -1 is outside the vocab"},
          {[](auto& x) { x.shard_end = 500; }, "shard_end: 500 must be above shard_start 500"},
          {[](auto& x) { x.shard_end = 1001; }, "shard_end: 1001 must be above"},
          {[](auto& x) { x.dtype = 7; }, "dtype: 7 is out of range"},
          {[](auto& x) { x.loss.reduction = 3; }, "loss.reduction: 3 is out of range"},
          {[](auto& x) { x.loss.target_type = -1; }, "loss.target_type: -1 is out of range"},
          {[](auto& x) { x.loss.class_weight_dtype = -2; },
           "loss.class_weight_dtype: -2 is out of range"},
          {[](auto& x) { x.loss.label_smoothing = 1; }, "label_smoothing:"},
          {[](auto& x) { x.loss.argmax = 1; }, "argmax"},
          {[](auto& x) { x.config = "banana"; }, "config: "},
          {[](auto& x) { x.config = "vec=8 threads=256 unroll=4 cluster=2 staged=0"; },
           "config.cluster: 2"},
      };
  for (const auto& [change, message] : cases) {
    kjit_sharded_cross_entropy_spec s = spec_;
    change(s);
    ExpectInvalid(Last(kjit_sharded_cross_entropy_create(rt_, &s, &op)), message);
    EXPECT_EQ(op, nullptr) << "a failed create leaves NULL in *out";
  }
  kjit_sharded_cross_entropy_spec s = spec_;
  s.struct_size = 8;
  ExpectInvalid(Last(kjit_sharded_cross_entropy_create(rt_, &s, &op)),
                "kjit_sharded_cross_entropy_create: spec->struct_size is 8, but "
                "kjit_sharded_cross_entropy_spec is");
}

// Each step checks its arguments (the C++ layer's messages name the C field) before the
// compile-only runtime refuses the launch.
TEST_F(CapiSharded, StepsCheckTheirArguments) {
  const int64_t rows = 3;
  kjit_sharded_cross_entropy* op = Sharded(spec_);
  const kjit_sharded_cross_entropy_args good = Args(op, rows);
  for (const Result& r :
       {Last(kjit_sharded_cross_entropy_compute_stats(op, nullptr, &good)),
        Last(kjit_sharded_cross_entropy_finish(op, nullptr, &good)),
        Last(kjit_sharded_cross_entropy_rescale_stats(op, nullptr, good.workspace, rows))}) {
    EXPECT_EQ(r.status, KJIT_FAILED_PRECONDITION) << r.message;
    EXPECT_THAT(r.message, HasSubstr("compile-only"));
  }
  const std::vector<std::pair<std::function<void(kjit_sharded_cross_entropy_args&)>, std::string>>
      cases = {
          {[](auto& a) { a.logits.cols = 1000; }, "logits:"},
          {[](auto& a) { a.logits.dtype = 9; }, "logits.dtype: 9 is out of range"},
          {[](auto& a) { a.targets.size = 2; }, "targets:"},
          {[](auto& a) { a.targets.type = 5; }, "targets.type: 5 is out of range"},
          {[](auto& a) { a.loss.cols = 3; }, "loss:"},
          {[](auto& a) { a.workspace_bytes -= 16; }, "workspace"},
          {[](auto& a) { a.class_weight = a.loss; },
           "class_weight: given, but the op was created without class weights"},
          {[](auto& a) {
             a.grad = {};
             a.grad_output = a.loss;
           },
           "grad_output: given without grad"},
      };
  for (const auto& [change, message] : cases) {
    kjit_sharded_cross_entropy_args bad = good;
    change(bad);
    ExpectInvalid(Last(kjit_sharded_cross_entropy_compute_stats(op, nullptr, &bad)), message);
    ExpectInvalid(Last(kjit_sharded_cross_entropy_finish(op, nullptr, &bad)), message);
  }
  kjit_sharded_cross_entropy_args small = good;
  small.struct_size -= 8;
  ExpectInvalid(Last(kjit_sharded_cross_entropy_finish(op, nullptr, &small)),
                "kjit_sharded_cross_entropy_finish: args->struct_size is");
  ExpectInvalid(Last(kjit_sharded_cross_entropy_rescale_stats(op, nullptr, good.workspace, 0)),
                "rows: 0 must be from 1");
  // The communicator is checked before NCCL is looked for: this machine may have none.
  void* comm = &mem_;  // never used: the compile-only runtime refuses first
  ExpectInvalid(Last(kjit_sharded_cross_entropy_run(op, nullptr, &good, nullptr)),
                "kjit_sharded_cross_entropy_run: nccl_comm is NULL");
  ExpectInvalid(
      Last(kjit_sharded_cross_entropy_all_reduce_stats(op, nullptr, good.workspace, rows, nullptr)),
      "kjit_sharded_cross_entropy_all_reduce_stats: nccl_comm is NULL");
  ExpectInvalid(Last(kjit_sharded_cross_entropy_all_reduce_stats(op, nullptr, nullptr, rows, comm)),
                "kjit_sharded_cross_entropy_all_reduce_stats: workspace is NULL");
  kjit_sharded_cross_entropy_args bad = good;
  bad.loss.cols = 3;
  ExpectInvalid(Last(kjit_sharded_cross_entropy_run(op, nullptr, &bad, comm)), "loss:");
}

TEST_F(CapiSharded, CombineStatsChecksTheShards) {
  const int64_t rows = 4;
  kjit_sharded_cross_entropy_spec first = spec_;
  first.shard_start = 0;
  first.shard_end = 500;
  kjit_sharded_cross_entropy* ops[2] = {Sharded(first), Sharded(spec_)};
  void* workspaces[2] = {Args(ops[0], rows).workspace, Args(ops[1], rows).workspace};
  const Result ok =
      Last(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, workspaces, 2, rows));
  EXPECT_EQ(ok.status, KJIT_FAILED_PRECONDITION) << ok.message;
  ExpectInvalid(Last(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, workspaces, 1, rows)),
                "shards: cover classes [0, 500) of 1000");
  kjit_sharded_cross_entropy* swapped[2] = {ops[1], ops[0]};
  ExpectInvalid(
      Last(kjit_sharded_cross_entropy_combine_stats(nullptr, swapped, workspaces, 2, rows)),
      "shards[0]: classes [500, 1000) of vocab 1000, expected the next shard");
  ExpectInvalid(Last(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, workspaces, 0, rows)),
                "kjit_sharded_cross_entropy_combine_stats: count: 0 shards, expected 1 to 32");
  ExpectInvalid(
      Last(kjit_sharded_cross_entropy_combine_stats(nullptr, nullptr, workspaces, 2, rows)),
      "kjit_sharded_cross_entropy_combine_stats: ops is NULL");
  void* missing[2] = {workspaces[0], nullptr};
  ExpectInvalid(Last(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, missing, 2, rows)),
                "kjit_sharded_cross_entropy_combine_stats: workspaces[1] is NULL");
  kjit_sharded_cross_entropy* wrong[2] = {ops[0],
                                          reinterpret_cast<kjit_sharded_cross_entropy*>(rt_)};
  ExpectInvalid(Last(kjit_sharded_cross_entropy_combine_stats(nullptr, wrong, workspaces, 2, rows)),
                "kjit_sharded_cross_entropy_combine_stats: ops[1] is a kjit_runtime handle; "
                "expected a kjit_sharded_cross_entropy");
}

// Issue 45, defects 3 and 4: a rank that fails after its first all-reduce never joins the
// second and its peers block; a compile-only runtime must not reach NCCL with a bogus
// communicator (a real NCCL crashes on it).
TEST_F(CapiSharded, AllReduceChecksEverythingBeforeItsFirstCollective) {
  const int64_t rows = 3;
  kjit_sharded_cross_entropy* op = Sharded(spec_);
  const kjit_sharded_cross_entropy_args good = Args(op, rows);
  void* comm = &mem_;  // not a communicator
  for (const Result& r :
       {Last(kjit_sharded_cross_entropy_all_reduce_stats(op, nullptr, good.workspace, rows, comm)),
        Last(kjit_sharded_cross_entropy_run(op, nullptr, &good, comm))}) {
    EXPECT_EQ(r.status, KJIT_FAILED_PRECONDITION) << r.message;
    EXPECT_THAT(r.message, HasSubstr("compile-only"));
  }
  void* misaligned = static_cast<char*>(good.workspace) + 4;
  ExpectInvalid(
      Last(kjit_sharded_cross_entropy_all_reduce_stats(op, nullptr, misaligned, rows, comm)),
      "workspace: 0x");
  ExpectInvalid(
      Last(kjit_sharded_cross_entropy_all_reduce_stats(op, nullptr, good.workspace, 0, comm)),
      "rows: 0 must be from 1");
  EXPECT_EQ(AllReducesIssued(), 0);
}

// Issue 45, defect 5: shards of different problems, runtimes or one workspace twice combine
// into wrong statistics; each is refused, naming the shard and what differs.
TEST_F(CapiSharded, CombineStatsRefusesShardsThatDoNotBelongTogether) {
  const int64_t rows = 4;
  kjit_sharded_cross_entropy_spec first = spec_;
  first.shard_start = 0;
  first.shard_end = 500;
  const auto combine = [&](kjit_sharded_cross_entropy* second, void* ws0, void* ws1) {
    kjit_sharded_cross_entropy* ops[2] = {Sharded(first), second};
    void* workspaces[2] = {ws0, ws1};
    return Last(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, workspaces, 2, rows));
  };
  void* ws0 = Args(Sharded(first), rows).workspace;
  void* ws1 = Args(Sharded(spec_), rows).workspace;
  const std::vector<std::pair<std::function<void(kjit_sharded_cross_entropy_spec&)>, std::string>>
      cases = {
          {[](auto& s) { s.dtype = KJIT_F16; }, "dtype: fp16, but shards[0]'s is bf16"},
          {[](auto& s) { s.loss.target_type = KJIT_INT32; }, "loss.target_type: int32, but"},
          {[](auto& s) { s.loss.ignore_index = -1; }, "loss.ignore_index: -1, but shards[0]'s"},
          {[](auto& s) { s.loss.label_smoothing = 0.1f; }, "loss.label_smoothing: 0.1, but"},
          {[](auto& s) { s.loss.z_loss = 1e-4f; }, "loss.z_loss: 0.0001, but shards[0]'s is 0"},
          {[](auto& s) { s.loss.softcap = 30; }, "loss.softcap: 30, but shards[0]'s is 0"},
          {[](auto& s) { s.loss.class_weight_dtype = KJIT_F32; },
           "loss.class_weight_dtype: fp32, but shards[0]'s is none"},
      };
  for (const auto& [change, message] : cases) {
    kjit_sharded_cross_entropy_spec s = spec_;
    change(s);
    ExpectInvalid(combine(Sharded(s), ws0, ws1), "shards[1]: " + message);
  }
  ExpectInvalid(combine(Sharded(spec_), ws0, ws0), "shards[1].workspace: overlaps shards[0]'s");
  ExpectInvalid(combine(Sharded(spec_), ws0, static_cast<char*>(ws0) + 16),
                "shards[1].workspace: overlaps");
  kjit_runtime* other = CompileOnlyRuntime();
  ASSERT_NE(other, nullptr);
  kjit_sharded_cross_entropy* foreign = nullptr;
  ASSERT_EQ(kjit_sharded_cross_entropy_create(other, &spec_, &foreign), KJIT_OK);
  ExpectInvalid(combine(foreign, ws0, ws1),
                "shards[1].op: made by another runtime than shards[0].op");
  kjit_sharded_cross_entropy_destroy(foreign);
  kjit_runtime_destroy(other);
  const Result ok = combine(Sharded(spec_), ws0, ws1);
  EXPECT_EQ(ok.status, KJIT_FAILED_PRECONDITION) << ok.message;
}

// Issue 45, defect 10: a huge count is refused before ops[] or workspaces[] is read past its
// end (here into a page that may not be read).
TEST_F(CapiSharded, CombineStatsChecksTheCountBeforeReadingTheArrays) {
  const long page = ::sysconf(_SC_PAGESIZE);
  void* pages =
      ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(pages, MAP_FAILED);
  ASSERT_EQ(::mprotect(static_cast<char*>(pages) + page, page, PROT_NONE), 0);
  // Two valid entries just before the unreadable page, in both arrays.
  auto** ops = reinterpret_cast<kjit_sharded_cross_entropy**>(static_cast<char*>(pages) + page) - 2;
  ops[0] = ops[1] = Sharded(spec_);
  void* const* workspaces = reinterpret_cast<void* const*>(ops);
  for (const int32_t count : {33, 1 << 20, INT32_MAX}) {
    ExpectInvalid(
        Last(kjit_sharded_cross_entropy_combine_stats(nullptr, ops, workspaces, count, 1)),
        "kjit_sharded_cross_entropy_combine_stats: count: " + std::to_string(count) +
            " shards, expected 1 to 32");
  }
  ::munmap(pages, 2 * page);
}

TEST_F(CapiSharded, NullArgumentsAndOtherKindsAreNamed) {
  kjit_sharded_cross_entropy* op = Sharded(spec_);
  kjit_sharded_cross_entropy* created = op;
  kjit_sharded_cross_entropy_args a;
  kjit_sharded_cross_entropy_args_init(&a);
  char* text = reinterpret_cast<char*>(&a);
  int64_t bytes = 1;
  float* max = nullptr;
  const std::vector<std::pair<Result, std::string>> cases = {
      {Last(kjit_sharded_cross_entropy_create(nullptr, &spec_, &created)),
       "kjit_sharded_cross_entropy_create: runtime is NULL"},
      {Last(kjit_sharded_cross_entropy_create(rt_, nullptr, &created)),
       "kjit_sharded_cross_entropy_create: spec is NULL"},
      {Last(kjit_sharded_cross_entropy_compute_stats(nullptr, nullptr, &a)),
       "kjit_sharded_cross_entropy_compute_stats: op is NULL"},
      {Last(kjit_sharded_cross_entropy_finish(op, nullptr, nullptr)),
       "kjit_sharded_cross_entropy_finish: args is NULL"},
      {Last(kjit_sharded_cross_entropy_run(op, nullptr, nullptr, op)),
       "kjit_sharded_cross_entropy_run: args is NULL"},
      {Last(kjit_sharded_cross_entropy_rescale_stats(op, nullptr, nullptr, 1)),
       "kjit_sharded_cross_entropy_rescale_stats: workspace is NULL"},
      {Last(kjit_sharded_cross_entropy_stats_of(op, &a, 1, &max, nullptr)),
       "kjit_sharded_cross_entropy_stats_of: sums_out is NULL"},
      {Last(kjit_sharded_cross_entropy_workspace_bytes(nullptr, 1, &bytes)),
       "kjit_sharded_cross_entropy_workspace_bytes: op is NULL"},
      {Last(kjit_sharded_cross_entropy_config(op, nullptr)),
       "kjit_sharded_cross_entropy_config: config_out is NULL"},
      {Last(kjit_sharded_cross_entropy_build(nullptr, &text)),
       "kjit_sharded_cross_entropy_build: op is NULL"},
      {Last(kjit_sharded_cross_entropy_build(reinterpret_cast<kjit_sharded_cross_entropy*>(rt_),
                                             &text)),
       "kjit_sharded_cross_entropy_build: op is a kjit_runtime handle; expected a "
       "kjit_sharded_cross_entropy"},
      {Last(kjit_cross_entropy_workspace_bytes(reinterpret_cast<kjit_cross_entropy*>(op), 1,
                                               &bytes)),
       "kjit_cross_entropy_workspace_bytes: op is a kjit_sharded_cross_entropy handle; expected a "
       "kjit_cross_entropy"},
  };
  for (const auto& [result, message] : cases) {
    EXPECT_EQ(result.status, KJIT_INVALID_ARGUMENT) << message;
    EXPECT_EQ(result.message, message);
  }
  EXPECT_EQ(created, nullptr);
  EXPECT_EQ(text, nullptr);
  EXPECT_EQ(bytes, 0);
  EXPECT_EQ(max, nullptr);
  kjit_sharded_cross_entropy_destroy(nullptr);
}

}  // namespace
}  // namespace kjit
