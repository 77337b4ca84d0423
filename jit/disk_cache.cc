#include "jit/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "jit/cache_entry.h"

namespace kjit::jit {

namespace {

constexpr std::string_view kEntrySuffix = ".kjit";
constexpr std::string_view kLockSuffix = ".lock";
// Temp files (in-flight writes and Open's write probe) start with this; Prune removes old ones.
constexpr std::string_view kTempPrefix = ".tmp-";
// Older than this, a temp file's writer is dead (a write takes well under a second). So is one
// dated this far in the future: written while the clock was ahead, before it was set back.
constexpr int64_t kStaleTempSeconds = 3600;
constexpr std::chrono::milliseconds kLockPoll{5};
// Far above any real CUBIN; a bigger file is not ours and is not read (it could exhaust memory).
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 30;

// Keys are CacheKey's 32 lowercase hex digits. Checking the exact form keeps every path we build
// inside the cache directory ("../", "/" and NUL cannot appear).
bool IsValidKey(std::string_view key) {
  return key.size() == 32 && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// "<key><suffix>" -> key; any other name -> empty.
std::string_view KeyOfFile(std::string_view name, std::string_view suffix) {
  if (!name.ends_with(suffix)) return {};
  name.remove_suffix(suffix.size());
  return IsValidKey(name) ? name : std::string_view{};
}

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

absl::Status ErrnoStatus(int err, std::string_view what) {
  std::string msg = fmt::format("{}: {}", what, ErrnoText(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:  // over RLIMIT_FSIZE or the filesystem's file size limit
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { Close(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  // close(2)'s result: a write error can surface only here on some filesystems (NFS).
  int Close() { return fd_ >= 0 ? ::close(std::exchange(fd_, -1)) : 0; }

 private:
  int fd_;
};

// Reads to EOF, or stops once more than `limit` bytes have been read.
int ReadAll(int fd, std::string& out, uint64_t limit) {
  char buf[1 << 16];
  while (out.size() <= limit) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return 0;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return 0;
}

int WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

// 16 hex digits from the kernel's CSPRNG: temp names nobody can predict and pre-plant.
absl::StatusOr<std::string> RandomHex16() {
  uint64_t v = 0;
  auto* p = reinterpret_cast<unsigned char*>(&v);
  size_t got = 0;
  while (got < sizeof v) {
    ssize_t n = ::getrandom(p + got, sizeof v - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "disk cache: getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return fmt::format("{:016x}", v);
}

absl::StatusOr<std::vector<std::string>> ScanDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, fmt::format("disk cache: cannot list {}", dir));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// One entry file, read without following a symlink. DataLoss means "not a valid entry" (corrupt,
// a symlink, not a regular file); other codes are I/O trouble that says nothing about the entry.
struct EntryFile {
  UniqueFd fd;
  struct stat st {};
  absl::StatusOr<Binary> binary = absl::UnknownError("unread");
};

EntryFile ReadEntryFile(const std::string& path) {
  EntryFile e;
  // O_NONBLOCK: a FIFO at the path must not hang us; regular-file reads ignore it.
  e.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (e.fd.get() < 0) {
    int err = errno;
    e.binary = err == ELOOP ? absl::DataLossError("a symlink, not an entry file (not followed)")
                            : ErrnoStatus(err, fmt::format("cannot open {}", path));
    return e;
  }
  if (::fstat(e.fd.get(), &e.st) != 0) {
    e.binary = ErrnoStatus(errno, fmt::format("cannot stat {}", path));
    return e;
  }
  if (!S_ISREG(e.st.st_mode)) {
    e.binary = absl::DataLossError("not a regular file");
    return e;
  }
  if (static_cast<uint64_t>(e.st.st_size) > kMaxEntryBytes) {
    e.binary = absl::DataLossError(fmt::format("{} bytes, more than an entry can have ({})",
                                               e.st.st_size, kMaxEntryBytes));
    return e;
  }
  std::string bytes;
  bytes.reserve(static_cast<size_t>(e.st.st_size));
  if (int err = ReadAll(e.fd.get(), bytes, kMaxEntryBytes)) {
    e.binary = ErrnoStatus(err, fmt::format("cannot read {}", path));
    return e;
  }
  if (bytes.size() > kMaxEntryBytes) {
    e.binary = absl::DataLossError(fmt::format("grew past {} bytes while read", kMaxEntryBytes));
    return e;
  }
  e.binary = DecodeEntry(bytes);
  return e;
}

// Deletes a bad entry, unless it was replaced since we looked (another process renamed a fresh
// entry into place). `e` is what we read; when the open itself refused a symlink, only a
// symlink is removed.
bool DiscardEntry(const std::string& path, const EntryFile& e) {
  struct stat now {};
  if (::lstat(path.c_str(), &now) != 0) return false;
  bool same = e.fd.get() >= 0 ? SameFile(now, e.st) : S_ISLNK(now.st_mode);
  return same && ::unlink(path.c_str()) == 0;
}

// Removes the least recently used entries (oldest mtime first) until the entries total at most
// max_bytes. `keep` (the entry just written) is never removed, even when it alone is over the cap.
// An mtime in the future (written while the clock was ahead) counts as the oldest: a hit would
// have reset it to now, so such an entry has not been used since the clock was set back.
int Evict(const std::string& dir, uint64_t max_bytes, std::string_view keep) {
  absl::StatusOr<std::vector<std::string>> names = ScanDir(dir);
  if (!names.ok()) return 0;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  struct Item {
    std::string key;
    uint64_t size;
    int64_t mtime_ns;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  for (const std::string& name : *names) {
    std::string_view key = KeyOfFile(name, kEntrySuffix);
    struct stat st {};
    if (key.empty() || ::lstat((dir + "/" + name).c_str(), &st) != 0) continue;
    const int64_t mtime_ns = MtimeNs(st) > now_ns ? INT64_MIN : MtimeNs(st);
    items.push_back({std::string(key), static_cast<uint64_t>(st.st_size), mtime_ns});
    total += static_cast<uint64_t>(st.st_size);
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.mtime_ns, a.key) < std::tie(b.mtime_ns, b.key);
  });
  int removed = 0;
  for (const Item& item : items) {
    if (total <= max_bytes) break;
    if (item.key == keep) continue;
    std::string path = fmt::format("{}/{}{}", dir, item.key, kEntrySuffix);
    if (::unlink(path.c_str()) == 0) {
      ++removed;
      total -= item.size;
    } else if (errno == ENOENT) {  // another process evicted it first
      total -= item.size;
    }
  }
  return removed;
}

// mkdir -p, creating missing components 0700. Returns whether the last component was created.
absl::StatusOr<bool> MakeDirs(const std::string& dir) {
  bool created = false;
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    std::string prefix = dir.substr(0, end);
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      created = false;
      continue;
    }
    if (errno != ENOENT) {
      return ErrnoStatus(errno, fmt::format("disk cache: cannot create {}: {} is inaccessible",
                                            dir, prefix));
    }
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, fmt::format("disk cache: cannot create {} (set KJIT_CACHE_DIR to "
                                            "a directory you can write)",
                                            prefix));
    }
    created = true;
  }
  return created;
}

absl::StatusOr<uint64_t> ParseMaxBytes(std::string_view text) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "KJIT_CACHE_MAX_BYTES='{}' is not a byte count; expected a whole number of bytes such as "
        "10737418240 (10 GiB), or 0 for no cap",
        text));
  }
  return v;
}

}  // namespace

