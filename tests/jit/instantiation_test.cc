#include "jit/instantiation.h"

#include <cstdint>
#include <type_traits>

#include <gtest/gtest.h>

namespace kjit::jit {
namespace {

enum class Casting { kLlama = 0, kGemma = 1 };

TEST(Instantiate, SpellsEachKindOfArgumentAsTheKernelSourceDoes) {
  EXPECT_EQ(Instantiate("kjit::k", DType::kF32, DType::kF16, DType::kBF16),
            "kjit::k<float, kjit::f16, kjit::bf16>");
  EXPECT_EQ(Instantiate("kjit::k", IndexType::kInt32, IndexType::kInt64),
            "kjit::k<int, long long>");
  EXPECT_EQ(Instantiate("kjit::k", true, false), "kjit::k<true, false>");
  EXPECT_EQ(Instantiate("kjit::k", 4096, int64_t{1} << 40, -1), "kjit::k<4096, 1099511627776, -1>");
  EXPECT_EQ(Instantiate("kjit::k", Casting::kGemma), "kjit::k<1>");
  EXPECT_EQ(Instantiate("kjit::k", TemplateArg::Name("kjit::kCeMean")), "kjit::k<kjit::kCeMean>");
}

TEST(Instantiate, SplicesGroupsOfArgumentsWhereTheyStand) {
  const TemplateArgs shape = {DType::kBF16, 128256};
  EXPECT_EQ(Instantiate("kjit::k", shape, 8, shape),
            "kjit::k<kjit::bf16, 128256, 8, kjit::bf16, 128256>");
  EXPECT_EQ(Instantiate("kjit::k", TemplateArgs{}), "kjit::k<>");
}

// A string or a pointer must not pass as a bool (as `const char*` to `bool` would): device names
// are said to be names.
static_assert(!std::is_convertible_v<const char*, TemplateArg>);
static_assert(!std::is_convertible_v<std::string, TemplateArg>);
static_assert(!std::is_convertible_v<const int*, TemplateArg>);
static_assert(!std::is_convertible_v<double, TemplateArg>);

}  // namespace
}  // namespace kjit::jit
