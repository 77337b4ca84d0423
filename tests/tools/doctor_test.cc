// `kjit doctor`: Diagnose against simulated machines (plain DoctorFacts: no driver, the stub
// driver, an NVRTC too old for the GPU, a driver older than NVRTC or below the toolkit's minimum,
// unsafe, stale and corrupt caches, a healthy H200), the probe's parts against real files, and the
// real `kjit doctor` binary on this machine with the driver pointed at a missing file or the stub,
// so the end-to-end tests mean the same on a machine with a GPU.
#include "tools/doctor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jit/cache_key.h"
#include "jit/disk_cache.h"
#include "kjit/host_convert.h"
#include "ops/common/tuning/random_values.h"
#include "ops/registry.h"
#include "ops/rms_norm/tuning/reference.h"
#include "runtime/tuning_db.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"
#include "tools/doctor_probe.h"

#ifndef KJIT_CLI_PATH
#error "KJIT_CLI_PATH must name the built kjit binary"
#endif

namespace kjit::tools {
namespace {

namespace fs = std::filesystem;

using testing::Contains;

using kjit::testing::CliResult;
using kjit::testing::StubLibcuda;

std::string Dump(const std::vector<Finding>& findings) { return FormatText(findings); }

const Finding* Find(const std::vector<Finding>& findings, const std::string& check) {
  for (const Finding& f : findings) {
    if (f.check == check) return &f;
  }
  return nullptr;
}

// Every finding: a known status, one-line message and fix, and a fix exactly when not OK.
void ExpectWellFormed(const std::vector<Finding>& findings) {
  for (const Finding& f : findings) {
    EXPECT_FALSE(f.check.empty());
    EXPECT_FALSE(f.message.empty()) << f.check;
    EXPECT_FALSE(Contains(f.message, "\n")) << f.check << ": " << f.message;
    EXPECT_FALSE(Contains(f.fix, "\n")) << f.check << ": " << f.fix;
    if (f.status == Status::kOk) {
      EXPECT_TRUE(f.fix.empty()) << f.check << " is OK but has a fix: " << f.fix;
    } else {
      EXPECT_FALSE(f.fix.empty()) << f.check << " is " << StatusName(f.status) << " without a fix";
    }
  }
}

// Asserts the finding exists with the status; returns it (or an empty one so tests go on).
Finding Expect(const std::vector<Finding>& findings, const std::string& check, Status status) {
  const Finding* f = Find(findings, check);
  EXPECT_NE(f, nullptr) << "no finding '" << check << "'\n" << Dump(findings);
  if (f == nullptr) return {};
  EXPECT_EQ(f->status, status) << check << "\n" << Dump(findings);
  return *f;
}

// --- simulated machines
// ---------------------------------------------------------------------------

const std::vector<int> kNvrtc13Archs = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
const std::vector<int> kNvrtc126Archs = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90};

GpuFacts H200(int ordinal = 0) {
  return {.ordinal = ordinal,
          .name = "NVIDIA H200",
          .cc_major = 9,
          .cc_minor = 0,
          .total_memory = uint64_t{150} << 30,
          .sm_count = 132};
}
GpuFacts B200(int ordinal = 0) {
  return {.ordinal = ordinal,
          .name = "NVIDIA B200",
          .cc_major = 10,
          .cc_minor = 0,
          .total_memory = uint64_t{180} << 30,
          .sm_count = 148};
}

// A healthy machine: one H200, driver and NVRTC 13.0, a working compile and launch, a clean cache.
DoctorFacts HealthyH200() {
  DoctorFacts f;
  f.kjit_version = "0.1.0";
  f.driver.path = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
  f.driver.candidates = {"libcuda.so.1", "libcuda.so"};
  f.driver.version = 13000;
  f.driver.release = "580.65.06";
  f.driver.gpus = {H200()};
  f.nvrtc = {.loaded = true,
             .path = "/usr/local/cuda/lib64/libnvrtc.so.13",
             .major = 13,
             .minor = 0,
             .archs = kNvrtc13Archs};
  f.compiles = {{.target = "sm_90", .ok = true, .code_bytes = 31856, .seconds = 0.2}};
  f.launches = {{.ordinal = 0,
                 .state = LaunchFacts::State::kOk,
                 .target = "sm_90",
                 .detail = "64x4096 bf16 matches RMSNorm computed in fp32"}};
  f.cublaslt = {.loaded = true,
                .path = "/usr/local/cuda/lib64/libcublasLt.so.13",
                .version = 130100,
                .cudart = 13000};
  f.cache = {.dir = "/home/u/.cache/kjit",
             .dir_source = "HOME",
             .exists = true,
             .is_dir = true,
             .mode = 0700,
             .owner_uid = 1000,
             .euid = 1000,
             .writable = true,
             .listed = true};
  f.cache.entries = {{.key = std::string(32, 'a'),
                      .bytes = 32000,
                      .valid = true,
                      .target = "sm_90",
                      .nvrtc_version = "13.0"}};
  f.tuning = {.state = TuningFacts::State::kMissing,
              .path = "/home/u/.cache/kjit/tuning.json",
              .absolute = "/home/u/.cache/kjit/tuning.json"};
  f.env.in_container = true;
  f.env.container_hint = "/.dockerenv";
  f.env.dev_nvidia = {"nvidia0", "nvidiactl", "nvidia-uvm"};
  return f;
}

// A machine with NVRTC but no usable driver: no GPUs, the default targets compiled.
DoctorFacts NoGpu(DriverFacts::Error error) {
  DoctorFacts f = HealthyH200();
  f.driver = {.error = error, .candidates = {"libcuda.so.1", "libcuda.so"}};
  f.launches.clear();
  f.compiles = {{.target = "sm_90", .ok = true, .code_bytes = 31856},
                {.target = "sm_100", .ok = true, .code_bytes = 40000}};
  f.env.dev_nvidia.clear();
  return f;
}

TEST(DoctorDiagnose, HealthyH200IsAllOk) {
  const auto findings = Diagnose(HealthyH200());
  ExpectWellFormed(findings);
  for (const char* check : {"driver", "gpu.0", "nvrtc", "target.gpu.0", "compat.min_driver",
                            "compat.ptx", "compile.sm_90", "launch.gpu.0", "cublaslt", "cache.dir",
                            "cache.permissions", "cache.stale", "cache.corrupt", "tuning", "env"}) {
    Expect(findings, check, Status::kOk);
  }
  EXPECT_EQ(ExitCodeFor(findings), 0) << Dump(findings);
  EXPECT_TRUE(Contains(Find(findings, "gpu.0")->message, "NVIDIA H200"));
  EXPECT_TRUE(Contains(Find(findings, "gpu.0")->message, "9.0"));
  EXPECT_TRUE(Contains(Find(findings, "gpu.0")->message, "132 SMs"));
  EXPECT_TRUE(Contains(Find(findings, "driver")->message, "580.65.06"));
  EXPECT_TRUE(Contains(Find(findings, "driver")->message, "CUDA 13.0"));
  EXPECT_TRUE(Contains(Find(findings, "target.gpu.0")->message, "CUBIN for sm_90"));
  EXPECT_TRUE(Contains(Find(findings, "tuning")->message, "no tuning database"));
  EXPECT_EQ(Find(findings, "cublaslt")->message,
            "cuBLASLt 13.1.0 (/usr/local/cuda/lib64/libcublasLt.so.13), built for CUDA 13.0: "
            "LinearCrossEntropy's GEMMs");
  // Nothing about --fix-cache unless it ran.
  EXPECT_EQ(Find(findings, "cache.fix"), nullptr);
}

TEST(DoctorDiagnose, NoDriverInAContainerFailsWithTheContainerToolkitFix) {
  const auto findings = Diagnose(NoGpu(DriverFacts::Error::kMissing));
  ExpectWellFormed(findings);
  const Finding d = Expect(findings, "driver", Status::kFail);
  EXPECT_TRUE(Contains(d.message, "no CUDA driver")) << d.message;
  EXPECT_TRUE(Contains(d.message, "libcuda.so.1")) << d.message;
  EXPECT_TRUE(Contains(d.message, "container")) << "says the container has no GPU: " << d.message;
  EXPECT_TRUE(Contains(d.message, "/dev/nvidia")) << d.message;
  EXPECT_TRUE(Contains(d.fix, "Install the NVIDIA driver")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "NVIDIA Container Toolkit")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "--gpus all")) << d.fix;
  // NVRTC and the compiles are still checked; what needs a driver is left out.
  Expect(findings, "nvrtc", Status::kOk);
  Expect(findings, "compile.sm_90", Status::kOk);
  Expect(findings, "compile.sm_100", Status::kOk);
  for (const char* absent :
       {"gpu.0", "target.gpu.0", "compat.ptx", "compat.min_driver", "launch.gpu.0"}) {
    EXPECT_EQ(Find(findings, absent), nullptr) << absent << "\n" << Dump(findings);
  }
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

// Issue 33: a pip user has `python -m kjit` (and the console scripts); the fixes name the commands
// the way kjit was started. The Python launcher sets KJIT_COMMAND for `python -m kjit`.
TEST(DoctorDiagnose, FixesNameTheCommandsTheWayKjitWasStarted) {
  struct Case {
    const char* command;  // KJIT_COMMAND, "" unset
    const char* driver_fix;
    const char* tuning;
  };
  for (const Case& c : {Case{"", "`kjit doctor --arch sm_90,sm_100` or `kjit compile --arch ...`",
                             "run `kjit-tune --model <name>`"},
                        Case{"python -m kjit",
                             "`python -m kjit doctor --arch sm_90,sm_100` or `python -m kjit "
                             "compile --arch ...`",
                             "run `python -m kjit tune --model <name>`"}}) {
    DoctorFacts f = NoGpu(DriverFacts::Error::kMissing);
    if (*c.command != '\0') f.env.kjit_vars["KJIT_COMMAND"] = c.command;
    const auto findings = Diagnose(f);
    EXPECT_TRUE(Contains(Find(findings, "driver")->fix, c.driver_fix))
        << Find(findings, "driver")->fix;
    EXPECT_TRUE(Contains(Find(findings, "tuning")->message, c.tuning))
        << Find(findings, "tuning")->message;
  }
}

