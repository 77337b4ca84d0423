// The POSIX file layer under the disk cache, the tuning database and the trace writer: errno codes,
// private directories, the flock timeout, and whole-file replacement that fails without damage.
#include "jit/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kjit::jit {
namespace {

using std::chrono::milliseconds;
using testing::NamesWithPrefix;
using testing::ReadFile;

TEST(FileIoErrnoTest, MapsErrnoToCodesAndNamesWhatFailed) {
  const std::vector<std::pair<int, absl::StatusCode>> cases = {
      {ENOENT, absl::StatusCode::kNotFound},
      {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied},
      {EROFS, absl::StatusCode::kPermissionDenied},
      {ENOSPC, absl::StatusCode::kResourceExhausted},
      {EDQUOT, absl::StatusCode::kResourceExhausted},
      {EFBIG, absl::StatusCode::kResourceExhausted},
      {EIO, absl::StatusCode::kInternal},
      {ENOTDIR, absl::StatusCode::kInternal},
  };
  for (const auto& [err, code] : cases) {
    const absl::Status s = ErrnoStatus(err, "cannot open /x");
    EXPECT_EQ(s.code(), code) << err;
    EXPECT_EQ(std::string(ToStd(s.message())), "cannot open /x: " + ErrnoText(err));
  }
  EXPECT_EQ(ErrnoText(ENOENT), "No such file or directory");
}

TEST(FileIoPathTest, ParentDirAndTempPathFor) {
  EXPECT_EQ(ParentDir("a/b/c.json"), "a/b");
  EXPECT_EQ(ParentDir("c.json"), ".");
  EXPECT_EQ(ParentDir("/c.json"), "/");

  absl::StatusOr<std::string> a = TempPathFor("dir/c.json");
  absl::StatusOr<std::string> b = TempPathFor("dir/c.json");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_TRUE(std::regex_match(*a, std::regex(R"(dir/\.tmp-c\.json-[0-9a-f]{16})"))) << *a;
  EXPECT_NE(*a, *b);
  absl::StatusOr<std::string> bare = TempPathFor("c.json");
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(std::regex_match(*bare, std::regex(R"(\.tmp-c\.json-[0-9a-f]{16})"))) << *bare;
}

class FileIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    path_ = dir_ + "/data.json";
  }
  std::vector<std::string> Temps() const { return NamesWithPrefix(dir_, ".tmp-"); }

  testing::TempDir tmp_{"kjit_file_io_test"};
  std::string dir_;
  std::string path_;
};

TEST_F(FileIoTest, AtomicWriteReplacesTheContentAndLeavesNoTempFile) {
  ASSERT_TRUE(WriteFileAtomically(path_, "first", 0600).ok());
  EXPECT_EQ(ReadFile(path_), "first");
  ASSERT_TRUE(WriteFileAtomically(path_, "the second, longer", 0600).ok());
  EXPECT_EQ(ReadFile(path_), "the second, longer");
  ASSERT_TRUE(WriteFileAtomically(path_, "", 0600).ok());
  EXPECT_EQ(ReadFile(path_), "");
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(NamesWithPrefix(dir_, ""), std::vector<std::string>{"data.json"});
}

TEST_F(FileIoTest, AWriteIntoAReadOnlyDirectoryFailsAndLeavesTheOldFile) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which creates files in a 0500 directory all the same";
  }
  ASSERT_TRUE(WriteFileAtomically(path_, "old", 0600).ok());
  ASSERT_EQ(::chmod(dir_.c_str(), 0500), 0);
  const absl::Status s = WriteFileAtomically(path_, "new", 0600);
  ::chmod(dir_.c_str(), 0700);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(path_), absl::string_view::npos) << s;
  EXPECT_EQ(ReadFile(path_), "old");
  EXPECT_TRUE(Temps().empty());
}

