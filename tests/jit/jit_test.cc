// The Jit facade: in-memory registry -> disk cache -> NVRTC. These tests compile a real (small)
// RMSNorm program through NVRTC, so they need libnvrtc but no GPU or driver. Each test gets its own
// mkdtemp cache directory; compile_count() proves which layer answered.
#include "jit/jit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <absl/strings/cord.h>
#include <gtest/gtest.h>

#include "jit/cache_key.h"
#include "jit/compiler.h"
#include "jit/disk_cache.h"
#include "jit/source.h"
#include "jit/status_helpers.h"
#include "jit/target.h"
#include "kjit/rms_norm.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/program.h"

namespace kjit::jit {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kHidden = 64;

Source SmallSource() {
  RmsNormSpec spec{.hidden = kHidden, .dtype = DType::kBF16};
  absl::StatusOr<Source> src =
      ops::RenderRmsNorm(spec, ops::DefaultRmsNormConfig(kHidden, /*vec=*/8));
  EXPECT_TRUE(src.ok()) << src.status();
  return src.ok() ? *src : Source{};
}

Target Sm(const char* text) {
  absl::StatusOr<Target> t = ParseTarget(text);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.value_or(Target{});
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every name in `dir`, sorted.
std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

class JitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kjit_jit_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    root_ = tmpl;
    dir_ = root_ + "/cache";  // created by DiskCache::Open
    source_ = SmallSource();
    ASSERT_FALSE(source_.text.empty());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  Jit::Options OptionsFor(const std::string& dir) const {
    return Jit::Options{.cache = DiskCache::Options{.dir = dir}};
  }
  std::unique_ptr<Jit> NewJit(const std::string& dir) const {
    absl::StatusOr<std::unique_ptr<Jit>> jit = Jit::Create(OptionsFor(dir));
    EXPECT_TRUE(jit.ok()) << jit.status();
    return jit.ok() ? std::move(*jit) : nullptr;
  }
  std::unique_ptr<Jit> NewJit() const { return NewJit(dir_); }

  std::string root_;
  std::string dir_;
  Source source_;
};

TEST_F(JitTest, SecondBuildInOneJitIsAMemoryHit) {
  auto jit = NewJit();
  ASSERT_NE(jit, nullptr);
  ASSERT_NE(jit->disk_cache(), nullptr);
  EXPECT_EQ(jit->compile_count(), 0);

  auto first = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->origin, Jit::Origin::kCompiled);
  EXPECT_EQ(jit->compile_count(), 1);
  ASSERT_NE(first->binary, nullptr);
  EXPECT_FALSE(first->binary->code.empty());
  EXPECT_EQ(first->binary->code.substr(0, 4),
            "\x7f"
            "ELF");  // a CUBIN is an ELF file
  EXPECT_EQ(first->binary->target, Sm("sm_90"));
  EXPECT_EQ(first->binary->lowered_names.size(), source_.name_expressions.size());
  EXPECT_EQ(first->key.size(), 32u);
  EXPECT_EQ(first->path, dir_ + "/" + first->key + ".kjit");
  EXPECT_TRUE(fs::is_regular_file(first->path)) << first->path;

  auto second = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->origin, Jit::Origin::kMemory);
  EXPECT_EQ(jit->compile_count(), 1);
  EXPECT_EQ(second->key, first->key);
  EXPECT_EQ(second->path, first->path);
  EXPECT_EQ(second->binary.get(), first->binary.get()) << "the registry hands out the same binary";
  EXPECT_STREQ(OriginName(second->origin), "memory");

  // Another target is another program: a new compile, a new key.
  auto other = jit->Build(source_, Sm("sm_100"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->origin, Jit::Origin::kCompiled);
  EXPECT_NE(other->key, first->key);
  EXPECT_EQ(other->binary->target, Sm("sm_100"));
  EXPECT_EQ(jit->compile_count(), 2);
}

