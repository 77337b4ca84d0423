// The disk cache is shared by every process of a user and runs what it returns on the GPU, so
// these tests attack it: corrupt and planted files, writers killed mid-write, processes racing
// for one key, unsafe or unwritable directories. CPU only; each test gets a fresh mkdtemp root.
#include "jit/disk_cache.h"
#include "tests/test_support.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/cache_entry.h"

namespace kjit::jit {
namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;
using kjit::testing::NamesWithPrefix;
using kjit::testing::ScopedEnv;

std::string Key(int i) { return fmt::format("{:032x}", 0xc0de0000 + i); }

Binary MakeBinary(int seed, size_t code_size = 1000) {
  Binary b;
  b.target = ParseTarget("sm_90").value();
  b.code.resize(code_size);
  for (size_t i = 0; i < code_size; ++i) b.code[i] = static_cast<char>((i * 131 + seed) & 0xff);
  b.lowered_names = {{"kjit::k<1>", "_Z1kILi1EEvv"}};
  b.nvrtc_version = "13.0";
  b.options = {"--gpu-architecture=sm_90"};
  b.params = {{"seed", std::to_string(seed % 10)}};  // same width for every seed: same entry size
  b.program_name = "test";
  b.created_unix = 1'790'000'000;
  return b;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

void SetMtime(const std::string& path, int64_t unix_seconds) {
  timespec times[2] = {{unix_seconds, 0}, {unix_seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// Forks a child that runs `body` and exits with its result (no gtest in the child).
pid_t ForkChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  return pid;
}

// The child's exit code, or 1000 + signal when it was killed.
int WaitChild(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 1000 + WTERMSIG(status);
  return -1;
}

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kjit_disk_cache_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/cache";
  }

  void TearDown() override {
    // Undo the tests' chmods so that the tree can be removed when not root.
    std::error_code ec;
    ::chmod(root_.c_str(), 0700);
    for (auto it = fs::recursive_directory_iterator(root_, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) ::chmod(it->path().c_str(), 0700);
    }
    fs::remove_all(root_, ec);
  }

  absl::StatusOr<DiskCache> Open(uint64_t max_bytes = 0) const {
    return DiskCache::Open(DiskCache::Options{.dir = dir_, .max_bytes = max_bytes});
  }
  std::string EntryPath(const std::string& key) const { return dir_ + "/" + key + ".kjit"; }

  std::string root_;
  std::string dir_;
};

// ---- basic behaviour -----------------------------------------------------------------------

TEST_F(DiskCacheTest, OpenCreatesMissingDirectoriesPrivate) {
  dir_ = root_ + "/a/b/cache";
  mode_t old_umask = ::umask(0);  // even with a permissive umask the new directory is 0700
  absl::StatusOr<DiskCache> cache = Open();
  ::umask(old_umask);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->dir(), dir_);
  EXPECT_FALSE(cache->read_only()) << cache->warning();
  EXPECT_TRUE(cache->warning().empty());
  struct stat st {};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat((root_ + "/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  // Open's write probe leaves nothing behind.
  EXPECT_TRUE(NamesWithPrefix(dir_, "").empty());
}

TEST_F(DiskCacheTest, StoreThenLookupReturnsIdenticalBinary) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_FALSE(cache->Lookup(Key(1)).has_value());

  const Binary b = MakeBinary(1);
  ASSERT_TRUE(cache->Store(Key(1), b).ok());
  for (int i = 0; i < 2; ++i) {
    std::optional<Binary> hit = cache->Lookup(Key(1));
    ASSERT_TRUE(hit.has_value()) << "lookup " << i;
    EXPECT_EQ(hit->code, b.code);
    EXPECT_EQ(hit->target, b.target);
    EXPECT_EQ(hit->lowered_names, b.lowered_names);
    EXPECT_EQ(hit->params, b.params);
  }
  EXPECT_FALSE(cache->Lookup(Key(2)).has_value());

  // The file is the encoded entry, private, and the write left no temp file.
  EXPECT_EQ(ReadFile(EntryPath(Key(1))), EncodeEntry(b, Key(1)));
  struct stat st {};
  ASSERT_EQ(::stat(EntryPath(Key(1)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u);
  EXPECT_TRUE(NamesWithPrefix(dir_, ".tmp-").empty());

  // A second process (here: a second handle) sees it too, and Store replaces.
  absl::StatusOr<DiskCache> other = Open();
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->Store(Key(1), MakeBinary(2)).ok());
  ASSERT_TRUE(cache->Lookup(Key(1)).has_value());
  EXPECT_EQ(cache->Lookup(Key(1))->code, MakeBinary(2).code);
}

TEST_F(DiskCacheTest, StoreRejectsEmptyCode) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  Binary b = MakeBinary(1);
  b.code.clear();
  EXPECT_EQ(cache->Store(Key(1), b).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(EntryPath(Key(1))));
}

TEST_F(DiskCacheTest, CorruptEntryIsDiscardedAndThenReplaced) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  const Binary b = MakeBinary(3);
  const std::string good = EncodeEntry(b);
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"bit flip", flipped},
      {"truncated", good.substr(0, good.size() / 2)},
      {"header only", good.substr(0, kCacheEntryHeaderSize)},
      {"empty", ""},
      {"garbage", "this is not a cubin"},
  };
  for (const auto& [what, bytes] : variants) {
    SCOPED_TRACE(what);
    WriteFile(EntryPath(Key(1)), bytes);
    EXPECT_FALSE(cache->Lookup(Key(1)).has_value());
    EXPECT_FALSE(Exists(EntryPath(Key(1)))) << "corrupt entry was not removed";
    ASSERT_TRUE(cache->Store(Key(1), b).ok());
    std::optional<Binary> hit = cache->Lookup(Key(1));
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->code, b.code);
  }
}