TEST(DoctorDiagnose, NoDriverOutsideAContainerDoesNotBlameTheContainer) {
  DoctorFacts f = NoGpu(DriverFacts::Error::kMissing);
  f.env.in_container = false;
  f.env.container_hint.clear();
  f.env.kjit_vars["KJIT_LIBCUDA_PATH"] = "/nonexistent/libcuda.so.1";
  const auto findings = Diagnose(f);
  const Finding d = Expect(findings, "driver", Status::kFail);
  EXPECT_FALSE(Contains(d.message, "container")) << d.message;
  EXPECT_TRUE(Contains(d.fix, "KJIT_LIBCUDA_PATH=/nonexistent/libcuda.so.1")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "unset it")) << d.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

TEST(DoctorDiagnose, StubDriverFailsWithTheLdLibraryPathFix) {
  DoctorFacts f = NoGpu(DriverFacts::Error::kStub);
  f.driver.path = "/usr/local/cuda/lib64/stubs/libcuda.so";
  f.env.ld_library_path = "/usr/local/cuda/lib64/stubs:/usr/local/cuda/lib64";
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding d = Expect(findings, "driver", Status::kFail);
  EXPECT_TRUE(Contains(d.message, "stub")) << d.message;
  EXPECT_TRUE(Contains(d.message, "CUDA_ERROR_STUB_LIBRARY, 34")) << d.message;
  EXPECT_TRUE(Contains(d.message, f.driver.path)) << d.message;
  EXPECT_TRUE(Contains(d.fix, "LD_LIBRARY_PATH")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "/usr/local/cuda/lib64/stubs")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "it is there now")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "--gpus all")) << d.fix;
  Expect(findings, "nvrtc", Status::kOk);
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

TEST(DoctorDiagnose, NoDeviceVisibleNamesCudaVisibleDevices) {
  DoctorFacts f = NoGpu(DriverFacts::Error::kNoDevice);
  f.driver.path = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
  f.driver.version = 13000;
  f.env.cuda_visible_devices = "";
  f.env.dev_nvidia = {"nvidia0", "nvidiactl"};
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding d = Expect(findings, "driver", Status::kFail);
  EXPECT_TRUE(Contains(d.message, "CUDA_ERROR_NO_DEVICE")) << d.message;
  EXPECT_TRUE(Contains(d.message, "CUDA_VISIBLE_DEVICES ''")) << d.message;
  EXPECT_TRUE(Contains(d.fix, "unset it")) << d.fix;
  EXPECT_TRUE(Contains(d.fix, "nvidia-smi -L")) << d.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);

  // Unset, in a container without device nodes: the container was started without GPUs.
  f.env.cuda_visible_devices.reset();
  f.env.dev_nvidia.clear();
  findings = Diagnose(f);
  d = Expect(findings, "driver", Status::kFail);
  EXPECT_TRUE(Contains(d.fix, "--gpus all")) << d.fix;
  EXPECT_FALSE(Contains(d.fix, "CUDA_VISIBLE_DEVICES")) << d.fix;
}

// The H200 machine with an NVRTC that did not load, as `error` says.
DoctorFacts NoNvrtc(const std::string& error) {
  DoctorFacts f = HealthyH200();
  f.nvrtc = {.loaded = false, .error = error};
  f.compiles.clear();
  f.launches = {{.ordinal = 0, .detail = "NVRTC is not available"}};
  return f;
}

// Issue 34 ("Also"): `kjit doctor --no-launch` on a healthy machine said "Resolve the FAIL findings
// above" when there were none.
TEST(DoctorDiagnose, ASkippedLaunchSaysHowToRunOne) {
  DoctorFacts f = HealthyH200();
  f.launches = {
      {.ordinal = 0, .state = LaunchFacts::State::kSkipped, .detail = "skipped (--no-launch)"}};
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  for (const Finding& x : findings) EXPECT_NE(x.status, Status::kFail) << Dump(findings);
  const Finding l = Expect(findings, "launch.gpu.0", Status::kWarn);
  EXPECT_EQ(l.message, "no test launch on GPU 0: skipped (--no-launch)");
  EXPECT_EQ(l.fix, "Run `kjit doctor` without --no-launch to test-launch a kernel.");
  // Not attempted because something failed: the other findings say what.
  const Finding n =
      Expect(Diagnose(NoNvrtc("libnvrtc.so.13: cannot open")), "launch.gpu.0", Status::kWarn);
  EXPECT_EQ(n.fix, "Resolve the FAIL findings above, then run `kjit doctor` again.");
}