// Threads of one process share a Jit: the same kernel requested by many at once is compiled once
// and every thread gets that binary; different kernels build side by side.
TEST_F(JitTest, ThreadsBuildingOneKernelCompileItOnce) {
  auto jit = NewJit();
  ASSERT_NE(jit, nullptr);
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<Jit::Built>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    // Half ask for sm_90, half for sm_100: two kernels, each wanted by four threads.
    threads.emplace_back(
        [&, i] { results[i] = jit->Build(source_, Sm(i % 2 ? "sm_100" : "sm_90")); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(jit->compile_count(), 2);
  int compiled = 0;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(results[i]->binary.get(), results[i % 2]->binary.get()) << i;
    compiled += results[i]->origin == Jit::Origin::kCompiled;
  }
  EXPECT_EQ(compiled, 2) << "the others waited and got a memory hit";
}

// BuildAll: several programs at once, in their order; a program given twice is compiled once, a
// second call finds them all in memory, and one broken program fails the call with its error.
TEST_F(JitTest, BuildAllBuildsEveryProgramInOrder) {
  auto jit = NewJit();
  ASSERT_NE(jit, nullptr);
  absl::StatusOr<Source> other = ops::RenderRmsNorm({.hidden = 2 * kHidden, .dtype = DType::kBF16},
                                                    ops::DefaultRmsNormConfig(2 * kHidden, 8));
  ASSERT_TRUE(other.ok()) << other.status();
  const std::vector<Source> sources = {source_, *other, source_};
  auto built = jit->BuildAll(sources, Sm("sm_90"));
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_EQ(built->size(), 3u);
  EXPECT_EQ(jit->compile_count(), 2);
  EXPECT_EQ((*built)[0].key, (*built)[2].key);
  EXPECT_NE((*built)[0].key, (*built)[1].key);
  EXPECT_EQ((*built)[1].binary->params, other->params);
  auto again = jit->BuildAll(sources, Sm("sm_90"));
  ASSERT_TRUE(again.ok()) << again.status();
  for (const Jit::Built& b : *again) EXPECT_EQ(b.origin, Jit::Origin::kMemory);
  EXPECT_EQ(jit->compile_count(), 2);

  auto broken = RenderSource("broken_kernel", {"common.cuh"}, {"kjit::no_such_kernel<1>"}, {});
  ASSERT_TRUE(broken.ok()) << broken.status();
  auto failed = jit->BuildAll({source_, *broken}, Sm("sm_90"));
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(std::string(failed.status().message()).find("broken_kernel"), std::string::npos)
      << failed.status();
  auto none = jit->BuildAll({}, Sm("sm_90"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST_F(JitTest, NewJitOnTheSameDirectoryLoadsFromDisk) {
  std::string code, key, path;
  std::map<std::string, std::string> lowered;
  {
    auto jit = NewJit();
    ASSERT_NE(jit, nullptr);
    auto built = jit->Build(source_, Sm("sm_90"));
    ASSERT_TRUE(built.ok()) << built.status();
    ASSERT_EQ(built->origin, Jit::Origin::kCompiled);
    code = built->binary->code;
    key = built->key;
    path = built->path;
    lowered = built->binary->lowered_names;
  }
  auto jit = NewJit();
  ASSERT_NE(jit, nullptr);
  auto built = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->origin, Jit::Origin::kDisk);
  EXPECT_STREQ(OriginName(built->origin), "disk cache");
  EXPECT_EQ(jit->compile_count(), 0);
  EXPECT_EQ(built->key, key);
  EXPECT_EQ(built->path, path);
  EXPECT_TRUE(built->binary->code == code) << "the disk hit must return the compiled bytes";
  EXPECT_EQ(built->binary->lowered_names, lowered);
  EXPECT_EQ(built->binary->target, Sm("sm_90"));
  EXPECT_EQ(built->binary->params, source_.params);

  // And after the disk hit, the same Jit answers from memory.
  auto again = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->origin, Jit::Origin::kMemory);
  EXPECT_EQ(jit->compile_count(), 0);
}

// What one child reports through the result pipe (one write, well under PIPE_BUF: atomic).
struct ChildReport {
  int index = -1;
  int ok = 0;
  int compile_count = -1;
  int origin = -1;
  char code_hash[33] = {};
  char error[160] = {};
};

TEST_F(JitTest, EightProcessesStartedTogetherCompileOnce) {
  constexpr int kChildren = 8;
  // Open the cache once up front so that the children race on the key, not on mkdir.
  ASSERT_NE(NewJit(), nullptr);
  // Load NVRTC before forking, as a training job's ranks would each have it loaded.
  ASSERT_TRUE(Nvrtc::Get().ok()) << Nvrtc::Get().status();

  int start[2], results[2];
  ASSERT_EQ(::pipe(start), 0);
  ASSERT_EQ(::pipe(results), 0);
  const Jit::Options options = OptionsFor(dir_);
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int i = 0; i < kChildren; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      ::close(start[1]);
      ::close(results[0]);
      char c;
      while (::read(start[0], &c, 1) < 0 && errno == EINTR) {
      }  // EOF: the parent closed the write end, everyone goes at once
      ChildReport r;
      r.index = i;
      auto jit = Jit::Create(options);
      if (!jit.ok()) {
        std::snprintf(r.error, sizeof r.error, "%s",
                      std::string(ToStd(jit.status().message())).c_str());
      } else {
        auto built = (*jit)->Build(source_, Sm("sm_90"));
        if (!built.ok()) {
          std::snprintf(r.error, sizeof r.error, "%s",
                        std::string(ToStd(built.status().message())).c_str());
        } else {
          r.ok = 1;
          r.compile_count = (*jit)->compile_count();
          r.origin = static_cast<int>(built->origin);
          std::snprintf(r.code_hash, sizeof r.code_hash, "%s",
                        HashHex(built->binary->code).c_str());
        }
      }
      ssize_t n = ::write(results[1], &r, sizeof r);
      ::_exit(n == static_cast<ssize_t>(sizeof r) ? 0 : 3);
    }
    pids.push_back(pid);
  }
  ::close(start[0]);
  ::close(results[1]);
  ::close(start[1]);  // release the barrier

  std::vector<ChildReport> reports;
  ChildReport r;
  ssize_t n;
  while ((n = ::read(results[0], &r, sizeof r)) == static_cast<ssize_t>(sizeof r))
    reports.push_back(r);
  ::close(results[0]);
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  ASSERT_EQ(reports.size(), static_cast<size_t>(kChildren));

  int total_compiles = 0, compiled = 0, from_disk = 0;
  for (const ChildReport& c : reports) {
    ASSERT_EQ(c.ok, 1) << "child " << c.index << ": " << c.error;
    total_compiles += c.compile_count;
    compiled += c.origin == static_cast<int>(Jit::Origin::kCompiled);
    from_disk += c.origin == static_cast<int>(Jit::Origin::kDisk);
    EXPECT_STREQ(c.code_hash, reports[0].code_hash) << "child " << c.index;
  }
  EXPECT_EQ(total_compiles, 1) << "the per-key lock must make 8 processes compile once";
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(from_disk, kChildren - 1);

  // The stored entry holds those same bytes, and it is the only entry.
  auto cache = DiskCache::Open({.dir = dir_});
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto entries = cache->List();
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_TRUE(entries[0].valid) << entries[0].problem;
  EXPECT_EQ(HashHex(entries[0].binary->code), std::string(reports[0].code_hash));
}

