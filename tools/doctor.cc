#include "tools/doctor.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <absl/strings/str_join.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/disk_cache.h"
#include "jit/json_text.h"
#include "jit/printable.h"
#include "jit/target.h"

namespace kjit::tools {

namespace {

// Finding text is one line: the loaders' messages carry "\nfix: ..." tails.
std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string Gib(uint64_t bytes) { return fmt::format("{:.1f} GiB", bytes / 1073741824.0); }

std::string Bytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) return Gib(bytes);
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string Sm(int cc) { return fmt::format("sm_{}", cc); }

// "sm_75 .. sm_121 (12 archs)": the supported list, compact.
std::string ArchRange(const std::vector<int>& archs) {
  if (archs.empty()) return "no archs";
  std::vector<int> sorted = archs;
  std::sort(sorted.begin(), sorted.end());
  std::string all;
  for (int a : sorted) all += (all.empty() ? "" : " ") + Sm(a);
  return all;
}

int MaxArch(const std::vector<int>& archs) {
  return archs.empty() ? 0 : *std::max_element(archs.begin(), archs.end());
}

bool HasArch(const std::vector<int>& archs, int cc) {
  return std::find(archs.begin(), archs.end(), cc) != archs.end();
}

// The --gpus hint for a container whose GPU devices were not passed in.
std::string ContainerHint(const EnvFacts& env) {
  if (env.in_container && env.dev_nvidia.empty()) {
    return fmt::format(
        " This runs in a container ({}) with no /dev/nvidia* devices: it was started without GPU "
        "access.",
        env.container_hint);
  }
  return "";
}

// The NVRTC to install for an arch: "CUDA 12.8 or newer (Blackwell needs 12.8+)".
std::string NvrtcForArch(int cc) {
  const std::string first = FirstCudaForArch(cc);
  std::string out = first.empty() ? "a CUDA toolkit whose NVRTC supports " + Sm(cc)
                                  : "the NVRTC of CUDA " + first + " or newer";
  if (cc >= 100 && cc < 130) out += " (Blackwell needs CUDA 12.8+)";
  return out;
}

// A kjit command as the user can type it, quoted: "`kjit doctor --fix-cache`", or
// "`python -m kjit doctor --fix-cache`" when kjit was started that way (the Python package's
// launcher sets KJIT_COMMAND); "tune ..." is kjit-tune's: "`kjit-tune --model <name>`".
std::string Command(const DoctorFacts& f, std::string_view args) {
  auto prefix = f.env.kjit_vars.find("KJIT_COMMAND");
  if (prefix != f.env.kjit_vars.end() && !prefix->second.empty()) {
    return fmt::format("`{} {}`", prefix->second, args);
  }
  if (args.starts_with("tune ")) return fmt::format("`kjit-tune {}`", args.substr(5));
  return fmt::format("`kjit {}`", args);
}

const char* kInstallNvrtc =
    "e.g. apt install cuda-nvrtc-13-0, or pip install nvidia-cuda-nvrtc, then point "
    "KJIT_NVRTC_PATH at its libnvrtc.so if it is not on the loader's path";

// --- driver
// -----------------------------------------------------------------------------------------

void DiagnoseDriver(const DoctorFacts& f, std::vector<Finding>& out) {
  const DriverFacts& d = f.driver;
  const EnvFacts& env = f.env;
  auto libcuda_override = [&]() -> std::string {
    auto it = env.kjit_vars.find("KJIT_LIBCUDA_PATH");
    if (it == env.kjit_vars.end() || it->second.empty()) return "";
    return fmt::format(
        "KJIT_LIBCUDA_PATH={} is set: unset it or point it at the driver's "
        "libcuda.so.1. ",
        it->second);
  };
  const std::string no_driver_is_ok =
      fmt::format(" (Compiling for explicit targets, {} or {}, works without a driver.)",
                  Command(f, "doctor --arch sm_90,sm_100"), Command(f, "compile --arch ..."));
  switch (d.error) {
    case DriverFacts::Error::kNone: {
      std::string release = d.release.empty() ? "" : fmt::format("driver {}, ", d.release);
      out.push_back({"driver", Status::kOk,
                     fmt::format("libcuda {} loaded: {}supports CUDA {}, {} GPU(s) visible", d.path,
                                 release, CudaVersionText(d.version), d.gpus.size()),
                     ""});
      for (const GpuFacts& g : d.gpus) {
        out.push_back(
            {fmt::format("gpu.{}", g.ordinal), Status::kOk,
             fmt::format("{}: compute capability {}.{} ({}), {}, {} SMs", g.name, g.cc_major,
                         g.cc_minor, Sm(g.cc()), Gib(g.total_memory), g.sm_count),
             ""});
      }
      return;
    }
    case DriverFacts::Error::kMissing: {
      std::string tried;
      for (const auto& c : d.candidates) tried += (tried.empty() ? "" : ", ") + c;
      out.push_back(
          {"driver", Status::kFail,
           fmt::format("no CUDA driver: libcuda.so.1 could not be loaded (tried {}).{}", tried,
                       ContainerHint(env)),
           libcuda_override() +
               "Install the NVIDIA driver (it provides libcuda.so.1); in a container, install the "
               "NVIDIA Container Toolkit on the host and start it with `docker run --gpus all "
               "...` (Kubernetes: request nvidia.com/gpu)." +
               no_driver_is_ok});
      return;
    }
    case DriverFacts::Error::kStub: {
      const std::string dir = d.path.substr(0, d.path.rfind('/'));
      const bool in_ld_path = !dir.empty() && env.ld_library_path.find(dir) != std::string::npos;
      out.push_back(
          {"driver", Status::kFail,
           fmt::format("{} is the CUDA toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY, 34), for "
                       "linking only, not a driver.{}",
                       d.path, ContainerHint(env)),
           libcuda_override() +
               fmt::format("Remove the toolkit's stubs directory ({}) from LD_LIBRARY_PATH{} so "
                           "that the real driver's libcuda.so.1 is found; install the NVIDIA "
                           "driver, or in a container run with `docker run --gpus all` (NVIDIA "
                           "Container Toolkit), which mounts the host's libcuda.so.1.",
                           dir, in_ld_path ? " (it is there now)" : "") +
               no_driver_is_ok});
      return;
    }
    case DriverFacts::Error::kNoDevice: {
      const std::string visible =
          env.cuda_visible_devices ? "'" + *env.cuda_visible_devices + "'" : "unset";
      std::string fix;
      if (env.cuda_visible_devices) {
        fix = fmt::format(
            "CUDA_VISIBLE_DEVICES={} hides every GPU: unset it, or set it to "
            "indices or UUIDs that exist (`nvidia-smi -L` lists them).",
            visible);
      } else if (env.in_container && env.dev_nvidia.empty()) {
        fix =
            "Start the container with GPU access: `docker run --gpus all ...` with the NVIDIA "
            "Container Toolkit on the host (Kubernetes: request nvidia.com/gpu).";
      } else {
        fix =
            "Check `nvidia-smi`: the GPU may be absent, or its kernel module not loaded "
            "(reinstall the driver or reboot after installing it).";
      }
      out.push_back(
          {"driver", Status::kFail,
           fmt::format("the CUDA driver ({}{}) sees no GPU (CUDA_ERROR_NO_DEVICE); "
                       "CUDA_VISIBLE_DEVICES {}.{}",
                       d.path, d.version ? ", CUDA " + CudaVersionText(d.version) : std::string(),
                       visible, ContainerHint(env)),
           fix + no_driver_is_ok});
      return;
    }
    case DriverFacts::Error::kOther:
      out.push_back(
          {"driver", Status::kFail,
           fmt::format("the CUDA driver{} could not be used: {}",
                       d.path.empty() ? "" : " (" + d.path + ")", OneLine(FirstLine(d.message))),
           libcuda_override() +
               "Install (or reinstall) an NVIDIA driver for CUDA 12.0 or newer and "
               "check `nvidia-smi`." +
               no_driver_is_ok});
      return;
  }
}

// The fix for a library that did not load. A set `variable` is the only library kjit tries, so
// the fix is to it; else `install`.
std::string LibraryFix(const DoctorFacts& f, const std::string& variable,
                       const std::string& expected, const std::string& install) {
  auto path = f.env.kjit_vars.find(variable);
  if (path == f.env.kjit_vars.end() || path->second.empty()) return install;
  return fmt::format("Point {} (now '{}') at {}, or unset it to search the default places.",
                     variable, path->second, expected);
}

// --- NVRTC, targets, compatibility --------------------------------------------------------------

void DiagnoseNvrtc(const DoctorFacts& f, std::vector<Finding>& out) {
  const NvrtcFacts& n = f.nvrtc;
  if (!n.loaded) {
    out.push_back(
        {"nvrtc", Status::kFail,
         fmt::format("NVRTC is not available: {}", OneLine(FirstLine(n.error))),
         LibraryFix(f, "KJIT_NVRTC_PATH",
                    "the libnvrtc.so of a CUDA toolkit (e.g. "
                    "/usr/local/cuda/lib64/libnvrtc.so)",
                    std::string("Install the CUDA toolkit's NVRTC (") + kInstallNvrtc + ").")});
    return;
  }
  out.push_back({"nvrtc", Status::kOk,
                 fmt::format("NVRTC {} ({}) builds CUBIN for {}", n.VersionString(), n.path,
                             ArchRange(n.archs)),
                 ""});
}

void DiagnoseTargets(const DoctorFacts& f, std::vector<Finding>& out) {
  const NvrtcFacts& n = f.nvrtc;
  const DriverFacts& d = f.driver;
  if (!n.loaded || !d.ok()) return;
  for (const GpuFacts& g : d.gpus) {
    const std::string id = fmt::format("target.gpu.{}", g.ordinal);
    const int cc = g.cc();
    if (HasArch(n.archs, cc)) {
      out.push_back({id, Status::kOk,
                     fmt::format("{} ({}): NVRTC {} builds CUBIN for {}", g.name, Sm(cc),
                                 n.VersionString(), Sm(cc)),
                     ""});
      continue;
    }
    const std::string lacks = fmt::format("NVRTC {} cannot build CUBIN for {} ({}; it stops at {})",
                                          n.VersionString(), g.name, Sm(cc), Sm(MaxArch(n.archs)));
    const std::string install = fmt::format("Install {} ({}).", NvrtcForArch(cc), kInstallNvrtc);
    auto target = jit::SelectTargetForDevice(cc, n.archs, n.version(), d.version);
    if (target.ok()) {
      out.push_back(
          {id, Status::kWarn,
           fmt::format("{}; kernels fall back to {} PTX, which the driver (CUDA {}) JIT-compiles "
                       "at load: slower first launch, no {}-specific features",
                       lacks, target->ToString(), CudaVersionText(d.version), Sm(cc)),
           install});
      continue;
    }
    int lower = 0;
    for (int a : n.archs) {
      if (a < cc) lower = std::max(lower, a);
    }
    if (lower == 0) {
      out.push_back(
          {id, Status::kFail,
           fmt::format("{}, nor PTX for any lower arch: kjit cannot run on this GPU", lacks),
           fmt::format("Install an NVRTC that supports {} (an older CUDA toolkit for "
                       "an older GPU), and point KJIT_NVRTC_PATH at it.",
                       Sm(cc))});
      continue;
    }
    out.push_back(
        {id, Status::kFail,
         fmt::format("{}, and its compute_{} PTX would be refused by the older driver (CUDA {} < "
                     "NVRTC {}) with CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
                     lacks, lower, CudaVersionText(d.version), n.VersionString()),
         fmt::format("{} Or upgrade the driver to one for CUDA {} or newer (R{}+), so that the "
                     "PTX fallback loads.",
                     install, n.VersionString(), MinimumDriverForCudaMajor(n.major))});
  }
}

void DiagnoseCompat(const DoctorFacts& f, std::vector<Finding>& out) {
  const NvrtcFacts& n = f.nvrtc;
  const DriverFacts& d = f.driver;
  if (!n.loaded || !d.ok() || d.version == 0) return;
  const int driver_major = d.version / 1000;
  const std::string min_driver = MinimumDriverForCudaMajor(n.major);
  const std::string min_text = min_driver.empty() ? "" : " (R" + min_driver + "+)";
  if (driver_major < n.major) {
    out.push_back(
        {"compat.min_driver", Status::kFail,
         fmt::format("NVRTC {} needs a driver for CUDA {}.x{}, but this driver supports only CUDA "
                     "{}: its kernels will not load (neither CUBIN nor PTX crosses a major "
                     "version)",
                     n.VersionString(), n.major, min_text, CudaVersionText(d.version)),
         fmt::format("Upgrade the NVIDIA driver to R{} or newer (in a container: the host's "
                     "driver; datacenter GPUs can use the cuda-compat-{} package), or use a CUDA "
                     "{}.x NVRTC through KJIT_NVRTC_PATH.",
                     min_driver.empty() ? "?" : min_driver, n.major, driver_major)});
  } else {
    out.push_back(
        {"compat.min_driver", Status::kOk,
         fmt::format("the driver supports CUDA {}, enough for NVRTC {} (CUDA {}.x "
                     "needs a driver for {}.0{})",
                     CudaVersionText(d.version), n.VersionString(), n.major, n.major, min_text),
         ""});
  }
  if (d.version < n.version()) {
    // Which GPUs would need PTX (the CUBIN-less ones) is target.gpu.N's business; here the
    // general rule.
    out.push_back(
        {"compat.ptx", Status::kWarn,
         fmt::format("NVRTC {} is newer than the driver (CUDA {}): PTX it emits is refused with "
                     "CUDA_ERROR_UNSUPPORTED_PTX_VERSION; kjit builds CUBIN, which still loads "
                     "within the same major version",
                     n.VersionString(), CudaVersionText(d.version)),
         fmt::format("Upgrade the driver to one for CUDA {} or newer{}, or use an NVRTC no newer "
                     "than CUDA {} (KJIT_NVRTC_PATH); until then never ask for compute_XY (PTX) "
                     "targets.",
                     n.VersionString(), min_text, CudaVersionText(d.version))});
  } else {
    out.push_back({"compat.ptx", Status::kOk,
                   fmt::format("the driver (CUDA {}) is at least as new as NVRTC {}: both CUBIN "
                               "and PTX load",
                               CudaVersionText(d.version), n.VersionString()),
                   ""});
  }
}

// --- compile and launch
// ---------------------------------------------------------------------------

void DiagnoseCompiles(const DoctorFacts& f, std::vector<Finding>& out) {
  if (!f.nvrtc.loaded) return;
  for (const CompileFacts& c : f.compiles) {
    const std::string id = "compile." + c.target;
    if (c.ok) {
      out.push_back({id, Status::kOk,
                     fmt::format("RMSNorm (hidden 4096, bf16) compiled for {}: {}, {:.2f} s",
                                 c.target, Bytes(c.code_bytes), c.seconds),
                     ""});
      continue;
    }
    std::string fix;
    auto parsed = jit::ParseTarget(c.target);
    if (parsed.ok() && !HasArch(f.nvrtc.archs, parsed->arch)) {
      fix = fmt::format(
          "This NVRTC does not support {}: install {} ({}), or drop {} from "
          "--arch.",
          Sm(parsed->arch), NvrtcForArch(parsed->arch), kInstallNvrtc, c.target);
    } else {
      fix = fmt::format(
          "NVRTC itself failed on a kjit kernel: check that KJIT_NVRTC_PATH / the libnvrtc "
          "found matches its libnvrtc-builtins (same toolkit), then report it with the output "
          "of {}.",
          Command(f, "doctor --json"));
    }
    out.push_back({id, Status::kFail,
                   fmt::format("RMSNorm (hidden 4096, bf16) failed to compile for {}: {}", c.target,
                               OneLine(FirstLine(c.error))),
                   fix});
  }
}

void DiagnoseLaunches(const DoctorFacts& f, std::vector<Finding>& out) {
  if (!f.driver.ok()) return;
  for (const LaunchFacts& l : f.launches) {
    const std::string id = fmt::format("launch.gpu.{}", l.ordinal);
    switch (l.state) {
      case LaunchFacts::State::kOk:
        out.push_back({id, Status::kOk,
                       fmt::format("RMSNorm forward ran on GPU {} ({}): {}", l.ordinal, l.target,
                                   OneLine(l.detail)),
                       ""});
        break;
      case LaunchFacts::State::kNotAttempted:
      case LaunchFacts::State::kSkipped:
        out.push_back({id, Status::kWarn,
                       fmt::format("no test launch on GPU {}: {}", l.ordinal, OneLine(l.detail)),
                       l.state == LaunchFacts::State::kSkipped
                           ? fmt::format("Run {} without --no-launch to test-launch a kernel.",
                                         Command(f, "doctor"))
                           : fmt::format("Resolve the FAIL findings above, then run {} again.",
                                         Command(f, "doctor"))});
        break;
      case LaunchFacts::State::kError: {
        std::string fix;
        if (f.nvrtc.loaded && f.driver.version > 0 && f.driver.version / 1000 < f.nvrtc.major) {
          // Issue 34, defect 10: whatever the driver called it (CUDA_ERROR_NO_BINARY_FOR_GPU reads
          // as the arch's fault), code from a newer CUDA major version does not load.
          fix = fmt::format(
              "The driver (CUDA {}) is older than NVRTC {}, whose code it cannot load: upgrade "
              "the driver to R{} or newer, or use a CUDA {}.x NVRTC through KJIT_NVRTC_PATH (see "
              "compat.min_driver).",
              CudaVersionText(f.driver.version), f.nvrtc.VersionString(),
              MinimumDriverForCudaMajor(f.nvrtc.major), f.driver.version / 1000);
        } else if (l.detail.find("CUDA_ERROR_UNSUPPORTED_PTX_VERSION") != std::string::npos) {
          fix = fmt::format(
              "The driver is older than NVRTC {}: upgrade the driver (R{}+), or "
              "install an NVRTC that builds CUBIN for this GPU.",
              f.nvrtc.VersionString(), MinimumDriverForCudaMajor(f.nvrtc.major));
        } else if (l.detail.find("wrong result") != std::string::npos) {
          fix = fmt::format(
              "The kernel ran but computed wrong values: report it with the output of {} and "
              "`nvidia-smi -q`.",
              Command(f, "doctor --json"));
        } else {
          fix = fmt::format(
              "Check `nvidia-smi` (a GPU in a bad state, out of memory or under MIG limits); "
              "if it persists, report it with the output of {}.",
              Command(f, "doctor --json"));
        }
        out.push_back(
            {id, Status::kFail,
             fmt::format("the test launch on GPU {} ({}) failed: {}", l.ordinal,
                         l.target.empty() ? "no target" : l.target, OneLine(FirstLine(l.detail))),
             fix});
        break;
      }
    }
  }
}

// --- cuBLASLt
// ---------------------------------------------------------------------------------------

// Never FAIL: RMSNorm and cross-entropy run without it.
void DiagnoseCublasLt(const DoctorFacts& f, std::vector<Finding>& out) {
  const CublasLtFacts& c = f.cublaslt;
  if (!c.loaded) {
    out.push_back(
        {"cublaslt", Status::kWarn,
         // The loader's line says what was tried and that LinearCrossEntropy needs it.
         fmt::format("{}; the other ops run without it", OneLine(FirstLine(c.error))),
         LibraryFix(f, "KJIT_CUBLASLT_PATH",
                    "a libcublasLt.so of CUDA 12 or newer (e.g. "
                    "/usr/local/cuda/lib64/libcublasLt.so)",
                    "Install cuBLAS (the CUDA toolkit's, or the nvidia-cublas wheel PyTorch uses) "
                    "and put its lib directory on LD_LIBRARY_PATH, or set KJIT_CUBLASLT_PATH to "
                    "its libcublasLt.so.")});
    return;
  }
  const std::string what = fmt::format("cuBLASLt {} ({}), built for CUDA {}", c.VersionString(),
                                       c.path, CudaVersionText(c.cudart));
  // A CUDA runtime runs on drivers of its own major version or newer (minor version
  // compatibility), so only the major decides.
  if (f.driver.ok() && f.driver.version > 0 && c.cudart / 1000 > f.driver.version / 1000) {
    out.push_back(
        {"cublaslt", Status::kWarn,
         fmt::format("{}, newer than the driver's CUDA {}: its GEMMs will not initialize, so "
                     "LinearCrossEntropy cannot run",
                     what, CudaVersionText(f.driver.version)),
         fmt::format("Upgrade the driver (R{}+), or point KJIT_CUBLASLT_PATH at the cuBLASLt of a "
                     "CUDA {} toolkit.",
                     MinimumDriverForCudaMajor(c.cudart / 1000), f.driver.version / 1000)});
    return;
  }
  out.push_back({"cublaslt", Status::kOk, what + ": LinearCrossEntropy's GEMMs", ""});
}

// --- cache
// -----------------------------------------------------------------------------------------

void DiagnoseCache(const DoctorFacts& f, std::vector<Finding>& out) {
  const CacheFacts& c = f.cache;
  const std::string q = "'" + c.dir + "'";
  if (!c.config_error.empty()) {
    out.push_back({"cache.dir", Status::kFail,
                   fmt::format("the cache configuration is invalid: {}", OneLine(c.config_error)),
                   "Fix or unset the variable named (KJIT_CACHE_MAX_BYTES takes a whole number of "
                   "bytes, 0 for no cap); until then every kjit runtime fails to start."});
    return;
  }
  if (c.dir.empty()) {
    out.push_back({"cache.dir", Status::kFail,
                   "no cache directory: KJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset and the "
                   "password database has no home directory",
                   "Set KJIT_CACHE_DIR to a directory of your own (e.g. export "
                   "KJIT_CACHE_DIR=/tmp/kjit-$UID)."});
    return;
  }
  if (!c.exists) {
    if (!c.dangling_symlink.empty()) {
      // What DiskCache::Open says too: kjit neither creates the target nor follows another path.
      out.push_back({"cache.dir", Status::kFail,
                     fmt::format("{} (from {}) cannot be used: {}", c.dir, c.dir_source,
                                 OneLine(c.dangling_symlink)),
                     "Create the symlink's target (mkdir -m 700), remove the symlink, or set "
                     "KJIT_CACHE_DIR to a directory of your own."});
    } else if (c.create_error.empty()) {
      out.push_back({"cache.dir", Status::kOk,
                     fmt::format("{} (from {}) does not exist yet; kjit creates it (mode 0700) on "
                                 "first use",
                                 c.dir, c.dir_source),
                     ""});
    } else {
      out.push_back({"cache.dir", Status::kFail,
                     fmt::format("{} (from {}) does not exist and cannot be created: {}", c.dir,
                                 c.dir_source, OneLine(c.create_error)),
                     "Set KJIT_CACHE_DIR to a directory you can create and write."});
    }
    return;
  }
  if (!c.is_dir) {
    out.push_back({"cache.dir", Status::kFail,
                   fmt::format("{} (from {}) exists but is not a directory", c.dir, c.dir_source),
                   fmt::format("Remove {}, or set KJIT_CACHE_DIR to another directory.", q)});
    return;
  }
  uint64_t bytes = 0;
  for (const CacheEntryFacts& e : c.entries) bytes += e.bytes;
  std::string size = c.listed ? fmt::format("{} entries, {}", c.entries.size(), Bytes(bytes))
                              : std::string("entries not read");
  if (c.max_bytes > 0) size += fmt::format(" (cap {})", Bytes(c.max_bytes));
  out.push_back(
      {"cache.dir", Status::kOk, fmt::format("{} (from {}): {}", c.dir, c.dir_source, size), ""});

  // Permissions: the same rules DiskCache::Open enforces, so doctor fails exactly where kjit would.
  bool safe = true;
  // The fix is DiskCache::Open's own, so that both give the same advice (never chmod /tmp).
  const std::string unsafe_fix =
      jit::DiskCache::UnsafeDirectoryFix(c.dir, c.mode, c.owner_uid, c.euid) + ".";
  if (c.owner_uid != c.euid) {
    safe = false;
    out.push_back({"cache.permissions", Status::kFail,
                   fmt::format("{} is owned by uid {}, not by this user (uid {}): kjit refuses it, "
                               "since its owner could plant kernels that run on the GPU",
                               c.dir, c.owner_uid, c.euid),
                   unsafe_fix});
  } else if ((c.mode & 022) != 0) {
    safe = false;
    out.push_back(
        {"cache.permissions", Status::kFail,
         fmt::format("{} is writable by {} (mode {:04o}): kjit refuses it, since they "
                     "could plant kernels that run on the GPU",
                     c.dir, (c.mode & 002) != 0 ? "other users" : "its group", c.mode & 07777),
         unsafe_fix});
  } else if (!c.writable) {
    out.push_back({"cache.permissions", Status::kWarn,
                   fmt::format("{} is not writable ({}): kjit uses it read-only, so kernels "
                               "compiled now are kept in memory only and recompiled by every "
                               "process",
                               c.dir, OneLine(c.not_writable_reason)),
                   fmt::format("chmod u+w {}, or set KJIT_CACHE_DIR to a writable directory (a "
                               "prebuilt read-only cache baked into an image is fine as long as "
                               "it holds the kernels you need).",
                               q)});
  } else {
    out.push_back(
        {"cache.permissions", Status::kOk,
         fmt::format("mode {:04o}, owned by this user (uid {}), writable", c.mode & 07777, c.euid),
         ""});
  }
  if (!c.listed) return;

  // Stale and corrupt entries.
  std::map<std::string, int> by_target, by_nvrtc;
  int stale = 0;
  std::vector<const CacheEntryFacts*> corrupt;
  for (const CacheEntryFacts& e : c.entries) {
    switch (JudgeCacheEntry(e, f)) {
      case EntryVerdict::kUsable: break;
      case EntryVerdict::kStaleTarget:
        ++stale;
        ++by_target[e.target];
        break;
      case EntryVerdict::kStaleNvrtc:
        ++stale;
        ++by_nvrtc[e.nvrtc_version];
        break;
      case EntryVerdict::kCorrupt: corrupt.push_back(&e); break;
    }
  }
  const std::string fix_cmd = fmt::format(
      "{} {} to remove them",
      c.writable && safe ? "Run"
                         : "Make the cache writable and safe (see cache.permissions), then run",
      Command(f, "doctor --fix-cache"));
  if (f.nvrtc.loaded) {
    std::string in_use;
    for (const std::string& t : TargetsInUse(f)) in_use += (in_use.empty() ? "" : ", ") + t;
    if (stale == 0) {
      out.push_back({"cache.stale", Status::kOk,
                     fmt::format("no stale entries (targets in use: {}; NVRTC {})", in_use,
                                 f.nvrtc.VersionString()),
                     ""});
    } else {
      std::string why;
      for (const auto& [t, count] : by_target) {
        why += fmt::format("{}{} for {}", why.empty() ? "" : ", ", count, t);
      }
      for (const auto& [v, count] : by_nvrtc) {
        why += fmt::format("{}{} from NVRTC {}", why.empty() ? "" : ", ", count,
                           v.empty() ? "(unknown)" : v);
      }
      std::string keep = fix_cmd + ".";
      if (!by_target.empty()) {
        // Entries prebuilt for other machines' GPUs stay when their targets are named.
        std::string all;
        for (const std::string& t : TargetsInUse(f)) all += (all.empty() ? "" : ",") + t;
        for (const auto& [t, count] : by_target) all += "," + t;
        keep = fix_cmd + fmt::format(
                             "; to keep entries prebuilt for other GPUs, name their "
                             "targets: {}.",
                             Command(f, fmt::format("doctor --arch {} --fix-cache", all)));
      }
      out.push_back(
          {"cache.stale", Status::kWarn,
           fmt::format("{} of {} entries can never be used here ({}); in use: {} with NVRTC {}",
                       stale, c.entries.size(), why, in_use, f.nvrtc.VersionString()),
           keep});
    }
  }
  if (c.entries.empty()) {
    out.push_back({"cache.corrupt", Status::kOk, "no entries to check", ""});
  } else if (corrupt.empty()) {
    out.push_back(
        {"cache.corrupt", Status::kOk,
         fmt::format("all {} entries pass their checksum and metadata checks", c.entries.size()),
         ""});
  } else {
    out.push_back({"cache.corrupt", Status::kWarn,
                   fmt::format("{} entries fail their checks (e.g. {}: {}); kjit never loads "
                               "them and recompiles instead",
                               corrupt.size(), corrupt[0]->key, OneLine(corrupt[0]->problem)),
                   fmt::format("{} (or {}); repeated corruption points at the disk or a shared "
                               "filesystem.",
                               fix_cmd, Command(f, "cache prune"))});
  }
}

void DiagnoseCacheFix(const DoctorFacts& f, std::vector<Finding>& out) {
  const CacheFixFacts& x = f.cache.fix;
  if (!x.ran) return;
  if (!x.refused.empty()) {
    out.push_back({"cache.fix", Status::kFail,
                   fmt::format("--fix-cache removed nothing: {}", OneLine(x.refused)),
                   fmt::format("Fix the cache.dir / cache.permissions findings first, then run {} "
                               "again.",
                               Command(f, "doctor --fix-cache"))});
    return;
  }
  const std::string removed =
      fmt::format("--fix-cache removed {} entries ({} stale, {} corrupt)",
                  x.removed_stale + x.removed_corrupt, x.removed_stale, x.removed_corrupt);
  if (!x.errors.empty()) {
    out.push_back({"cache.fix", Status::kFail,
                   fmt::format("{}; {} could not be removed (e.g. {})", removed, x.errors.size(),
                               OneLine(x.errors[0])),
                   fmt::format("Remove them by hand (rm -r '{}'/<key>.kjit: an entry's name may "
                               "hold a directory) or check the directory's permissions.",
                               f.cache.dir)});
    return;
  }
  out.push_back({"cache.fix", Status::kOk, removed, ""});
}

// --- tuning --------------------------------------------------------------------------------------

// What the runtime does with a database it cannot use (LoadTuningDb in runtime.cc).
const char* kTuningIgnored =
    "the runtime ignores it with a warning and ops use their heuristic launch configs";

// "run `kjit-tune --model <name>` to tune them", as Command names kjit-tune.
std::string TuneHint(const DoctorFacts& f) {
  return fmt::format("run {} to tune them", Command(f, "tune --model <name>"));
}

// The database's path and why there, as TuningDb::DefaultPath() picks it.
std::string TuningWhere(const DoctorFacts& f) {
  const TuningFacts& t = f.tuning;
  auto env = f.env.kjit_vars.find("KJIT_TUNING_DB");
  std::string where = t.path;
  if (env == f.env.kjit_vars.end()) {
    where += " (tuning.json in the cache directory)";
  } else if (env->second.empty()) {
    where +=
        " (KJIT_TUNING_DB is set but empty, which counts as unset: tuning.json in the cache "
        "directory)";
  } else {
    where += " (from KJIT_TUNING_DB)";
  }
  if (!t.path.starts_with('/')) {
    // Every process (each rank, kjit-tune) reads its own copy: worth saying where this one is.
    where += fmt::format(
        ", relative, so each process reads it from its own working directory "
        "(here {})",
        t.absolute);
  }
  return where;
}

// The arch the runtime keys a GPU's records by: its target's (TuningKeyFor in runtime.cc), which
// is the PTX fallback's when NVRTC cannot build CUBIN for the GPU.
int TuningArch(const DoctorFacts& f, const GpuFacts& g) {
  if (f.nvrtc.loaded) {
    auto target =
        jit::SelectTargetForDevice(g.cc(), f.nvrtc.archs, f.nvrtc.version(), f.driver.version);
    if (target.ok()) return target->arch;
  }
  return g.cc();
}

// "NVIDIA H200 sm_90 (driver CUDA 13.0, NVRTC 13.0)": what a record was tuned under.
std::string TunedUnder(const std::string& device, int arch, int driver, int nvrtc) {
  return fmt::format("{} {} (driver CUDA {}, NVRTC {})", device, Sm(arch), CudaVersionText(driver),
                     CudaVersionText(nvrtc));
}

// Nothing to tune with yet, which is fine: `what` says why.
Finding Untuned(const DoctorFacts& f, const std::string& what) {
  return {"tuning", Status::kOk,
          fmt::format("{}: ops use their heuristic launch configs; {}", what, TuneHint(f)), ""};
}

// The records a launch would refuse, read as the runtime reads them (issue 34, defect 9): whatever
// GPU they are for, since a database that holds them was written wrong or by another kjit.
void DiagnoseRefusedRecords(const DoctorFacts& f, const std::vector<TuningRecordFacts>& records,
                            std::vector<Finding>& out) {
  constexpr size_t kListed = 4;
  std::vector<std::string> listed;
  size_t refused = 0;
  for (const TuningRecordFacts& r : records) {
    if (r.refused.empty()) continue;
    if (++refused <= kListed) listed.push_back(fmt::format("{} ({})", r.what, r.refused));
  }
  if (refused == 0) return;
  if (refused > kListed) listed.push_back(fmt::format("and {} more", refused - kListed));
  out.push_back(
      {"tuning.records", Status::kWarn,
       fmt::format("{} of the {} records in the tuning database would be refused at launch (the "
                   "runtime warns and runs the heuristic's config instead): {}",
                   refused, records.size(), absl::StrJoin(listed, "; ")),
       fmt::format("retune those shapes with {} (it replaces their records), or delete the "
                   "database {} to start afresh",
                   Command(f, "tune --model <name>"), f.tuning.path)});
}

void DiagnoseTuningRecords(const DoctorFacts& f, const std::string& where,
                           std::vector<Finding>& out) {
  const std::vector<TuningRecordFacts>& records = f.tuning.records;
  if (records.empty()) {
    out.push_back(Untuned(f, fmt::format("the tuning database {} holds no records", where)));
    return;
  }
  // Per GPU model present, the records that apply: device, arch, driver and NVRTC all match, as
  // in the runtime's TuningKey. An unknown NVRTC (not loaded) rules out no record.
  std::vector<std::string> parts;
  std::vector<bool> applies(records.size(), false);
  std::set<std::pair<std::string, int>> seen;
  const std::vector<GpuFacts> no_gpus;
  for (const GpuFacts& g : f.driver.ok() ? f.driver.gpus : no_gpus) {
    const int arch = TuningArch(f, g);
    if (!seen.insert({g.name, arch}).second) continue;  // GPUs of one model share their records
    int count = 0, refused = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      const TuningRecordFacts& r = records[i];
      if (r.device == g.name && r.arch == arch && r.driver == f.driver.version &&
          (!f.nvrtc.loaded || r.nvrtc == f.nvrtc.version())) {
        applies[i] = true;
        ++(r.refused.empty() ? count : refused);
      }
    }
    const std::string gpu =
        TunedUnder(g.name, arch, f.driver.version, f.nvrtc.loaded ? f.nvrtc.version() : 0);
    // Those the runtime would refuse are not counted as applying (tuning.records names them).
    const std::string also_refused =
        refused > 0 ? fmt::format(" ({} more match it, but the runtime refuses them)", refused)
                    : "";
    parts.push_back(count > 0 ? fmt::format("{} apply to {}{}", count, gpu, also_refused)
                              : fmt::format("none apply to {}{}, whose ops use their heuristic "
                                            "launch configs ({} here)",
                                            gpu, also_refused, TuneHint(f)));
  }
  // The others, grouped by what they were tuned under: the runtime never reads them here.
  std::map<std::tuple<std::string, int, int, int>, int> others;
  for (size_t i = 0; i < records.size(); ++i) {
    const TuningRecordFacts& r = records[i];
    if (!applies[i]) ++others[{r.device, r.arch, r.driver, r.nvrtc}];
  }
  constexpr size_t kListed = 4;
  std::vector<std::string> groups;
  size_t ignored = 0;
  for (const auto& [key, count] : others) {
    ignored += count;
    if (groups.size() < kListed) {
      const auto& [device, arch, driver, nvrtc] = key;
      groups.push_back(fmt::format("{} for {}", count, TunedUnder(device, arch, driver, nvrtc)));
    }
  }
  if (others.size() > kListed) groups.push_back(fmt::format("{} more", others.size() - kListed));
  if (parts.empty()) {
    parts.push_back("no GPU here to match them against: " + absl::StrJoin(groups, ", "));
  } else if (ignored > 0) {
    parts.push_back(
        fmt::format("the runtime ignores the other {}, tuned for other GPUs, drivers "
                    "or NVRTC versions: {}",
                    ignored, absl::StrJoin(groups, ", ")));
  }
  out.push_back({"tuning", Status::kOk,
                 fmt::format("the tuning database {} holds {} record{}; {}", where, records.size(),
                             records.size() == 1 ? "" : "s", absl::StrJoin(parts, "; ")),
                 ""});
  DiagnoseRefusedRecords(f, records, out);
}

