// The folder and file direction of README.md's "Layout", checked on every quoted #include in the
// tree against tests/layering/allowed_includes.txt (tools -> autotune -> ops -> runtime -> jit ->
// templates; within an op, what users link apart from what only the tuner needs). A new include
// the table does not allow fails here, naming the file; the checker itself is tested on planted
// trees, so that it can fail.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/layering/include_rules.h"
#include "tests/temp_dir.h"

namespace kjit::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// The problems the checker finds in the tree under `root` with the table `table`.
std::vector<std::string> Check(const fs::path& root, const std::string& table) {
  std::vector<std::string> problems;
  const IncludeRules rules = ParseIncludeRules(table, problems);
  CheckIncludes(root, rules, problems);
  return problems;
}

TEST(Layering, EveryIncludeOfTheTreeIsAnAllowedEdge) {
  const fs::path root = KJIT_SOURCE_DIR;
  const std::string table = ReadFile(root / kAllowedIncludesTable);
  ASSERT_FALSE(table.empty()) << "cannot read " << root / kAllowedIncludesTable;
  std::vector<std::string> problems;
  const IncludeRules rules = ParseIncludeRules(table, problems);
  const IncludeScan scan = CheckIncludes(root, rules, problems);
  EXPECT_TRUE(problems.empty()) << Joined(problems);
  EXPECT_GT(scan.files, 200) << "the scan found too few files under " << root;
  EXPECT_GT(scan.includes, 600) << "the scan found too few includes under " << root;
}

class PlantedTree : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    WriteFile(root_ / "jit/a.h", "#pragma once\n");
    WriteFile(root_ / "runtime/b.cc", "#include \"jit/a.h\"\n#include <vector>\n");
    WriteFile(root_ / "ops/x/x.cc", "#include \"ops/x/config.h\"\n");
    WriteFile(root_ / "ops/x/config.h", "#pragma once\n");
    WriteFile(root_ / "ops/y/config.h", "#pragma once\n");
    WriteFile(root_ / "build/CMakeCache.txt", "");
    WriteFile(root_ / "build/gen.cc", "#include \"tools/anything.h\"\n");  // a build tree: skipped
  }
  static constexpr char kTable[] =
      "group jit: jit/*\n"
      "group runtime: runtime/*\n"
      "group op: ops/{op}/*\n"
      "allow jit -> jit\n"
      "allow runtime -> runtime jit\n"
      "allow op -> op runtime jit  # within one op\n";

  // The one problem the checker finds with `table`, or a failure listing all it found.
  std::string OneProblem(const std::string& table = kTable) {
    const std::vector<std::string> problems = Check(root_, table);
    EXPECT_EQ(problems.size(), 1u) << Joined(problems);
    return problems.size() == 1 ? problems[0] : "";
  }

  TempDir tmp_{"kjit_layering_test"};
  const fs::path root_ = tmp_.path();
};

// Whether the checker's problem says `text`.
::testing::AssertionResult Says(const std::string& problem, const std::string& text) {
  if (problem.find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << problem << "\" does not say \"" << text << "\"";
}

TEST_F(PlantedTree, ACleanTreePasses) { EXPECT_EQ(Joined(Check(root_, kTable)), ""); }

TEST_F(PlantedTree, AnIncludeAgainstTheArrowsFails) {
  WriteFile(root_ / "jit/c.cc", "#include \"jit/a.h\"\n  #  include \"runtime/b.cc\"\n");
  EXPECT_TRUE(Says(OneProblem(), "jit/c.cc: #include \"runtime/b.cc\" (jit -> runtime"));
}

TEST_F(PlantedTree, AnOpIncludingAnotherOpFails) {
  WriteFile(root_ / "ops/x/x.cc", "#include \"ops/y/config.h\"\n");
  EXPECT_TRUE(Says(OneProblem(), "ops/x/x.cc"));
}

TEST_F(PlantedTree, AFileNoGroupClaimsFails) {
  WriteFile(root_ / "newfolder/n.cc", "#include \"jit/a.h\"\n");
  EXPECT_TRUE(Says(OneProblem(), "newfolder/n.cc: no group"));
}

TEST_F(PlantedTree, AnIncludeOfNoFileFails) {
  WriteFile(root_ / "runtime/d.cc", "#include \"runtime/missing.h\"\n");
  EXPECT_TRUE(Says(OneProblem(), "names no file of the tree"));
}

TEST_F(PlantedTree, AKnownViolationIsAllowedUntilItIsGone) {
  WriteFile(root_ / "jit/c.cc", "#include \"runtime/b.cc\"\n");
  const std::string table = std::string(kTable) + "known jit/c.cc -> runtime/b.cc: to remove\n";
  EXPECT_EQ(Joined(Check(root_, table)), "");
  WriteFile(root_ / "jit/c.cc", "#include \"jit/a.h\"\n");
  EXPECT_TRUE(
      Says(OneProblem(table), "table line 7: known violation jit/c.cc -> runtime/b.cc no longer"));
}

TEST(IncludeRules, MalformedLinesAreReportedWithTheirNumber) {
  std::vector<std::string> problems;
  ParseIncludeRules(
      "group jit: jit/*\n"
      "allow jit -> nosuchgroup\n"
      "allow jit jit\n"
      "known jit/a.h -> jit/*: no patterns\n"
      "known jit/a.h -> jit/b.h\n"
      "forbid jit\n"
      "group jit: jit/*\n",
      problems);
  EXPECT_EQ(Joined(problems),
            "table line 2: \"nosuchgroup\" is no group defined above\n"
            "table line 3: expected `allow FROM... -> TO...`\n"
            "table line 4: a known violation names two files exactly, not patterns\n"
            "table line 5: expected `known FILE -> FILE: REASON`\n"
            "table line 6: unknown statement \"forbid\" (expected group, allow or known)\n"
            "table line 7: group jit is defined twice\n");
}

TEST(IncludeRules, PatternsMatchSegmentsAndBindTheOpFolder) {
  std::string op;
  EXPECT_TRUE(MatchPath("ops/{op}/tuning/*", "ops/rms_norm/tuning/trait.h", &op));
  EXPECT_EQ(op, "rms_norm");
  EXPECT_FALSE(MatchPath("ops/{op}/tuning/*", "ops/rms_norm/config.h", &op));
  EXPECT_FALSE(MatchPath("jit/*", "jit/sub/a.h", &op));
  EXPECT_TRUE(MatchPath("tests/**", "tests/a/b/c.cc", &op));
  EXPECT_TRUE(MatchPath("tests/**", "tests/c.cc", &op));
  EXPECT_EQ(op, "");
}

}  // namespace
}  // namespace kjit::testing