// /proc/self/fdinfo is a directory nobody can create files in, root included (a chmod 0500
// directory would not do: root ignores its mode). It is owned by us and not group/other-writable,
// so DiskCache::Open accepts it and degrades to read-only.
TEST_F(JitTest, UnwritableCacheDirectoryStillBuildsInMemory) {
  const std::string ro = "/proc/self/fdinfo";
  auto jit = NewJit(ro);
  ASSERT_NE(jit, nullptr);
  ASSERT_NE(jit->disk_cache(), nullptr);
  ASSERT_TRUE(jit->disk_cache()->read_only()) << "expected " << ro << " to open read-only";
  EXPECT_NE(jit->disk_cache()->warning().find("not writable"), std::string::npos)
      << jit->disk_cache()->warning();

  auto first = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->origin, Jit::Origin::kCompiled);
  EXPECT_TRUE(first->path.empty()) << "nothing was stored, yet path is " << first->path;
  EXPECT_FALSE(first->binary->code.empty());
  EXPECT_EQ(jit->compile_count(), 1);

  auto second = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->origin, Jit::Origin::kMemory);
  EXPECT_EQ(second->binary.get(), first->binary.get());
  EXPECT_EQ(jit->compile_count(), 1);
}

// Jit::Built::path is "the disk entry, empty when memory-only": a memory hit on a kernel that never
// reached the disk must not name a file that does not exist.
TEST_F(JitTest, MemoryHitOfAMemoryOnlyKernelHasNoPath) {
  auto jit = NewJit("/proc/self/fdinfo");
  ASSERT_NE(jit, nullptr);
  ASSERT_TRUE(jit->disk_cache()->read_only());
  auto first = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->path.empty());
  auto second = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->origin, Jit::Origin::kMemory);
  EXPECT_EQ(second->path, first->path) << "a memory hit names a disk entry that was never written";
}