TEST(DoctorDiagnose, NvrtcMissingFailsWithTheInstallFix) {
  const DoctorFacts f =
      NoNvrtc("NVRTC (libnvrtc) is not available: libnvrtc.so.13: cannot open shared object file");
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding n = Expect(findings, "nvrtc", Status::kFail);
  EXPECT_TRUE(Contains(n.message, "libnvrtc.so.13")) << n.message;
  EXPECT_TRUE(Contains(n.fix, "cuda-nvrtc")) << n.fix;
  EXPECT_TRUE(Contains(n.fix, "KJIT_NVRTC_PATH")) << n.fix;
  Expect(findings, "driver", Status::kOk);
  Expect(findings, "launch.gpu.0", Status::kWarn);
  EXPECT_EQ(Find(findings, "target.gpu.0"), nullptr);
  EXPECT_EQ(Find(findings, "cache.stale"), nullptr) << "nothing to judge staleness against";
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

// Issue 18, defect 9: with KJIT_NVRTC_PATH set, that library is the only one tried, so its failure
// is a FAIL whose fix is about the variable, not "install NVRTC".
TEST(DoctorDiagnose, AnUnusableNvrtcPathFailsWithTheVariableInTheFix) {
  DoctorFacts f = NoNvrtc(
      "KJIT_NVRTC_PATH=/dev/zero cannot be used as NVRTC: could not load /dev/zero: invalid ELF "
      "header\nfix: point KJIT_NVRTC_PATH at ...");
  f.env.kjit_vars["KJIT_NVRTC_PATH"] = "/dev/zero";
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding n = Expect(findings, "nvrtc", Status::kFail);
  EXPECT_EQ(n.message,
            "NVRTC is not available: KJIT_NVRTC_PATH=/dev/zero cannot be used as NVRTC: could not "
            "load /dev/zero: invalid ELF header");
  EXPECT_EQ(n.fix,
            "Point KJIT_NVRTC_PATH (now '/dev/zero') at the libnvrtc.so of a CUDA toolkit (e.g. "
            "/usr/local/cuda/lib64/libnvrtc.so), or unset it to search the default places.");
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

// Only LinearCrossEntropy needs cuBLASLt: without it doctor warns, and the exit code stays 0.
TEST(DoctorDiagnose, CublasLtMissingWarnsWithTheInstallFix) {
  DoctorFacts f = HealthyH200();
  f.cublaslt = {.error =
                    "no cuBLASLt (the fused linear + cross-entropy op's GEMMs): could not load "
                    "libcublasLt.so.13: cannot open shared object file\nfix: install ..."};
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding c = Expect(findings, "cublaslt", Status::kWarn);
  EXPECT_EQ(c.message,
            "no cuBLASLt (the fused linear + cross-entropy op's GEMMs): could not load "
            "libcublasLt.so.13: cannot open shared object file; the other ops run without it");
  EXPECT_TRUE(Contains(c.fix, "nvidia-cublas")) << c.fix;
  EXPECT_TRUE(Contains(c.fix, "KJIT_CUBLASLT_PATH")) << c.fix;
  EXPECT_EQ(ExitCodeFor(findings), 0) << Dump(findings);

  // A set KJIT_CUBLASLT_PATH is the only library tried: the fix is to the variable.
  f.env.kjit_vars["KJIT_CUBLASLT_PATH"] = "/opt/x/libcublasLt.so";
  findings = Diagnose(f);
  c = Expect(findings, "cublaslt", Status::kWarn);
  EXPECT_TRUE(c.fix.starts_with("Point KJIT_CUBLASLT_PATH (now '/opt/x/libcublasLt.so') at"))
      << c.fix;
}

// A CUDA runtime needs a driver of its major version or newer; an older runtime is fine.
TEST(DoctorDiagnose, CublasLtBuiltForANewerCudaThanTheDriverWarns) {
  DoctorFacts f = HealthyH200();
  f.driver.version = 12080;
  f.driver.release = "570.86.10";
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding c = Expect(findings, "cublaslt", Status::kWarn);
  EXPECT_TRUE(Contains(c.message, "built for CUDA 13.0, newer than the driver's CUDA 12.8"))
      << c.message;
  EXPECT_TRUE(Contains(c.fix, "R580.65.06+")) << c.fix;
  EXPECT_TRUE(Contains(c.fix, "CUDA 12 toolkit")) << c.fix;

  f.cublaslt.cudart = 12080;  // cuBLASLt 12.8 on the same driver
  f.cublaslt.version = 120804;
  Expect(Diagnose(f), "cublaslt", Status::kOk);
  f = HealthyH200();
  f.driver.version = 13010;  // a newer minor of the same major
  Expect(Diagnose(f), "cublaslt", Status::kOk);
  // Without a driver there is nothing to compare: what was found is reported.
  f = NoGpu(DriverFacts::Error::kMissing);
  const Finding no_driver = Expect(Diagnose(f), "cublaslt", Status::kOk);
  EXPECT_TRUE(Contains(no_driver.message, "cuBLASLt 13.1.0")) << no_driver.message;
}

// A B200 (sm_100) with an NVRTC that stops at sm_90 (CUDA 12.6).
DoctorFacts B200WithNvrtc126(int driver_version) {
  DoctorFacts f = HealthyH200();
  f.driver.gpus = {B200()};
  f.driver.version = driver_version;
  f.nvrtc = {.loaded = true,
             .path = "/usr/local/cuda-12.6/lib64/libnvrtc.so.12",
             .major = 12,
             .minor = 6,
             .archs = kNvrtc126Archs};
  f.compiles = {{.target = "compute_90", .ok = true, .code_bytes = 90000}};
  f.launches = {
      {.ordinal = 0, .state = LaunchFacts::State::kOk, .target = "compute_90", .detail = "ok"}};
  f.cache.entries.clear();
  return f;
}

TEST(DoctorDiagnose, NvrtcLackingTheGpuArchWarnsWhenThePtxFallbackLoads) {
  const DoctorFacts f = B200WithNvrtc126(12080);  // driver CUDA 12.8 >= NVRTC 12.6
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding t = Expect(findings, "target.gpu.0", Status::kWarn);
  EXPECT_TRUE(Contains(t.message, "cannot build CUBIN")) << t.message;
  EXPECT_TRUE(Contains(t.message, "sm_100")) << t.message;
  EXPECT_TRUE(Contains(t.message, "stops at sm_90")) << t.message;
  EXPECT_TRUE(Contains(t.message, "compute_90 PTX")) << t.message;
  EXPECT_TRUE(Contains(t.fix, "CUDA 12.8")) << t.fix;
  EXPECT_TRUE(Contains(t.fix, "Blackwell")) << t.fix;
  Expect(findings, "compat.ptx", Status::kOk);
  Expect(findings, "compat.min_driver", Status::kOk);
  Expect(findings, "compile.compute_90", Status::kOk);
  EXPECT_EQ(TargetsInUse(f), std::vector<std::string>{"compute_90"});
  EXPECT_EQ(ExitCodeFor(findings), 0) << Dump(findings);
}

TEST(DoctorDiagnose, NvrtcLackingTheGpuArchFailsWhenTheDriverIsOlder) {
  DoctorFacts f = B200WithNvrtc126(12040);  // driver CUDA 12.4 < NVRTC 12.6: PTX refused
  f.compiles.clear();
  f.launches = {{.ordinal = 0, .detail = "no target kjit can build for this GPU"}};
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding t = Expect(findings, "target.gpu.0", Status::kFail);
  EXPECT_TRUE(Contains(t.message, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION")) << t.message;
  EXPECT_TRUE(Contains(t.message, "compute_90")) << t.message;
  EXPECT_TRUE(Contains(t.fix, "CUDA 12.8")) << t.fix;
  EXPECT_TRUE(Contains(t.fix, "upgrade the driver")) << t.fix;
  Expect(findings, "compat.ptx", Status::kWarn);
  Expect(findings, "launch.gpu.0", Status::kWarn);
  EXPECT_TRUE(TargetsInUse(f).empty()) << "no target for the GPU, no --arch";
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

TEST(DoctorDiagnose, DriverOlderThanNvrtcWarnsAboutPtx) {
  DoctorFacts f = HealthyH200();
  f.driver.version = 12040;  // CUDA 12.4
  f.nvrtc.major = 12;
  f.nvrtc.minor = 8;
  f.cache.entries[0].nvrtc_version = "12.8";
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding p = Expect(findings, "compat.ptx", Status::kWarn);
  EXPECT_TRUE(Contains(p.message, "NVRTC 12.8 is newer than the driver (CUDA 12.4)")) << p.message;
  EXPECT_TRUE(Contains(p.message, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION")) << p.message;
  EXPECT_TRUE(Contains(p.message, "CUBIN")) << p.message;
  EXPECT_TRUE(Contains(p.fix, "Upgrade the driver")) << p.fix;
  Expect(findings, "compat.min_driver", Status::kOk);
  Expect(findings, "target.gpu.0", Status::kOk);  // CUBIN for sm_90 loads
  EXPECT_EQ(ExitCodeFor(findings), 0) << Dump(findings);
}

TEST(DoctorDiagnose, DriverBelowTheToolkitMinimumFails) {
  DoctorFacts f = HealthyH200();
  f.driver.version = 12080;  // R570: CUDA 12.8, NVRTC is 13.0
  f.driver.release = "570.86.15";
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding m = Expect(findings, "compat.min_driver", Status::kFail);
  EXPECT_TRUE(Contains(m.message, "NVRTC 13.0 needs a driver for CUDA 13.x")) << m.message;
  EXPECT_TRUE(Contains(m.message, "580")) << m.message;
  EXPECT_TRUE(Contains(m.fix, "R580.65.06 or newer")) << m.fix;
  EXPECT_TRUE(Contains(m.fix, "KJIT_NVRTC_PATH")) << m.fix;
  Expect(findings, "compat.ptx", Status::kWarn);
  EXPECT_EQ(ExitCodeFor(findings), 1);

  // Issue 34, defect 10: the test launch's failure, whatever the driver called it, is the driver's
  // age, not a GPU to check with nvidia-smi.
  f.launches[0] = {.ordinal = 0,
                   .state = LaunchFacts::State::kError,
                   .target = "sm_90",
                   .detail =
                       "the GPU cannot run code built for sm_90 (program 'rms_norm', "
                       "CUDA_ERROR_NO_BINARY_FOR_GPU, 209)"};
  findings = Diagnose(f);
  ExpectWellFormed(findings);
  const std::string fix = Expect(findings, "launch.gpu.0", Status::kFail).fix;
  for (const char* said : {"The driver (CUDA 12.8) is older than NVRTC 13.0", "R580.65.06 or newer",
                           "KJIT_NVRTC_PATH"}) {
    EXPECT_TRUE(Contains(fix, said)) << said << "\n" << fix;
  }
  EXPECT_FALSE(Contains(fix, "nvidia-smi")) << fix;

  f.launches = HealthyH200().launches;
  f.nvrtc.major = 12;
  f.nvrtc.minor = 4;
  f.driver.version = 11080;
  f.cache.entries.clear();
  findings = Diagnose(f);
  m = Expect(findings, "compat.min_driver", Status::kFail);
  EXPECT_TRUE(Contains(m.fix, "525")) << m.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

TEST(DoctorDiagnose, CompileAndLaunchFailures) {
  DoctorFacts f = HealthyH200();
  f.arch_targets = {"sm_100"};
  f.compiles.push_back({.target = "sm_100",
                        .ok = false,
                        .error = "NVRTC failed to compile 'rms_norm' for sm_100: error\nlog"});
  f.launches[0] = {.ordinal = 0,
                   .state = LaunchFacts::State::kError,
                   .target = "compute_90",
                   .detail = "cuModuleLoadData failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)"};
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding c = Expect(findings, "compile.sm_100", Status::kFail);
  EXPECT_TRUE(Contains(c.message, "NVRTC failed")) << c.message;
  EXPECT_TRUE(Contains(c.fix, "kjit doctor --json")) << c.fix;
  Finding l = Expect(findings, "launch.gpu.0", Status::kFail);
  EXPECT_TRUE(Contains(l.fix, "upgrade the driver")) << l.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);

  f.launches[0].detail = "wrong result: y: 12 of 262144 elements differ";
  findings = Diagnose(f);
  l = Expect(findings, "launch.gpu.0", Status::kFail);
  EXPECT_TRUE(Contains(l.fix, "report")) << l.fix;

  // An --arch target this NVRTC does not know: the fix names the toolkit to install.
  f.nvrtc.archs = kNvrtc126Archs;
  f.nvrtc.major = 12;
  f.nvrtc.minor = 6;
  f.compiles[1].error = "arch: this NVRTC cannot compile for sm_100";
  findings = Diagnose(f);
  c = Expect(findings, "compile.sm_100", Status::kFail);
  EXPECT_TRUE(Contains(c.fix, "CUDA 12.8")) << c.fix;
}

TEST(DoctorDiagnose, CacheWritableByOthersOrOwnedByAnotherUserFails) {
  DoctorFacts f = HealthyH200();
  f.cache.mode = 0777;
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding p = Expect(findings, "cache.permissions", Status::kFail);
  EXPECT_TRUE(Contains(p.message, "other users")) << p.message;
  EXPECT_TRUE(Contains(p.message, "0777")) << p.message;
  EXPECT_TRUE(Contains(p.fix, "chmod 700 '/home/u/.cache/kjit'")) << p.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);

  f.cache.mode = 0770;
  findings = Diagnose(f);
  p = Expect(findings, "cache.permissions", Status::kFail);
  EXPECT_TRUE(Contains(p.message, "its group")) << p.message;

  f.cache.mode = 0700;
  f.cache.owner_uid = 0;
  findings = Diagnose(f);
  p = Expect(findings, "cache.permissions", Status::kFail);
  EXPECT_TRUE(Contains(p.message, "owned by uid 0")) << p.message;
  EXPECT_TRUE(Contains(p.fix, "chown 1000")) << p.fix;
  EXPECT_TRUE(Contains(p.fix, "KJIT_CACHE_DIR")) << p.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

// Issue 18, defect 11: "chmod 700 '/tmp'" was the fix for KJIT_CACHE_DIR=/tmp. The advice is
// jit::DiskCache::UnsafeDirectoryFix, the one kjit's own error gives.
TEST(DoctorDiagnose, ASharedCacheDirectoryGetsAPrivateOneNotAChmod) {
  DoctorFacts f = HealthyH200();
  f.cache.dir = "/tmp";
  f.cache.dir_source = "KJIT_CACHE_DIR";
  f.cache.mode = 01777;
  f.cache.owner_uid = f.cache.euid = 0;
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding p = Expect(findings, "cache.permissions", Status::kFail);
  EXPECT_EQ(p.fix,
            "set KJIT_CACHE_DIR to a private directory of your own (e.g. `export "
            "KJIT_CACHE_DIR=$HOME/.cache/kjit`); '/tmp' is a sticky directory like /tmp, shared by "
            "every user: do not chmod or chown it.");
  EXPECT_EQ(p.fix, jit::DiskCache::UnsafeDirectoryFix("/tmp", 01777, 0, 0) + ".");

  f.cache.owner_uid = 0;  // the same /tmp for a user who is not root
  f.cache.euid = 1000;
  findings = Diagnose(f);
  p = Expect(findings, "cache.permissions", Status::kFail);
  EXPECT_TRUE(Contains(p.message, "owned by uid 0")) << p.message;
  EXPECT_FALSE(Contains(p.fix, "chown 1000")) << p.fix;
  EXPECT_FALSE(Contains(p.fix, "chmod 700")) << p.fix;
  EXPECT_TRUE(Contains(p.fix, "export KJIT_CACHE_DIR=$HOME/.cache/kjit")) << p.fix;
}

TEST(DoctorDiagnose, ReadOnlyCacheWarns) {
  DoctorFacts f = HealthyH200();
  f.cache.writable = false;
  f.cache.not_writable_reason = "Read-only file system";
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding p = Expect(findings, "cache.permissions", Status::kWarn);
  EXPECT_TRUE(Contains(p.message, "read-only")) << p.message;
  EXPECT_TRUE(Contains(p.message, "memory only")) << p.message;
  EXPECT_TRUE(Contains(p.fix, "KJIT_CACHE_DIR")) << p.fix;
  EXPECT_EQ(ExitCodeFor(findings), 0);
}

TEST(DoctorDiagnose, CacheDirectoryProblems) {
  DoctorFacts f = HealthyH200();
  f.cache = {.config_error = "KJIT_CACHE_MAX_BYTES='10G' is not a byte count"};
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  Finding d = Expect(findings, "cache.dir", Status::kFail);
  EXPECT_TRUE(Contains(d.message, "KJIT_CACHE_MAX_BYTES")) << d.message;

  f.cache = {
      .dir = "/ro/kjit", .dir_source = "KJIT_CACHE_DIR", .create_error = "/ro: Permission denied"};
  findings = Diagnose(f);
  d = Expect(findings, "cache.dir", Status::kFail);
  EXPECT_TRUE(Contains(d.fix, "KJIT_CACHE_DIR")) << d.fix;

  f.cache = {.dir = "/home/u/.cache/kjit", .dir_source = "HOME"};
  findings = Diagnose(f);
  d = Expect(findings, "cache.dir", Status::kOk);
  EXPECT_TRUE(Contains(d.message, "does not exist yet")) << d.message;
  EXPECT_EQ(ExitCodeFor(findings), 0);

  // Issue 18, defect 5: a dangling symlink is not "does not exist yet; kjit creates it".
  f.cache = {.dir = "/home/u/L",
             .dir_source = "KJIT_CACHE_DIR",
             .create_error = "/home/u/L is a symlink to '/gone', which does not exist",
             .dangling_symlink = "/home/u/L is a symlink to '/gone', which does not exist"};
  findings = Diagnose(f);
  d = Expect(findings, "cache.dir", Status::kFail);
  EXPECT_EQ(d.message,
            "/home/u/L (from KJIT_CACHE_DIR) cannot be used: /home/u/L is a symlink to '/gone', "
            "which does not exist");
  EXPECT_TRUE(Contains(d.fix, "remove the symlink")) << d.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);
}

TEST(DoctorDiagnose, JudgeCacheEntry) {
  DoctorFacts f = HealthyH200();
  auto entry = [](std::string target, std::string nvrtc) {
    return CacheEntryFacts{.key = std::string(32, 'b'),
                           .valid = true,
                           .target = std::move(target),
                           .nvrtc_version = std::move(nvrtc)};
  };
  EXPECT_EQ(JudgeCacheEntry(entry("sm_90", "13.0"), f), EntryVerdict::kUsable);
  EXPECT_EQ(JudgeCacheEntry(entry("sm_90a", "13.0"), f), EntryVerdict::kUsable);
  EXPECT_EQ(JudgeCacheEntry(entry("sm_100", "13.0"), f), EntryVerdict::kStaleTarget);
  EXPECT_EQ(JudgeCacheEntry(entry("sm_90", "12.8"), f), EntryVerdict::kStaleNvrtc);
  EXPECT_EQ(JudgeCacheEntry({.key = std::string(32, 'c'), .valid = false}, f),
            EntryVerdict::kCorrupt);
  f.arch_targets = {"sm_100"};  // --arch keeps its targets' entries
  EXPECT_EQ(JudgeCacheEntry(entry("sm_100", "13.0"), f), EntryVerdict::kUsable);
  // Without a GPU or --arch, the default prebuild targets are the ones in use.
  DoctorFacts none = NoGpu(DriverFacts::Error::kMissing);
  EXPECT_EQ(TargetsInUse(none), (std::vector<std::string>{"sm_90", "sm_100"}));
  EXPECT_EQ(JudgeCacheEntry(entry("sm_100", "13.0"), none), EntryVerdict::kUsable);
  EXPECT_EQ(JudgeCacheEntry(entry("sm_80", "13.0"), none), EntryVerdict::kStaleTarget);
}

TEST(DoctorDiagnose, CublasLtVersionString) {
  EXPECT_EQ((CublasLtFacts{.version = 130100}).VersionString(), "13.1.0");
  EXPECT_EQ((CublasLtFacts{.version = 120804}).VersionString(), "12.8.4");
}

TEST(DoctorDiagnose, VersionTables) {
  EXPECT_EQ(CudaVersionText(13000), "13.0");
  EXPECT_EQ(CudaVersionText(12080), "12.8");
  EXPECT_EQ(CudaVersionText(0), "unknown");
  EXPECT_EQ(MinimumDriverForCudaMajor(13), "580.65.06");
  EXPECT_EQ(MinimumDriverForCudaMajor(12), "525.60.13");
  EXPECT_EQ(MinimumDriverForCudaMajor(99), "");
  EXPECT_EQ(FirstCudaForArch(100), "12.8");
  EXPECT_EQ(FirstCudaForArch(120), "12.8");
  EXPECT_EQ(FirstCudaForArch(90), "11.8");
}

TEST(DoctorFormat, TextAndJson) {
  DoctorFacts f = HealthyH200();
  f.cache.mode = 0777;       // FAIL
  f.driver.version = 12090;  // compat.min_driver FAIL, compat.ptx WARN
  const auto findings = Diagnose(f);
  int ok = 0, warn = 0, fail = 0;
  for (const Finding& x : findings) {
    (x.status == Status::kOk ? ok : x.status == Status::kWarn ? warn : fail)++;
  }
  ASSERT_GT(warn, 0);
  ASSERT_GT(fail, 0);

  const std::string text = FormatText(findings);
  std::istringstream in(text);
  std::string line;
  int tagged = 0;
  std::string previous;
  while (std::getline(in, line)) {
    if (line.starts_with("[ OK ] ") || line.starts_with("[WARN] ") || line.starts_with("[FAIL] ")) {
      ++tagged;
      EXPECT_NE(line.find(": "), std::string::npos) << line;
    } else if (line.starts_with("       fix: ")) {
      EXPECT_FALSE(previous.starts_with("[ OK ]")) << "an OK finding has no fix line";
    } else {
      EXPECT_EQ(line, fmt::format("{} ok, {} warn, {} fail", ok, warn, fail));
    }
    previous = line;
  }
  EXPECT_EQ(tagged, static_cast<int>(findings.size()));
  EXPECT_TRUE(Contains(text, "[FAIL] cache.permissions: ")) << text;
  EXPECT_TRUE(Contains(text, "[WARN] compat.ptx: ")) << text;

  nlohmann::json j = nlohmann::json::parse(FormatJson(findings, "0.1.0"));
  EXPECT_EQ(j["schema"], 1);
  EXPECT_EQ(j["kjit"], "0.1.0");
  ASSERT_EQ(j["findings"].size(), findings.size());
  for (size_t i = 0; i < findings.size(); ++i) {
    const nlohmann::json& e = j["findings"][i];
    EXPECT_EQ(e["check"], findings[i].check);
    EXPECT_EQ(e["status"], StatusName(findings[i].status));
    EXPECT_EQ(e["message"], findings[i].message);
    EXPECT_EQ(e["fix"], findings[i].fix);
  }
  EXPECT_EQ(j["summary"]["ok"], ok);
  EXPECT_EQ(j["summary"]["warn"], warn);
  EXPECT_EQ(j["summary"]["fail"], fail);
  EXPECT_EQ(j["exit_code"], 1);
}

// --- the probe's parts, on real files
// --------------------------------------------------------------

// A TempDir per test, named for this suite.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("kjit_doctor_test") {}
};

TEST(DoctorProbe, MissingAndStubDriversAreClassified) {
  DriverFacts missing = ProbeDriver({"/nonexistent/libcuda.so.1"});
  EXPECT_EQ(missing.error, DriverFacts::Error::kMissing) << missing.message;
  EXPECT_EQ(missing.candidates, std::vector<std::string>{"/nonexistent/libcuda.so.1"});
  EXPECT_TRUE(missing.gpus.empty());

  ASSERT_TRUE(fs::exists(StubLibcuda())) << StubLibcuda();
  DriverFacts stub = ProbeDriver({"/nonexistent/libcuda.so.1", StubLibcuda()});
  EXPECT_EQ(stub.error, DriverFacts::Error::kStub) << stub.message;
  EXPECT_TRUE(Contains(stub.path, "stubs")) << stub.path;

  DriverFacts not_cuda = ProbeDriver({"libc.so.6"});
  EXPECT_EQ(not_cuda.error, DriverFacts::Error::kOther);
  EXPECT_TRUE(Contains(not_cuda.message, "cuInit")) << not_cuda.message;
}

TEST(DoctorProbe, Nvrtc) {
  NvrtcFacts n = ProbeNvrtc({"/nonexistent/libnvrtc.so"});
  EXPECT_FALSE(n.loaded);
  EXPECT_TRUE(Contains(n.error, "/nonexistent/libnvrtc.so")) << n.error;
  EXPECT_FALSE(Contains(n.error, "\n"));
}

TEST(DoctorProbe, CublasLt) {
  const CublasLtFacts missing = ProbeCublasLt({"/nonexistent/libcublasLt.so"});
  EXPECT_FALSE(missing.loaded);
  EXPECT_TRUE(Contains(missing.error, "/nonexistent/libcublasLt.so")) << missing.error;
  EXPECT_TRUE(Contains(missing.error, "could not load")) << missing.error;
  EXPECT_FALSE(Contains(missing.error, "\n"));

  // The toolkit's, which this machine and CI have: the version as the library reports it.
  const CublasLtFacts found = ProbeCublasLt({"/usr/local/cuda/lib64/libcublasLt.so"});
  if (!found.loaded) GTEST_SKIP() << "no CUDA toolkit cuBLASLt here: " << found.error;
  EXPECT_TRUE(Contains(found.path, "libcublasLt")) << found.path;
  EXPECT_GE(found.version, 120000u);
  EXPECT_GE(found.cudart, 12000);
  EXPECT_EQ(found.VersionString(), fmt::format("{}.{}.{}", found.version / 10000,
                                               found.version / 100 % 100, found.version % 100));
}

// The test launch's check: what a correct kernel stores (the fp64 reference, rounded as the kernel
// rounds) passes; a kernel's mistakes are reported as a wrong result, naming the output.
TEST(DoctorProbe, TestLaunchCheckPassesCorrectValuesAndReportsWrongOnes) {
  constexpr int64_t kRows = 8, kHidden = 4096;
  std::mt19937_64 rng(7);
  TestLaunchValues run{.rows = kRows,
                       .hidden = kHidden,
                       .x = ops::RandomValues(rng, kRows * kHidden, 1.0, 0.0, DType::kBF16),
                       .w = ops::RandomValues(rng, kHidden, 0.1, 1.0, DType::kBF16)};
  const ops::RmsNormMath math{.hidden = kHidden, .dtype = DType::kBF16, .eps = run.eps};
  const ops::RmsNormForwardResult ref =
      ops::RmsNormForwardReference(math, kRows, run.x, nullptr, run.w);
  for (double y : ref.y) run.y.push_back(RoundTo(y, DType::kBF16));
  for (double rstd : ref.rstd) run.rstd.push_back(RoundTo(rstd, DType::kF32));
  const absl::StatusOr<double> worst = CheckRmsNormInFp32(run);
  ASSERT_TRUE(worst.ok()) << worst.status();
  EXPECT_GT(*worst, 0);
  EXPECT_LE(*worst, 1);

  auto error = [](const TestLaunchValues& values) {
    const absl::Status s = CheckRmsNormInFp32(values).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    return std::string(s.message());
  };
  TestLaunchValues wrong = run;
  wrong.y[17] += 0.25;  // more than 2^-6 of any |y| here (below 5)
  EXPECT_TRUE(Contains(error(wrong), "wrong result: y: 1 of 32768 elements differ (first y[17] = "))
      << error(wrong);

  wrong = run;
  wrong.rstd[3] = std::nan("");  // not written
  EXPECT_TRUE(
      Contains(error(wrong), "wrong result: rstd: 1 of 8 elements differ (first rstd[3] = nan"))
      << error(wrong);

  // The weight left out: w is 1 +- 0.1, so most elements are off by more than 2^-6.
  wrong = run;
  for (int64_t i = 0; i < kRows * kHidden; ++i)
    wrong.y[i] = RoundTo(ref.y[i] / run.w[i % kHidden], DType::kBF16);
  EXPECT_TRUE(error(wrong).starts_with("wrong result: y: ")) << error(wrong);
}

TEST(DoctorProbe, CacheThatDoesNotExistIsNotCreated) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/a/b/kjit";
  CacheFacts c = ProbeCache(dir);
  EXPECT_EQ(c.dir, dir);
  EXPECT_FALSE(c.exists);
  EXPECT_EQ(c.create_error, "");
  EXPECT_FALSE(fs::exists(tmp.path() + "/a")) << "the probe must not create the cache";

  // Under a regular file nothing can be created.
  std::ofstream(tmp.path() + "/file") << "x";
  c = ProbeCache(tmp.path() + "/file/kjit");
  EXPECT_FALSE(c.exists);
  EXPECT_TRUE(Contains(c.create_error, "not a directory")) << c.create_error;
}

// Issue 18, defect 5: the probe and DiskCache::Open describe a dangling link alike.
TEST(DoctorProbe, ADanglingSymlinkAsTheCacheIsFoundAndAgreesWithKjit) {
  TempDir tmp;
  const std::string link = tmp.path() + "/L", target = tmp.path() + "/gone";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  const std::string said =
      fmt::format("{} is a symlink to '{}', which does not exist", link, target);
  for (const std::string& dir : {link, link + "/kjit"}) {
    SCOPED_TRACE(dir);
    const CacheFacts c = ProbeCache(dir);
    EXPECT_FALSE(c.exists);
    EXPECT_EQ(c.dangling_symlink, said);
    auto opened = jit::DiskCache::Open({.dir = dir});
    ASSERT_FALSE(opened.ok());
    EXPECT_TRUE(Contains(std::string(opened.status().message()), said)) << opened.status();
  }
  EXPECT_FALSE(fs::exists(target));
}

// Issue 18, defect 14: --fix-cache called unlink on a directory named like an entry, failed, and
// advised `rm` (which cannot remove a directory either).
TEST(DoctorProbe, FixCacheRemovesADirectoryNamedLikeAnEntry) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/cache";
  ASSERT_TRUE(jit::DiskCache::Open({.dir = dir}).ok());
  const std::string squatter = dir + "/" + std::string(32, 'd') + ".kjit";
  ASSERT_EQ(::mkdir(squatter.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((squatter + "/sub").c_str(), 0700), 0);
  std::ofstream(squatter + "/sub/file") << "x";

  DoctorFacts f = HealthyH200();
  f.cache = ProbeCache(dir);
  ASSERT_EQ(f.cache.entries.size(), 1u);
  EXPECT_FALSE(f.cache.entries[0].valid);
  EXPECT_TRUE(Contains(f.cache.entries[0].problem, "a directory")) << f.cache.entries[0].problem;
  FixCache(f);
  EXPECT_EQ(f.cache.fix.refused, "");
  EXPECT_TRUE(f.cache.fix.errors.empty()) << f.cache.fix.errors[0];
  EXPECT_EQ(f.cache.fix.removed_corrupt, 1);
  EXPECT_FALSE(fs::exists(squatter));
  const auto findings = Diagnose(f);
  const Finding fixed = Expect(findings, "cache.fix", Status::kOk);
  EXPECT_TRUE(Contains(fixed.message, "removed 1 entries (0 stale, 1 corrupt)")) << fixed.message;
  Expect(findings, "cache.corrupt", Status::kOk);

  // What cannot be removed is advised with a command that removes directories too.
  f.cache.fix = {.ran = true, .removed_corrupt = 0, .errors = {"dd..: Permission denied"}};
  const Finding failed = Expect(Diagnose(f), "cache.fix", Status::kFail);
  EXPECT_TRUE(Contains(failed.fix, "rm -r '" + dir + "'/<key>.kjit")) << failed.fix;
}

TEST(DoctorProbe, OthersWritableCacheDirectoryFailsAndIsNotFixed) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/cache";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  std::ofstream(dir + "/" + std::string(32, 'e') + ".kjit") << "not an entry";

  DoctorFacts f = HealthyH200();
  f.cache = ProbeCache(dir);
  EXPECT_EQ(f.cache.mode, 0777u);
  EXPECT_TRUE(f.cache.listed);
  ASSERT_EQ(f.cache.entries.size(), 1u);
  EXPECT_FALSE(f.cache.entries[0].valid);
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding p = Expect(findings, "cache.permissions", Status::kFail);
  EXPECT_TRUE(Contains(p.fix, "chmod 700 '" + dir + "'")) << p.fix;
  EXPECT_EQ(ExitCodeFor(findings), 1);

  FixCache(f);
  EXPECT_TRUE(f.cache.fix.ran);
  EXPECT_FALSE(f.cache.fix.refused.empty());
  EXPECT_TRUE(fs::exists(dir + "/" + std::string(32, 'e') + ".kjit"))
      << "an unsafe directory is not touched";
  findings = Diagnose(f);
  Expect(findings, "cache.fix", Status::kFail);
}

jit::Binary FakeBinary(const std::string& target, const std::string& nvrtc) {
  jit::Binary b;
  b.target = jit::ParseTarget(target).value();
  b.code =
      "\x7f"
      "ELF fake code for " +
      target;
  b.nvrtc_version = nvrtc;
  b.program_name = "rms_norm";
  b.params = {{"op", "rms_norm"}, {"hidden", "4096"}};
  return b;
}

TEST(DoctorProbe, StaleAndCorruptEntriesAreFoundAndFixed) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path() + "/cache";
  auto cache = jit::DiskCache::Open({.dir = dir});
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string old_toolkit = jit::HashHex("sm_75 / 11.8");
  const std::string other_gpu = jit::HashHex("sm_75 / 13.0");
  const std::string usable = jit::HashHex("sm_90 / 13.0");
  const std::string corrupt = jit::HashHex("corrupt");
  ASSERT_TRUE(cache->Store(old_toolkit, FakeBinary("sm_75", "11.8")).ok());
  ASSERT_TRUE(cache->Store(other_gpu, FakeBinary("sm_75", "13.0")).ok());
  ASSERT_TRUE(cache->Store(usable, FakeBinary("sm_90", "13.0")).ok());
  ASSERT_TRUE(cache->Store(corrupt, FakeBinary("sm_90", "13.0")).ok());
  {
    // Flip a byte of the payload: the checksum no longer matches.
    const std::string path = dir + "/" + corrupt + ".kjit";
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-3, std::ios::end);
    char c = 0;
    io.get(c);
    io.seekp(-3, std::ios::end);
    io.put(static_cast<char>(c ^ 0x20));
    ASSERT_TRUE(io.good());
  }

  DoctorFacts f = HealthyH200();  // one sm_90 GPU, NVRTC 13.0
  f.cache = ProbeCache(dir);
  ASSERT_TRUE(f.cache.exists);
  ASSERT_TRUE(f.cache.writable) << f.cache.not_writable_reason;
  ASSERT_EQ(f.cache.entries.size(), 4u);
  auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding stale = Expect(findings, "cache.stale", Status::kWarn);
  EXPECT_TRUE(Contains(stale.message, "2 of 4")) << stale.message;
  EXPECT_TRUE(Contains(stale.message, "1 for sm_75")) << stale.message;
  EXPECT_TRUE(Contains(stale.message, "1 from NVRTC 11.8")) << stale.message;
  EXPECT_TRUE(Contains(stale.fix, "kjit doctor --fix-cache")) << stale.fix;
  EXPECT_TRUE(Contains(stale.fix, "--arch sm_90,sm_75")) << stale.fix;
  const Finding bad = Expect(findings, "cache.corrupt", Status::kWarn);
  EXPECT_TRUE(Contains(bad.message, corrupt)) << bad.message;
  EXPECT_TRUE(Contains(bad.message, "checksum")) << bad.message;
  EXPECT_TRUE(Contains(bad.fix, "kjit doctor --fix-cache")) << bad.fix;
  EXPECT_EQ(ExitCodeFor(findings), 0) << "stale and corrupt entries are warnings";

  FixCache(f);
  EXPECT_TRUE(f.cache.fix.ran);
  EXPECT_EQ(f.cache.fix.refused, "");
  EXPECT_EQ(f.cache.fix.removed_stale, 2);
  EXPECT_EQ(f.cache.fix.removed_corrupt, 1);
  EXPECT_TRUE(f.cache.fix.errors.empty());
  EXPECT_TRUE(fs::exists(dir + "/" + usable + ".kjit"));
  for (const std::string& gone : {old_toolkit, other_gpu, corrupt}) {
    EXPECT_FALSE(fs::exists(dir + "/" + gone + ".kjit")) << gone;
  }
  ASSERT_EQ(f.cache.entries.size(), 1u) << "the cache is read again after the fix";
  findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding fixed = Expect(findings, "cache.fix", Status::kOk);
  EXPECT_TRUE(Contains(fixed.message, "removed 3 entries (2 stale, 1 corrupt)")) << fixed.message;
  Expect(findings, "cache.stale", Status::kOk);
  Expect(findings, "cache.corrupt", Status::kOk);
  EXPECT_EQ(ExitCodeFor(findings), 0);
}

// --- the tuning database -------------------------------------------------------------------------

// `count` valid records tuned under device, arch, driver and NVRTC, one per rows bucket.
std::vector<internal::TuningRecord> TunedRecords(const std::string& device, int arch, int count,
                                                 int driver = 13000, int nvrtc = 13000) {
  std::vector<internal::TuningRecord> out;
  for (int i = 0; i < count; ++i) {
    internal::TuningRecord r;
    r.key = {.device = device,
             .arch = arch,
             .driver = driver,
             .nvrtc = nvrtc,
             .op = "rms_norm",
             .dtype = "bf16",
             .shape = "hidden=4096",
             .rows_bucket = int64_t{1} << i};
    r.config = "vec=8 fwd=256x1 bwd=512x1r2";  // the heuristic's at hidden 4096: the runtime's too
    r.median_us = r.p10_us = r.p90_us = 10;
    r.candidates = 4;
    r.tuned_at = "2026-12-02T21:04:05Z";
    out.push_back(std::move(r));
  }
  return out;
}

void WriteTuningDb(const std::string& path, const std::vector<internal::TuningRecord>& records) {
  auto written = internal::TuningDb::Upsert(path, records);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->written, static_cast<int>(records.size()));
}

