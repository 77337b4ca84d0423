#include "jit/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace kjit::jit {

namespace {

// How often LockFile retries; a holder's work (a compile, a merge) takes far longer.
constexpr std::chrono::milliseconds kLockPoll{5};
// RemoveTree's nesting limit: one descriptor per level is open at once.
constexpr int kMaxTreeDepth = 64;

// Empties the directory open as `fd` (taken over) depth-first. 0, or the errno that stopped it,
// with `failed` naming the entry.
int EmptyDirectory(int fd, int depth, std::string& failed) {
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return err;
  }
  // Names first: removing entries while readdir walks the directory may skip some.
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  int err = 0;
  for (const std::string& name : names) {
    failed = name;
    if (::unlinkat(::dirfd(d), name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) {  // EPERM: what POSIX lets unlink say of a directory
      err = errno;
      break;
    }
    if (depth >= kMaxTreeDepth) {
      err = ELOOP;
      break;
    }
    const int sub =
        ::openat(::dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      err = errno;
      break;
    }
    std::string below;
    if ((err = EmptyDirectory(sub, depth + 1, below)) != 0) {
      failed = name + "/" + below;
      break;
    }
    if (::unlinkat(::dirfd(d), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      err = errno;
      break;
    }
  }
  ::closedir(d);
  return err;
}

}  // namespace

UniqueFd::UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

int UniqueFd::release() { return std::exchange(fd_, -1); }

int UniqueFd::Close() { return fd_ >= 0 ? ::close(std::exchange(fd_, -1)) : 0; }

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

absl::Status ErrnoStatus(int err, std::string_view what) {
  std::string msg = fmt::format("{}: {}", what, ErrnoText(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:  // over RLIMIT_FSIZE or the filesystem's file size limit
      return absl::ResourceExhaustedError(msg);
    default: return absl::InternalError(msg);
  }
}

int ReadAll(int fd, std::string& out, size_t limit) {
  char buf[1 << 16];
  while (out.size() <= limit) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
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
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status MakePrivateDirs(const std::string& dir) {
  for (size_t end = 1; end <= dir.size(); ++end) {
    if (end != dir.size() && dir[end] != '/') continue;
    const std::string prefix = dir.substr(0, end);
    // stat first: mkdir of an existing directory on a read-only mount fails with EROFS.
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) continue;
    if (errno != ENOENT) {
      return ErrnoStatus(errno, fmt::format("cannot create {}: {} is inaccessible", dir, prefix));
    }
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      ::chmod(prefix.c_str(), 0700);  // mkdir's mode was masked by the umask
    } else if (errno != EEXIST) {     // EEXIST: another process made it meanwhile, or a link
      return ErrnoStatus(errno, fmt::format("cannot create {}", prefix));
    } else if (std::string dangling = DescribeDanglingSymlink(prefix); !dangling.empty()) {
      return absl::FailedPreconditionError(fmt::format("cannot create {}: {}", dir, dangling));
    }
  }
  return absl::OkStatus();
}

std::string DescribeDanglingSymlink(const std::string& path) {
  // Up from `path` to the first component that exists: mkdir -p stops at a dangling link there.
  for (std::string p = path; !p.empty(); p = ParentDir(p)) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0) {
      if (!S_ISLNK(st.st_mode) || ::stat(p.c_str(), &st) == 0 || errno != ENOENT) return "";
      std::string target(4096, '\0');
      const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
      if (n < 0) return "";
      target.resize(static_cast<size_t>(n));
      if (!target.starts_with('/')) target = ParentDir(p) + "/" + target;
      return fmt::format("{} is a symlink to '{}', which does not exist", p, target);
    }
    if (errno != ENOENT || p == "/" || p == ".") return "";
  }
  return "";
}

absl::Status RemoveTree(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot open directory {}", path));
  std::string failed;
  if (int err = EmptyDirectory(fd.release(), 0, failed)) {
    return ErrnoStatus(err, fmt::format("cannot remove {}/{}", path, failed));
  }
  if (::rmdir(path.c_str()) != 0) return ErrnoStatus(errno, fmt::format("cannot remove {}", path));
  return absl::OkStatus();
}