// Issue 18, defect 3: the hidden=512 entry copied over the hidden=1024 one was served (and listed
// as valid) under the 1024 key, so a kernel built for another shape would run.
TEST_F(DiskCacheTest, EntryCopiedOntoAnotherKeyIsCorruptAndDiscarded) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Store(Key(512), MakeBinary(5)).ok());
  ASSERT_TRUE(cache->Store(Key(1024), MakeBinary(6)).ok());
  WriteFile(EntryPath(Key(1024)), ReadFile(EntryPath(Key(512))));

  const std::string why = "corrupt cache entry: it was written for key '" + Key(512) + "', not " +
                          Key(1024) + " (an entry copied or renamed onto another key's file)";
  std::vector<DiskCache::EntryInfo> listed = cache->List();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, Key(512));
  EXPECT_TRUE(listed[0].valid) << listed[0].problem;
  EXPECT_EQ(listed[1].key, Key(1024));
  EXPECT_FALSE(listed[1].valid);
  EXPECT_EQ(listed[1].problem, why);

  EXPECT_FALSE(cache->Lookup(Key(1024)).has_value()) << "another key's kernel was served";
  EXPECT_FALSE(Exists(EntryPath(Key(1024)))) << "the misplaced entry was not removed";
  std::optional<Binary> original = cache->Lookup(Key(512));
  ASSERT_TRUE(original.has_value());
  EXPECT_EQ(original->key, Key(512));
  EXPECT_EQ(original->code, MakeBinary(5).code);

  // Prune counts it as corrupt too.
  WriteFile(EntryPath(Key(1024)), ReadFile(EntryPath(Key(512))));
  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(*pruned, 1);
  EXPECT_FALSE(Exists(EntryPath(Key(1024))));
  EXPECT_TRUE(Exists(EntryPath(Key(512))));
}

// Issue 18, defect 14: a directory with an entry's name was "not a regular file" forever: unlink
// cannot remove it, so prune left it, verify failed on every run, and Store could never replace it.
TEST_F(DiskCacheTest, DirectoryNamedLikeAnEntryIsRemovedWithoutFollowingLinks) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  // Outside the cache, which links inside the directory point at: they must survive.
  const std::string outside = root_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0700), 0);
  WriteFile(outside + "/keep", "not the cache's");
  auto plant = [&](const std::string& dir) {
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(::mkdir((dir + "/sub").c_str(), 0700), 0);
    WriteFile(dir + "/sub/file", "x");
    ASSERT_EQ(::symlink(outside.c_str(), (dir + "/sub/link-to-dir").c_str()), 0);
    ASSERT_EQ(::symlink((outside + "/keep").c_str(), (dir + "/link-to-file").c_str()), 0);
  };
  plant(EntryPath(Key(2)));
  const std::string not_an_entry = dir_ + "/not-a-key.kjit";
  plant(not_an_entry);

  std::vector<DiskCache::EntryInfo> listed = cache->List();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[1].key, Key(2));
  EXPECT_FALSE(listed[1].valid);
  EXPECT_EQ(listed[1].problem, "a directory, not an entry file (`kjit cache prune` removes it)");

  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(*pruned, 1);
  EXPECT_FALSE(Exists(EntryPath(Key(2))));
  EXPECT_TRUE(Exists(not_an_entry + "/sub/file")) << "only names of entries are the cache's";
  EXPECT_EQ(ReadFile(outside + "/keep"), "not the cache's");
  EXPECT_TRUE(Exists(EntryPath(Key(1))));
  EXPECT_TRUE(cache->Store(Key(2), MakeBinary(2)).ok()) << "the key is usable again";

  // Lookup discards it as it does any corrupt entry, and Remove (doctor --fix-cache) takes it too.
  ASSERT_EQ(::unlink(EntryPath(Key(2)).c_str()), 0);
  plant(EntryPath(Key(2)));
  EXPECT_FALSE(cache->Lookup(Key(2)).has_value());
  EXPECT_FALSE(Exists(EntryPath(Key(2))));
  plant(EntryPath(Key(3)));
  EXPECT_TRUE(cache->Remove(Key(3)).ok());
  EXPECT_FALSE(Exists(EntryPath(Key(3))));
  EXPECT_EQ(cache->Remove(Key(3)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadFile(outside + "/keep"), "not the cache's");
}

TEST_F(DiskCacheTest, OversizedEntryFileIsDiscardedWithoutBeingRead) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  // Sparse: 4 GiB that take no disk, and would take 4 GiB of memory if read.
  int fd = ::open(EntryPath(Key(1)).c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{4} << 30), 0);
  ::close(fd);
  std::vector<DiskCache::EntryInfo> listed = cache->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].valid);
  EXPECT_NE(listed[0].problem.find("more than an entry can have"), std::string::npos);
  EXPECT_FALSE(cache->Lookup(Key(1)).has_value());
  EXPECT_FALSE(Exists(EntryPath(Key(1))));
}

