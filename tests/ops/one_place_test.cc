// An op registers in one place (issues 36 and 48): its folder under ops/, its line in the
// registry's OpSpec and, for a public op, its public header (include/kjit/<op>.h), its line in the
// umbrella header and its entry file of the C API (capi/<op>_capi.cc). This scans the files every
// op shares (the tools, the registry, the tuner, the runtime, the public headers, the C API and the
// Python package) for an op's name or its spec's type outside the short allow-list below, so that a
// shared file that grows a per-op branch ("if (op == "rms_norm")", "std::get_if<CrossEntropySpec>",
// a Python class per op) fails here, naming the file and line. The scanner is tested on planted
// trees, so that it can fail.
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

// The shared files: each folder's C++, Python and CMake files, or one file. An op's own files in
// them (include/kjit/<op>.h, capi/<op>_capi.cc) are its, as its folder under ops/ is.
constexpr std::string_view kSharedFiles[] = {"tools/",         "autotune/",       "runtime/",
                                             "ops/registry.h", "ops/registry.cc", "include/kjit/",
                                             "capi/",          "python/kjit/"};

// The ops that came before the C API's ops by name (kjit_op_*, ABI 6), each with a Runtime factory,
// C functions and structs, and Python classes of its own, which stay for their users. A new op has
// none of these: Op::Create, kjit_op_* and kjit.Runtime.op serve it without a shared file naming
// it. (The sharded cross-entropy and the RL heads share cross_entropy's name or types.)
constexpr std::string_view kOpsBeforeAbi6[] = {"rms_norm", "cross_entropy", "linear_cross_entropy",
                                               "log_probs"};

// Where an op may be named in a shared file: a file ("path/") or a line of it that contains the
// text, for every op or only those before ABI 6. Each entry says why; keep it short.
struct Allowed {
  std::string_view path;  // "" for every shared file
  std::string_view text;  // "" for the whole file
  bool before_abi6_only = false;
};
constexpr Allowed kAllowed[] = {
    // The registry's one line per op: its trait's header and its spec in OpSpec (the variant's
    // line, wrapped or not).
    {"ops/registry.h", "/trait.h\""},
    {"ops/registry.h", "std::variant<RmsNormSpec, "},
    // The umbrella header's one line per public op.
    {"include/kjit/kjit.h", "#include \"kjit/"},
    // Tools of one op each: the sharded cross-entropy's bench, the fused op's GEMM-baseline bench.
    {"tools/bench_sharded_main.cc", ""},
    {"tools/bench_linear_cross_entropy.", ""},
    {"tools/CMakeLists.txt", "bench_linear_cross_entropy.cc"},
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
    // The typed API of the ops before ABI 6, kept for its users: their Runtime factories, their C
    // functions, structs and handles, the vocab-parallel (sharded_*) variants' headers and C entry
    // files (modes of those ops, not ops of the registry), and their Python classes and torch
    // layer.
    {"include/kjit/runtime.h", "", true},
    {"include/kjit/kjit_c.h", "", true},
    {"include/kjit/sharded_", "", true},
    {"capi/capi_common.", "", true},
    {"capi/sharded_", "", true},
    {"python/kjit/", "", true},
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

// The code of a Python or CMake file without its comments and Python's triple-quoted strings (its
// docstrings), string literals kept.
std::string WithoutHashComments(const std::string& text) {
  std::string out;
  char quote = 0;  // the open string's quote
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == 0 && (text.compare(i, 3, "\"\"\"") == 0 || text.compare(i, 3, "'''") == 0)) {
      const size_t end = text.find(text.substr(i, 3), i + 3);
      for (size_t j = i; j < std::min(end, text.size()); ++j) {
        if (text[j] == '\n') out += '\n';
      }
      i = end == std::string::npos ? text.size() : end + 2;
      continue;
    }
    if (quote == 0 && c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
      out += '\n';
      continue;
    }
    if (quote != 0 && c == '\\' && i + 1 < text.size()) {
      out += text.substr(i, 2);
      ++i;
      continue;
    }
    if (c == '"' || c == '\'') {
      if (quote == 0) {
        quote = c;
      } else if (quote == c) {
        quote = 0;
      }
    }
    if (c == '\n') quote = 0;  // an unclosed quote (an apostrophe in CMake text) ends with its line
    out += c;
  }
  return out;
}

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// Whether `line` names `word` as an identifier or a part of one between underscores
// (kjit_rms_norm_create names rms_norm; "rescale" does not name scale), or, for a type prefix, at
// the start of a name (RmsNormSpec names RmsNorm; LinearCrossEntropy does not name CrossEntropy).
bool Names(std::string_view line, std::string_view word, bool type_prefix) {
  for (size_t at = line.find(word); at != std::string_view::npos; at = line.find(word, at + 1)) {
    const bool starts = at == 0 || !IsWordChar(line[at - 1]);
    const size_t end = at + word.size();
    const bool ends = type_prefix || end == line.size() || !IsWordChar(line[end]);
    if (starts && ends) return true;
  }
  return false;
}

