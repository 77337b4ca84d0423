#include "jit/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <thread>

#include <fmt/format.h>

namespace kjit::jit {

namespace {

// How often LockFile retries; a holder's work (a compile, a merge) takes far longer.
constexpr std::chrono::milliseconds kLockPoll{5};

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
    } else if (errno != EEXIST) {     // EEXIST: another process made it meanwhile
      return ErrnoStatus(errno, fmt::format("cannot create {}", prefix));
    }
  }
  return absl::OkStatus();
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

}  // namespace kjit::jit