TEST_F(DiskCacheTest, BadKeysAreRejected) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  // A valid entry just outside the cache, where "../x" would point.
  WriteFile(root_ + "/x.kjit", EncodeEntry(MakeBinary(1)));
  const std::vector<std::string> bad = {
      "",
      "..",
      "../x",
      "../../../../etc/passwd",
      "a/b",
      std::string(32, 'A'),  // uppercase is not CacheKey's form
      std::string(31, 'a'),
      std::string(33, 'a'),
      "0123456789abcdef0123456789abcd/f",
      "0123456789abcdef0123456789ab/../",
      std::string("0123456789abcdef\0"
                  "123456789abcdef",
                  32),
      "0123456789abcdef0123456789abcdeg",
  };
  for (const std::string& key : bad) {
    SCOPED_TRACE("key '" + key + "'");
    EXPECT_FALSE(cache->Lookup(key).has_value());
    EXPECT_EQ(cache->Store(key, MakeBinary(1)).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(cache->LockKey(key, milliseconds(0)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Nothing was written anywhere: the cache is empty and root_ holds only what we put there.
  EXPECT_TRUE(NamesWithPrefix(dir_, "").empty());
  std::vector<std::string> in_root = NamesWithPrefix(root_, "");
  std::sort(in_root.begin(), in_root.end());
  EXPECT_EQ(in_root, (std::vector<std::string>{"cache", "x.kjit"}));
}

// ---- directory safety ----------------------------------------------------------------------

TEST_F(DiskCacheTest, GroupOrOthersWritableDirectoryIsRefused) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  for (mode_t mode : {0777, 0770, 0702, 0720, 01777}) {
    SCOPED_TRACE(fmt::format("mode {:o}", mode));
    ASSERT_EQ(::chmod(dir_.c_str(), mode), 0);
    absl::StatusOr<DiskCache> cache = Open();
    ASSERT_FALSE(cache.ok());
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(cache.status().message().find(dir_), absl::string_view::npos);
    // The sticky bit says the directory is shared (as /tmp): not one user's to chmod.
    EXPECT_EQ(cache.status().message().find("chmod 700") != absl::string_view::npos,
              (mode & S_ISVTX) == 0)
        << cache.status();
  }
  // Readable by others is fine; only writing lets them plant kernels.
  for (mode_t mode : {0755, 0700}) {
    ASSERT_EQ(::chmod(dir_.c_str(), mode), 0);
    EXPECT_TRUE(Open().ok()) << fmt::format("mode {:o}", mode);
  }
}

TEST_F(DiskCacheTest, DirectoryOwnedByAnotherUserIsRefused) {
  std::string dir;
  if (::geteuid() == 0) {
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
    ASSERT_EQ(::chown(dir_.c_str(), 12345, 12345), 0);
    dir = dir_;
  } else {
    struct stat st {};
    ASSERT_EQ(::stat("/", &st), 0);
    if (st.st_uid == ::geteuid()) GTEST_SKIP() << "needs a directory owned by someone else";
    dir = "/";
  }
  absl::StatusOr<DiskCache> cache = DiskCache::Open({.dir = dir});
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(cache.status().message().find("chown"), absl::string_view::npos) << cache.status();
}

// Issue 18, defect 11: KJIT_CACHE_DIR=/tmp was answered with "chmod 700 '/tmp'", which (as root)
// breaks every other program on the machine. A shared directory gets a private one instead.
TEST_F(DiskCacheTest, SharedDirectoriesAreNeverToldToChmodOrChown) {
  const std::string own_dir =
      "set KJIT_CACHE_DIR to a private directory of your own (e.g. `export "
      "KJIT_CACHE_DIR=$HOME/.cache/kjit`)";
  const uint32_t me = ::geteuid(), other = me + 1;
  struct Case {
    std::string dir;
    uint32_t mode, owner;
    std::string fix;
  };
  const std::vector<Case> cases = {
      {"/tmp", 041777, 0,
       own_dir + "; '/tmp' is a sticky directory like /tmp, shared by every user: do not chmod or "
                 "chown it"},
      {"/scratch/team", 041777, other,
       own_dir + "; '/scratch/team' is a sticky directory like /tmp, shared by every user: do not "
                 "chmod or chown it"},
      {"/var/tmp/", 040777, me,
       own_dir + "; '/var/tmp/' is a system directory, shared by every user: do not chmod or chown "
                 "it"},
      {"/usr/local", 040775, other,
       own_dir + "; '/usr/local' is a system directory, shared by every user: do not chmod or "
                 "chown it"},
      // A directory of one's own keeps the chmod, another's (made under sudo) the chown.
      {"/home/u/.cache/kjit", 040777, me,
       "chmod 700 '/home/u/.cache/kjit', or set KJIT_CACHE_DIR to a directory of your own"},
      {"/home/u/.cache/kjit", 040700, other,
       own_dir + fmt::format(", or, if '/home/u/.cache/kjit' is yours (made under sudo), chown {} "
                             "'/home/u/.cache/kjit' (as root)",
                             me)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir);
    EXPECT_EQ(DiskCache::UnsafeDirectoryFix(c.dir, c.mode, c.owner, me), c.fix);
  }

  // The real /tmp, as Open reports it (owned by root: as root the mode is the problem, otherwise
  // the owner).
  struct stat st {};
  ASSERT_EQ(::stat("/tmp", &st), 0);
  if ((st.st_mode & S_ISVTX) == 0) GTEST_SKIP() << "/tmp has no sticky bit here";
  absl::StatusOr<DiskCache> tmp = DiskCache::Open({.dir = "/tmp"});
  ASSERT_FALSE(tmp.ok());
  EXPECT_EQ(tmp.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tmp.status().message().find("chmod 700"), absl::string_view::npos) << tmp.status();
  EXPECT_EQ(tmp.status().message().find(fmt::format("chown {}", me)), absl::string_view::npos)
      << tmp.status();
  EXPECT_NE(tmp.status().message().find("export KJIT_CACHE_DIR=$HOME/.cache/kjit"),
            absl::string_view::npos)
      << tmp.status();
}

// Issue 34 ("Also"): KJIT_CACHE_DIR=/ (what "$UNSET/" gives) was accepted as a cache when running
// as root, who owns / with mode 0755.
TEST_F(DiskCacheTest, TheRootDirectoryIsNoCache) {
  for (const std::string dir : {"/", "//", "/./", "/tmp/.."}) {
    SCOPED_TRACE(dir);
    absl::StatusOr<DiskCache> cache = DiskCache::Open({.dir = dir});
    ASSERT_FALSE(cache.ok());
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument) << cache.status();
    EXPECT_NE(cache.status().message().find("is the root directory, not a cache directory"),
              absl::string_view::npos)
        << cache.status();
  }
}

// Issue 18, defect 5: a symlink to a missing target was "cannot stat L: No such file or directory"
// here and "does not exist yet; kjit creates it" in doctor.
TEST_F(DiskCacheTest, DanglingSymlinkAsTheDirectoryIsNamedAsSuch) {
  const std::string target = root_ + "/gone";
  ASSERT_EQ(::symlink(target.c_str(), dir_.c_str()), 0);
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      cache.status().message(),
      fmt::format("disk cache: {} is a symlink to '{}', which does not exist; fix: create the "
                  "target (mkdir -m 700), remove the symlink, or set KJIT_CACHE_DIR to a "
                  "directory you can write",
                  dir_, target));
  // Below the link too (KJIT_CACHE_DIR=L/kjit), and a relative target is shown resolved.
  ASSERT_EQ(::unlink(dir_.c_str()), 0);
  ASSERT_EQ(::symlink("gone", dir_.c_str()), 0);
  const std::string below = dir_ + "/kjit";
  absl::StatusOr<DiskCache> deeper = DiskCache::Open({.dir = below});
  ASSERT_FALSE(deeper.ok());
  EXPECT_NE(deeper.status().message().find(
                fmt::format("{} is a symlink to '{}', which does not exist", dir_, target)),
            absl::string_view::npos)
      << deeper.status();
  EXPECT_FALSE(Exists(target)) << "kjit does not create the link's target";
  EXPECT_EQ(MakePrivateDirs(below).message(),
            fmt::format("cannot create {}: {} is a symlink to '{}', which does not exist", below,
                        dir_, target));
}

