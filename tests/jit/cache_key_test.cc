#include "jit/cache_key.h"

#include <gtest/gtest.h>

#include "jit/compiler.h"

namespace kjit::jit {
namespace {

Source MakeSource() {
  Source s;
  s.name = "p";
  s.text = "#include \"a.cuh\"\n";
  s.headers = {{"a.cuh", "__global__ void k() {}"}};
  s.name_expressions = {"k"};
  return s;
}

TEST(CacheKeyTest, IsStableAndHex) {
  const Target t = *ParseTarget("sm_90");
  const std::string a = CacheKey(MakeSource(), t, CompileOptions(t), "13.0");
  EXPECT_EQ(a, CacheKey(MakeSource(), t, CompileOptions(t), "13.0"));
  ASSERT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(CacheKeyTest, EveryInputChangesTheKey) {
  const Target t = *ParseTarget("sm_90");
  const std::string base = CacheKey(MakeSource(), t, CompileOptions(t), "13.0");
  Source header_edit = MakeSource();
  header_edit.headers[0].second += " ";
  Source stub_edit = MakeSource();
  stub_edit.text += "\n";
  Source kernel_edit = MakeSource();
  kernel_edit.name_expressions = {"k2"};
  const Target t100 = *ParseTarget("sm_100");
  const Target ptx = *ParseTarget("compute_90");
  std::vector<std::string> other_options = CompileOptions(t);
  other_options.push_back("-lineinfo");
  for (const std::string& k : {CacheKey(header_edit, t, CompileOptions(t), "13.0"),
                               CacheKey(stub_edit, t, CompileOptions(t), "13.0"),
                               CacheKey(kernel_edit, t, CompileOptions(t), "13.0"),
                               CacheKey(MakeSource(), t100, CompileOptions(t), "13.0"),
                               CacheKey(MakeSource(), ptx, CompileOptions(t), "13.0"),
                               CacheKey(MakeSource(), t, other_options, "13.0"),
                               CacheKey(MakeSource(), t, CompileOptions(t), "13.1")}) {
    EXPECT_NE(k, base);
  }
}

TEST(CacheKeyTest, FieldsCannotBleedIntoEachOther) {
  // "ab" + "c" and "a" + "bc" must not serialize alike.
  const Target t = *ParseTarget("sm_90");
  Source a = MakeSource(), b = MakeSource();
  a.headers = {{"ab", "c"}};
  b.headers = {{"a", "bc"}};
  EXPECT_NE(CacheKey(a, t, {}, "13.0"), CacheKey(b, t, {}, "13.0"));
}

}  // namespace
}  // namespace kjit::jit