// Whether a line of Python names the op `op` (snake case): as a string of its own ("rms_norm"), in
// a C function's name ("kjit_rms_norm_create"), or as a function or method (def rms_norm(,
// .rms_norm(). Python's variables and keywords are words too (grad_scale, a loss `scale`), so a
// part of a name is not enough there, as it is in C and C++, whose shared files name ops only in
// their types and functions.
bool PythonNames(std::string_view line, const std::string& op) {
  for (const std::string& form :
       {"\"" + op + "\"", "'" + op + "'", "kjit_" + op + "_", "def " + op + "(", "." + op + "("}) {
    if (line.find(form) != std::string_view::npos) return true;
  }
  return false;
}

bool IsAllowed(const std::string& path, const std::string& line, std::string_view op,
               const std::vector<Allowed>& allowed) {
  const bool before_abi6 = std::find(std::begin(kOpsBeforeAbi6), std::end(kOpsBeforeAbi6), op) !=
                           std::end(kOpsBeforeAbi6);
  return std::any_of(allowed.begin(), allowed.end(), [&](const Allowed& a) {
    return path.starts_with(a.path) && line.find(a.text) != std::string::npos &&
           (!a.before_abi6_only || before_abi6);
  });
}

// Whether `path` is a shared file, and not one of an op's own.
bool IsShared(const std::string& path, const std::vector<std::string>& op_names) {
  const bool shared = std::any_of(
      std::begin(kSharedFiles), std::end(kSharedFiles),
      [&](std::string_view s) { return s.ends_with('/') ? path.starts_with(s) : path == s; });
  const bool owned = std::any_of(op_names.begin(), op_names.end(), [&](const std::string& op) {
    return path == "include/kjit/" + op + ".h" || path == "capi/" + op + "_capi.cc";
  });
  return shared && !owned;
}

