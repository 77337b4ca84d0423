// Loading the CUDA driver and NVRTC at run time, on a machine without a GPU: a missing driver, the
// toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY, 34) and a missing NVRTC are errors with a fix,
// never a crash; a compile-only runtime builds kernels without touching a driver.
#include "jit/driver.h"
#include "jit/status_helpers.h"
#include "tests/test_support.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "jit/loaded_module.h"
#include "jit/nvrtc.h"
#include "kjit/rms_norm.h"
#include "kjit/runtime.h"
#include "runtime/runtime_state.h"

namespace kjit {
namespace {

namespace fs = std::filesystem;
using kjit::testing::ScopedEnv;

std::string Msg(const absl::Status& s) { return std::string(ToStd(s.message())); }

using testing::Contains;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kjit_driver_test_XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// --- Driver -------------------------------------------------------------------------------------

TEST(DriverTest, MissingLibraryIsFailedPreconditionWithTheFix) {
  auto d = jit::Driver::Load({"/nonexistent/libcuda.so.1"});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  const std::string msg = Msg(d.status());
  EXPECT_TRUE(Contains(msg, "no CUDA driver")) << msg;
  EXPECT_TRUE(Contains(msg, "/nonexistent/libcuda.so.1")) << "names what it tried: " << msg;
  EXPECT_TRUE(Contains(msg, "fix")) << msg;
  EXPECT_TRUE(Contains(msg, "--gpus all")) << msg;
  EXPECT_TRUE(Contains(msg, "NVIDIA Container Toolkit")) << msg;
}

TEST(DriverTest, EveryCandidateIsTriedAndNamed) {
  auto d = jit::Driver::Load({"/nonexistent/a/libcuda.so.1", "/nonexistent/b/libcuda.so"});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(d.status()), "/nonexistent/a/libcuda.so.1")) << d.status();
  EXPECT_TRUE(Contains(Msg(d.status()), "/nonexistent/b/libcuda.so")) << d.status();
}

TEST(DriverTest, StubLibraryIsRecognizedWithTheFix) {
  ASSERT_TRUE(fs::exists(testing::StubLibcuda())) << testing::StubLibcuda();
  auto d = jit::Driver::Load({testing::StubLibcuda()});
  ASSERT_FALSE(d.ok()) << "the stub driver must never pass for a real one";
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  const std::string msg = Msg(d.status());
  EXPECT_TRUE(Contains(msg, "stub")) << msg;
  EXPECT_TRUE(Contains(msg, "CUDA_ERROR_STUB_LIBRARY")) << msg;
  EXPECT_TRUE(Contains(msg, "34")) << msg;
  EXPECT_TRUE(Contains(msg, "stubs")) << "names the stub's path: " << msg;
  EXPECT_TRUE(Contains(msg, "fix")) << msg;
  EXPECT_TRUE(Contains(msg, "LD_LIBRARY_PATH")) << msg;
  EXPECT_TRUE(Contains(msg, "--gpus all")) << msg;
}

TEST(DriverTest, StubIsFoundAfterAMissingCandidate) {
  auto d = jit::Driver::Load({"/nonexistent/libcuda.so.1", testing::StubLibcuda()});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(d.status()), "CUDA_ERROR_STUB_LIBRARY")) << d.status();
}

TEST(DriverTest, LibraryWithoutTheDriverApiIsRefused) {
  // libc loads fine but has no cuInit: an error naming the missing symbols, not a crash.
  auto d = jit::Driver::Load({"libc.so.6"});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  EXPECT_TRUE(Contains(Msg(d.status()), "cuInit")) << d.status();
  EXPECT_TRUE(Contains(Msg(d.status()), "fix")) << d.status();
}

TEST(DriverTest, DefaultCandidatesHonorTheOverride) {
  {
    ScopedEnv env("KJIT_LIBCUDA_PATH", "/opt/custom/libcuda.so.1");
    EXPECT_EQ(jit::DefaultDriverCandidates(), std::vector<std::string>{"/opt/custom/libcuda.so.1"});
  }
  {
    ScopedEnv env("KJIT_LIBCUDA_PATH", nullptr);
    const auto c = jit::DefaultDriverCandidates();
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c.front(), "libcuda.so.1") << "the driver's soname comes first";
  }
}

