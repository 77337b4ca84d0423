// The POSIX file plumbing that the disk cache, the tuning database, the trace writer, the worker
// pool and the tools share: an owned descriptor, errno as an absl::Status, reads that a FIFO cannot
// hang, private directories, flocks (one that gives up after a timeout, one that asks whether an
// owner lives, one created held), and the replacement of a whole file in one step (a reader sees
// the old file or the new one, never a part).
//
//   KJIT_RETURN_IF_ERROR(MakePrivateDirs(dir));
//   KJIT_ASSIGN_OR_RETURN(FileLock lock, LockFile(dir + "/db.lock", std::chrono::seconds(10)));
//   ... read dir + "/db.json", merge ...
//   KJIT_RETURN_IF_ERROR(WriteFileAtomically(dir + "/db.json", text, 0600));
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "kjit/status.h"

namespace kjit::jit {

// Owns a file descriptor (-1: none) and closes it on destruction.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& other) noexcept;
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  ~UniqueFd() { Close(); }

  int get() const { return fd_; }
  int release();
  // close(2)'s result: some filesystems (NFS) report a failed write only here.
  int Close();

 private:
  int fd_;
};

// strerror's text for err, safe from any thread: "No such file or directory".
std::string ErrnoText(int err);
// "<what>: <ErrnoText(err)>" with a code for what the caller can do about it: ENOENT NotFound;
// EACCES, EPERM, EROFS PermissionDenied; ENOSPC, EDQUOT, EFBIG ResourceExhausted; else Internal.
absl::Status ErrnoStatus(int err, std::string_view what);

// Reads to EOF, or stops once more than `limit` bytes are in `out`. 0, or the read's errno.
int ReadAll(int fd, std::string& out, size_t limit);
// The bytes of the regular file `path`, read as ReadAll does (a result longer than `limit` means
// the file is). Opened non-blocking, so that a FIFO at the path cannot hang the caller: it is
// FailedPrecondition "<path> is not a regular file". No file is NotFound ("cannot open <path>:
// ...").
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, size_t limit);
// Writes all of `data`, resuming after signals and short writes. 0, or the write's errno.
int WriteAll(int fd, std::string_view data);

// Whether two stats describe one file (device and inode).
bool SameFile(const struct stat& a, const struct stat& b);
// The directory `path` names an entry of: "a/b" for "a/b/c", "." for "c", "/" for "/c".
std::string ParentDir(const std::string& path);

// mkdir -p. Components it creates are 0700 whatever the umask: what the callers keep (kernels to
// run, which GPUs and models a user runs) is nobody else's business. A component that is a symlink
// to a missing target is FailedPrecondition saying so (DescribeDanglingSymlink): mkdir cannot
// create through it, and "no such file" would send the user looking for the wrong thing.
absl::Status MakePrivateDirs(const std::string& dir);

// "<link> is a symlink to '<target>', which does not exist" when `path`, or the nearest of its
// ancestors that exists, is a symlink whose target is missing (a relative target shown resolved
// against the link's directory): what keeps `path` from being created. "" otherwise.
std::string DescribeDanglingSymlink(const std::string& path);

// rm -r of the directory `path` (itself not a symlink), never following a symlink: links inside
// are removed, not what they point to. The message names what could not be removed.
absl::Status RemoveTree(const std::string& path);

// rename(2) of `from` to `to`; the message names both.
absl::Status RenamePath(const std::string& from, const std::string& to);

// An exclusive flock, released when this is destroyed or the process dies, so a crashed holder
// never leaves it locked. The lock file stays: deleting it on release would let a waiter lock the
// deleted inode while a newcomer locks a fresh file at the path.
class FileLock {
 public:
  FileLock(FileLock&&) noexcept = default;
  FileLock& operator=(FileLock&&) noexcept = default;

 private:
  friend absl::StatusOr<FileLock> LockFile(const std::string& path,
                                           std::chrono::milliseconds timeout);
  friend absl::StatusOr<FileLock> TryLockExistingFile(const std::string& path);
  friend absl::StatusOr<FileLock> CreateLockedFile(const std::string& path);
  explicit FileLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// Locks `path` (created 0600 if missing, never through a symlink), waiting at most `timeout` for
// another holder: DeadlineExceeded after that, naming the path. flock excludes every other open of
// the file, another in this process included. Whoever may delete lock files must hold the lock
// while doing it: a lock taken on a file that was then deleted is retaken on the new one.
absl::StatusOr<FileLock> LockFile(const std::string& path, std::chrono::milliseconds timeout);

// Takes the lock of the file already at `path` (never through a symlink) without waiting: NotFound
// when there is none, Unavailable while another open of it holds the lock. Where a file's lock
// tells whether its owner lives, this asks.
absl::StatusOr<FileLock> TryLockExistingFile(const std::string& path);

// Creates `path` (0600) already locked: the lock is taken on a temporary name beside it, which is
// then renamed to `path`, so that nobody finds `path` unlocked while the lock lives. Whatever was
// at `path` is replaced.
absl::StatusOr<FileLock> CreateLockedFile(const std::string& path);

// A fresh name beside `path` that nobody can predict and pre-plant:
// "<dir>/.tmp-<name>-<16 hex digits>". Leftovers of killed writers all start with ".tmp-".
absl::StatusOr<std::string> TempPathFor(const std::string& path);

// Replaces `path` with `bytes` in one step: written to TempPathFor(path) (created with `mode`,
// less the umask), fsynced, renamed over `path`, and the rename fsynced, so that a crash cannot
// leave a whole-looking name over missing blocks. On any error the temp file is removed and `path`
// is as it was; the message names `path` and the step that failed. Whatever was at `path` is
// replaced, a symlink or a FIFO included: check first if that matters.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes, mode_t mode);

// Writes `bytes` into `path` in place (truncated, or created 0644 less the umask): for an output a
// user names, which may be /dev/stdout or a FIFO. The message names `path` and the step that
// failed, close included (where NFS reports a failed write).
absl::Status WriteFileInPlace(const std::string& path, std::string_view bytes);

}  // namespace kjit::jit
