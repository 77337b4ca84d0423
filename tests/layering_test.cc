// The folder direction of ARCHITECTURE.md, checked on every quoted #include in the tree:
// tools -> autotune -> ops -> runtime -> jit, each folder including only itself and those below,
// capi (the C API) above ops and below tools, beside autotune (neither includes the other),
// include/kjit (the public headers) only itself, examples only the public headers, templates
// nothing of the host's. A new include that runs against the arrows fails here, naming the file.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kjit {
namespace {

namespace fs = std::filesystem;

// The top-level folders each folder's files may include from (the first path component of a
// quoted include). "kjit" is include/kjit, reached as "kjit/...".
const std::map<std::string, std::set<std::string>>& Allowed() {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"include", {"kjit"}},
      {"jit", {"jit", "kjit"}},
      {"runtime", {"runtime", "jit", "kjit"}},
      {"ops", {"ops", "runtime", "jit", "kjit", "templates"}},
      {"autotune", {"autotune", "ops", "runtime", "jit", "kjit"}},
      {"capi", {"capi", "ops", "runtime", "jit", "kjit"}},
      {"tools", {"tools", "capi", "autotune", "ops", "runtime", "jit", "kjit"}},
      {"examples", {"kjit"}},
      // The measurement harnesses sit beside the tools.
      {"bench",
       {"bench", "tools", "capi", "autotune", "ops", "runtime", "jit", "kjit", "templates"}},
  };
  return allowed;
}

// Why `included` (a quoted include's text) may not be included from a file of `folder`, or "".
std::string Violation(const std::string& folder, const std::string& included) {
  const auto rules = Allowed().find(folder);
  if (rules == Allowed().end()) return "";  // tests, templates (checked apart), generated code
  const size_t slash = included.find('/');
  if (slash == std::string::npos) {
    // Library code names an include's folder; bench's harness embeds NVRTC source, which includes
    // the templates by their own names.
    return folder == "bench" ? "" : "an include without its folder";
  }
  const std::string top = included.substr(0, slash);
  if (rules->second.count(top)) return "";
  return "runs against the folder order (" + folder + " may not include " + top + "/)";
}

struct Include {
  std::string file, included;
};

std::vector<Include> QuotedIncludes(const fs::path& root, const std::string& folder) {
  static const std::regex quoted(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<Include> out;
  if (!fs::exists(root / folder)) return out;
  for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cuh")) continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_search(line, m, quoted)) {
        out.push_back({fs::relative(e.path(), root).string(), m[1].str()});
      }
    }
  }
  return out;
}

TEST(Layering, TheRuleRejectsAnIncludeAgainstTheArrows) {
  EXPECT_NE(Violation("runtime", "autotune/tuning_db.h"), "");
  EXPECT_NE(Violation("jit", "runtime/runtime_state.h"), "");
  EXPECT_NE(Violation("examples", "runtime/runtime_state.h"), "");
  EXPECT_NE(Violation("include", "jit/jit.h"), "");
  EXPECT_NE(Violation("ops", "autotune/gpu_timer.h"), "");
  EXPECT_EQ(Violation("ops", "runtime/op_kernels.h"), "");
  EXPECT_EQ(Violation("autotune", "ops/registry.h"), "");
  EXPECT_EQ(Violation("capi", "ops/rms_norm/config.h"), "");
  EXPECT_EQ(Violation("tools", "capi/kjit_c_internal.h"), "");
  for (const char* below : {"jit", "runtime", "ops", "autotune", "include", "examples"}) {
    EXPECT_NE(Violation(below, "capi/kjit_c_internal.h"), "") << below;
  }
  EXPECT_NE(Violation("capi", "autotune/tuner.h"), "");
  EXPECT_NE(Violation("capi", "tools/doctor.h"), "");
}

TEST(Layering, NoFolderIncludesOneAboveIt) {
  const fs::path root = KJIT_SOURCE_DIR;
  int checked = 0;
  for (const auto& [folder, allowed] : Allowed()) {
    for (const Include& inc : QuotedIncludes(root, folder)) {
      ++checked;
      EXPECT_EQ(Violation(folder, inc.included), "")
          << inc.file << ": #include \"" << inc.included << "\"";
    }
  }
  EXPECT_GT(checked, 200) << "the scan found too few includes under " << root;
}

TEST(Layering, TemplatesIncludeOnlyEachOther) {
  const fs::path root = KJIT_SOURCE_DIR;
  int checked = 0;
  for (const Include& inc : QuotedIncludes(root, "templates")) {
    ++checked;
    EXPECT_TRUE(fs::exists(root / "templates" / inc.included))
        << inc.file << ": #include \"" << inc.included << "\" is not a template";
  }
  EXPECT_GT(checked, 3);
}

}  // namespace
}  // namespace kjit