DiskCache::KeyLock::KeyLock(KeyLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

DiskCache::KeyLock& DiskCache::KeyLock::operator=(KeyLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

// Closing the descriptor releases the flock. The lock file stays: deleting it here would let a
// waiter lock the deleted inode while a newcomer locks a fresh file.
DiskCache::KeyLock::~KeyLock() {
  if (fd_ >= 0) ::close(fd_);
}

std::string DiskCache::DefaultDirectory() {
  if (const char* v = std::getenv("KJIT_CACHE_DIR"); v != nullptr && *v != '\0') return v;
  // The XDG spec says a relative $XDG_CACHE_HOME is invalid and must be ignored.
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v != nullptr && v[0] == '/') {
    return std::string(v) + "/kjit";
  }
  if (const char* v = std::getenv("HOME"); v != nullptr && *v != '\0') {
    return std::string(v) + "/.cache/kjit";
  }
  // No $HOME (a daemon, a bare container): the password database may still know it.
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buf[4096];
  if (::getpwuid_r(::geteuid(), &pw, buf, sizeof buf, &found) == 0 && found != nullptr &&
      found->pw_dir != nullptr && found->pw_dir[0] != '\0') {
    return std::string(found->pw_dir) + "/.cache/kjit";
  }
  return "";
}

absl::StatusOr<DiskCache::Options> DiskCache::Options::FromEnvironment() {
  Options o;
  o.dir = DefaultDirectory();
  // Set but empty reads as unset, as shells make it easy to export VAR= by accident.
  if (const char* v = std::getenv("KJIT_CACHE_MAX_BYTES"); v != nullptr && *v != '\0') {
    KJIT_ASSIGN_OR_RETURN(o.max_bytes, ParseMaxBytes(v));
  }
  return o;
}

absl::StatusOr<DiskCache> DiskCache::Open(const Options& options) {
  std::string dir = options.dir.empty() ? DefaultDirectory() : options.dir;
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "disk cache: no directory (KJIT_CACHE_DIR, XDG_CACHE_HOME and HOME are unset and the "
        "password database has no home); fix: set KJIT_CACHE_DIR");
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();

  KJIT_ASSIGN_OR_RETURN(bool created, MakeDirs(dir));
  if (created) ::chmod(dir.c_str(), 0700);  // mkdir's mode was masked by the umask

  // stat, not lstat: a symlinked cache directory is fine when its target passes the checks.
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, fmt::format("disk cache: cannot stat {}", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format(
        "disk cache: {} is not a directory; fix: remove it or set KJIT_CACHE_DIR elsewhere", dir));
  }
  // Anyone who can write here can plant a CUBIN that we would run on the GPU.
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(fmt::format(
        "disk cache: {} is owned by uid {}, not by this user (uid {}), who could plant kernels "
        "in it; fix: chown {} '{}', or set KJIT_CACHE_DIR to a directory of your own",
        dir, st.st_uid, ::geteuid(), ::geteuid(), dir));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(fmt::format(
        "disk cache: {} is writable by {} (mode {:04o}), who could plant kernels in it; fix: "
        "chmod 700 '{}', or set KJIT_CACHE_DIR to a directory of your own",
        dir, (st.st_mode & S_IWOTH) != 0 ? "other users" : "its group", st.st_mode & 07777, dir));
  }

  DiskCache cache;
  cache.dir_ = dir;
  cache.max_bytes_ = options.max_bytes;
  // access() alone is not enough: it ignores read-only mounts for root and says yes to procfs-like
  // directories; creating a file is the real test.
  std::string why;
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    why = ErrnoText(errno);
  } else {
    absl::StatusOr<std::string> suffix = RandomHex16();
    if (!suffix.ok()) {
      why = std::string(ToStd(suffix.status().message()));
    } else {
      std::string probe = fmt::format("{}/{}probe-{}", dir, kTempPrefix, *suffix);
      int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) {
        why = ErrnoText(errno);
      } else {
        ::close(fd);
        ::unlink(probe.c_str());
      }
    }
  }
  if (!why.empty()) {
    cache.read_only_ = true;
    cache.warning_ = fmt::format(
        "disk cache {} is not writable ({}); using it read-only, so kernels compiled now "
        "are kept in memory only",
        dir, why);
  }
  return cache;
}

