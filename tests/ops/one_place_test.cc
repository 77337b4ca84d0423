// An op registers in one place (issue 36): its folder under ops/ and its line in the registry's
// OpSpec. This scans the files every op shares (the tools, the registry, the tuner, the runtime)
// for an op's name or its spec's type outside the short allow-list below, so that a shared file
// that grows a per-op branch ("if (op == "rms_norm")", "std::get_if<CrossEntropySpec>") fails here,
// naming the file and line. The scanner is tested on planted trees, so that it can fail.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "ops/registry.h"
#include "tests/temp_dir.h"

namespace kjit::testing {
namespace {

namespace fs = std::filesystem;

// The shared files: each folder's C++ files, or one file.
constexpr std::string_view kSharedFiles[] = {"tools/", "autotune/", "runtime/", "ops/registry.h",
                                             "ops/registry.cc"};

// Where an op may be named in a shared file: a file ("path/") or a line of it that contains the
// text. Each entry says why; keep it short.
struct Allowed {
  std::string_view path;  // "" for every shared file
  std::string_view text;  // "" for the whole file
};
constexpr Allowed kAllowed[] = {
    // The registry's one line per op: its trait's header and its spec in OpSpec.
    {"ops/registry.h", "/trait.h\""},
    {"ops/registry.h", "using OpSpec = std::variant<"},
    // Tools of one op each: the sharded cross-entropy's bench, the fused op's GEMM-baseline bench.
    {"tools/bench_sharded_main.cc", ""},
    {"tools/bench_linear_cross_entropy.", ""},
    // `kjit bench` hands the fused op to that bench (its own shapes, configs and table).
    {"tools/bench_command.cc", "LinearCrossEntropy"},
    {"tools/bench_command.cc", "#include \"tools/bench_linear_cross_entropy.h\""},
    {"tools/bench_command.cc", "and for cross_entropy 50257 at 16384)"},
    {"tools/bench_command.cc", "(rms_norm: forward and backward shapes"},
    {"tools/bench_command.cc", "separately; cross_entropy: threads"},
    {"tools/bench_command.cc", "linear_cross_entropy: chunk rows"},
    // Doctor runs an RMSNorm by hand (issue 36's known include violations) and names cuBLASLt's
    // user.
    {"tools/doctor", ""},
    // A Hugging Face config's field, not an op.
    {"", "rms_norm_eps"},
};

// The code of a C++ file without its comments (string literals kept: a name in one is a branch).
std::string WithoutComments(const std::string& text) {
  std::string out;
  bool in_string = false, in_char = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!in_string && !in_char && text.compare(i, 2, "//") == 0) {
      while (i < text.size() && text[i] != '\n') ++i;
      out += '\n';
      continue;
    }
    if (!in_string && !in_char && text.compare(i, 2, "/*") == 0) {
      const size_t end = text.find("*/", i + 2);
      for (size_t j = i; j < std::min(end, text.size()); ++j) {
        if (text[j] == '\n') out += '\n';  // keeps the line numbers
      }
      i = end == std::string::npos ? text.size() : end + 1;
      continue;
    }
    if (c == '\\' && (in_string || in_char) && i + 1 < text.size()) {
      out += text.substr(i, 2);
      ++i;
      continue;
    }
    if (c == '"' && !in_char) in_string = !in_string;
    if (c == '\'' && !in_string) in_char = !in_char;
    out += c;
  }
  return out;
}

// "rms_norm" -> "RmsNorm": the op's types (RmsNormSpec, RmsNorm, RmsNormConfig) start with it.
std::string CamelCase(std::string_view name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (c == '_') {
      upper = true;
    } else {
      out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
  }
  return out;
}

bool IsAllowed(const std::string& path, const std::string& line,
               const std::vector<Allowed>& allowed) {
  return std::any_of(allowed.begin(), allowed.end(), [&](const Allowed& a) {
    return path.starts_with(a.path) && line.find(a.text) != std::string::npos;
  });
}