void DiagnoseTuning(const DoctorFacts& f, std::vector<Finding>& out) {
  const TuningFacts& t = f.tuning;
  const std::string where = TuningWhere(f);
  switch (t.state) {
    case TuningFacts::State::kNoPath:
      out.push_back({"tuning", Status::kWarn,
                     "no tuning database path: KJIT_TUNING_DB is unset and there is no cache "
                     "directory (see cache.dir), so the runtime neither reads nor tunes launch "
                     "configs",
                     "Set KJIT_TUNING_DB to a file, or KJIT_CACHE_DIR to a directory of your "
                     "own."});
      return;
    case TuningFacts::State::kMissing:
      out.push_back(Untuned(f, fmt::format("no tuning database yet at {}", where)));
      return;
    case TuningFacts::State::kLoaded: DiagnoseTuningRecords(f, where, out); return;
    case TuningFacts::State::kCorrupt:
      out.push_back({"tuning", Status::kWarn,
                     fmt::format("the tuning database {} is corrupt ({}): {}", where,
                                 OneLine(t.error), kTuningIgnored),
                     fmt::format("Run {}, which sets the corrupt file aside as "
                                 "{}.corrupt-<time> and builds a new one, or delete it.",
                                 Command(f, "tune --model <name>"), t.path)});
      return;
    case TuningFacts::State::kNotAFile:
      out.push_back({"tuning", Status::kWarn,
                     fmt::format("{} is {}, not a tuning database file: {}, and kjit-tune cannot "
                                 "save its results there",
                                 where, t.what, kTuningIgnored),
                     "Remove it, or point KJIT_TUNING_DB at a file."});
      return;
    case TuningFacts::State::kUnreadable:
      out.push_back({"tuning", Status::kWarn,
                     fmt::format("the tuning database {} cannot be read ({}): {}", where,
                                 OneLine(t.error), kTuningIgnored),
                     "Make it readable by this user (kjit-tune writes it mode 0600 for whoever "
                     "ran it, so one written under sudo needs a chown), or point KJIT_TUNING_DB "
                     "at a file of your own."});
      return;
  }
}