// The healthy H200 with the tuning database the probe finds where KJIT_TUNING_DB points, as a
// user would set it.
DoctorFacts H200WithTuningDbAt(const std::string& path) {
  testing::ScopedEnv env("KJIT_TUNING_DB", path.c_str());
  DoctorFacts f = HealthyH200();
  f.env.kjit_vars["KJIT_TUNING_DB"] = path;
  f.tuning = ProbeTuning();
  return f;
}

// The `tuning` finding, with the given status; every finding well-formed.
Finding TuningFinding(const DoctorFacts& f, Status status) {
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  return Expect(findings, "tuning", status);
}

int Occurrences(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(DoctorTuning, RecordsForTheGpuPresentApplyAndTheOthersAreNamed) {
  TempDir tmp;
  const std::string path = tmp.path() + "/tuning.json";
  auto records = TunedRecords("NVIDIA H200", 90, 3);
  for (auto more : {TunedRecords("NVIDIA B200", 100, 2),
                    TunedRecords("NVIDIA H200", 90, 1, /*driver=*/12080, /*nvrtc=*/12080)}) {
    records.insert(records.end(), more.begin(), more.end());
  }
  WriteTuningDb(path, records);

  DoctorFacts f = H200WithTuningDbAt(path);
  f.driver.gpus = {H200(0), H200(1)};  // one model, counted once
  EXPECT_EQ(f.tuning.state, TuningFacts::State::kLoaded) << f.tuning.error;
  EXPECT_EQ(f.tuning.path, path);
  ASSERT_EQ(f.tuning.records.size(), 6u);
  const Finding t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(t.message.starts_with("the tuning database " + path +
                                    " (from KJIT_TUNING_DB) holds "
                                    "6 records; "))
      << t.message;
  EXPECT_TRUE(Contains(t.message, "3 apply to NVIDIA H200 sm_90 (driver CUDA 13.0, NVRTC 13.0)"))
      << t.message;
  EXPECT_EQ(Occurrences(t.message, "apply to"), 1) << t.message;
  EXPECT_TRUE(Contains(t.message, "the runtime ignores the other 3")) << t.message;
  EXPECT_TRUE(Contains(t.message, "2 for NVIDIA B200 sm_100 (driver CUDA 13.0, NVRTC 13.0)"))
      << t.message;
  EXPECT_TRUE(Contains(t.message, "1 for NVIDIA H200 sm_90 (driver CUDA 12.8, NVRTC 12.8)"))
      << t.message;
}

TEST(DoctorTuning, RecordsOnlyForAnotherGpuDoNotApply) {
  TempDir tmp;
  const std::string path = tmp.path() + "/tuning.json";
  WriteTuningDb(path, TunedRecords("NVIDIA B200", 100, 2));
  const Finding t = TuningFinding(H200WithTuningDbAt(path), Status::kOk);
  EXPECT_TRUE(Contains(t.message, "holds 2 records; none apply to NVIDIA H200 sm_90")) << t.message;
  EXPECT_TRUE(Contains(t.message, "heuristic launch configs")) << t.message;
  EXPECT_TRUE(Contains(t.message, "kjit-tune --model")) << t.message;
  EXPECT_TRUE(Contains(t.message,
                       "ignores the other 2, tuned for other GPUs, drivers or NVRTC "
                       "versions: 2 for NVIDIA B200 sm_100"))
      << t.message;
}

TEST(DoctorTuning, RecordsOfThePtxFallbackTargetApply) {
  // NVRTC 12.6 cannot build sm_100: the runtime runs compute_90 and keys its records by arch 90.
  DoctorFacts f = B200WithNvrtc126(12080);
  f.tuning.state = TuningFacts::State::kLoaded;
  f.tuning.records = {{.device = "NVIDIA B200", .arch = 90, .driver = 12080, .nvrtc = 12060},
                      {.device = "NVIDIA B200", .arch = 100, .driver = 12080, .nvrtc = 12060}};
  const Finding t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(Contains(t.message, "1 apply to NVIDIA B200 sm_90 (driver CUDA 12.8, NVRTC 12.6)"))
      << t.message;
  EXPECT_TRUE(Contains(t.message, "1 for NVIDIA B200 sm_100")) << t.message;
}

TEST(DoctorTuning, WithoutAGpuRecordsAreListedByDevice) {
  DoctorFacts f = NoGpu(DriverFacts::Error::kMissing);
  f.tuning.state = TuningFacts::State::kLoaded;
  f.tuning.records = {{.device = "NVIDIA H200", .arch = 90, .driver = 13000, .nvrtc = 13000},
                      {.device = "NVIDIA H200", .arch = 90, .driver = 13000, .nvrtc = 13000},
                      {.device = "NVIDIA B200", .arch = 100, .driver = 13000, .nvrtc = 13000}};
  const Finding t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(Contains(t.message,
                       "holds 3 records; no GPU here to match them against: 1 for "
                       "NVIDIA B200 sm_100 (driver CUDA 13.0, NVRTC 13.0), 2 for "
                       "NVIDIA H200 sm_90"))
      << t.message;
}

TEST(DoctorTuning, NoFileYetIsOkAndNothingIsCreated) {
  TempDir tmp;
  const std::string path = tmp.path() + "/not/yet/tuning.json";
  const DoctorFacts f = H200WithTuningDbAt(path);
  EXPECT_EQ(f.tuning.state, TuningFacts::State::kMissing) << f.tuning.error;
  const Finding t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(t.message.starts_with("no tuning database yet at " + path +
                                    " (from KJIT_TUNING_DB): ops use their heuristic launch "
                                    "configs"))
      << t.message;
  EXPECT_TRUE(Contains(t.message, "run `kjit-tune --model <name>`")) << t.message;
  EXPECT_FALSE(fs::exists(tmp.path() + "/not")) << "the probe must not create anything";
}

// A record for the H200 of HealthyH200 (driver and NVRTC 13.0) of any op, shape and config.
internal::TuningRecord H200Record(const std::string& op, const std::string& shape,
                                  const std::string& config, int64_t rows_bucket) {
  internal::TuningRecord r = TunedRecords("NVIDIA H200", 90, 1).front();
  r.key.op = op;
  r.key.shape = shape;
  r.key.rows_bucket = rows_bucket;
  r.config = config;
  return r;
}

// Issue 34, defect 9: doctor counted every record for the GPU present as applying ("10 records; 10
// apply") while the runtime refused four configs at launch and one record named no op. Now each
// is read as a launch reads it: those refused are named, and not counted.
TEST(DoctorTuning, RecordsTheRuntimeWouldRefuseAreNamedNotCounted) {
  TempDir tmp;
  const std::string path = tmp.path() + "/tuning.json";
  std::vector<internal::TuningRecord> records = TunedRecords("NVIDIA H200", 90, 2);
  // Records of every op kjit-tune writes, with the configs the heuristics choose: all usable.
  auto twin = Runtime::Create({.target = "sm_90", .compile_only = true, .tuning_db = "off"});
  ASSERT_TRUE(twin.ok()) << twin.status();
  for (const ops::OpSpec& spec :
       {ops::OpSpec(
            RmsNormSpec{.hidden = 3584, .casting = RmsNormCasting::kGemma, .fused_residual = true}),
        ops::OpSpec(CrossEntropySpec{.vocab = 256000, .loss = {.softcap = 30}}),
        ops::OpSpec(LinearCrossEntropySpec{.vocab = 128256,
        .hidden = 4096,
        .weight_grad_dtype = DType::kF32,
        .loss = {.argmax = true}})}) {
    auto config = ops::HeuristicConfig(*twin, spec);
    ASSERT_TRUE(config.ok()) << config.status();
    for (const ops::TunedPass& pass : ops::TunedPasses(spec)) {
      records.push_back(H200Record(pass.record_op, ops::TuningShape(spec), *config, 1024));
    }
  }
  const size_t usable = records.size();
  records.push_back(H200Record("rms_norm", "hidden=4096", "vec=8 fwd=4096x1 bwd=512x1r2", 64));
  records.push_back(H200Record("rms_norm", "hidden=4096", "threads=frobnicate", 128));
  records.push_back(H200Record("cross_entropy", "vocab=128256",
                               "vec=8 threads=256 unroll=4 cluster=64 staged=1", 16));
  records.push_back(H200Record("rms_norm", "hidden=4096 sideways", "vec=8 fwd=256x1", 256));
  records.push_back(H200Record("softmax", "vocab=32000", "vec=8 fwd=256x1", 16));
  WriteTuningDb(path, records);

  const DoctorFacts f = H200WithTuningDbAt(path);
  ASSERT_EQ(f.tuning.records.size(), records.size());
  const auto findings = Diagnose(f);
  ExpectWellFormed(findings);
  const Finding t = Expect(findings, "tuning", Status::kOk);
  EXPECT_TRUE(Contains(t.message, fmt::format("holds {} records; {} apply to NVIDIA H200 sm_90 "
                                              "(driver CUDA 13.0, NVRTC 13.0) (5 more match it, "
                                              "but the runtime refuses them)",
                                              records.size(), usable)))
      << t.message;
  const Finding refused = Expect(findings, "tuning.records", Status::kWarn);
  EXPECT_TRUE(refused.message.starts_with(
      fmt::format("5 of the {} records in the tuning database would be refused at launch (the "
                  "runtime warns and runs the heuristic's config instead): ",
                  records.size())))
      << refused.message;
  for (const char* named :
       {"rms_norm hidden=4096 bf16 rows<=64: \"vec=8 fwd=4096x1 bwd=512x1r2\" (",
        "rms_norm hidden=4096 bf16 rows<=128: \"threads=frobnicate\" (",
        "cross_entropy vocab=128256 bf16 rows<=16: ", "and 1 more"}) {
    EXPECT_TRUE(Contains(refused.message, named)) << named << "\n" << refused.message;
  }
  EXPECT_TRUE(Contains(refused.fix, "kjit-tune --model")) << refused.fix;
  EXPECT_TRUE(Contains(refused.fix, path)) << refused.fix;
  EXPECT_EQ(ExitCodeFor(findings), 0) << "the runtime runs on: a warning, not a failure";
  // The ones past the first four are refused for naming no op kjit has.
  int no_op = 0;
  for (const TuningRecordFacts& r : f.tuning.records) {
    if (Contains(r.refused, "is none of kjit's ops")) ++no_op;
  }
  EXPECT_EQ(no_op, 2);
}

TEST(DoctorTuning, CorruptFileWarnsWithTheKjitTuneFix) {
  TempDir tmp;
  const std::string path = tmp.path() + "/tuning.json";
  std::ofstream(path, std::ios::binary) << std::string("\x00\xff{garbage", 10);
  DoctorFacts f = H200WithTuningDbAt(path);
  EXPECT_EQ(f.tuning.state, TuningFacts::State::kCorrupt);
  Finding t = TuningFinding(f, Status::kWarn);
  EXPECT_TRUE(Contains(t.message, path + " (from KJIT_TUNING_DB) is corrupt (not valid JSON"))
      << t.message;
  EXPECT_TRUE(Contains(t.message, "the runtime ignores it with a warning")) << t.message;
  EXPECT_FALSE(Contains(t.message, "fix:")) << "Load's own fix is left to the finding's\n"
                                            << t.message;
  EXPECT_TRUE(Contains(t.fix, "kjit-tune")) << t.fix;
  EXPECT_TRUE(Contains(t.fix, path + ".corrupt-<time>")) << t.fix;
  EXPECT_TRUE(Contains(t.fix, "delete it")) << t.fix;

  // Valid JSON that is not a tuning database: the same, saying why.
  std::ofstream(path, std::ios::binary) << R"({"format": "something else"})";
  f = H200WithTuningDbAt(path);
  t = TuningFinding(f, Status::kWarn);
  EXPECT_TRUE(Contains(t.message, "is corrupt (not a kjit tuning database")) << t.message;
}

TEST(DoctorTuning, DirectoryAtThePathWarns) {
  TempDir tmp;
  const std::string path = tmp.path() + "/tuning.json";
  ASSERT_EQ(::mkdir(path.c_str(), 0700), 0);
  const DoctorFacts f = H200WithTuningDbAt(path);
  EXPECT_EQ(f.tuning.state, TuningFacts::State::kNotAFile) << f.tuning.error;
  const Finding t = TuningFinding(f, Status::kWarn);
  EXPECT_TRUE(t.message.starts_with(path + " (from KJIT_TUNING_DB) is a directory, not a tuning "
                                           "database file"))
      << t.message;
  EXPECT_TRUE(Contains(t.message, "kjit-tune cannot save")) << t.message;
  EXPECT_TRUE(Contains(t.fix, "Remove it, or point KJIT_TUNING_DB at a file")) << t.fix;
}

TEST(DoctorTuning, UnreadableFileWarns) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads a file whatever its mode";
  TempDir tmp;
  const std::string path = tmp.path() + "/tuning.json";
  WriteTuningDb(path, TunedRecords("NVIDIA H200", 90, 1));
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  const DoctorFacts f = H200WithTuningDbAt(path);
  EXPECT_EQ(f.tuning.state, TuningFacts::State::kUnreadable);
  const Finding t = TuningFinding(f, Status::kWarn);
  EXPECT_TRUE(Contains(t.message, "(from KJIT_TUNING_DB) cannot be read (")) << t.message;
  EXPECT_TRUE(Contains(t.message, "Permission denied")) << t.message;
  EXPECT_TRUE(Contains(t.fix, "readable by this user")) << t.fix;
}

