// Cache stress (issue 7): 16 processes share one disk cache for 40 s while this test SIGKILLs them
// at random (mid-compile, mid-write), fills the disk, makes the directory read-only and dates files
// years into the past and the future. Afterwards `kjit cache verify` must find no corrupt entry,
// every entry must decode to exactly what its writer stored (real ones: a CUDA ELF that `kjit
// compile` loads back from the cache), and prune must leave nothing but entries. It prints the
// counts, and fails when a phase did not bite (no kill, no failed write), since then it proved
// nothing.
//
// Most traffic is synthetic entries stored through DiskCache (1 KiB to 512 KiB, content fixed by
// the key, so any reader can check any entry); two workers at a time run the real `kjit compile`
// (NVRTC, about 0.3 s) for RMSNorm shapes, so kills also land mid-compile and CUBINs share the
// cache. A size cap makes nearly every store evict.
//
// What privileges allow decides the mechanisms; the report names the ones that ran:
//   full disk  a 32 MiB tmpfs in a private mount namespace that the test keeps filled (needs
//              CAP_SYS_ADMIN), else RLIMIT_FSIZE in the workers (SIGXFSZ ignored): writes past
//              16 KiB fail with EFBIG.
//   read-only  chmod 0555 on the cache directory. Root ignores permission bits, so as root the
//              workers run as uid 65534 over a tree chowned to it (the cache refuses a directory
//              owned by another user, so it is chowned back for the checks afterwards); where root
//              cannot switch to it, the phase is reported SKIPPED and the rest still runs.
#include "tests/test_support.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jit/disk_cache.h"

namespace kjit::jit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kjit::testing::CliResult;
using kjit::testing::NamesWithPrefix;
using kjit::testing::RunKjit;
using std::chrono::milliseconds;

constexpr int kWorkers = 16;
constexpr int kSyntheticKeys = 256;
constexpr int kRealShapes = 8;                     // RMSNorm hidden 64, 72, ..., 120 for sm_90
constexpr int kMaxCompilesInFlight = 2;            // NVRTC is CPU-bound and CI has 2 cores
constexpr uint64_t kCapBytes = uint64_t{4} << 20;  // KJIT_CACHE_MAX_BYTES, ~40 average entries
constexpr uint64_t kTmpfsBytes = uint64_t{32} << 20;
constexpr rlim_t kFullDiskFileLimit = 16 << 10;  // RLIMIT_FSIZE while the disk is "full"
constexpr uid_t kNobody = 65534;
constexpr int64_t kStaleTempSeconds = 3600;  // DiskCache's age for a dead writer's temp file

// The schedule in seconds from the start; kills and mtime skew run throughout.
constexpr double kDiskFullFrom = 6, kDiskFullTo = 16, kReadOnlyFrom = 22, kReadOnlyTo = 32,
                 kStopAt = 40;

enum Phase : int { kNormal, kDiskFull, kReadOnly };
// What a worker is doing, read by the parent after a kill to say where the kill landed.
enum WorkerState : int { kIdle, kCompiling, kStoring };

// Lives in MAP_SHARED memory: workers count into it, the parent steers through it.
struct Shared {
  std::atomic<bool> stop{false};
  std::atomic<int> phase{kNormal};
  std::array<std::atomic<int>, kWorkers> state{};
  std::atomic<int64_t> ops{0}, hits{0}, stored{0}, corrupt_hits{0};
  std::atomic<int64_t> compile_runs{0}, compiled_stored{0}, compiled_memory_only{0},
      compile_disk_hits{0}, compile_failures{0};
  std::atomic<int64_t> no_space{0}, file_too_large{0}, read_only_opens{0}, refused_read_only{0},
      temp_pruned_under_writer{0}, other_errors{0}, open_errors{0}, prunes{0};
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "counters must work across processes");

std::string SyntheticKey(int index) { return fmt::format("{:032x}", 0x5eed0000 + index); }