void DiagnoseEnv(const DoctorFacts& f, std::vector<Finding>& out) {
  const EnvFacts& e = f.env;
  std::string vars;
  for (const auto& [k, v] : e.kjit_vars)
    vars += fmt::format("{}{}={}", vars.empty() ? "" : " ", k, v);
  std::string msg = vars.empty() ? "no KJIT_* variables set" : vars;
  msg += e.cuda_visible_devices ? "; CUDA_VISIBLE_DEVICES='" + *e.cuda_visible_devices + "'"
                                : "; CUDA_VISIBLE_DEVICES unset";
  if (e.in_container) {
    msg += fmt::format("; in a container ({})", e.container_hint);
  } else {
    msg += "; not in a container";
  }
  std::string devs;
  for (const std::string& d : e.dev_nvidia) devs += (devs.empty() ? "" : " ") + d;
  msg += devs.empty() ? "; no /dev/nvidia* devices" : "; /dev: " + devs;
  out.push_back({"env", Status::kOk, msg, ""});
}

}  // namespace

// --- public
// ------------------------------------------------------------------------------------------

std::string NvrtcFacts::VersionString() const { return fmt::format("{}.{}", major, minor); }

std::string CublasLtFacts::VersionString() const {
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

const char* StatusName(Status s) {
  switch (s) {
    case Status::kOk: return "OK";
    case Status::kWarn: return "WARN";
    case Status::kFail: return "FAIL";
  }
  return "?";
}

std::string CudaVersionText(int version) {
  if (version <= 0) return "unknown";
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

std::string MinimumDriverForCudaMajor(int major) {
  switch (major) {
    case 11: return "450.80.02";
    case 12: return "525.60.13";
    case 13: return "580.65.06";
  }
  return "";
}

std::string FirstCudaForArch(int cc) {
  static const std::map<int, const char*> kFirst = {
      {50, "6.0"},   {52, "6.5"},   {53, "6.5"},   {60, "8.0"},   {61, "8.0"},
      {62, "8.0"},   {70, "9.0"},   {72, "10.0"},  {75, "10.0"},  {80, "11.0"},
      {86, "11.1"},  {87, "11.4"},  {89, "11.8"},  {90, "11.8"},  {100, "12.8"},
      {101, "12.8"}, {103, "12.9"}, {110, "13.0"}, {120, "12.8"}, {121, "12.9"}};
  auto it = kFirst.find(cc);
  return it == kFirst.end() ? "" : it->second;
}

std::vector<std::string> TargetsInUse(const DoctorFacts& f) {
  std::vector<std::string> out;
  auto add = [&](const std::string& t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  if (f.nvrtc.loaded && f.driver.ok()) {
    for (const GpuFacts& g : f.driver.gpus) {
      auto t =
          jit::SelectTargetForDevice(g.cc(), f.nvrtc.archs, f.nvrtc.version(), f.driver.version);
      if (t.ok()) add(t->ToString());
    }
  }
  for (const std::string& t : f.arch_targets) add(t);
  if (f.driver.gpus.empty() && f.arch_targets.empty()) {
    for (const jit::Target& t : jit::DefaultPrebuildTargets()) add(t.ToString());
  }
  return out;
}

EntryVerdict JudgeCacheEntry(const CacheEntryFacts& e, const DoctorFacts& f) {
  if (!e.valid) return EntryVerdict::kCorrupt;
  if (!f.nvrtc.loaded) return EntryVerdict::kUsable;  // nothing to judge against
  if (e.nvrtc_version != f.nvrtc.VersionString()) return EntryVerdict::kStaleNvrtc;
  const std::vector<std::string> in_use = TargetsInUse(f);
  if (std::find(in_use.begin(), in_use.end(), e.target) != in_use.end()) {
    return EntryVerdict::kUsable;
  }
  // An arch-specific CUBIN (sm_90a) a user asked for explicitly runs on its exact arch.
  if (auto t = jit::ParseTarget(e.target); t.ok() && t->arch_specific) {
    for (const GpuFacts& g : f.driver.gpus) {
      if (g.cc() == t->arch) return EntryVerdict::kUsable;
    }
  }
  return EntryVerdict::kStaleTarget;
}

std::vector<Finding> Diagnose(const DoctorFacts& facts) {
  std::vector<Finding> out;
  DiagnoseDriver(facts, out);
  DiagnoseNvrtc(facts, out);
  DiagnoseTargets(facts, out);
  DiagnoseCompat(facts, out);
  DiagnoseCompiles(facts, out);
  DiagnoseLaunches(facts, out);
  DiagnoseCublasLt(facts, out);
  DiagnoseCache(facts, out);
  DiagnoseCacheFix(facts, out);
  DiagnoseTuning(facts, out);
  DiagnoseEnv(facts, out);
  return out;
}

int ExitCodeFor(const std::vector<Finding>& findings) {
  for (const Finding& f : findings) {
    if (f.status == Status::kFail) return 1;
  }
  return 0;
}

std::string FormatText(const std::vector<Finding>& findings) {
  std::string out;
  int counts[3] = {0, 0, 0};
  for (const Finding& f : findings) {
    ++counts[static_cast<int>(f.status)];
    const char* tag = f.status == Status::kOk     ? "[ OK ]"
                      : f.status == Status::kWarn ? "[WARN]"
                                                  : "[FAIL]";
    // Findings quote paths, environment variables and files: none may reach a terminal raw.
    out += fmt::format("{} {}: {}\n", tag, f.check, jit::Printable(f.message));
    if (!f.fix.empty()) out += fmt::format("       fix: {}\n", jit::Printable(f.fix));
  }
  out += fmt::format("{} ok, {} warn, {} fail\n", counts[0], counts[1], counts[2]);
  return out;
}

std::string FormatJson(const std::vector<Finding>& findings, const std::string& kjit_version) {
  // Ordered: the document reads in the order the schema lists its fields.
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  int counts[3] = {0, 0, 0};
  for (const Finding& f : findings) {
    ++counts[static_cast<int>(f.status)];
    list.push_back(nlohmann::ordered_json{{"check", f.check},
                                          {"status", StatusName(f.status)},
                                          {"message", f.message},
                                          {"fix", f.fix}});
  }
  nlohmann::ordered_json doc = {
      {"schema", 1},
      {"kjit", kjit_version},
      {"findings", std::move(list)},
      {"summary", {{"ok", counts[0]}, {"warn", counts[1]}, {"fail", counts[2]}}},
      {"exit_code", ExitCodeFor(findings)}};
  // Invalid UTF-8 (a device or path name) is replaced rather than throwing.
  return jit::JsonText(doc, 2) + "\n";
}

}  // namespace kjit::tools
