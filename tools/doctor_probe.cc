#include "tools/doctor_probe.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <regex>
#include <system_error>

#include <fmt/format.h>

#include "jit/cache_entry.h"
#include "jit/disk_cache.h"
#include "jit/driver.h"
#include "jit/dynlib.h"
#include "jit/file_io.h"
#include "jit/nvrtc.h"
#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "jit/target.h"
#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "kjit/rms_norm.h"
#include "kjit/runtime.h"
#include "kjit/version.h"
#include "ops/common/tuning/random_values.h"
#include "ops/linear_cross_entropy/cublaslt.h"
#include "ops/registry.h"
#include "runtime/tuning_db.h"

extern char** environ;

namespace kjit::tools {

namespace {

constexpr int64_t kTestHidden = 4096;
constexpr int64_t kTestRows = 64;
constexpr DType kTestDType = DType::kBF16;
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 30;  // as DiskCache: bigger is not an entry

std::string FirstLine(std::string_view s) { return std::string(s.substr(0, s.find('\n'))); }
std::string Msg(const absl::Status& s) { return FirstLine(ToStd(s.message())); }
std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// libcuda, once cuInit ran, has threads of its own: unloading it would pull the code from under
// them. Everything the probe loads stays loaded, NVRTC included (unloading it also strands what its
// static C++ runtime allocated for good, which LeakSanitizer then reports as a leak).
template <typename T>
const T* KeepLoaded(T value) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  auto owned = std::make_shared<T>(std::move(value));
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(owned);
  return owned.get();
}

// The text of a small file under /proc; "" when it cannot be read.
std::string ReadSmallFile(const std::string& path) {
  absl::StatusOr<std::string> text = jit::ReadRegularFile(path, size_t{1} << 20);
  return text.ok() ? *std::move(text) : "";
}

// The kernel module's release from /proc/driver/nvidia/version ("... Kernel Module  580.65.06
// ...").
std::string DriverRelease() {
  const std::string text = FirstLine(ReadSmallFile("/proc/driver/nvidia/version"));
  std::smatch m;
  static const std::regex kRelease(R"(\b(\d{3,}\.\d+(\.\d+)?)\b)");
  return std::regex_search(text, m, kRelease) ? m[1].str() : "";
}

// The test kernel: RMSNorm as a Llama-sized model runs it.
constexpr RmsNormSpec kTestSpec{.hidden = kTestHidden, .dtype = kTestDType};

// The test kernel built for `target` by a compile-only runtime that keeps it in memory and ignores
// the tuning database (the user's cache and database are not touched): the heuristic's config.
CompileFacts TestCompile(const std::string& target) {
  CompileFacts c;
  c.target = target;
  const auto start = std::chrono::steady_clock::now();
  auto built = [&]() -> absl::StatusOr<BuildInfo> {
    KJIT_ASSIGN_OR_RETURN(
        Runtime rt,
        Runtime::Create(
            {.target = target, .compile_only = true, .disk_cache = false, .tuning_db = "off"}));
    KJIT_ASSIGN_OR_RETURN(RmsNorm norm, rt.RmsNorm(kTestSpec));
    return norm.Build();
  }();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!built.ok()) {
    c.error = Msg(built.status());
    return c;
  }
  c.ok = true;
  c.code_bytes = built->bytes;
  return c;
}