// Each line of a shared file under `root` that names one of `op_names` (or its CamelCase type
// prefix) outside `allowed`, as "path:line: text".
std::vector<std::string> PerOpLines(const fs::path& root, const std::vector<std::string>& op_names,
                                    const std::vector<Allowed>& allowed) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string path = fs::relative(entry.path(), root).generic_string();
    const std::string ext = entry.path().extension().string();
    const bool cpp = ext == ".cc" || ext == ".h";
    const bool hash = ext == ".py" || entry.path().filename() == "CMakeLists.txt";
    if (!entry.is_regular_file() || !IsShared(path, op_names) || !(cpp || hash)) continue;
    std::ifstream in(entry.path());
    std::ostringstream text;
    text << in.rdbuf();
    std::istringstream code(cpp ? WithoutComments(text.str()) : WithoutHashComments(text.str()));
    std::string line;
    for (int number = 1; std::getline(code, line); ++number) {
      const bool offends =
          std::any_of(op_names.begin(), op_names.end(), [&](const std::string& op) {
            const bool snake = ext == ".py" ? PythonNames(line, op) : Names(line, op, false);
            return (snake || Names(line, CamelCase(op), true)) &&
                   !IsAllowed(path, line, op, allowed);
          });
      if (offends) found.push_back(path + ":" + std::to_string(number) + ": " + line);
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

TEST_F(PlantedSharedFiles, PublicHeadersTheCApiAndPythonAreShared) {
  ASSERT_TRUE(tmp_.ok());
  Write("include/kjit/rms_norm.h", "struct RmsNormSpec {};\n");  // the op's own header
  Write("capi/rms_norm_capi.cc", "kjit_rms_norm_create();\n");   // the op's own entry file
  Write("include/kjit/runtime.h", "int a;\nabsl::StatusOr<RmsNorm> RmsNorm(const RmsNormSpec&);\n");
  Write("capi/capi_common.cc", "case kCrossEntropy: return \"kjit_cross_entropy\";\n");
  Write("python/kjit/_runtime.py",
        "# rms_norm in a comment\ndef f():\n    \"\"\"rt.rms_norm(4096)\"\"\"\n"
        "    return call(\"kjit_rms_norm_create\")\n");
  Write("capi/CMakeLists.txt", "# cross_entropy_capi.cc\nadd_library(c cross_entropy_capi.cc)\n");
  EXPECT_EQ(Joined(Found()),
            "capi/CMakeLists.txt:2: add_library(c cross_entropy_capi.cc)\n"
            "capi/capi_common.cc:1: case kCrossEntropy: return \"kjit_cross_entropy\";\n"
            "include/kjit/runtime.h:2: absl::StatusOr<RmsNorm> RmsNorm(const RmsNormSpec&);\n"
            "python/kjit/_runtime.py:4:     return call(\"kjit_rms_norm_create\")\n");
}

TEST_F(PlantedSharedFiles, NamesAreWholeWordsOrTypePrefixes) {
  ASSERT_TRUE(tmp_.ok());
  Write("runtime/words.cc",
        "Rescale(); x.rescale_gradient; LinearCrossEntropy l;\nkjit_cross_entropy_create();\n"
        "CrossEntropySpec s;\n");
  EXPECT_EQ(Joined(PerOpLines(root_, {"scale", "cross_entropy"}, {})),
            "runtime/words.cc:2: kjit_cross_entropy_create();\n"
            "runtime/words.cc:3: CrossEntropySpec s;\n");
}

TEST_F(PlantedSharedFiles, PythonNamesAnOpInStringsFunctionsAndTypes) {
  ASSERT_TRUE(tmp_.ok());
  Write("python/kjit/_words.py",
        "grad_scale = scale * 2\n"
        "call(\"kjit_scale_create\")\n"
        "getattr(rt, 'scale')\n"
        "def scale(self):\n"
        "rt.scale(4)\n"
        "class Scale:\n"
        "_scale_tensor(x)\n");
  EXPECT_EQ(Joined(PerOpLines(root_, {"scale"}, {})),
            "python/kjit/_words.py:2: call(\"kjit_scale_create\")\n"
            "python/kjit/_words.py:3: getattr(rt, 'scale')\n"
            "python/kjit/_words.py:4: def scale(self):\n"
            "python/kjit/_words.py:5: rt.scale(4)\n"
            "python/kjit/_words.py:6: class Scale:\n");
}

TEST_F(PlantedSharedFiles, TheOpsBeforeAbi6KeepTheirTypedApiAndANewOpDoesNot) {
  ASSERT_TRUE(tmp_.ok());
  Write("include/kjit/kjit_c.h", "kjit_rms_norm_create();\nkjit_scale_create();\n");
  Write("python/kjit/_runtime.py", "class Scale(_Handle):\n    pass\n");
  Write("include/kjit/kjit.h", "#include \"kjit/scale.h\"\n");
  EXPECT_EQ(
      Joined(PerOpLines(root_, {"rms_norm", "scale"}, {std::begin(kAllowed), std::end(kAllowed)})),
      "include/kjit/kjit_c.h:2: kjit_scale_create();\n"
      "python/kjit/_runtime.py:1: class Scale(_Handle):\n");
}

}  // namespace
}  // namespace kjit::testing