TEST_F(DiskCacheTest, SymlinkedDirectoryIsUsedWhenItsTargetIsSafe) {
  const std::string real = root_ + "/real";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), dir_.c_str()), 0);
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_FALSE(cache->read_only());
  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  EXPECT_TRUE(Exists(real + "/" + Key(1) + ".kjit"));
  EXPECT_TRUE(cache->Lookup(Key(1)).has_value());

  ASSERT_EQ(::chmod(real.c_str(), 0777), 0);
  EXPECT_EQ(Open().status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(DiskCacheTest, PathThatIsNotADirectoryIsAnError) {
  WriteFile(dir_, "a file");
  EXPECT_EQ(Open().status().code(), absl::StatusCode::kFailedPrecondition);
  dir_ = root_ + "/cache/sub";  // below a file
  EXPECT_FALSE(Open().ok());
}

// Runs `body` where permission bits bind. Root ignores them (CAP_DAC_OVERRIDE), so as root the
// body runs in a forked child inside a new user namespace with no uid map: the files stay owned by
// the same kernel uid, so the owner bits apply, but the namespace's capabilities do not cover
// inodes whose owner is unmapped, so nothing overrides them. Returns 77 when that is unavailable
// (e.g. seccomp forbids unshare), else the number of failures seen in the child (0 = passed).
int RunWherePermissionBitsBind(const std::function<void()>& body) {
  if (::geteuid() != 0) {
    body();
    return 0;  // failures were recorded in this process
  }
  pid_t pid = ForkChild([&body] {
    if (::unshare(CLONE_NEWUSER) != 0) return 77;
    body();
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  return WaitChild(pid);
}

TEST_F(DiskCacheTest, UnwritableDirectoryOpensReadOnlyAndServesLookups) {
  // A prebuilt cache baked into an image: entries present, directory not writable.
  {
    absl::StatusOr<DiskCache> writer = Open();
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->Store(Key(1), MakeBinary(1)).ok());
  }
  WriteFile(EntryPath(Key(2)), "corrupt");
  ASSERT_EQ(::chmod(dir_.c_str(), 0500), 0);

  int rc = RunWherePermissionBitsBind([this] {
    ASSERT_NE(::access(dir_.c_str(), W_OK), 0) << "permission bits do not bind here";
    absl::StatusOr<DiskCache> cache = Open();
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_TRUE(cache->read_only());
    EXPECT_NE(cache->warning().find(dir_), std::string::npos) << cache->warning();
    EXPECT_NE(cache->warning().find("read-only"), std::string::npos) << cache->warning();

    std::optional<Binary> hit = cache->Lookup(Key(1));
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->code, MakeBinary(1).code);
    // A corrupt entry is still never returned, but cannot (and need not) be removed.
    EXPECT_FALSE(cache->Lookup(Key(2)).has_value());
    EXPECT_TRUE(Exists(EntryPath(Key(2))));

    EXPECT_EQ(cache->Store(Key(3), MakeBinary(3)).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache->LockKey(Key(3), milliseconds(0)).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache->Clear().status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache->Prune().status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache->List().size(), 2u);
  });
  if (rc == 77) {
    GTEST_SKIP() << "running as root and cannot create a user namespace, so chmod 0500 does not "
                    "make a directory unwritable; ReadOnlyProcfsDirectory covers the read-only "
                    "path";
  }
  EXPECT_EQ(rc, 0) << "the unprivileged child reported failures (see its output above)";
  std::vector<std::string> names = NamesWithPrefix(dir_, "");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{Key(1) + ".kjit", Key(2) + ".kjit"}));
}

