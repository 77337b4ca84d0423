// The loader skeleton the driver, NVRTC, NCCL and cuBLASLt wrappers share: candidates, the error
// for a missing library, the missing functions named, one instance per process.
#include "jit/dynlib.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "jit/status_helpers.h"

namespace kjit::jit {
namespace {

TEST(DynLibTest, CandidatesForTakesTheVariablesPathAlone) {
  ::unsetenv("KJIT_DYNLIB_TEST_PATH");
  EXPECT_EQ(CandidatesFor("KJIT_DYNLIB_TEST_PATH", {"liba.so.1", "liba.so"}),
            (std::vector<std::string>{"liba.so.1", "liba.so"}));
  ::setenv("KJIT_DYNLIB_TEST_PATH", "", 1);
  EXPECT_EQ(CandidatesFor("KJIT_DYNLIB_TEST_PATH", {"liba.so"}),
            std::vector<std::string>{"liba.so"});
  ::setenv("KJIT_DYNLIB_TEST_PATH", "/opt/liba.so", 1);
  EXPECT_EQ(CandidatesFor("KJIT_DYNLIB_TEST_PATH", {"liba.so"}),
            std::vector<std::string>{"/opt/liba.so"});
  ::unsetenv("KJIT_DYNLIB_TEST_PATH");
}

TEST(DynLibTest, AMissingLibrarySaysWhatTheLoaderWants) {
  const absl::StatusOr<DynLib> lib =
      DynLib::Open({"libkjit_no_such.so"},
                   {absl::StatusCode::kFailedPrecondition, "no liba: {}\nfix: install it"});
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(ToStd(lib.status().message()));
  EXPECT_EQ(message.rfind("no liba: could not load libkjit_no_such.so", 0), 0u) << message;
  EXPECT_NE(message.find("\nfix: install it"), std::string::npos) << message;
}

TEST(DynLibTest, SymbolResolverNamesEveryMissingFunction) {
  absl::StatusOr<DynLib> libc = DynLib::Open({"libc.so.6"});
  ASSERT_TRUE(libc.ok()) << libc.status();
  SymbolResolver symbols(*libc);
  decltype(&std::getenv) getenv_fn = nullptr;
  void (*absent)() = nullptr;
  void (*also_absent)() = nullptr;
  symbols.Resolve(getenv_fn, "getenv");
  EXPECT_NE(getenv_fn, nullptr);
  EXPECT_TRUE(symbols.Check("libc 2 is needed").ok());
  symbols.Resolve(absent, "kjit_absent");
  symbols.Resolve(also_absent, "kjit_also_absent");
  EXPECT_EQ(absent, nullptr);
  const absl::Status s = symbols.Check("libc 2 is needed");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(ToStd(s.message())),
            libc->path() + " lacks kjit_absent kjit_also_absent: libc 2 is needed");
}

struct Counted {
  static absl::StatusOr<Counted> Load() {
    ++loads;
    return Counted{};
  }
  static inline int loads = 0;
};

TEST(DynLibTest, LoadedOnceLoadsOnce) {
  const absl::StatusOr<const Counted*> a = LoadedOnce<Counted>(&Counted::Load);
  const absl::StatusOr<const Counted*> b = LoadedOnce<Counted>(&Counted::Load);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(Counted::loads, 1);
}

}  // namespace
}  // namespace kjit::jit