absl::Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) return absl::OkStatus();
  return ErrnoStatus(errno, fmt::format("cannot rename {} to {}", from, to));
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot open {}", path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, fmt::format("cannot stat {}", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format("{} is not a regular file", path));
  }
  std::string text;
  if (int err = ReadAll(fd.get(), text, limit)) {
    return ErrnoStatus(err, fmt::format("cannot read {}", path));
  }
  return text;
}

absl::StatusOr<FileLock> TryLockExistingFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot open lock {}", path));
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return absl::UnavailableError(fmt::format("another process holds the lock on {}", path));
    }
    return ErrnoStatus(errno, fmt::format("cannot lock {}", path));
  }
  return FileLock(std::move(fd));
}

absl::StatusOr<FileLock> CreateLockedFile(const std::string& path) {
  KJIT_ASSIGN_OR_RETURN(std::string tmp, TempPathFor(path));
  UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot create lock {}", tmp));
  absl::Status status;
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    status = ErrnoStatus(errno, fmt::format("cannot lock {}", tmp));
  } else {
    status = RenamePath(tmp, path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return FileLock(std::move(fd));
}

absl::StatusOr<FileLock> LockFile(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot open lock {}", path));
    // Polling rather than a blocking flock: a blocking call cannot time out without signals.
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) return ErrnoStatus(errno, fmt::format("cannot lock {}", path));
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(fmt::format(
            "another process has held the lock on {} for over {} ms", path, timeout.count()));
      }
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(kLockPoll, deadline - now));
    }
    // The file may have been deleted between our open and flock; a lock on a deleted inode
    // excludes nobody, so take the one now at the path instead.
    struct stat held {
    }, current{};
    if (::fstat(fd.get(), &held) == 0 && ::lstat(path.c_str(), &current) == 0 &&
        SameFile(held, current)) {
      return FileLock(std::move(fd));
    }
  }
}

absl::StatusOr<std::string> TempPathFor(const std::string& path) {
  // From the kernel's CSPRNG: in a directory others can write, a predictable name could be
  // created first, as a symlink to a file of ours.
  uint64_t v = 0;
  auto* p = reinterpret_cast<unsigned char*>(&v);
  size_t got = 0;
  while (got < sizeof v) {
    const ssize_t n = ::getrandom(p + got, sizeof v - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  const size_t name_at = path.rfind('/') + 1;  // 0 without a slash
  return fmt::format("{}.tmp-{}-{:016x}", path.substr(0, name_at), path.substr(name_at), v);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes, mode_t mode) {
  KJIT_ASSIGN_OR_RETURN(std::string tmp, TempPathFor(path));
  // O_EXCL|O_NOFOLLOW: never write through something already at the name.
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (fd.get() < 0) {
    return ErrnoStatus(errno, fmt::format("cannot write {} (create temp file {})", path, tmp));
  }
  auto fail = [&](int err, std::string_view step) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, fmt::format("cannot write {} ({})", path, step));
  };
  if (int err = WriteAll(fd.get(), bytes)) return fail(err, "write");
  // Data on disk before the rename makes it visible.
  if (::fsync(fd.get()) != 0) return fail(errno, "fsync");
  if (fd.Close() != 0) return fail(errno, "close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "rename");
  // Persist the rename itself. Best effort: some filesystems refuse fsync on a directory.
  if (UniqueFd dir(::open(ParentDir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      dir.get() >= 0) {
    ::fsync(dir.get());
  }
  return absl::OkStatus();
}

absl::Status WriteFileInPlace(const std::string& path, std::string_view bytes) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, fmt::format("cannot write {} (open)", path));
  if (int err = WriteAll(fd.get(), bytes)) {
    return ErrnoStatus(err, fmt::format("cannot write {} (write)", path));
  }
  if (fd.Close() != 0) return ErrnoStatus(errno, fmt::format("cannot write {} (close)", path));
  return absl::OkStatus();
}

}  // namespace kjit::jit