// RMSNorm forward on `ordinal` through a memory-only runtime (the user's cache is not touched), on
// random bf16 input, checked by CheckRmsNormInFp32. Returns the target it ran and a one-line
// result; wrong values are an error whose message starts "wrong result".
absl::StatusOr<std::pair<std::string, std::string>> LaunchOnce(int ordinal) {
  KJIT_ASSIGN_OR_RETURN(Runtime rt, Runtime::Create({.device = ordinal, .disk_cache = false}));
  const std::string target = rt.target();
  KJIT_ASSIGN_OR_RETURN(RmsNorm norm, rt.RmsNorm(kTestSpec));

  std::mt19937_64 rng(12345 + ordinal);
  TestLaunchValues run{.rows = kTestRows,
                       .hidden = kTestHidden,
                       .eps = kTestSpec.eps,
                       .x = ops::RandomValues(rng, kTestRows * kTestHidden, 1.0, 0.0, kTestDType),
                       .w = ops::RandomValues(rng, kTestHidden, 0.1, 1.0, kTestDType)};
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer x_buf, UploadValues(rt, run.x, kTestDType));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer w_buf, UploadValues(rt, run.w, kTestDType));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer y_buf,
                        DeviceBuffer::Create(rt, kTestRows * kTestHidden * SizeOf(kTestDType)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer rstd_buf, DeviceBuffer::Create(rt, kTestRows * sizeof(float)));
  // NaN everywhere first: an element the kernel does not write fails the check.
  KJIT_RETURN_IF_ERROR(y_buf.Fill(0xFF));
  KJIT_RETURN_IF_ERROR(rstd_buf.Fill(0xFF));
  const RmsNormForwardArgs args{
      .x = TensorView::Matrix(x_buf.data(), kTestDType, kTestRows, kTestHidden),
      .weight = TensorView::Vector(w_buf.data(), kTestDType, kTestHidden),
      .y = TensorView::Matrix(y_buf.data(), kTestDType, kTestRows, kTestHidden),
      .rstd = TensorView::Vector(rstd_buf.data(), DType::kF32, kTestRows)};
  KJIT_RETURN_IF_ERROR(norm.Forward(nullptr, args));
  // A synchronous copy on the default stream: it waits for the launch, and reports its fault.
  KJIT_ASSIGN_OR_RETURN(run.y, DownloadValues(y_buf, kTestDType));
  KJIT_ASSIGN_OR_RETURN(run.rstd, DownloadValues(rstd_buf, DType::kF32));
  KJIT_ASSIGN_OR_RETURN(const double worst, CheckRmsNormInFp32(run));
  return std::make_pair(
      target, fmt::format("{}x{} bf16 matches RMSNorm computed in fp32 (worst error {:.2f} of the "
                          "tolerance)",
                          kTestRows, kTestHidden, worst));
}

// Why `dir` (absent) cannot be created, or "" when it can: its nearest existing ancestor must be a
// directory this user can write.
std::string CreateError(const std::string& dir) {
  std::string p = dir;
  while (true) {
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos) return "";  // relative: created under the working directory
    p = slash == 0 ? "/" : p.substr(0, slash);
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return fmt::format("{} is not a directory", p);
      if (::access(p.c_str(), W_OK | X_OK) != 0) {
        return fmt::format("{}: {}", p, ErrnoText(errno));
      }
      return "";
    }
    if (errno != ENOENT) return fmt::format("{}: {}", p, ErrnoText(errno));
    if (p == "/") return "";
  }
}