TEST(DoctorTuning, PathThroughAFileIsUnreadable) {
  // Unlike permissions, this holds for root too.
  TempDir tmp;
  std::ofstream(tmp.path() + "/file") << "x";
  const std::string path = tmp.path() + "/file/tuning.json";
  const DoctorFacts f = H200WithTuningDbAt(path);
  EXPECT_EQ(f.tuning.state, TuningFacts::State::kUnreadable);
  const Finding t = TuningFinding(f, Status::kWarn);
  EXPECT_TRUE(Contains(t.message, path + " (from KJIT_TUNING_DB) cannot be read (")) << t.message;
  EXPECT_TRUE(Contains(t.message, "Not a directory")) << t.message;
  EXPECT_TRUE(Contains(t.fix, "readable by this user")) << t.fix;
}

TEST(DoctorTuning, EmptyOrRelativeKjitTuningDbIsReadAsTheRuntimeReadsIt) {
  TempDir tmp;
  const std::string cache = tmp.path() + "/cache";
  testing::ScopedEnv cache_dir("KJIT_CACHE_DIR", cache.c_str());
  // Set but empty counts as unset: the cache directory's tuning.json.
  DoctorFacts f = H200WithTuningDbAt("");
  EXPECT_EQ(f.tuning.path, cache + "/tuning.json");
  Finding t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(Contains(t.message, cache + "/tuning.json (KJIT_TUNING_DB is set but empty, which "
                                          "counts as unset"))
      << t.message;

  // Relative: each process resolves it against its working directory.
  f = H200WithTuningDbAt("rel/tuning.json");
  EXPECT_EQ(f.tuning.path, "rel/tuning.json");
  EXPECT_EQ(f.tuning.absolute, (fs::current_path() / "rel/tuning.json").string());
  t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(Contains(t.message,
                       "rel/tuning.json (from KJIT_TUNING_DB), relative, so each "
                       "process reads it from its own working directory (here " +
                           f.tuning.absolute + ")"))
      << t.message;

  // Unset: the cache directory's, said so.
  f.env.kjit_vars.erase("KJIT_TUNING_DB");
  f.tuning.path = f.tuning.absolute = cache + "/tuning.json";
  t = TuningFinding(f, Status::kOk);
  EXPECT_TRUE(Contains(t.message, cache + "/tuning.json (tuning.json in the cache directory)"))
      << t.message;
}