TEST_F(DiskCacheTest, ReadOnlyProcfsDirectory) {
  // /proc/self/fdinfo is ours (0500) and refuses new files even to root: a read-only directory
  // that needs no privileges to set up. access() says yes to root, so this exercises the probe.
  absl::StatusOr<DiskCache> cache = DiskCache::Open({.dir = "/proc/self/fdinfo"});
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_TRUE(cache->read_only());
  EXPECT_NE(cache->warning().find("/proc/self/fdinfo"), std::string::npos) << cache->warning();
  EXPECT_FALSE(cache->Lookup(Key(1)).has_value());
  EXPECT_EQ(cache->Store(Key(1), MakeBinary(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache->LockKey(Key(1), milliseconds(0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache->List().empty());  // fd numbers are not entries
}

// ---- planted files -------------------------------------------------------------------------

TEST_F(DiskCacheTest, SymlinkPlantedAtEntryPathIsNotLoaded) {
  // A valid entry elsewhere; a link to it where the cache would look.
  const std::string elsewhere = root_ + "/elsewhere";
  absl::StatusOr<DiskCache> other = DiskCache::Open({.dir = elsewhere});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->Store(Key(1), MakeBinary(1)).ok());
  const std::string target = elsewhere + "/" + Key(1) + ".kjit";

  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  ASSERT_EQ(::symlink(target.c_str(), EntryPath(Key(1)).c_str()), 0);

  std::vector<DiskCache::EntryInfo> listed = cache->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].valid);
  EXPECT_NE(listed[0].problem.find("symlink"), std::string::npos) << listed[0].problem;

  EXPECT_FALSE(cache->Lookup(Key(1)).has_value());
  EXPECT_FALSE(Exists(EntryPath(Key(1)))) << "the planted link should be removed";
  EXPECT_TRUE(other->Lookup(Key(1)).has_value()) << "its target must be left alone";
}

TEST_F(DiskCacheTest, StoreReplacesAPlantedSymlinkWithoutWritingThroughIt) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  const std::string victim = root_ + "/victim";
  WriteFile(victim, "precious");
  ASSERT_EQ(::symlink(victim.c_str(), EntryPath(Key(1)).c_str()), 0);

  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  EXPECT_EQ(ReadFile(victim), "precious");
  struct stat st {};
  ASSERT_EQ(::lstat(EntryPath(Key(1)).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_TRUE(cache->Lookup(Key(1)).has_value());
}

// ---- crashes and concurrency ---------------------------------------------------------------

TEST_F(DiskCacheTest, WriterKilledMidWriteNeverLeavesACorruptEntry) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  const Binary big = MakeBinary(5, 64 << 20);
  const std::string temp_prefix = ".tmp-" + Key(1) + ".kjit-";

  // Kill the writer at different points after its temp file appears; the last attempt is allowed
  // to finish, so the exact-binary comparison below is exercised on a real hit.
  const std::vector<int> kill_after_ms = {0, 0, 1, 3, 10, -1};
  int leftovers = 0;
  for (int delay : kill_after_ms) {
    SCOPED_TRACE(fmt::format("kill after {} ms", delay));
    const size_t temps_before = NamesWithPrefix(dir_, temp_prefix).size();
    pid_t pid = ForkChild([&] { return cache->Store(Key(1), big).ok() ? 0 : 1; });
    ASSERT_GT(pid, 0);
    if (delay >= 0) {
      // Wait for the write to start (encoding 64 MB comes first), then kill it.
      auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (NamesWithPrefix(dir_, temp_prefix).size() == temps_before &&
             std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      std::this_thread::sleep_for(milliseconds(delay));
      ::kill(pid, SIGKILL);
      int rc = WaitChild(pid);
      EXPECT_TRUE(rc == 1000 + SIGKILL || rc == 0) << rc;
    } else {
      ASSERT_EQ(WaitChild(pid), 0);
    }
    std::optional<Binary> hit = cache->Lookup(Key(1));
    if (hit.has_value()) {
      EXPECT_TRUE(hit->code == big.code) << "Lookup returned a damaged binary";
    }
    if (delay < 0) {
      EXPECT_TRUE(hit.has_value());
    }
    leftovers = static_cast<int>(NamesWithPrefix(dir_, temp_prefix).size());
  }
  EXPECT_GE(leftovers, 1) << "no writer was caught mid-write; the test proved nothing";

  // Temp files of live writers are young; these are an hour old, so Prune takes them.
  for (const std::string& name : NamesWithPrefix(dir_, ".tmp-")) {
    SetMtime(dir_ + "/" + name, Now() - 7200);
  }
  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(*pruned, leftovers);
  EXPECT_TRUE(NamesWithPrefix(dir_, ".tmp-").empty());
  std::optional<Binary> hit = cache->Lookup(Key(1));
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(hit->code == big.code);
}

TEST_F(DiskCacheTest, EightProcessesCompileOnce) {
  const std::string counter = root_ + "/compiles";
  const Binary compiled = MakeBinary(8);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < 8; ++i) {
    pids.push_back(ForkChild([&, i] {
      ::close(go[1]);
      char c;
      (void)::read(go[0], &c, 1);  // returns at EOF, when the parent closes: all start together
      absl::StatusOr<DiskCache> cache = Open();
      if (!cache.ok()) return 10;
      std::optional<Binary> got = cache->Lookup(Key(1));
      if (!got) {
        absl::StatusOr<DiskCache::KeyLock> lock = cache->LockKey(Key(1), std::chrono::seconds(10));
        if (!lock.ok()) return 11;
        got = cache->Lookup(Key(1));
        if (!got) {
          // "Compile": count it, take a while, store.
          int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
          if (fd < 0 || ::write(fd, "x", 1) != 1) return 12;
          ::close(fd);
          std::this_thread::sleep_for(milliseconds(30));
          if (!cache->Store(Key(1), compiled).ok()) return 13;
          got = compiled;
        }
      }
      std::ofstream(fmt::format("{}/result.{}", root_, i), std::ios::binary) << got->code;
      return 0;
    }));
  }
  ::close(go[0]);
  ::close(go[1]);
  for (pid_t pid : pids) EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(ReadFile(counter), "x") << "the kernel was compiled more than once (or never)";
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(ReadFile(fmt::format("{}/result.{}", root_, i)) == compiled.code) << i;
  }
}