// The content is a function of the index alone, so every writer of a key writes the same bytes
// and any reader can check a hit.
Binary SyntheticBinary(int index) {
  Binary b;
  b.target = ParseTarget("sm_90").value();
  b.code.resize(size_t{1024} << (index % 10));
  for (size_t i = 0; i < b.code.size(); ++i)
    b.code[i] = static_cast<char>((i * 131 + index) & 0xff);
  b.lowered_names = {{"kjit::stress", "_ZN4kjit6stressEv"}};
  b.nvrtc_version = "13.0";
  b.options = {"--gpu-architecture=sm_90"};
  b.params = {{"op", "stress"}, {"index", std::to_string(index)}};
  b.program_name = "stress";
  b.created_unix = 1'790'000'000;
  return b;
}

// A CUBIN is a 64-bit ELF for EM_CUDA (190).
bool IsCudaElf(const std::string& code) {
  return code.size() >= 64 &&
         code.compare(0, 4,
                      "\x7f"
                      "ELF") == 0 &&
         code[4] == 2 && static_cast<unsigned char>(code[18]) == 190 && code[19] == 0;
}

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

int64_t MtimeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mtim.tv_sec : 0;
}

void SetMtime(const std::string& path, int64_t unix_seconds) {
  timespec times[2] = {{unix_seconds, 0}, {unix_seconds, 0}};
  ::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW);  // gone meanwhile: fine
}

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// Leaves root for uid/gid 65534, so that permission bits bind.
bool DropToNobody() {
  return ::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0;
}

// Mounts a tmpfs of kTmpfsBytes at `dir`, owned by uid:gid, in a mount namespace of this process
// alone (the workers and the kjit binaries inherit it; the host never sees it). Empty on success.
std::string MountPrivateTmpfs(const std::string& dir, uid_t uid, gid_t gid) {
  if (::unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS): " + ErrnoText(errno);
  // Else, where / is a shared mount, the tmpfs would propagate back to the host's namespace.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return "making / private: " + ErrnoText(errno);
  }
  if (::mkdir(dir.c_str(), 0700) != 0) return "mkdir: " + ErrnoText(errno);
  const std::string opts = fmt::format("size={},mode=0700,uid={},gid={}", kTmpfsBytes, uid, gid);
  if (::mount("kjit-stress", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
    return "mount -t tmpfs: " + ErrnoText(errno);
  }
  return "";
}

struct Config {
  std::string root;  // scratch files of the workers (not on the small filesystem)
  std::string cache_dir;
  bool use_rlimit = false;  // full disk by RLIMIT_FSIZE rather than a filled tmpfs
  bool drop_to_nobody = false;
};