TEST_F(JitTest, CorruptedEntryIsRecompiledAndReplaced) {
  std::string path, code;
  {
    auto jit = NewJit();
    ASSERT_NE(jit, nullptr);
    auto built = jit->Build(source_, Sm("sm_90"));
    ASSERT_TRUE(built.ok()) << built.status();
    ASSERT_EQ(built->origin, Jit::Origin::kCompiled);
    path = built->path;
    code = built->binary->code;
  }
  // Flip one byte in the middle of the stored CUBIN.
  std::string bytes = ReadFile(path);
  ASSERT_GT(bytes.size(), code.size());
  const size_t at = bytes.size() - code.size() / 2;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
    ASSERT_TRUE(out.good());
  }
  {
    auto cache = DiskCache::Open({.dir = dir_});
    ASSERT_TRUE(cache.ok()) << cache.status();
    auto entries = cache->List();
    ASSERT_EQ(entries.size(), 1u);
    ASSERT_FALSE(entries[0].valid) << "the flipped byte went unnoticed";
  }

  auto jit = NewJit();
  ASSERT_NE(jit, nullptr);
  auto built = jit->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->origin, Jit::Origin::kCompiled) << "a corrupt entry must never be loaded";
  EXPECT_EQ(jit->compile_count(), 1);
  EXPECT_EQ(built->path, path);
  EXPECT_TRUE(built->binary->code == code) << "NVRTC is deterministic: the same CUBIN again";

  // The entry is whole again: a fresh Jit loads it from disk.
  auto cache = DiskCache::Open({.dir = dir_});
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto entries = cache->List();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].valid) << entries[0].problem;
  auto fresh = NewJit();
  ASSERT_NE(fresh, nullptr);
  auto hit = fresh->Build(source_, Sm("sm_90"));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->origin, Jit::Origin::kDisk);
  EXPECT_EQ(fresh->compile_count(), 0);
  EXPECT_TRUE(hit->binary->code == code);
}

TEST_F(JitTest, CompileErrorCarriesLogTargetAndOptionsAndStoresNothing) {
  auto broken = RenderSource("broken_kernel", {"common.cuh"}, {"kjit::no_such_kernel<1>"},
                             {{"op", "broken"}, {"hidden", "123"}});
  ASSERT_TRUE(broken.ok()) << broken.status();
  auto jit = NewJit();
  ASSERT_NE(jit, nullptr);

  const Target target = Sm("sm_90");
  auto built = jit->Build(*broken, target);
  ASSERT_FALSE(built.ok());
  const absl::Status& s = built.status();
  EXPECT_TRUE(s.code() == absl::StatusCode::kInternal ||
              s.code() == absl::StatusCode::kInvalidArgument)
      << s;
  const std::string msg(ToStd(s.message()));
  EXPECT_NE(msg.find("sm_90"), std::string::npos) << msg;
  for (const std::string& option : CompileOptions(target)) {
    EXPECT_NE(msg.find(option), std::string::npos) << "option " << option << " missing: " << msg;
  }
  EXPECT_NE(msg.find("broken_kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden=123"), std::string::npos) << "the op's params: " << msg;
  // The NVRTC log: attached as a payload and included in the message.
  auto log = s.GetPayload(kCompileLogPayload);
  ASSERT_TRUE(log.has_value()) << msg;
  const std::string log_text(*log);
  EXPECT_NE(log_text.find("no_such_kernel"), std::string::npos) << log_text;
  EXPECT_NE(log_text.find("error"), std::string::npos) << log_text;
  EXPECT_NE(msg.find(log_text), std::string::npos) << "the message must carry the log: " << msg;

  // A failure is not remembered as a success: the next Build fails the same way.
  auto again = jit->Build(*broken, target);
  EXPECT_FALSE(again.ok());

  // No entry and no temp file; at most the per-key lock file remains.
  auto cache = DiskCache::Open({.dir = dir_});
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_TRUE(cache->List().empty());
  for (const std::string& name : DirNames(dir_)) {
    EXPECT_TRUE(name.ends_with(".lock"))
        << "unexpected file in the cache: " << name << " (all: " << Joined(DirNames(dir_)) << ")";
  }
}

TEST_F(JitTest, CacheOffCompilesEveryNewJitAndWritesNothing) {
  Jit::Options options = OptionsFor(dir_);
  options.use_disk_cache = false;
  for (int round = 0; round < 2; ++round) {
    auto jit = Jit::Create(options);
    ASSERT_TRUE(jit.ok()) << jit.status();
    EXPECT_EQ((*jit)->disk_cache(), nullptr);
    auto built = (*jit)->Build(source_, Sm("sm_90"));
    ASSERT_TRUE(built.ok()) << built.status();
    EXPECT_EQ(built->origin, Jit::Origin::kCompiled) << "round " << round;
    EXPECT_TRUE(built->path.empty());
    EXPECT_EQ((*jit)->compile_count(), 1);
  }
  EXPECT_FALSE(fs::exists(dir_)) << "a Jit without a disk cache created " << dir_;
}

}  // namespace
}  // namespace kjit::jit