TEST_F(FileIoTest, AWriteCutShortLeavesTheOldFileAndNoTempFile) {
  ASSERT_TRUE(WriteFileAtomically(path_, "old", 0600).ok());
  // A child that may not grow a file past 3 bytes: the write fails part way (EFBIG, as a full disk
  // would), even for root.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{3, 3};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(1);
    const absl::Status s = WriteFileAtomically(path_, std::string(1000, 'x'), 0600);
    if (s.code() != absl::StatusCode::kResourceExhausted) ::_exit(2);
    ::_exit(s.message().find(path_ + " (write)") != absl::string_view::npos ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: setrlimit, 2: not ResourceExhausted, 3: the message";
  EXPECT_EQ(ReadFile(path_), "old");
  EXPECT_TRUE(Temps().empty());
}

TEST_F(FileIoTest, AWriteIntoAMissingDirectoryNamesThePath) {
  const std::string path = dir_ + "/missing/data.json";
  const absl::Status s = WriteFileAtomically(path, "x", 0600);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
}

TEST_F(FileIoTest, MakePrivateDirsCreatesTheChain0700WhateverTheUmask) {
  const mode_t old_umask = ::umask(0);
  const absl::Status made = MakePrivateDirs(dir_ + "/a/b/c");
  ::umask(old_umask);
  ASSERT_TRUE(made.ok()) << made;
  for (const std::string& d : {dir_ + "/a", dir_ + "/a/b", dir_ + "/a/b/c"}) {
    struct stat st {};
    ASSERT_EQ(::stat(d.c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_mode & 07777, 0700u) << d;
  }
  EXPECT_TRUE(MakePrivateDirs(dir_ + "/a/b/c").ok()) << "an existing chain is fine";

  // A directory that cannot exist, whoever runs the test (root ignores permission bits).
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/file", "x", 0600).ok());
  const absl::Status beneath = MakePrivateDirs(dir_ + "/file/d");
  EXPECT_FALSE(beneath.ok());
  EXPECT_NE(beneath.message().find(dir_ + "/file"), absl::string_view::npos) << beneath;
}

TEST_F(FileIoTest, LockTimesOutWhileAnotherOpenHoldsItAndIsReleasedWithTheLock) {
  const std::string lock_path = dir_ + "/data.json.lock";
  absl::StatusOr<FileLock> first = LockFile(lock_path, milliseconds(0));
  ASSERT_TRUE(first.ok()) << first.status();

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<FileLock> second = LockFile(lock_path, milliseconds(50));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(50));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDeadlineExceeded) << second.status();
  EXPECT_NE(second.status().message().find(lock_path), absl::string_view::npos);

  { FileLock released = *std::move(first); }
  EXPECT_TRUE(LockFile(lock_path, milliseconds(0)).ok()) << "destroying the lock releases it";

  // flock excludes every other open file description of the file, another in this process too:
  // this one stands for another process.
  const int held = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  EXPECT_EQ(LockFile(lock_path, milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ::close(held);
  EXPECT_TRUE(LockFile(lock_path, milliseconds(0)).ok());
  EXPECT_EQ(NamesWithPrefix(dir_, ""), std::vector<std::string>{"data.json.lock"})
      << "the lock file stays";
}

TEST_F(FileIoTest, LockRefusesASymlink) {
  const std::string target = dir_ + "/target";
  ASSERT_TRUE(WriteFileAtomically(target, "precious", 0600).ok());
  const std::string lock_path = dir_ + "/data.json.lock";
  ASSERT_EQ(::symlink(target.c_str(), lock_path.c_str()), 0);
  absl::StatusOr<FileLock> lock = LockFile(lock_path, milliseconds(0));
  EXPECT_FALSE(lock.ok());
  EXPECT_NE(lock.status().message().find(lock_path), absl::string_view::npos) << lock.status();
  EXPECT_EQ(ReadFile(target), "precious");
}

TEST_F(FileIoTest, ReadRegularFileReadsAFileAndRefusesTheRest) {
  ASSERT_TRUE(WriteFileAtomically(path_, "0123456789", 0600).ok());
  EXPECT_EQ(ReadRegularFile(path_, 100).value_or("?"), "0123456789");
  EXPECT_GT(ReadRegularFile(path_, 4).value_or("").size(), 4u) << "longer than the limit: too big";
  const absl::StatusOr<std::string> missing = ReadRegularFile(dir_ + "/none", 100);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const absl::StatusOr<std::string> not_regular = ReadRegularFile(fifo, 100);  // does not hang
  EXPECT_EQ(not_regular.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(ToStd(not_regular.status().message())), fifo + " is not a regular file");
}

TEST_F(FileIoTest, RenamePathNamesBothPaths) {
  const absl::Status s = RenamePath(dir_ + "/none", path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(ToStd(s.message())),
            "cannot rename " + dir_ + "/none to " + path_ + ": " + ErrnoText(ENOENT));
}

TEST_F(FileIoTest, ACreatedLockedFileIsHeldUntilItsLockGoes) {
  const std::string lock_path = dir_ + "/owner.lock";
  EXPECT_EQ(TryLockExistingFile(lock_path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(NamesWithPrefix(dir_, ""), std::vector<std::string>{}) << "trying creates nothing";
  absl::StatusOr<FileLock> owner = CreateLockedFile(lock_path);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(NamesWithPrefix(dir_, ""), std::vector<std::string>{"owner.lock"});
  const absl::StatusOr<FileLock> while_held = TryLockExistingFile(lock_path);
  EXPECT_EQ(while_held.status().code(), absl::StatusCode::kUnavailable) << while_held.status();
  EXPECT_NE(while_held.status().message().find(lock_path), absl::string_view::npos);
  { FileLock released = *std::move(owner); }
  EXPECT_TRUE(TryLockExistingFile(lock_path).ok());
}

TEST_F(FileIoTest, WriteFileInPlaceWritesAndNamesThePathItCannotWrite) {
  ASSERT_TRUE(WriteFileInPlace(path_, "a longer first text").ok());
  ASSERT_TRUE(WriteFileInPlace(path_, "second").ok());
  EXPECT_EQ(ReadFile(path_), "second");
  const absl::Status s = WriteFileInPlace(dir_ + "/none/out.json", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(ToStd(s.message())),
            "cannot write " + dir_ + "/none/out.json (open): " + ErrnoText(ENOENT));
}

}  // namespace
}  // namespace kjit::jit