// Runs `kjit compile` for one RMSNorm shape, as a user would, and counts what it says it did.
void RealCompile(int slot, int hidden, const Config& config, Shared& shared) {
  const std::string out = fmt::format("{}/worker-{}.out", config.root, slot);
  const std::string err = fmt::format("{}/worker-{}.err", config.root, slot);
  const std::string hidden_text = std::to_string(hidden);
  ++shared.compile_runs;
  const pid_t pid = ::fork();
  if (pid == 0) {
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(126);
    ::execl(KJIT_CLI_PATH, "kjit", "compile", "--op", "rms_norm", "--hidden", hidden_text.c_str(),
            "--dtype", "bf16", "--arch", "sm_90", "--json", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const nlohmann::json report =
      nlohmann::json::parse(kjit::testing::ReadFile(out), nullptr, /*allow_exceptions=*/false);
  // A kernel kept in memory only (the cache full or read-only) exits 1 with its report.
  const bool memory_only =
      report.is_array() && report.size() == 1 && report[0].value("stored", true) == false;
  const int expected_exit = memory_only ? 1 : 0;
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != expected_exit || !report.is_array() ||
      report.size() != 1) {
    if (++shared.compile_failures <= 3) {
      fmt::print(stderr, "worker {}: kjit compile --hidden {} failed (status {:#x}):\n{}\n", slot,
                 hidden, status, kjit::testing::ReadFile(err));
    }
    return;
  }
  const std::string origin = report[0].value("origin", "");
  if (origin == "disk cache") {
    ++shared.compile_disk_hits;
  } else if (memory_only) {
    ++shared.compiled_memory_only;  // the cache was full or read-only; kjit kept it in memory
  } else {
    ++shared.compiled_stored;
  }
}

void CountStoreFailure(const absl::Status& s, Shared& shared) {
  if (absl::IsResourceExhausted(s)) {
    ++shared.no_space;
  } else if (s.message().find(ErrnoText(EFBIG)) != absl::string_view::npos) {
    ++shared.file_too_large;
  } else if (absl::IsPermissionDenied(s)) {
    ++shared.refused_read_only;  // the directory turned read-only after this process opened it
  } else if (absl::IsNotFound(s)) {
    // A worker's Prune took the temp file because the parent had dated it years away.
    ++shared.temp_pruned_under_writer;
  } else if (++shared.other_errors <= 5) {
    fmt::print(stderr, "stress: unexpected store failure: {}\n", s.ToString());
  }
}

// Looks a synthetic key up and, on a miss, stores it the way Jit does: under the key's lock,
// after a second lookup.
void SyntheticOp(int slot, int index, const DiskCache& cache, Shared& shared) {
  const std::string key = SyntheticKey(index);
  const Binary expected = SyntheticBinary(index);
  auto check = [&](const Binary& hit) {
    ++shared.hits;
    if (hit.code != expected.code || hit.params != expected.params) ++shared.corrupt_hits;
  };
  if (std::optional<Binary> hit = cache.Lookup(key)) return check(*hit);
  if (cache.read_only()) return;
  std::optional<DiskCache::KeyLock> lock;
  if (absl::StatusOr<DiskCache::KeyLock> l = cache.LockKey(key, milliseconds(2000)); l.ok()) {
    lock.emplace(std::move(*l));
    if (std::optional<Binary> hit = cache.Lookup(key)) return check(*hit);
  }
  shared.state[slot] = kStoring;
  const absl::Status s = cache.Store(key, expected);
  shared.state[slot] = kIdle;
  if (s.ok()) {
    ++shared.stored;
  } else {
    CountStoreFailure(s, shared);
  }
}

int CompilesInFlight(const Shared& shared) {
  return static_cast<int>(std::count_if(shared.state.begin(), shared.state.end(),
                                        [](const std::atomic<int>& s) { return s == kCompiling; }));
}

// One worker process: random operations until told to stop.
int RunWorker(int slot, const Config& config, Shared& shared) {
  std::mt19937_64 rng(static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ULL ^
                      static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  const DiskCache::Options options{.dir = config.cache_dir, .max_bytes = kCapBytes};
  rlimit fsize{};
  ::getrlimit(RLIMIT_FSIZE, &fsize);
  const rlim_t unlimited = fsize.rlim_max;
  std::optional<DiskCache> cache;
  while (!shared.stop) {
    ++shared.ops;
    if (config.use_rlimit) {
      fsize.rlim_cur =
          shared.phase == kDiskFull ? std::min(kFullDiskFileLimit, unlimited) : unlimited;
      ::setrlimit(RLIMIT_FSIZE, &fsize);
    }
    if (rng() % 8 == 0 && CompilesInFlight(shared) < kMaxCompilesInFlight) {
      shared.state[slot] = kCompiling;
      RealCompile(slot, 64 + 8 * static_cast<int>(rng() % kRealShapes), config, shared);
      shared.state[slot] = kIdle;
      continue;
    }
    // Mostly the cache opened earlier, as in a long training job, so that the directory turns
    // read-only under open caches; now and then a fresh open, as in a new process, which notices.
    if (!cache || rng() % 16 == 0) {
      absl::StatusOr<DiskCache> opened = DiskCache::Open(options);
      if (!opened.ok()) {
        if (++shared.open_errors <= 3)
          fmt::print(stderr, "stress: open: {}\n", opened.status().ToString());
        continue;
      }
      cache.emplace(*std::move(opened));
      if (cache->read_only()) ++shared.read_only_opens;
    }
    if (rng() % 100 == 0) {
      // Someone runs `kjit cache prune` meanwhile.
      if (cache->Prune().ok()) ++shared.prunes;
    } else {
      SyntheticOp(slot, static_cast<int>(rng() % kSyntheticKeys), *cache, shared);
    }
    // A short pause keeps 16 processes from starving the compiles on a 2-core machine.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
  }
  return 0;
}

class CacheStressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kjit_cache_stress_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    void* mem =
        ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    shared_ = new (mem) Shared();
  }

  void TearDown() override {
    // Workers still running when an assertion ended the test early.
    for (pid_t& pid : pids_) {
      if (pid <= 0) continue;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = 0;
    }
    if (filler_fd_ >= 0) ::close(filler_fd_);
    if (!fs_mount_.empty()) ::umount2(fs_mount_.c_str(), MNT_DETACH);
    std::error_code ec;
    if (!config_.cache_dir.empty()) ::chmod(config_.cache_dir.c_str(), 0700);
    fs::remove_all(root_, ec);
    if (shared_ != nullptr) {
      shared_->~Shared();
      ::munmap(shared_, sizeof(Shared));
    }
  }

  // Starts (or restarts) the worker in `slot`; false when fork fails.
  bool StartWorker(int slot) {
    shared_->state[slot] = kIdle;
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its own process group, so that one kill takes the worker and the kjit it runs.
      ::setpgid(0, 0);
      // The filler's space must come back when the parent deletes it.
      if (filler_fd_ >= 0) ::close(filler_fd_);
      ::signal(SIGXFSZ, SIG_IGN);  // RLIMIT_FSIZE: a failed write, not a dead process
      if (config_.drop_to_nobody && !DropToNobody()) ::_exit(3);
      ::_exit(RunWorker(slot, config_, *shared_));
    }
    if (pid > 0) ::setpgid(pid, pid);  // also here: the parent may kill before the child runs
    pids_[slot] = std::max(pid, 0);
    return pid > 0;
  }

  std::string root_;
  std::string fs_mount_;  // the tmpfs, when mounted
  int filler_fd_ = -1;    // the file that keeps the tmpfs full
  Config config_;
  Shared* shared_ = nullptr;
  std::array<pid_t, kWorkers> pids_{};  // 0: none
};