TEST_F(DiskCacheTest, LockKeyTimesOutWhileAnotherProcessHoldsIt) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  pid_t pid = ForkChild([&] {
    absl::StatusOr<DiskCache::KeyLock> lock = cache->LockKey(Key(1), milliseconds(1000));
    if (!lock.ok()) return 1;
    if (::write(ready[1], "r", 1) != 1) return 2;
    char c;
    (void)::read(release[0], &c, 1);
    return 0;  // exiting releases the lock
  });
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);

  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<DiskCache::KeyLock> blocked = cache->LockKey(Key(1), milliseconds(100));
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kDeadlineExceeded) << blocked.status();
  EXPECT_GE(waited, milliseconds(100));
  EXPECT_LT(waited, milliseconds(2000));
  // Another key is not affected.
  EXPECT_TRUE(cache->LockKey(Key(2), milliseconds(0)).ok());

  ASSERT_EQ(::write(release[1], "g", 1), 1);
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_TRUE(cache->LockKey(Key(1), milliseconds(2000)).ok());
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
}

TEST_F(DiskCacheTest, LockDiesWithItsProcess) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ForkChild([&] {
    absl::StatusOr<DiskCache::KeyLock> lock = cache->LockKey(Key(1), milliseconds(1000));
    if (!lock.ok() || ::write(ready[1], "r", 1) != 1) return 1;
    for (;;) ::pause();
  });
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(cache->LockKey(Key(1), milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ::kill(pid, SIGKILL);
  EXPECT_EQ(WaitChild(pid), 1000 + SIGKILL);
  EXPECT_TRUE(cache->LockKey(Key(1), milliseconds(2000)).ok());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(DiskCacheTest, LockIsExclusiveWithinAProcessAndFollowsMoves) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  absl::StatusOr<DiskCache::KeyLock> first = cache->LockKey(Key(1), milliseconds(0));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(cache->LockKey(Key(1), milliseconds(0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  {
    DiskCache::KeyLock moved = std::move(*first);
    first = absl::CancelledError("moved out");  // destroys the moved-from lock: must not unlock
    EXPECT_EQ(cache->LockKey(Key(1), milliseconds(0)).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  EXPECT_TRUE(cache->LockKey(Key(1), milliseconds(0)).ok());
  // The lock file stays after release (deleting it would race with waiters).
  EXPECT_TRUE(Exists(dir_ + "/" + Key(1) + ".lock"));
}

// ---- eviction, listing, maintenance --------------------------------------------------------

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

TEST_F(DiskCacheTest, LruEvictionKeepsRecentlyUsedUnderCap) {
  const uint64_t entry = EncodeEntry(MakeBinary(0), Key(0)).size();
  const uint64_t cap = 3 * entry + entry / 2;  // room for three entries
  absl::StatusOr<DiskCache> cache = Open(cap);
  ASSERT_TRUE(cache.ok());
  auto total = [&] {
    uint64_t sum = 0;
    for (int i = 0; i < 5; ++i) sum += FileSize(EntryPath(Key(i)));
    return sum;
  };
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cache->Store(Key(i), MakeBinary(i)).ok());
    ASSERT_EQ(FileSize(EntryPath(Key(i))), entry);
  }
  // Written in order 0, 1, 2 (0 oldest); then 0 is used, which makes 1 the least recently used.
  SetMtime(EntryPath(Key(0)), Now() - 300);
  SetMtime(EntryPath(Key(1)), Now() - 200);
  SetMtime(EntryPath(Key(2)), Now() - 100);
  ASSERT_TRUE(cache->Lookup(Key(0)).has_value());

  ASSERT_TRUE(cache->Store(Key(3), MakeBinary(3)).ok());
  EXPECT_TRUE(Exists(EntryPath(Key(0))));
  EXPECT_FALSE(Exists(EntryPath(Key(1))));
  EXPECT_TRUE(Exists(EntryPath(Key(2))));
  EXPECT_TRUE(Exists(EntryPath(Key(3))));
  EXPECT_LE(total(), cap);

  ASSERT_TRUE(cache->Store(Key(4), MakeBinary(4)).ok());
  EXPECT_TRUE(Exists(EntryPath(Key(0))));
  EXPECT_FALSE(Exists(EntryPath(Key(2))));
  EXPECT_TRUE(Exists(EntryPath(Key(3))));
  EXPECT_TRUE(Exists(EntryPath(Key(4))));
  EXPECT_LE(total(), cap);
  EXPECT_EQ(total(), 3 * entry);
}

// An entry dated in the future (written while the clock was ahead) is evicted first, not last:
// a hit would have reset its mtime to now.
TEST_F(DiskCacheTest, EvictionTakesFutureDatedEntriesFirst) {
  const uint64_t entry = EncodeEntry(MakeBinary(0), Key(0)).size();
  absl::StatusOr<DiskCache> cache = Open(2 * entry + entry / 2);  // room for two entries
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Store(Key(0), MakeBinary(0)).ok());
  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  SetMtime(EntryPath(Key(0)), Now() + 10 * 365 * 86400);
  SetMtime(EntryPath(Key(1)), Now() - 100);
  ASSERT_TRUE(cache->Store(Key(2), MakeBinary(2)).ok());
  EXPECT_FALSE(Exists(EntryPath(Key(0))));
  EXPECT_TRUE(Exists(EntryPath(Key(1))));
  EXPECT_TRUE(Exists(EntryPath(Key(2))));
}

TEST_F(DiskCacheTest, EntryJustWrittenIsNeverEvicted) {
  absl::StatusOr<DiskCache> cache = Open(/*max_bytes=*/1);  // smaller than any entry
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  EXPECT_TRUE(cache->Lookup(Key(1)).has_value());
  ASSERT_TRUE(cache->Store(Key(2), MakeBinary(2)).ok());
  EXPECT_FALSE(Exists(EntryPath(Key(1))));
  EXPECT_TRUE(cache->Lookup(Key(2)).has_value());
}

TEST_F(DiskCacheTest, ListReportsValidAndInvalidEntriesAndSkipsOthers) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Store(Key(2), MakeBinary(2)).ok());
  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  std::string bytes = ReadFile(EntryPath(Key(2)));
  bytes.back() ^= 1;
  WriteFile(EntryPath(Key(2)), bytes);
  WriteFile(dir_ + "/.tmp-" + Key(3) + "-0123456789abcdef", "partial");
  WriteFile(dir_ + "/" + Key(3) + ".lock", "");
  WriteFile(dir_ + "/README", "not an entry");

  std::vector<DiskCache::EntryInfo> entries = cache->List();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].key, Key(1));
  EXPECT_TRUE(entries[0].valid) << entries[0].problem;
  ASSERT_TRUE(entries[0].binary.has_value());
  EXPECT_EQ(entries[0].binary->code, MakeBinary(1).code);
  EXPECT_EQ(entries[0].size_bytes, FileSize(EntryPath(Key(1))));
  EXPECT_LE(std::abs(entries[0].mtime_unix - Now()), 60);

  EXPECT_EQ(entries[1].key, Key(2));
  EXPECT_FALSE(entries[1].valid);
  EXPECT_FALSE(entries[1].binary.has_value());
  EXPECT_NE(entries[1].problem.find("checksum"), std::string::npos) << entries[1].problem;
  EXPECT_TRUE(Exists(EntryPath(Key(2)))) << "List only reports";
}