TEST(DoctorTuning, NoPathWarns) {
  DoctorFacts f = HealthyH200();
  f.tuning = {};
  const Finding t = TuningFinding(f, Status::kWarn);
  EXPECT_TRUE(Contains(t.message, "no tuning database path")) << t.message;
  EXPECT_TRUE(Contains(t.fix, "KJIT_TUNING_DB")) << t.fix;
}

// --- the real binary
// ---------------------------------------------------------------------------------

class DoctorCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(KJIT_CLI_PATH)) << KJIT_CLI_PATH << " is not built";
    ASSERT_FALSE(tmp_.path().empty());
    cache_ = tmp_.path() + "/cache";
    env_["KJIT_CACHE_DIR"] = cache_;
    env_["KJIT_CACHE_MAX_BYTES"] = "";
    // No GPU, whatever the machine has: the tests mean the same everywhere.
    env_["KJIT_LIBCUDA_PATH"] = "/nonexistent/libcuda.so.1";
  }

  // Runs kjit with `args`; the environment is ours with env_ applied (an empty value unsets).
  CliResult Run(const std::vector<std::string>& args) {
    return testing::RunKjit(args, env_, tmp_.path());
  }

  // The line of the text report for `check`, and its fix line ("" when none).
  static std::pair<std::string, std::string> Line(const std::string& text,
                                                  const std::string& check) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.size() > 7 && line.substr(7).starts_with(check + ": ")) {
        std::string next;
        if (std::getline(in, next) && next.starts_with("       fix: ")) return {line, next};
        return {line, ""};
      }
    }
    return {"", ""};
  }

  TempDir tmp_;
  std::string cache_;
  std::map<std::string, std::string> env_;
};