// --- NVRTC --------------------------------------------------------------------------------------

TEST(NvrtcTest, MissingLibraryIsNotFoundWithTheFix) {
  auto n = jit::Nvrtc::Load({"/nonexistent/libnvrtc.so"});
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound) << n.status();
  const std::string msg = Msg(n.status());
  EXPECT_TRUE(Contains(msg, "NVRTC")) << msg;
  EXPECT_TRUE(Contains(msg, "/nonexistent/libnvrtc.so")) << msg;
  EXPECT_TRUE(Contains(msg, "fix")) << msg;
  EXPECT_TRUE(Contains(msg, "KJIT_NVRTC_PATH")) << msg;
}

TEST(NvrtcTest, LibraryWithoutTheNvrtcApiIsRefused) {
  auto n = jit::Nvrtc::Load({"libc.so.6"});
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kFailedPrecondition) << n.status();
  EXPECT_TRUE(Contains(Msg(n.status()), "nvrtcCompileProgram")) << n.status();
}

// Issue 18, defect 9: an explicit KJIT_NVRTC_PATH used to come first and then fall back to the
// usual places, so a path that did not load was ignored without a word.
TEST(NvrtcTest, AnOverrideIsTheOnlyCandidateAndItsFailureNamesTheVariable) {
  {
    ScopedEnv env("KJIT_NVRTC_PATH", "/opt/custom/libnvrtc.so.13");
    EXPECT_EQ(jit::DefaultNvrtcCandidates(),
              std::vector<std::string>{"/opt/custom/libnvrtc.so.13"});
    auto n = jit::Nvrtc::LoadDefault();
    ASSERT_FALSE(n.ok()) << "loaded " << n->path();
    EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound) << n.status();
    EXPECT_EQ(Msg(n.status()),
              "KJIT_NVRTC_PATH=/opt/custom/libnvrtc.so.13 cannot be used as NVRTC: could not load "
              "/opt/custom/libnvrtc.so.13: cannot open shared object file: No such file or "
              "directory\nfix: point KJIT_NVRTC_PATH at the libnvrtc.so of a CUDA toolkit (e.g. "
              "/usr/local/cuda/lib64/libnvrtc.so), or unset it to search the default places");
  }
  {
    // A library that loads but is not NVRTC: one fix, the variable's.
    ScopedEnv env("KJIT_NVRTC_PATH", "libc.so.6");
    auto n = jit::Nvrtc::LoadDefault();
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.status().code(), absl::StatusCode::kFailedPrecondition) << n.status();
    const std::string msg = Msg(n.status());
    EXPECT_TRUE(msg.starts_with("KJIT_NVRTC_PATH=libc.so.6 cannot be used as NVRTC: ")) << msg;
    EXPECT_TRUE(Contains(msg, "nvrtcCompileProgram")) << msg;
    EXPECT_EQ(msg.find("fix:"), msg.rfind("fix:")) << msg;
  }
  {
    ScopedEnv env("KJIT_NVRTC_PATH", "");  // set but empty reads as unset
    const auto c = jit::DefaultNvrtcCandidates();
    ASSERT_GT(c.size(), 1u);
    EXPECT_EQ(c.front(), "libnvrtc.so.13");
    // Kept loaded for the process's life, as Nvrtc::Get keeps it: unloading libnvrtc would strand
    // what its own C++ runtime allocated (LeakSanitizer reports it).
    static const auto* loaded = new absl::StatusOr<jit::Nvrtc>(jit::Nvrtc::LoadDefault());
    EXPECT_TRUE(loaded->ok()) << loaded->status();
  }
}

