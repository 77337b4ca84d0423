// The on-disk cache of compiled programs, shared by every process of a user.
//
// Location: $KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit, else ~/.cache/kjit. Created 0700; a
// directory others can write (or owned by another user) is refused, since a planted CUBIN would run
// on the GPU. Entries are files named by their key (CacheKey) holding a checksummed header, JSON
// metadata (the key among it: an entry under another key's name is corrupt) and the binary
// (cache_entry.h). Writes go to an unpredictable temporary name in the same directory, are
// fsynced and renamed into place, so a reader sees a whole entry or none. A per-key
// flock lets N processes compile a kernel once; the lock dies with its process. When the directory
// cannot be written the cache degrades to read-only (lookups still work) with a warning. A size cap
// evicts least-recently-used entries (by mtime, refreshed on every hit).
//
//   KJIT_ASSIGN_OR_RETURN(DiskCache cache, DiskCache::Open(DiskCache::Options::FromEnvironment()));
//   if (std::optional<Binary> hit = cache.Lookup(key)) return *hit;
//   auto lock = cache.LockKey(key, std::chrono::seconds(60));  // another process may be compiling
//   ... compile, then cache.Store(key, binary) ...
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jit/binary.h"
#include "jit/file_io.h"
#include "kjit/status.h"

namespace kjit::jit {

class DiskCache {
 public:
  struct Options {
    std::string dir;         // empty: DefaultDirectory()
    uint64_t max_bytes = 0;  // 0: no cap
    // $KJIT_CACHE_DIR / $XDG_CACHE_HOME / $HOME and $KJIT_CACHE_MAX_BYTES.
    static absl::StatusOr<Options> FromEnvironment();
  };

  // One entry as `kjit cache ls` shows it.
  struct EntryInfo {
    std::string key;
    uint64_t size_bytes = 0;
    int64_t mtime_unix = 0;
    bool valid = false;            // header, checksum and metadata all check out
    std::string problem;           // why not, when !valid
    std::optional<Binary> binary;  // metadata and code when valid
  };

  // An exclusive lock on one key, released on destruction (or when the process dies).
  using KeyLock = FileLock;

  static std::string DefaultDirectory();
  // The fix for a cache directory Open refuses as unsafe (owned by another uid than `euid`, or
  // writable by group or others): chmod 700 or chown for a directory of one's own, but a private
  // directory instead for a shared one (the sticky bit, as /tmp; a system directory), whose
  // permissions are not one user's to change. `kjit doctor` gives the same advice.
  static std::string UnsafeDirectoryFix(const std::string& dir, uint32_t mode, uint32_t owner,
                                        uint32_t euid);

  // Creates the directory (0700) if missing. PermissionDenied when it is writable by group/others
  // or owned by another user (the message names the path and UnsafeDirectoryFix). A symlink to a
  // missing target is FailedPrecondition saying so. A directory that exists but cannot be written
  // opens read-only with warning() set.
  static absl::StatusOr<DiskCache> Open(const Options& options);

  const std::string& dir() const { return dir_; }
  bool read_only() const { return read_only_; }
  const std::string& warning() const { return warning_; }

  // The entry for key, or nullopt when absent. A corrupt entry (bad magic, version, length,
  // checksum or metadata, or one recording another key: copied onto this key's file) or anything
  // else at its name (a directory) is deleted (when writable) and reported as absent; never
  // returned. A hit refreshes the entry's mtime for LRU eviction.
  std::optional<Binary> Lookup(const std::string& key) const;

  // Writes atomically (temp file, fsync, rename, fsync dir), then evicts LRU entries beyond
  // max_bytes. On a read-only cache or a failed write returns the error and changes nothing; the
  // caller keeps the binary in memory.
  absl::Status Store(const std::string& key, const Binary& binary) const;

  // Blocks until the key's lock is held or timeout passes (DeadlineExceeded). Read-only caches
  // return FailedPrecondition.
  absl::StatusOr<KeyLock> LockKey(const std::string& key, std::chrono::milliseconds timeout) const;

  // Every entry file, checked (for `kjit cache ls` / `verify`). Temp and lock files are skipped.
  std::vector<EntryInfo> List() const;
  // Removes the entry of `key`, whatever is at its name: a directory goes with everything in it
  // (symlinks inside are removed, never followed). NotFound when there is none.
  absl::Status Remove(const std::string& key) const;
  // Removes every entry; returns how many.
  absl::StatusOr<int> Clear() const;
  // Removes invalid entries (entry-named directories included), stale temp files, and LRU entries
  // beyond max_bytes; returns how many.
  absl::StatusOr<int> Prune() const;

 private:
  DiskCache() = default;
  std::string EntryPath(const std::string& key) const;
  std::string dir_;
  uint64_t max_bytes_ = 0;
  bool read_only_ = false;
  std::string warning_;
};

}  // namespace kjit::jit