// Reads entries without DiskCache (which refuses unsafe directories): for the counts only.
std::vector<CacheEntryFacts> ScanEntries(const std::string& dir) {
  std::vector<CacheEntryFacts> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  static const std::regex kEntryName("^[0-9a-f]{32}\\.kjit$");
  for (const std::string& name : names) {
    if (!std::regex_match(name, kEntryName)) continue;
    CacheEntryFacts e;
    e.key = name.substr(0, 32);
    const std::string path = dir + "/" + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) > kMaxEntryBytes) {
      e.problem = fd < 0 ? ErrnoText(errno) : "not a regular entry file";
      if (fd >= 0) ::close(fd);
      out.push_back(std::move(e));
      continue;
    }
    e.bytes = static_cast<uint64_t>(st.st_size);
    std::string bytes(e.bytes, '\0');
    size_t got = 0;
    while (got < bytes.size()) {
      ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    bytes.resize(got);
    auto bin = jit::DecodeEntryFor(bytes, e.key);
    e.valid = bin.ok();
    if (bin.ok()) {
      e.target = bin->target.ToString();
      e.nvrtc_version = bin->nvrtc_version;
    } else {
      e.problem = Msg(bin.status());
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string ContainerHint() {
  struct stat st {};
  if (::stat("/.dockerenv", &st) == 0) return "/.dockerenv";
  if (::stat("/run/.containerenv", &st) == 0) return "/run/.containerenv";
  if (const char* c = std::getenv("container"); c != nullptr && *c != '\0') {
    return fmt::format("container={}", c);
  }
  const std::string cgroup = ReadSmallFile("/proc/1/cgroup");
  for (const char* word : {"kubepods", "docker", "containerd", "libpod", "lxc"}) {
    if (cgroup.find(word) != std::string::npos) return fmt::format("cgroup: {}", word);
  }
  if (std::getenv("KUBERNETES_SERVICE_HOST") != nullptr) return "KUBERNETES_SERVICE_HOST";
  return "";
}

}  // namespace

absl::StatusOr<double> CheckRmsNormInFp32(const TestLaunchValues& run) {
  constexpr double kYRtol = 0x1p-6, kRstdRtol = 0x1p-12, kAtol = 1e-6;
  struct Differences {
    const char* name;
    int64_t count = 0;
    std::string first;
  } y_diff{"y"}, rstd_diff{"rstd"};
  double worst = 0;
  auto compare = [&](Differences& d, int64_t i, double got, double want, double rtol) {
    const double ratio = std::abs(got - want) / (rtol * std::abs(want) + kAtol);
    if (ratio <= 1) {  // false for a NaN
      worst = std::max(worst, ratio);
    } else if (d.count++ == 0) {
      d.first = fmt::format("{}[{}] = {}, RMSNorm in fp32 gives {}", d.name, i, got, want);
    }
  };
  const int64_t hidden = run.hidden;
  for (int64_t row = 0; row < run.rows; ++row) {
    // bf16 values, exact in fp32.
    const std::vector<float> x(run.x.begin() + row * hidden, run.x.begin() + (row + 1) * hidden);
    float sum_of_squares = 0;
    for (float v : x) sum_of_squares += v * v;
    const float rstd = 1.0f / std::sqrt(sum_of_squares / static_cast<float>(hidden) + run.eps);
    compare(rstd_diff, row, run.rstd[row], rstd, kRstdRtol);
    for (int64_t c = 0; c < hidden; ++c) {
      // Llama casting: the normalized x rounded to bf16, then times w (exact in fp32).
      const double normalized = RoundTo(x[c] * rstd, DType::kBF16);
      compare(y_diff, row * hidden + c, run.y[row * hidden + c], normalized * run.w[c], kYRtol);
    }
  }
  std::string problems;
  for (const Differences* d : {&y_diff, &rstd_diff}) {
    if (d->count == 0) continue;
    const int64_t total = d == &y_diff ? run.rows * hidden : run.rows;
    problems += fmt::format("{}{}: {} of {} elements differ (first {})",
                            problems.empty() ? "" : "; ", d->name, d->count, total, d->first);
  }
  if (!problems.empty()) return absl::InternalError("wrong result: " + problems);
  return worst;
}

EnvFacts ProbeEnv() {
  EnvFacts e;
  for (char** p = environ; p != nullptr && *p != nullptr; ++p) {
    std::string_view kv = *p;
    if (!kv.starts_with("KJIT_")) continue;
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    e.kjit_vars[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) e.cuda_visible_devices = v;
  if (const char* v = std::getenv("LD_LIBRARY_PATH")) e.ld_library_path = v;
  e.container_hint = ContainerHint();
  e.in_container = !e.container_hint.empty();
  if (DIR* d = ::opendir("/dev")) {
    while (dirent* ent = ::readdir(d)) {
      if (std::string_view(ent->d_name).starts_with("nvidia"))
        e.dev_nvidia.emplace_back(ent->d_name);
    }
    ::closedir(d);
    std::sort(e.dev_nvidia.begin(), e.dev_nvidia.end());
  }
  return e;
}

DriverFacts ProbeDriver(const std::vector<std::string>& candidates) {
  DriverFacts d;
  d.candidates = candidates;
  d.release = DriverRelease();
  auto loaded = jit::Driver::Load(candidates);
  if (loaded.ok()) {
    const jit::Driver* cu = KeepLoaded(std::move(*loaded));
    d.path = cu->path();
    d.version = cu->version();
    int count = 0;
    if (absl::Status s = cu->Check(cu->cuDeviceGetCount(&count), "cuDeviceGetCount"); !s.ok()) {
      d.error = DriverFacts::Error::kOther;
      d.message = Msg(s);
      return d;
    }
    if (count == 0) {
      d.error = DriverFacts::Error::kNoDevice;
      d.message = "cuDeviceGetCount: 0 devices";
      return d;
    }
    for (int i = 0; i < count; ++i) {
      auto info = jit::QueryDevice(*cu, i);
      if (!info.ok()) {
        d.error = DriverFacts::Error::kOther;
        d.message = fmt::format("GPU {}: {}", i, Msg(info.status()));
        return d;
      }
      d.gpus.push_back({.ordinal = i,
                        .name = info->name,
                        .cc_major = info->cc_major,
                        .cc_minor = info->cc_minor,
                        .total_memory = info->total_memory,
                        .sm_count = info->sm_count});
    }
    return d;
  }
  d.message = Msg(loaded.status());
  // Classify by what the library does, not by the message's wording.
  auto lib = jit::DynLib::Open(candidates);
  if (!lib.ok()) {
    d.error = DriverFacts::Error::kMissing;
    return d;
  }
  const jit::DynLib* kept = KeepLoaded(std::move(*lib));
  d.path = kept->path();
  using InitFn = CUresult (*)(unsigned);
  using VersionFn = CUresult (*)(int*);
  auto init = reinterpret_cast<InitFn>(kept->Symbol("cuInit"));
  auto version = reinterpret_cast<VersionFn>(kept->Symbol("cuDriverGetVersion"));
  if (init == nullptr) {
    d.error = DriverFacts::Error::kOther;
    return d;
  }
  const CUresult r = init(0);
  if (r == CUDA_ERROR_STUB_LIBRARY) {
    d.error = DriverFacts::Error::kStub;
    return d;
  }
  int v = 0;
  if (version != nullptr && version(&v) == CUDA_SUCCESS && v > 0) d.version = v;
  d.error = r == CUDA_ERROR_NO_DEVICE ? DriverFacts::Error::kNoDevice : DriverFacts::Error::kOther;
  return d;
}

namespace {

NvrtcFacts FactsOf(const absl::StatusOr<jit::Nvrtc>& loaded) {
  NvrtcFacts n;
  if (!loaded.ok()) {
    n.error = Msg(loaded.status());
    return n;
  }
  n.loaded = true;
  n.path = loaded->path();
  n.major = loaded->version().major;
  n.minor = loaded->version().minor;
  n.archs = loaded->supported_archs();
  return n;
}

}  // namespace

NvrtcFacts ProbeNvrtc(const std::vector<std::string>& candidates) {
  auto loaded = jit::Nvrtc::Load(candidates);
  NvrtcFacts n = FactsOf(loaded);
  if (loaded.ok()) KeepLoaded(std::move(*loaded));
  return n;
}

CublasLtFacts ProbeCublasLt(const std::vector<std::string>& candidates) {
  CublasLtFacts c;
  auto lt = ops::CublasLt::Load(candidates);
  if (!lt.ok()) {
    c.error = Msg(lt.status());
    return c;
  }
  const ops::CublasLt* kept = KeepLoaded(std::move(*lt));  // as NVRTC: its C++ runtime's pool
  c.loaded = true;
  c.path = kept->path();
  c.version = kept->version();
  c.cudart = static_cast<int>(kept->cudart_version());
  return c;
}

CacheFacts ProbeCache(const std::string& dir_override) {
  CacheFacts c;
  c.euid = ::geteuid();
  auto options = jit::DiskCache::Options::FromEnvironment();
  if (options.ok()) {
    c.max_bytes = options->max_bytes;
  } else {
    c.config_error = std::string(ToStd(options.status().message()));
  }
  if (!dir_override.empty()) {
    c.dir = dir_override;
    c.dir_source = "given";
  } else {
    c.dir = jit::DiskCache::DefaultDirectory();
    auto set = [](const char* name) {
      const char* v = std::getenv(name);
      return v != nullptr && *v != '\0';
    };
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    c.dir_source = set("KJIT_CACHE_DIR")             ? "KJIT_CACHE_DIR"
                   : xdg != nullptr && xdg[0] == '/' ? "XDG_CACHE_HOME"
                   : set("HOME")                     ? "HOME"
                                                     : "the password database";
  }
  while (c.dir.size() > 1 && c.dir.back() == '/') c.dir.pop_back();
  if (c.dir.empty()) return c;

  struct stat st {};
  if (::stat(c.dir.c_str(), &st) != 0) {
    c.create_error = errno == ENOENT || errno == ENOTDIR ? CreateError(c.dir) : ErrnoText(errno);
    c.dangling_symlink = jit::DescribeDanglingSymlink(c.dir);
    if (!c.dangling_symlink.empty()) c.create_error = c.dangling_symlink;
    return c;
  }
  c.exists = true;
  c.is_dir = S_ISDIR(st.st_mode);
  if (!c.is_dir) return c;
  c.mode = st.st_mode & 07777;
  c.owner_uid = st.st_uid;
  const bool safe = st.st_uid == c.euid && (st.st_mode & 022) == 0;
  if (safe) {
    // DiskCache itself decides writability (it tries to create a file): the same answer kjit gets.
    auto cache = jit::DiskCache::Open({.dir = c.dir, .max_bytes = c.max_bytes});
    if (cache.ok()) {
      c.writable = !cache->read_only();
      c.not_writable_reason = cache->warning();
      c.listed = true;
      for (const jit::DiskCache::EntryInfo& info : cache->List()) {
        CacheEntryFacts e{.key = info.key,
                          .bytes = info.size_bytes,
                          .valid = info.valid,
                          .problem = FirstLine(info.problem)};
        if (info.binary) {
          e.target = info.binary->target.ToString();
          e.nvrtc_version = info.binary->nvrtc_version;
        }
        c.entries.push_back(std::move(e));
      }
      return c;
    }
    c.not_writable_reason = Msg(cache.status());
    return c;
  }
  c.writable = ::access(c.dir.c_str(), W_OK | X_OK) == 0;
  if (!c.writable) c.not_writable_reason = ErrnoText(errno);
  c.entries = ScanEntries(c.dir);
  c.listed = true;
  return c;
}

namespace {

// "a directory", "a FIFO", ...: what stands where a file should.
std::string FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// What Load said, for a finding that names the path and has a fix of its own: the first line
// without its "tuning db PATH: " prefix and "; fix: ..." tail. Only presentation: if Load words it
// otherwise, more of its text shows.
std::string LoadProblem(const absl::Status& status, const std::string& path) {
  std::string m = Msg(status);
  if (const size_t fix = m.find("; fix: "); fix != std::string::npos) m.resize(fix);
  for (const std::string& prefix : {"tuning db " + path + ": ", std::string("tuning db: ")}) {
    if (m.starts_with(prefix)) return m.substr(prefix.size());
  }
  return m;
}

}  // namespace

TuningFacts ProbeTuning() {
  TuningFacts t;
  t.path = internal::TuningDb::DefaultPath();
  if (t.path.empty()) return t;  // kNoPath
  std::error_code ec;
  t.absolute = std::filesystem::absolute(t.path, ec).string();
  if (ec) t.absolute = t.path;
  // The runtime's own Load, so that doctor warns exactly where a runtime would.
  absl::StatusOr<internal::TuningDb> db = internal::TuningDb::Load(t.path);
  struct stat st {};
  const bool exists = ::stat(t.path.c_str(), &st) == 0;
  if (db.ok()) {
    // Load reads a missing file as an empty database.
    t.state = exists || !db->records().empty() ? TuningFacts::State::kLoaded
                                               : TuningFacts::State::kMissing;
    // Each record as a launch would read it (issue 34, defect 9: doctor said "10 apply" while the
    // runtime refused five).
    const std::vector<absl::Status> checked = ops::CheckTuningRecords(db->records());
    for (size_t i = 0; i < db->records().size(); ++i) {
      const internal::TuningRecord& r = db->records()[i];
      const absl::Status& why = checked[i];
      t.records.push_back(
          {.device = r.key.device,
           .arch = r.key.arch,
           .driver = r.key.driver,
           .nvrtc = r.key.nvrtc,
           .what = fmt::format("{} {} {} rows<={}: {}", jit::Printable(r.key.op),
                               jit::Printable(r.key.shape), jit::Printable(r.key.dtype),
                               r.key.rows_bucket, jit::Quoted(r.config)),
           .refused = why.ok() || absl::IsUnavailable(why) ? "" : std::string(why.message())});
    }
    return t;
  }
  t.error = LoadProblem(db.status(), t.path);
  if (db.status().code() == absl::StatusCode::kDataLoss) {
    t.state = TuningFacts::State::kCorrupt;
  } else if (exists && !S_ISREG(st.st_mode)) {
    t.state = TuningFacts::State::kNotAFile;
    t.what = FileKind(st.st_mode);
  } else {
    t.state = TuningFacts::State::kUnreadable;
  }
  return t;
}

void FixCache(DoctorFacts& facts) {
  CacheFixFacts fix;
  fix.ran = true;
  const CacheFacts& c = facts.cache;
  if (!c.config_error.empty() || c.dir.empty()) {
    fix.refused = "the cache configuration is invalid (see cache.dir)";
  } else if (c.exists && !c.is_dir) {
    fix.refused = fmt::format("{} is not a directory", c.dir);
  } else if (c.exists && (c.owner_uid != c.euid || (c.mode & 022) != 0)) {
    fix.refused =
        fmt::format("{} is not safe (see cache.permissions), so it is not touched", c.dir);
  } else if (c.exists && !c.writable) {
    fix.refused = fmt::format("{} is read-only ({})", c.dir, FirstLine(c.not_writable_reason));
  } else if (c.exists) {
    // DiskCache's own removal, which also takes a directory squatting on an entry's name.
    absl::StatusOr<jit::DiskCache> cache = jit::DiskCache::Open({.dir = c.dir});
    if (!cache.ok()) {
      fix.refused = Msg(cache.status());
    } else {
      for (const CacheEntryFacts& e : c.entries) {
        const EntryVerdict v = JudgeCacheEntry(e, facts);
        if (v == EntryVerdict::kUsable) continue;
        if (absl::Status removed = cache->Remove(e.key);
            !removed.ok() && !absl::IsNotFound(removed)) {  // NotFound: another process did it
          fix.errors.push_back(fmt::format("{}: {}", e.key, Msg(removed)));
          continue;
        }
        ++(v == EntryVerdict::kCorrupt ? fix.removed_corrupt : fix.removed_stale);
      }
    }
  }
  facts.cache = ProbeCache(c.dir_source == "given" ? c.dir : "");
  facts.cache.fix = std::move(fix);
}

DoctorFacts GatherFacts(const ProbeOptions& options) {
  DoctorFacts f;
  f.kjit_version = VersionString();
  if (f.kjit_version.starts_with("kjit ")) f.kjit_version.erase(0, 5);
  f.env = ProbeEnv();
  f.driver = ProbeDriver(jit::DefaultDriverCandidates());
  f.arch_targets = options.arch_targets;

  auto loaded = jit::Nvrtc::LoadDefault();
  f.nvrtc = FactsOf(loaded);
  if (loaded.ok()) {
    KeepLoaded(std::move(*loaded));
    // The runtimes of the test compiles load it again as Nvrtc::Get(), from the same candidates.
    for (const std::string& target : TargetsInUse(f)) f.compiles.push_back(TestCompile(target));
  }

  for (const GpuFacts& g : f.driver.gpus) {
    LaunchFacts l;
    l.ordinal = g.ordinal;
    if (!f.driver.ok()) {
      l.detail = "the driver is not usable";
    } else if (!f.nvrtc.loaded) {
      l.detail = "NVRTC is not available";
    } else if (!options.launch) {
      l.state = LaunchFacts::State::kSkipped;
      l.detail = "skipped (--no-launch)";
    } else {
      auto target =
          jit::SelectTargetForDevice(g.cc(), f.nvrtc.archs, f.nvrtc.version(), f.driver.version);
      const CompileFacts* compiled = nullptr;
      for (const CompileFacts& c : f.compiles) {
        if (target.ok() && c.target == target->ToString()) compiled = &c;
      }
      if (!target.ok()) {
        l.detail = "no target kjit can build for this GPU (see target.gpu." +
                   std::to_string(g.ordinal) + ")";
      } else if (compiled == nullptr || !compiled->ok) {
        l.detail = "the test compile for " + target->ToString() + " failed";
      } else {
        auto r = LaunchOnce(g.ordinal);
        if (r.ok()) {
          l.state = LaunchFacts::State::kOk;
          l.target = r->first;
          l.detail = r->second;
        } else {
          l.state = LaunchFacts::State::kError;
          l.target = target->ToString();
          l.detail = std::string(ToStd(r.status().message()));
        }
      }
    }
    f.launches.push_back(std::move(l));
  }

  f.cublaslt = ProbeCublasLt(ops::CublasLt::DefaultCandidates());
  f.cache = ProbeCache();
  if (options.fix_cache) FixCache(f);
  f.tuning = ProbeTuning();
  return f;
}

}  // namespace kjit::tools