TEST(NvrtcTest, GetLoadsNvrtc13WithTheBlackwellArchs) {
  auto n = jit::Nvrtc::Get();
  ASSERT_TRUE(n.ok()) << n.status();
  const jit::Nvrtc& nvrtc = **n;
  EXPECT_EQ(nvrtc.version().major, 13) << nvrtc.version().ToString();
  EXPECT_GE(nvrtc.version().minor, 0);
  EXPECT_EQ(nvrtc.version().ToString().rfind("13.", 0), 0u) << nvrtc.version().ToString();
  EXPECT_TRUE(Contains(nvrtc.path(), "nvrtc")) << nvrtc.path();
  const std::vector<int>& archs = nvrtc.supported_archs();
  for (int arch : {80, 90, 100, 120}) {
    EXPECT_NE(std::find(archs.begin(), archs.end(), arch), archs.end()) << "sm_" << arch;
  }
  EXPECT_TRUE(std::is_sorted(archs.begin(), archs.end()));
  // The same instance every time.
  auto again = jit::Nvrtc::Get();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *n);
  // And explicit loading from the path it found works as well.
  auto loaded = jit::Nvrtc::Load({nvrtc.path()});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->supported_archs(), archs);
}

// --- Runtime ------------------------------------------------------------------------------------

TEST(RuntimeTest, CreateWithoutADriverFailsWithTheDriversError) {
  ScopedEnv env("KJIT_LIBCUDA_PATH", nullptr);
  // Driver::Get() remembers its first result for the whole process, so compare against it.
  auto driver = jit::Driver::Get();
  if (driver.ok()) {
    GTEST_SKIP() << "a real CUDA driver is present (" << (*driver)->path()
                 << "); this test checks the no-driver path";
  }
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition) << driver.status();
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto rt = Runtime::Create({.cache_dir = dir.path()});
  ASSERT_FALSE(rt.ok()) << "Runtime::Create succeeded although Driver::Get failed";
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kFailedPrecondition) << rt.status();
  EXPECT_EQ(Msg(rt.status()), Msg(driver.status()));
  const std::string msg = Msg(rt.status());
  EXPECT_TRUE(Contains(msg, "no CUDA driver") || Contains(msg, "CUDA_ERROR_STUB_LIBRARY") ||
              Contains(msg, "CUDA_ERROR_NO_DEVICE"))
      << msg;
  EXPECT_TRUE(Contains(msg, "fix")) << msg;
}

TEST(RuntimeTest, CompileOnlyNeedsATarget) {
  TempDir dir;
  auto rt = Runtime::Create({.compile_only = true, .cache_dir = dir.path()});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument) << rt.status();
  EXPECT_TRUE(Contains(Msg(rt.status()), "target")) << rt.status();

  auto bad = Runtime::Create({.target = "sm_5", .compile_only = true, .cache_dir = dir.path()});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_TRUE(Contains(Msg(bad.status()), "arch")) << bad.status();
}