std::string DiskCache::EntryPath(const std::string& key) const {
  return fmt::format("{}/{}{}", dir_, key, kEntrySuffix);
}

std::optional<Binary> DiskCache::Lookup(const std::string& key) const {
  if (!IsValidKey(key)) return std::nullopt;
  const std::string path = EntryPath(key);
  EntryFile e = ReadEntryFile(path);
  if (e.binary.ok()) {
    ::futimens(e.fd.get(), nullptr);  // LRU: a hit is a use. Best effort (read-only caches).
    return *std::move(e.binary);
  }
  if (e.binary.status().code() == absl::StatusCode::kDataLoss && !read_only_) {
    DiscardEntry(path, e);
  }
  return std::nullopt;
}

absl::Status DiskCache::Store(const std::string& key, const Binary& binary) const {
  if (!IsValidKey(key)) {
    return absl::InvalidArgumentError(
        fmt::format("disk cache: '{}' is not a cache key (32 lowercase hex digits)", key));
  }
  if (read_only_) {
    return absl::FailedPreconditionError(
        fmt::format("disk cache: {} is read-only; the kernel stays in memory", dir_));
  }
  if (binary.code.empty()) {
    return absl::InvalidArgumentError("disk cache: refusing to store a binary with no code");
  }
  const std::string bytes = EncodeEntry(binary);
  if (bytes.size() > kMaxEntryBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "disk cache: a {}-byte entry is over the {}-byte limit; it stays in memory", bytes.size(),
        kMaxEntryBytes));
  }
  KJIT_ASSIGN_OR_RETURN(std::string suffix, RandomHex16());
  const std::string tmp = fmt::format("{}/{}{}-{}", dir_, kTempPrefix, key, suffix);
  const std::string path = EntryPath(key);

  // O_EXCL|O_NOFOLLOW: never write through something already at the (unpredictable) name.
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    return ErrnoStatus(errno, fmt::format("disk cache: cannot create {}", tmp));
  }
  auto fail = [&](int err, std::string_view step) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, fmt::format("disk cache: cannot write {} ({})", path, step));
  };
  if (int err = WriteAll(fd.get(), bytes)) return fail(err, "write");
  // Data on disk before the rename makes it visible, or a crash could leave a whole-looking
  // name over missing blocks.
  if (::fsync(fd.get()) != 0) return fail(errno, "fsync");
  if (fd.Close() != 0) return fail(errno, "close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "rename");
  // Persist the rename itself. Best effort: some filesystems refuse fsync on a directory.
  if (UniqueFd d(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d.get() >= 0) {
    ::fsync(d.get());
  }
  if (max_bytes_ > 0) Evict(dir_, max_bytes_, key);
  return absl::OkStatus();
}

absl::StatusOr<DiskCache::KeyLock> DiskCache::LockKey(const std::string& key,
                                                      std::chrono::milliseconds timeout) const {
  if (!IsValidKey(key)) {
    return absl::InvalidArgumentError(
        fmt::format("disk cache: '{}' is not a cache key (32 lowercase hex digits)", key));
  }
  if (read_only_) {
    return absl::FailedPreconditionError(
        fmt::format("disk cache: {} is read-only, so it has no locks", dir_));
  }
  const std::string path = fmt::format("{}/{}{}", dir_, key, kLockSuffix);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0) {
      return ErrnoStatus(errno, fmt::format("disk cache: cannot open lock {}", path));
    }
    // Polling rather than a blocking flock: a blocking call cannot time out without signals.
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        return ErrnoStatus(errno, fmt::format("disk cache: cannot lock {}", path));
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(fmt::format(
            "disk cache: another process has held the lock on {} for over {} ms (probably "
            "compiling the same kernel); compile without waiting",
            path, timeout.count()));
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          kLockPoll, deadline - now));
    }
    // Prune may have removed the file between our open and flock; a lock on a deleted inode
    // excludes nobody, so take the one now at the path instead.
    struct stat held {}, current {};
    if (::fstat(fd.get(), &held) == 0 && ::lstat(path.c_str(), &current) == 0 &&
        SameFile(held, current)) {
      return KeyLock(fd.release());
    }
  }
}