TEST_F(DoctorCliTest, WithoutADriverReportsTheDriverAndStillCompiles) {
  CliResult r = Run({"doctor"});
  EXPECT_EQ(r.signal, 0) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  auto [driver, fix] = Line(r.out, "driver");
  EXPECT_TRUE(driver.starts_with("[FAIL] driver: no CUDA driver")) << r.Describe();
  EXPECT_TRUE(Contains(driver, "/nonexistent/libcuda.so.1")) << r.Describe();
  EXPECT_TRUE(Contains(fix, "NVIDIA Container Toolkit")) << r.Describe();
  EXPECT_TRUE(Contains(fix, "--gpus all")) << r.Describe();
  EXPECT_TRUE(Contains(fix, "KJIT_LIBCUDA_PATH")) << r.Describe();
  EXPECT_TRUE(Line(r.out, "nvrtc").first.starts_with("[ OK ] nvrtc: NVRTC ")) << r.Describe();
  EXPECT_TRUE(Line(r.out, "compile.sm_90").first.starts_with("[ OK ] ")) << r.Describe();
  EXPECT_TRUE(Line(r.out, "compile.sm_100").first.starts_with("[ OK ] ")) << r.Describe();
  EXPECT_TRUE(Line(r.out, "cache.dir").first.starts_with("[ OK ] ")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "0 warn, 1 fail")) << "only the driver fails\n" << r.Describe();
  EXPECT_FALSE(fs::exists(cache_)) << "doctor must not create the cache directory";

  CliResult j = Run({"doctor", "--json"});
  EXPECT_EQ(j.exit_code, 1) << j.Describe();
  nlohmann::json doc = nlohmann::json::parse(j.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << "stdout must be only the JSON document\n" << j.Describe();
  EXPECT_EQ(doc["schema"], 1);
  EXPECT_EQ(doc["kjit"], "0.1.0");
  EXPECT_EQ(doc["exit_code"], 1);
  ASSERT_TRUE(doc["findings"].is_array());
  std::map<std::string, std::string> status;
  int counts[3] = {0, 0, 0};
  for (const nlohmann::json& f : doc["findings"]) {
    for (const char* field : {"check", "status", "message", "fix"}) {
      ASSERT_TRUE(f.contains(field) && f[field].is_string()) << field << " in " << f.dump();
    }
    const std::string s = f["status"];
    ASSERT_TRUE(s == "OK" || s == "WARN" || s == "FAIL") << s;
    ++counts[s == "OK" ? 0 : s == "WARN" ? 1 : 2];
    EXPECT_EQ(f["fix"].get<std::string>().empty(), s == "OK") << f.dump();
    status[f["check"]] = s;
  }
  EXPECT_EQ(status["driver"], "FAIL");
  EXPECT_EQ(status["nvrtc"], "OK");
  EXPECT_EQ(status["compile.sm_90"], "OK");
  EXPECT_EQ(status["compile.sm_100"], "OK");
  EXPECT_EQ(doc["summary"]["ok"], counts[0]);
  EXPECT_EQ(doc["summary"]["warn"], counts[1]);
  EXPECT_EQ(doc["summary"]["fail"], counts[2]);
  EXPECT_EQ(counts[2], 1) << j.Describe();
}