TEST(RuntimeTest, CompileOnlyBuildsButDoesNotLaunch) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto rt = Runtime::Create({.target = "sm_100", .compile_only = true, .cache_dir = dir.path()});
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_TRUE(rt->compile_only());
  EXPECT_EQ(kjit::internal::StateOf(*rt).driver, nullptr);
  EXPECT_EQ(kjit::internal::StateOf(*rt).ctx, nullptr);
  EXPECT_EQ(rt->target(), "sm_100");

  constexpr int64_t kHidden = 64, kRows = 4;
  auto norm = rt->RmsNorm({.hidden = kHidden, .dtype = DType::kBF16});
  ASSERT_TRUE(norm.ok()) << norm.status();
  auto built = norm->Build();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->origin, "compiled");
  EXPECT_EQ(built->target, "sm_100");  // CUBIN: an sm_ target, not compute_
  EXPECT_GT(built->bytes, 0u);
  EXPECT_TRUE(fs::is_regular_file(built->path)) << built->path;
  EXPECT_EQ(kjit::internal::StateOf(*rt).jit->compile_count(), 1);

  // Fake, well-aligned, non-overlapping device addresses of the right shapes: argument checks pass,
  // so what stops the launch is the compile-only runtime. Nothing is dereferenced.
  auto addr = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  const RmsNormForwardArgs fwd{
      .x = TensorView::Matrix(addr(0x100000), DType::kBF16, kRows, kHidden),
      .weight = TensorView::Vector(addr(0x200000), DType::kBF16, kHidden),
      .y = TensorView::Matrix(addr(0x300000), DType::kBF16, kRows, kHidden),
      .rstd = TensorView::Vector(addr(0x400000), DType::kF32, kRows)};
  absl::Status s = norm->Forward(nullptr, fwd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(Msg(s), "compile-only")) << s;

  // Arguments are checked first: a bad one is reported as such, even compile-only.
  RmsNormForwardArgs null_x = fwd;
  null_x.x.data = nullptr;
  s = norm->Forward(nullptr, null_x);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(Msg(s), "x")) << s;
  RmsNormForwardArgs wrong_cols = fwd;
  wrong_cols.y.cols = kHidden / 2;
  s = norm->Forward(nullptr, wrong_cols);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(Msg(s), "y")) << s;

  const RmsNormBackwardArgs bwd{
      .dy = TensorView::Matrix(addr(0x500000), DType::kBF16, kRows, kHidden),
      .x = fwd.x,
      .weight = fwd.weight,
      .rstd = fwd.rstd,
      .dx = TensorView::Matrix(addr(0x600000), DType::kBF16, kRows, kHidden),
      .dw = TensorView::Vector(addr(0x700000), DType::kBF16, kHidden),
      .workspace = addr(0x800000),
      .workspace_bytes = norm->BackwardWorkspaceBytes(kRows)};
  EXPECT_GT(bwd.workspace_bytes, 0);
  s = norm->Backward(nullptr, bwd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(Msg(s), "compile-only")) << s;

  // Nothing was compiled or loaded for the refused launches.
  EXPECT_EQ(kjit::internal::StateOf(*rt).jit->compile_count(), 1);
}

// Issue 34, defect 10: with driver 12.2 and NVRTC 13 the driver refuses the sm_90 CUBIN
// (CUDA_ERROR_NO_BINARY_FOR_GPU), and the error blamed the arch on an sm_90 GPU. The driver's age
// is the cause and is named, with the fix; the arch is blamed only when it is the arch.
TEST(ModuleLoadError, ADriverOlderThanTheNvrtcIsNamedNotTheArch) {
  jit::Binary bin;
  bin.target = {.kind = jit::Target::Kind::kCubin, .arch = 90};
  bin.nvrtc_version = "13.0";
  bin.program_name = "rms_norm";
  const absl::Status driver_says = absl::InternalError("cuModuleLoadData failed: driver text");
  for (CUresult r : {CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_IMAGE,
                     CUDA_ERROR_UNSUPPORTED_PTX_VERSION}) {
    const absl::Status s = jit::ModuleLoadError(r, "CUDA_ERROR_X", 12020, bin, driver_says);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    const std::string m(s.message());
    EXPECT_TRUE(
        m.starts_with("the driver (CUDA 12.2) is older than the NVRTC 13.0 that built "
                      "this code for sm_90 (program 'rms_norm')"))
        << m;
    EXPECT_TRUE(testing::Contains(m,
                                  "fix: upgrade the NVIDIA driver to one for CUDA 13.x, or "
                                  "point KJIT_NVRTC_PATH at a CUDA 12.x NVRTC"))
        << m;
    EXPECT_FALSE(testing::Contains(m, "cannot run code built for")) << m;
  }
  // A driver of NVRTC's major version: then it is the arch.
  absl::Status s = jit::ModuleLoadError(CUDA_ERROR_NO_BINARY_FOR_GPU,
                                        "CUDA_ERROR_NO_BINARY_FOR_GPU", 13000, bin, driver_says);
  EXPECT_TRUE(std::string(s.message()).starts_with("the GPU cannot run code built for sm_90")) << s;
  // Anything else is the driver's own message.
  s = jit::ModuleLoadError(CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", 12020, bin,
                           driver_says);
  EXPECT_EQ(s, driver_says);
}

}  // namespace
}  // namespace kjit