std::vector<DiskCache::EntryInfo> DiskCache::List() const {
  std::vector<EntryInfo> out;
  absl::StatusOr<std::vector<std::string>> names = ScanDir(dir_);
  if (!names.ok()) return out;
  for (const std::string& name : *names) {
    std::string_view key = KeyOfFile(name, kEntrySuffix);
    if (key.empty()) continue;
    const std::string path = fmt::format("{}/{}", dir_, name);
    EntryInfo info;
    info.key = std::string(key);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;  // removed meanwhile
    info.size_bytes = static_cast<uint64_t>(st.st_size);
    info.mtime_unix = st.st_mtim.tv_sec;
    EntryFile e = ReadEntryFile(path);
    info.valid = e.binary.ok();
    if (info.valid) {
      info.binary = *std::move(e.binary);
    } else {
      info.problem = std::string(ToStd(e.binary.status().message()));
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<int> DiskCache::Clear() const {
  if (read_only_) {
    return absl::FailedPreconditionError(fmt::format("disk cache: {} is read-only", dir_));
  }
  KJIT_ASSIGN_OR_RETURN(std::vector<std::string> names, ScanDir(dir_));
  int removed = 0;
  for (const std::string& name : names) {
    if (KeyOfFile(name, kEntrySuffix).empty()) continue;
    if (::unlink(fmt::format("{}/{}", dir_, name).c_str()) == 0) ++removed;
  }
  return removed;
}

absl::StatusOr<int> DiskCache::Prune() const {
  if (read_only_) {
    return absl::FailedPreconditionError(fmt::format("disk cache: {} is read-only", dir_));
  }
  KJIT_ASSIGN_OR_RETURN(std::vector<std::string> names, ScanDir(dir_));
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  int removed = 0;
  for (const std::string& name : names) {
    const std::string path = fmt::format("{}/{}", dir_, name);
    if (!KeyOfFile(name, kEntrySuffix).empty()) {
      EntryFile e = ReadEntryFile(path);
      if (!e.binary.ok() && e.binary.status().code() == absl::StatusCode::kDataLoss &&
          DiscardEntry(path, e)) {
        ++removed;
      }
    } else if (std::string_view(name).starts_with(kTempPrefix)) {
      // A young temp file may be a write in progress in another process. Measured both ways: a
      // file dated years ahead would otherwise stay until the clock caught up.
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 &&
          std::abs(now - static_cast<int64_t>(st.st_mtim.tv_sec)) > kStaleTempSeconds &&
          ::unlink(path.c_str()) == 0) {
        ++removed;
      }
    } else if (!KeyOfFile(name, kLockSuffix).empty()) {
      // Only a lock nobody holds; LockKey re-checks the path after locking, so removing it while
      // someone is between open and flock is safe. The path must still be the file we locked:
      // another Prune may have unlinked it since our open, and the path may now hold a new lock
      // that a LockKey owns. Only the holder of a lock file's flock unlinks it, so the check
      // stays true until our unlink. Not counted: lock files are bookkeeping.
      UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
      struct stat held {}, current {};
      if (fd.get() >= 0 && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0 &&
          ::fstat(fd.get(), &held) == 0 && ::lstat(path.c_str(), &current) == 0 &&
          SameFile(held, current)) {
        ::unlink(path.c_str());
      }
    }
  }
  if (max_bytes_ > 0) removed += Evict(dir_, max_bytes_, /*keep=*/"");
  return removed;
}

}  // namespace kjit::jit