TEST_F(DiskCacheTest, ClearRemovesEveryEntry) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache->Store(Key(i), MakeBinary(i)).ok());
  WriteFile(EntryPath(Key(9)), "corrupt entries count too");
  absl::StatusOr<int> cleared = cache->Clear();
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(*cleared, 4);
  EXPECT_TRUE(cache->List().empty());
  EXPECT_FALSE(cache->Lookup(Key(0)).has_value());
}

TEST_F(DiskCacheTest, PruneRemovesInvalidEntriesStaleTempsAndUnheldLocks) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE(cache->Store(Key(1), MakeBinary(1)).ok());
  WriteFile(EntryPath(Key(2)), "corrupt");
  const std::string stale = dir_ + "/.tmp-" + Key(4) + "-00000000000000aa";
  const std::string fresh = dir_ + "/.tmp-" + Key(4) + "-00000000000000bb";
  WriteFile(stale, "crashed writer");
  WriteFile(fresh, "writer in progress");
  SetMtime(stale, Now() - 2 * 3600);
  { ASSERT_TRUE(cache->LockKey(Key(1), milliseconds(0)).ok()); }  // released: file left behind
  absl::StatusOr<DiskCache::KeyLock> held = cache->LockKey(Key(3), milliseconds(0));
  ASSERT_TRUE(held.ok());

  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(*pruned, 2);  // the corrupt entry and the stale temp file
  EXPECT_TRUE(cache->Lookup(Key(1)).has_value());
  EXPECT_FALSE(Exists(EntryPath(Key(2))));
  EXPECT_FALSE(Exists(stale));
  EXPECT_TRUE(Exists(fresh));
  EXPECT_FALSE(Exists(dir_ + "/" + Key(1) + ".lock"));
  EXPECT_TRUE(Exists(dir_ + "/" + Key(3) + ".lock"));
  // The held lock still excludes others, and a pruned lock file is simply recreated.
  EXPECT_EQ(cache->LockKey(Key(3), milliseconds(0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(cache->LockKey(Key(1), milliseconds(0)).ok());
}

// A writer killed while the clock was ahead leaves a temp file dated in the future; once the clock
// is set back, Prune must not wait years for it to become "old" (found by the cache stress test).
TEST_F(DiskCacheTest, PruneRemovesTempFilesDatedFarInTheFuture) {
  absl::StatusOr<DiskCache> cache = Open();
  ASSERT_TRUE(cache.ok());
  const std::string ahead = dir_ + "/.tmp-" + Key(1) + "-00000000000000aa";
  const std::string slightly_ahead = dir_ + "/.tmp-" + Key(1) + "-00000000000000bb";
  WriteFile(ahead, "crashed writer, clock ten years ahead");
  WriteFile(slightly_ahead, "writer in progress, clock a minute ahead");
  SetMtime(ahead, Now() + 10 * 365 * 86400);
  SetMtime(slightly_ahead, Now() + 60);

  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(*pruned, 1);
  EXPECT_FALSE(Exists(ahead));
  EXPECT_TRUE(Exists(slightly_ahead));
}

TEST_F(DiskCacheTest, PruneEvictsBeyondCap) {
  const uint64_t entry = EncodeEntry(MakeBinary(0), Key(0)).size();
  {
    absl::StatusOr<DiskCache> uncapped = Open();
    ASSERT_TRUE(uncapped.ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(uncapped->Store(Key(i), MakeBinary(i)).ok());
      SetMtime(EntryPath(Key(i)), Now() - 100 + i);
    }
  }
  absl::StatusOr<DiskCache> cache = Open(2 * entry);
  ASSERT_TRUE(cache.ok());
  absl::StatusOr<int> pruned = cache->Prune();
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(*pruned, 1);
  EXPECT_FALSE(Exists(EntryPath(Key(0))));  // the oldest
  EXPECT_TRUE(Exists(EntryPath(Key(1))));
  EXPECT_TRUE(Exists(EntryPath(Key(2))));
}

// ---- configuration -------------------------------------------------------------------------

TEST(DiskCacheOptionsTest, FromEnvironmentPrecedence) {
  ScopedEnv max("KJIT_CACHE_MAX_BYTES", nullptr);
  {
    ScopedEnv a("KJIT_CACHE_DIR", "/kjit/dir"), b("XDG_CACHE_HOME", "/xdg"), c("HOME", "/home/u");
    absl::StatusOr<DiskCache::Options> o = DiskCache::Options::FromEnvironment();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->dir, "/kjit/dir");
    EXPECT_EQ(o->max_bytes, 0u);
    EXPECT_EQ(DiskCache::DefaultDirectory(), "/kjit/dir");
  }
  for (const char* unset_dir : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv a("KJIT_CACHE_DIR", unset_dir), b("XDG_CACHE_HOME", "/xdg"), c("HOME", "/home/u");
    EXPECT_EQ(DiskCache::Options::FromEnvironment()->dir, "/xdg/kjit");
  }
  {
    ScopedEnv a("KJIT_CACHE_DIR", nullptr), b("XDG_CACHE_HOME", nullptr), c("HOME", "/home/u");
    EXPECT_EQ(DiskCache::Options::FromEnvironment()->dir, "/home/u/.cache/kjit");
  }
  {
    // The XDG spec: a relative XDG_CACHE_HOME is invalid and ignored.
    ScopedEnv a("KJIT_CACHE_DIR", nullptr), b("XDG_CACHE_HOME", "rel"), c("HOME", "/home/u");
    EXPECT_EQ(DiskCache::Options::FromEnvironment()->dir, "/home/u/.cache/kjit");
  }
}

TEST(DiskCacheOptionsTest, OpenWithEmptyDirUsesTheEnvironment) {
  char tmpl[] = "/tmp/kjit_disk_cache_env_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/c";
  {
    ScopedEnv a("KJIT_CACHE_DIR", dir.c_str());
    absl::StatusOr<DiskCache> cache = DiskCache::Open({});
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ(cache->dir(), dir);
  }
  std::error_code ec;
  fs::remove_all(tmpl, ec);
}

TEST(DiskCacheOptionsTest, MaxBytesIsParsedStrictly) {
  ScopedEnv dir("KJIT_CACHE_DIR", "/kjit/dir");
  const std::vector<std::pair<const char*, uint64_t>> good = {
      {"1048576", 1048576}, {"0", 0}, {"", 0}, {"18446744073709551615", UINT64_MAX}};
  for (const auto& [text, value] : good) {
    ScopedEnv m("KJIT_CACHE_MAX_BYTES", text);
    absl::StatusOr<DiskCache::Options> o = DiskCache::Options::FromEnvironment();
    ASSERT_TRUE(o.ok()) << text << ": " << o.status();
    EXPECT_EQ(o->max_bytes, value) << text;
  }
  for (const char* text :
       {"abc", "-1", "+5", " 5", "5 ", "10G", "1.5", "0x10", "18446744073709551616"}) {
    ScopedEnv m("KJIT_CACHE_MAX_BYTES", text);
    absl::StatusOr<DiskCache::Options> o = DiskCache::Options::FromEnvironment();
    ASSERT_FALSE(o.ok()) << "accepted '" << text << "'";
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find("KJIT_CACHE_MAX_BYTES"), absl::string_view::npos);
  }
}

}  // namespace
}  // namespace kjit::jit