TEST_F(DoctorCliTest, WithTheStubDriverReportsTheStub) {
  ASSERT_TRUE(fs::exists(StubLibcuda())) << StubLibcuda();
  env_["KJIT_LIBCUDA_PATH"] = StubLibcuda();
  CliResult r = Run({"doctor"});
  EXPECT_EQ(r.signal, 0) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  auto [driver, fix] = Line(r.out, "driver");
  EXPECT_TRUE(driver.starts_with("[FAIL] driver: ")) << r.Describe();
  EXPECT_TRUE(Contains(driver, "stub")) << r.Describe();
  EXPECT_TRUE(Contains(driver, "CUDA_ERROR_STUB_LIBRARY, 34")) << r.Describe();
  EXPECT_TRUE(Contains(fix, "LD_LIBRARY_PATH")) << r.Describe();
  EXPECT_TRUE(Line(r.out, "compile.sm_90").first.starts_with("[ OK ] ")) << r.Describe();
}

TEST_F(DoctorCliTest, ArchChoosesTheCompileTargets) {
  CliResult r = Run({"doctor", "--arch", "sm_80,sm_120"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_TRUE(Line(r.out, "compile.sm_80").first.starts_with("[ OK ] ")) << r.Describe();
  EXPECT_TRUE(Line(r.out, "compile.sm_120").first.starts_with("[ OK ] ")) << r.Describe();
  EXPECT_EQ(Line(r.out, "compile.sm_90").first, "") << r.Describe();
}

TEST_F(DoctorCliTest, UsageErrorsExitWith2) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"doctor", "--arch", "sm_5"}, {"doctor", "--arch", ","}, {"doctor", "--bogus"}}) {
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args.back() << "\n" << r.Describe();
  }
}

TEST_F(DoctorCliTest, FixCacheRemovesEntriesForOtherTargets) {
  CliResult c = Run({"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_80,sm_90"});
  ASSERT_EQ(c.exit_code, 0) << c.Describe();
  CliResult before = Run({"doctor"});
  auto [stale, fix] = Line(before.out, "cache.stale");
  EXPECT_TRUE(stale.starts_with("[WARN] cache.stale: 1 of 2 entries")) << before.Describe();
  EXPECT_TRUE(Contains(stale, "sm_80")) << before.Describe();
  EXPECT_TRUE(Contains(fix, "--fix-cache")) << before.Describe();

  CliResult fixed = Run({"doctor", "--fix-cache"});
  EXPECT_EQ(fixed.exit_code, 1) << "the driver still fails\n" << fixed.Describe();
  EXPECT_TRUE(Line(fixed.out, "cache.fix")
                  .first.starts_with(
                      "[ OK ] cache.fix: --fix-cache removed 1 entries (1 stale, 0 corrupt)"))
      << fixed.Describe();
  EXPECT_TRUE(Line(fixed.out, "cache.stale").first.starts_with("[ OK ] ")) << fixed.Describe();
  int entries = 0;
  for (const auto& e : fs::directory_iterator(cache_)) entries += e.path().extension() == ".kjit";
  EXPECT_EQ(entries, 1);
}

TEST_F(DoctorCliTest, TuningReportsTheDatabaseKjitTuningDbNames) {
  const std::string valid = tmp_.path() + "/valid.json";
  WriteTuningDb(valid, TunedRecords("NVIDIA H200", 90, 2));
  // Not UTF-8, like the bytes in it: --json must still print a document.
  const std::string garbage = tmp_.path() + "/garbage-\xff.json";
  std::ofstream(garbage, std::ios::binary) << std::string("\x00\xff{garbage", 10);
  const std::string dir = tmp_.path() + "/a-directory";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  struct Case {
    std::string db;  // KJIT_TUNING_DB; "" unsets it
    std::string status, message, fix;
  };
  for (const Case& c : std::vector<Case>{
           {valid, "OK",
            valid + " (from KJIT_TUNING_DB) holds 2 records; no GPU here to match them against: 2 "
                    "for NVIDIA H200 sm_90 (driver CUDA 13.0, NVRTC 13.0)",
            ""},
           {garbage, "WARN", "(from KJIT_TUNING_DB) is corrupt (not valid JSON", ".corrupt-<time>"},
           {dir, "WARN", dir + " (from KJIT_TUNING_DB) is a directory, not a tuning database file",
            "point KJIT_TUNING_DB at a file"},
           {"", "OK",
            "no tuning database yet at " + cache_ +
                "/tuning.json (tuning.json in the "
                "cache directory)",
            ""}}) {
    SCOPED_TRACE(c.db);
    env_["KJIT_TUNING_DB"] = c.db;
    CliResult r = Run({"doctor", "--json", "--no-launch"});
    EXPECT_EQ(r.signal, 0) << r.Describe();
    nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(doc.is_discarded()) << r.Describe();
    int found = 0;
    for (const nlohmann::json& f : doc["findings"]) {
      if (f["check"] != "tuning") continue;
      ++found;
      EXPECT_EQ(f["status"], c.status) << f.dump();
      EXPECT_TRUE(Contains(f["message"], c.message)) << f.dump();
      EXPECT_TRUE(c.fix.empty() ? f["fix"] == "" : Contains(f["fix"], c.fix)) << f.dump();
    }
    EXPECT_EQ(found, 1) << r.Describe();
  }
  EXPECT_FALSE(fs::exists(cache_)) << "doctor must not create the cache or the tuning database";
}

TEST_F(DoctorCliTest, OthersWritableCacheFails) {
  ASSERT_EQ(::mkdir(cache_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(cache_.c_str(), 0777), 0);
  CliResult r = Run({"doctor", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.Describe();
  bool found = false;
  for (const nlohmann::json& f : doc["findings"]) {
    if (f["check"] != "cache.permissions") continue;
    found = true;
    EXPECT_EQ(f["status"], "FAIL");
    EXPECT_TRUE(Contains(f["fix"], "chmod 700")) << f.dump();
  }
  EXPECT_TRUE(found) << r.Describe();
}

}  // namespace
}  // namespace kjit::tools
