#include "jit/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <string_view>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "jit/cache_entry.h"
#include "jit/file_io.h"
#include "jit/status_helpers.h"

namespace kjit::jit {

namespace {

constexpr std::string_view kEntrySuffix = ".kjit";
constexpr std::string_view kLockSuffix = ".lock";
// Temp files (in-flight writes and Open's write probe: TempPathFor's names) start with this; Prune
// removes old ones.
constexpr std::string_view kTempPrefix = ".tmp-";
// Older than this, a temp file's writer is dead (a write takes well under a second). So is one
// dated this far in the future: written while the clock was ahead, before it was set back.
constexpr int64_t kStaleTempSeconds = 3600;
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

// One entry file, read without following a symlink. DataLoss means "not a valid entry" (corrupt,
// a symlink, not a regular file); other codes are I/O trouble that says nothing about the entry.
struct EntryFile {
  UniqueFd fd;
  struct stat st {};
  absl::StatusOr<Binary> binary = absl::UnknownError("unread");
};

EntryFile ReadEntryFile(const std::string& path, std::string_view key) {
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
    e.binary = absl::DataLossError(S_ISDIR(e.st.st_mode)
                                       ? "a directory, not an entry file (`kjit cache prune` "
                                         "removes it)"
                                       : "not a regular file");
    return e;
  }
  if (static_cast<uint64_t>(e.st.st_size) > kMaxEntryBytes) {
    e.binary = absl::DataLossError(
        fmt::format("{} bytes, more than an entry can have ({})", e.st.st_size, kMaxEntryBytes));
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
  e.binary = DecodeEntryFor(bytes, key);
  return e;
}

// Removes what is at `path`, as lstat describes it: a file or link, or a directory (an entry's name
// on a directory would otherwise block its key for good: rename cannot replace it).
absl::Status RemoveEntryPath(const std::string& path, const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return RemoveTree(path);
  if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, fmt::format("cannot remove {}", path));
  return absl::OkStatus();
}

// Deletes a bad entry, unless it was replaced since we looked (another process renamed a fresh
// entry into place). `e` is what we read; when the open itself refused a symlink, only a
// symlink is removed.
bool DiscardEntry(const std::string& path, const EntryFile& e) {
  struct stat now {};
  if (::lstat(path.c_str(), &now) != 0) return false;
  bool same = e.fd.get() >= 0 ? SameFile(now, e.st) : S_ISLNK(now.st_mode);
  return same && RemoveEntryPath(path, now).ok();
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

std::string DiskCache::UnsafeDirectoryFix(const std::string& dir, uint32_t mode, uint32_t owner,
                                          uint32_t euid) {
  // Directories everyone shares: chmod 700 /tmp (as root) would break every other program.
  static constexpr std::string_view kSystemDirs[] = {
      "/",        "/tmp",       "/var/tmp", "/dev/shm",   "/dev",  "/run",  "/var",
      "/var/lib", "/var/cache", "/usr",     "/usr/local", "/opt",  "/srv",  "/mnt",
      "/media",   "/home",      "/etc",     "/root",      "/boot", "/proc", "/sys"};
  const std::string normal = std::filesystem::path(dir).lexically_normal().string();
  std::string_view trimmed = normal;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.remove_suffix(1);
  const bool sticky = (mode & S_ISVTX) != 0;
  const bool system =
      std::find(std::begin(kSystemDirs), std::end(kSystemDirs), trimmed) != std::end(kSystemDirs);
  const std::string own =
      "set KJIT_CACHE_DIR to a private directory of your own (e.g. `export "
      "KJIT_CACHE_DIR=$HOME/.cache/kjit`)";
  if (sticky || system) {
    return fmt::format("{}; '{}' is {}, shared by every user: do not chmod or chown it", own, dir,
                       sticky ? "a sticky directory like /tmp" : "a system directory");
  }
  if (owner != euid) {
    // Someone else's directory; a cache made under sudo in one's own home is the exception.
    return fmt::format("{}, or, if '{}' is yours (made under sudo), chown {} '{}' (as root)", own,
                       dir, euid, dir);
  }
  return fmt::format("chmod 700 '{}', or set KJIT_CACHE_DIR to a directory of your own", dir);
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
  // "$UNSET/" is "/", which passes every check below for root: a cache there would put its
  // entries in the file system's root, and `kjit cache clear` would empty it of them.
  if (std::filesystem::path(dir).lexically_normal() == "/") {
    return absl::InvalidArgumentError(
        fmt::format("disk cache: {} is the root directory, not a cache directory (a variable that "
                    "was empty in \"$VAR/\"?); fix: set KJIT_CACHE_DIR to a directory of its own, "
                    "such as $HOME/.cache/kjit",
                    dir));
  }

  if (std::string dangling = DescribeDanglingSymlink(dir); !dangling.empty()) {
    return absl::FailedPreconditionError(fmt::format(
        "disk cache: {}; fix: create the target (mkdir -m 700), remove the symlink, or set "
        "KJIT_CACHE_DIR to a directory you can write",
        dangling));
  }
  if (absl::Status made = MakePrivateDirs(dir); !made.ok()) {
    return absl::Status(made.code(),
                        fmt::format("disk cache: {}; fix: set KJIT_CACHE_DIR to a directory you "
                                    "can write",
                                    ToStd(made.message())));
  }

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
  const std::string fix = UnsafeDirectoryFix(dir, st.st_mode, st.st_uid, ::geteuid());
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        fmt::format("disk cache: {} is owned by uid {}, not by this user (uid {}), who could plant "
                    "kernels in it; fix: {}",
                    dir, st.st_uid, ::geteuid(), fix));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(fmt::format(
        "disk cache: {} is writable by {} (mode {:04o}), who could plant kernels in it; fix: {}",
        dir, (st.st_mode & S_IWOTH) != 0 ? "other users" : "its group", st.st_mode & 07777, fix));
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
    absl::StatusOr<std::string> probe = TempPathFor(dir + "/probe");
    if (!probe.ok()) {
      why = std::string(ToStd(probe.status().message()));
    } else if (UniqueFd fd(::open(probe->c_str(),
                                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
               fd.get() < 0) {
      why = ErrnoText(errno);
    } else {
      ::unlink(probe->c_str());
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
  EntryFile e = ReadEntryFile(path, key);
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
  const std::string bytes = EncodeEntry(binary, key);
  if (bytes.size() > kMaxEntryBytes) {
    return absl::InvalidArgumentError(
        fmt::format("disk cache: a {}-byte entry is over the {}-byte limit; it stays in memory",
                    bytes.size(), kMaxEntryBytes));
  }
  KJIT_RETURN_IF_ERROR(Annotate(WriteFileAtomically(EntryPath(key), bytes, 0600), "disk cache"));
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
  absl::StatusOr<FileLock> lock = LockFile(path, timeout);
  if (absl::IsDeadlineExceeded(lock.status())) {
    return absl::DeadlineExceededError(
        fmt::format("disk cache: {} (probably compiling the same kernel); compile without waiting",
                    ToStd(lock.status().message())));
  }
  KJIT_RETURN_IF_ERROR(Annotate(lock.status(), "disk cache"));
  return *std::move(lock);
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
    EntryFile e = ReadEntryFile(path, key);
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
    std::string_view key = KeyOfFile(name, kEntrySuffix);
    if (!key.empty() && Remove(std::string(key)).ok()) ++removed;
  }
  return removed;
}

absl::Status DiskCache::Remove(const std::string& key) const {
  if (!IsValidKey(key)) {
    return absl::InvalidArgumentError(
        fmt::format("disk cache: '{}' is not a cache key (32 lowercase hex digits)", key));
  }
  if (read_only_) {
    return absl::FailedPreconditionError(fmt::format("disk cache: {} is read-only", dir_));
  }
  const std::string path = EntryPath(key);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return ErrnoStatus(errno, fmt::format("disk cache: cannot stat {}", path));
  }
  return Annotate(RemoveEntryPath(path, st), "disk cache");
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
    if (std::string_view key = KeyOfFile(name, kEntrySuffix); !key.empty()) {
      EntryFile e = ReadEntryFile(path, key);
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
      struct stat held {
      }, current{};
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