// Each line of a shared file under `root` that names one of `op_names` (or its CamelCase type
// prefix) outside `allowed`, as "path:line: text".
std::vector<std::string> PerOpLines(const fs::path& root, const std::vector<std::string>& op_names,
                                    const std::vector<Allowed>& allowed) {
  std::vector<std::string> words;
  for (const std::string& n : op_names) {
    words.push_back(n);
    words.push_back(CamelCase(n));
  }
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string path = fs::relative(entry.path(), root).generic_string();
    const std::string ext = entry.path().extension().string();
    const bool shared = std::any_of(
        std::begin(kSharedFiles), std::end(kSharedFiles),
        [&](std::string_view s) { return s.ends_with('/') ? path.starts_with(s) : path == s; });
    if (!entry.is_regular_file() || !shared || (ext != ".cc" && ext != ".h")) continue;
    std::ifstream in(entry.path());
    std::ostringstream text;
    text << in.rdbuf();
    std::istringstream code(WithoutComments(text.str()));
    std::string line;
    for (int number = 1; std::getline(code, line); ++number) {
      const bool names_an_op = std::any_of(words.begin(), words.end(), [&](const std::string& w) {
        return line.find(w) != std::string::npos;
      });
      if (names_an_op && !IsAllowed(path, line, allowed)) {
        found.push_back(path + ":" + std::to_string(number) + ": " + line);
      }
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

TEST(OnePlace, NoSharedFileNamesAnOp) {
  const std::vector<std::string> found =
      PerOpLines(KJIT_SOURCE_DIR, ops::OpNames(), {std::begin(kAllowed), std::end(kAllowed)});
  EXPECT_TRUE(found.empty())
      << "shared files name an op: move the branch into the op's trait (ops/op_trait.h, "
         "docs/ADDING_AN_OP.md) or, if it must stay, say why in tests/ops/one_place_test.cc's "
         "allow-list:\n"
      << Joined(found);
}

class PlantedSharedFiles : public ::testing::Test {
 protected:
  void Write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text;
  }
  std::vector<std::string> Found(const std::vector<Allowed>& allowed = {}) {
    return PerOpLines(root_, {"rms_norm", "cross_entropy"}, allowed);
  }
  TempDir tmp_{"kjit_one_place_test"};
  const fs::path root_ = tmp_.path();
};

TEST_F(PlantedSharedFiles, ABranchOnAnOpsNameOrSpecFails) {
  ASSERT_TRUE(tmp_.ok());
  Write("tools/generic.cc", "int Run(const Spec& s) { return Dispatch(s); }\n");
  Write("tools/branch.cc", "int a;\nif (f.op == \"rms_norm\") Norm();\n");
  Write("autotune/typed.h", "auto* ce = std::get_if<CrossEntropySpec>(&spec);\n");
  EXPECT_EQ(Joined(Found()),
            "autotune/typed.h:1: auto* ce = std::get_if<CrossEntropySpec>(&spec);\n"
            "tools/branch.cc:2: if (f.op == \"rms_norm\") Norm();\n");
}

TEST_F(PlantedSharedFiles, CommentsOpFoldersAndTheAllowListPass) {
  ASSERT_TRUE(tmp_.ok());
  Write("runtime/doc.h", "// e.g. rms_norm\n/* CrossEntropySpec\n */ int x;  // rms_norm\n");
  Write("ops/rms_norm/tuning/trait.cc", "RmsNormSpec s;\n");  // an op's own folder is not shared
  Write("tools/own_bench.cc", "RmsNorm norm;\n");
  Write("tools/run.cc", "Use(\"// not a comment\"); Name(\"rms_norm\");\n");
  EXPECT_EQ(Joined(Found({{"tools/own_bench.cc", ""}})),
            "tools/run.cc:1: Use(\"// not a comment\"); Name(\"rms_norm\");\n");
}

}  // namespace
}  // namespace kjit::testing