TEST_F(CacheStressTest, SixteenProcessesWithKillsFullDiskReadOnlyAndClockSkew) {
  const auto start = Clock::now();
  const bool root = ::geteuid() == 0;
  config_.root = root_;

  // Read-only by chmod needs workers that permission bits bind: as root, workers run as nobody.
  std::string read_only_skip;
  if (root) {
    // Probe in a child: the switch cannot be undone, and nobody must be able to run kjit.
    const pid_t probe = ::fork();
    if (probe == 0) {
      if (!DropToNobody()) ::_exit(1);
      ::_exit(::access(KJIT_CLI_PATH, X_OK) == 0 ? 0 : 2);
    }
    int status = 0;
    ::waitpid(probe, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    config_.drop_to_nobody = rc == 0;
    if (rc != 0) {
      read_only_skip = rc == 2
                           ? fmt::format("uid {} cannot run {}", kNobody, KJIT_CLI_PATH)
                           : fmt::format("running as root and cannot switch to uid {}", kNobody);
    }
  }
  const uid_t owner = config_.drop_to_nobody ? kNobody : ::geteuid();
  const gid_t group = config_.drop_to_nobody ? kNobody : ::getegid();
  ASSERT_EQ(::chown(root_.c_str(), owner, group), 0);

  const std::string tmpfs_why = MountPrivateTmpfs(root_ + "/fs", owner, group);
  if (tmpfs_why.empty()) fs_mount_ = root_ + "/fs";
  config_.use_rlimit = !tmpfs_why.empty();
  config_.cache_dir = (config_.use_rlimit ? root_ : fs_mount_) + "/cache";
  ASSERT_EQ(::mkdir(config_.cache_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(config_.cache_dir.c_str(), owner, group), 0);
  const std::string filler = fs_mount_ + "/filler";

  kjit::testing::ScopedEnv dir_env("KJIT_CACHE_DIR", config_.cache_dir.c_str());
  kjit::testing::ScopedEnv cap_env("KJIT_CACHE_MAX_BYTES", std::to_string(kCapBytes).c_str());
  // Orphaned kjit processes (their worker was killed) are reparented here and reaped below.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(StartWorker(i)) << "fork: " << ErrnoText(errno);

  std::mt19937_64 rng(static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  int kills = 0, restarts = 0, crashes = 0, skews = 0;
  std::array<int, 3> kills_by_state{};
  const std::string chunk(4096, 'f');  // a page: the tmpfs ends up full to the last one
  auto next_kill = Clock::now() + milliseconds(100);
  auto next_skew = Clock::now();

  // Reaps whatever exited on its own: a worker doing so is a crash (they run until told to stop);
  // anything else is an orphaned kjit.
  auto reap = [&] {
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = std::find(pids_.begin(), pids_.end(), pid);
      if (it == pids_.end()) continue;
      ++crashes;
      ADD_FAILURE() << "worker " << pid << " died on its own: status " << status;
      StartWorker(static_cast<int>(it - pids_.begin()));
    }
  };

  while (seconds() < kStopAt) {
    reap();
    const double t = seconds();
    const int phase = t >= kDiskFullFrom && t < kDiskFullTo   ? kDiskFull
                      : t >= kReadOnlyFrom && t < kReadOnlyTo ? kReadOnly
                                                              : kNormal;
    if (phase != shared_->phase) {
      if (shared_->phase == kDiskFull && filler_fd_ >= 0) {
        ::close(std::exchange(filler_fd_, -1));
        ::unlink(filler.c_str());
      }
      if (read_only_skip.empty()) {
        ::chmod(config_.cache_dir.c_str(), phase == kReadOnly ? 0555 : 0700);
      }
      shared_->phase = phase;
    }
    if (phase == kDiskFull && !config_.use_rlimit) {
      // Evictions free space all the time; take it back.
      if (filler_fd_ < 0) {
        filler_fd_ = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      }
      while (filler_fd_ >= 0 && ::write(filler_fd_, chunk.data(), chunk.size()) > 0) {
      }
    }

    if (Clock::now() >= next_kill) {
      // A sixteenth of the kills go for a worker that is compiling, a quarter for one inside
      // Store, the rest for anyone, so that both moments are hit often while most compiles (0.3 s,
      // several seconds under a sanitizer) still finish.
      std::vector<int> candidates;
      const int want = rng() % 16 == 0 ? kCompiling : rng() % 15 < 4 ? kStoring : -1;
      for (int i = 0; i < kWorkers; ++i) {
        if (want < 0 || shared_->state[i] == want) candidates.push_back(i);
      }
      if (candidates.empty()) candidates.push_back(static_cast<int>(rng() % kWorkers));
      const int slot = candidates[rng() % candidates.size()];
      if (pids_[slot] > 0) {
        ::kill(-pids_[slot], SIGKILL);
        int status = 0;
        ::waitpid(pids_[slot], &status, 0);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
          ++kills;
          ++kills_by_state[shared_->state[slot]];  // the dead worker's last state
        } else {
          ++crashes;
          ADD_FAILURE() << "worker " << pids_[slot] << " had exited on its own: status " << status;
        }
      }
      restarts += StartWorker(slot);
      next_kill = Clock::now() + milliseconds(100 + rng() % 300);
    }

    if (Clock::now() >= next_skew) {
      // A clock that jumped: entries and temp files dated up to 30 years away, either way.
      std::vector<std::string> names = NamesWithPrefix(config_.cache_dir, "");
      for (int n = 0; n < 3 && !names.empty(); ++n) {
        const std::string& name = names[rng() % names.size()];
        if (!name.ends_with(".kjit") && !name.starts_with(".tmp-")) continue;
        const int64_t years = 1 + static_cast<int64_t>(rng() % 30);
        SetMtime(config_.cache_dir + "/" + name, Now() + (rng() % 2 ? 1 : -1) * years * 31'557'600);
        ++skews;
      }
      next_skew = Clock::now() + milliseconds(100);
    }
    std::this_thread::sleep_for(milliseconds(10));
  }

  // Stop. A worker finishes its operation (a lock wait is 2 s at most, a compile well under 60 s);
  // one that does not is hung.
  shared_->stop = true;
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  int hung = 0;
  for (pid_t& pid : pids_) {
    if (pid <= 0) continue;
    int status = 0;
    pid_t got = 0;
    while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (got == 0) {
      ++hung;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++crashes;
    }
    pid = 0;
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  const double traffic_seconds = seconds();
  ASSERT_EQ(::chmod(config_.cache_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(config_.cache_dir.c_str(), ::geteuid(), ::getegid()), 0);
  const Shared& s = *shared_;

  // ---- afterwards: the cache is whole ----------------------------------------------------------
  const std::map<std::string, std::string> env = {
      {"KJIT_CACHE_DIR", config_.cache_dir}, {"KJIT_CACHE_MAX_BYTES", std::to_string(kCapBytes)}};
  CliResult verify = RunKjit({"cache", "verify", "--json"}, env, root_);
  EXPECT_EQ(verify.exit_code, 0) << verify.Describe();
  const nlohmann::json verified = nlohmann::json::parse(verify.out, nullptr, false);
  ASSERT_TRUE(verified.is_object()) << verify.Describe();
  EXPECT_EQ(verified.value("invalid", -1), 0) << verify.out;

  absl::StatusOr<DiskCache> cache =
      DiskCache::Open({.dir = config_.cache_dir, .max_bytes = kCapBytes});
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_FALSE(cache->read_only()) << cache->warning();
  int synthetic_ok = 0, cubins_ok = 0, reloaded = 0, future_dated = 0;
  for (const DiskCache::EntryInfo& e : cache->List()) {
    ASSERT_TRUE(e.valid) << e.key << ": " << e.problem;
    future_dated += e.mtime_unix > Now() + kStaleTempSeconds;
    std::optional<Binary> again = cache->Lookup(e.key);
    ASSERT_TRUE(again.has_value()) << e.key;
    EXPECT_TRUE(again->code == e.binary->code) << e.key;
    if (e.binary->program_name == "stress") {
      const int index = std::stoi(e.binary->params.at("index"));
      EXPECT_EQ(e.key, SyntheticKey(index));
      EXPECT_TRUE(again->code == SyntheticBinary(index).code) << e.key;
      ++synthetic_ok;
      continue;
    }
    EXPECT_TRUE(IsCudaElf(again->code)) << e.key << " is not a CUBIN";
    EXPECT_FALSE(again->lowered_names.empty()) << e.key;
    ++cubins_ok;
    // The real path loads it back: `kjit compile` for its shape must be served by this entry.
    const std::string hidden = e.binary->params.at("hidden");
    CliResult r = RunKjit({"compile", "--op", "rms_norm", "--hidden", hidden, "--dtype", "bf16",
                           "--arch", "sm_90", "--json"},
                          env, root_);
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(r.exit_code == 0 && j.is_array() && j.size() == 1) << r.Describe();
    EXPECT_EQ(j[0].value("origin", ""), "disk cache") << r.out;
    EXPECT_EQ(j[0].value("key", ""), e.key) << r.out;
    ++reloaded;
  }
  const int entries = synthetic_ok + cubins_ok;
  EXPECT_EQ(verified.value("entries", nlohmann::json::array()).size(),
            static_cast<size_t>(entries));

  // Temp files of killed writers: prune takes the ones dated far away at once (a clock jump says
  // nothing about a writer being alive), leaves the young ones (as it would a live write's), and
  // takes those too once they are an hour old.
  const std::vector<std::string> temps = NamesWithPrefix(config_.cache_dir, ".tmp-");
  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  const std::vector<std::string> young = NamesWithPrefix(config_.cache_dir, ".tmp-");
  for (const std::string& name : young) {
    const int64_t age = Now() - MtimeOf(config_.cache_dir + "/" + name);
    EXPECT_LE(std::abs(age), kStaleTempSeconds)
        << name << " dated " << age << " s ago survived prune";
    SetMtime(config_.cache_dir + "/" + name, Now() - 2 * kStaleTempSeconds);
  }
  ASSERT_TRUE(cache->Prune().ok());
  uint64_t total = 0;
  for (const std::string& name : NamesWithPrefix(config_.cache_dir, "")) {
    EXPECT_TRUE(name.ends_with(".kjit")) << name << " left after prune (no process is running)";
    struct stat st {};
    if (::lstat((config_.cache_dir + "/" + name).c_str(), &st) == 0) total += st.st_size;
  }
  EXPECT_LE(total, kCapBytes) << "prune left the cache over its cap";
  verify = RunKjit({"cache", "verify"}, env, root_);
  EXPECT_EQ(verify.exit_code, 0) << verify.Describe();

  // ---- the report --------------------------------------------------------------------------
  const double total_seconds = seconds();
  fmt::print(
      "cache stress: {} workers for {:.0f} s ({} restarts after kills), {}\n"
      "  full disk: {}\n"
      "  read-only: {}\n"
      "  clock skew: {} mtimes set 1 to 30 years into the past or future; {} prunes by workers\n"
      "  operations {}: {} synthetic entries stored, {} hits (0 corrupt: {})\n"
      "  kjit compile {} runs: {} compiled and stored, {} compiled but kept in memory (full or "
      "read-only cache), {} served by the cache, {} killed, {} failed\n"
      "  kills (SIGKILL) {}: {} mid-compile, {} inside DiskCache::Store, {} elsewhere\n"
      "  write failures: ENOSPC {}, EFBIG {}, refused by the read-only directory {}, temp file "
      "pruned under its writer {}, other {}; opens that fell back to read-only {}\n"
      "  afterwards: {} entries verified ({} synthetic byte-exact, {} CUBIN ELF, {} reloaded by "
      "kjit compile; {} dated in the future), verify exit {}; {} temp files left by killed or "
      "cut-off writers, {} dated "
      "far away removed by the first prune, the rest once an hour old; {} bytes under the {}-byte "
      "cap\n"
      "  runtime {:.1f} s ({:.1f} s of traffic)\n",
      kWorkers, kStopAt, restarts, config_.drop_to_nobody ? "as uid 65534" : "as this user",
      config_.use_rlimit
          ? fmt::format("RLIMIT_FSIZE {} KiB in the workers, seconds {}-{} (no tmpfs: {})",
                        kFullDiskFileLimit >> 10, kDiskFullFrom, kDiskFullTo, tmpfs_why)
          : fmt::format("{} MiB tmpfs in a private mount namespace, kept full "
                        "seconds {}-{}",
                        kTmpfsBytes >> 20, kDiskFullFrom, kDiskFullTo),
      read_only_skip.empty()
          ? fmt::format(
                "chmod 0555 seconds {}-{}{}", kReadOnlyFrom, kReadOnlyTo,
                config_.drop_to_nobody ? " (root ignores it: workers run as uid 65534)" : "")
          : "SKIPPED: " + read_only_skip,
      skews, s.prunes.load(), s.ops.load(), s.stored.load(), s.hits.load(),
      s.corrupt_hits == 0 ? "yes" : "NO", s.compile_runs.load(), s.compiled_stored.load(),
      s.compiled_memory_only.load(), s.compile_disk_hits.load(),
      s.compile_runs - s.compiled_stored - s.compiled_memory_only - s.compile_disk_hits -
          s.compile_failures,
      s.compile_failures.load(), kills, kills_by_state[kCompiling], kills_by_state[kStoring],
      kills_by_state[kIdle], s.no_space.load(), s.file_too_large.load(), s.refused_read_only.load(),
      s.temp_pruned_under_writer.load(), s.other_errors.load(), s.read_only_opens.load(), entries,
      synthetic_ok, cubins_ok, reloaded, future_dated, verify.exit_code, temps.size(),
      temps.size() - young.size(), total, kCapBytes, total_seconds, traffic_seconds);
  if (!read_only_skip.empty()) fmt::print("SKIPPED read-only phase: {}\n", read_only_skip);

  // Every phase must have bitten, or the run proved nothing.
  EXPECT_EQ(s.corrupt_hits, 0) << "a lookup returned bytes other than those stored";
  EXPECT_EQ(crashes, 0);
  EXPECT_EQ(hung, 0) << "workers did not stop within 60 s (a deadlock?)";
  EXPECT_EQ(s.compile_failures, 0);
  EXPECT_EQ(s.open_errors, 0);
  EXPECT_EQ(s.other_errors, 0);
  EXPECT_GT(kills_by_state[kCompiling], 0);
  EXPECT_GT(kills_by_state[kStoring], 0);
  EXPECT_GT(s.stored, 0);
  EXPECT_GT(s.compiled_stored, 0);
  EXPECT_GT(s.no_space + s.file_too_large, 0) << "the full disk failed no write";
  if (read_only_skip.empty()) {
    EXPECT_GT(s.read_only_opens, 0) << "no open saw the read-only directory";
    EXPECT_GT(s.refused_read_only, 0) << "no write was refused by the read-only directory";
  }
  EXPECT_GT(skews, 0);
  EXPECT_GT(synthetic_ok, 0);
}

}  // namespace
}  // namespace kjit::jit
