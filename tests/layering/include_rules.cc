#include "tests/layering/include_rules.h"

#include <fnmatch.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace kjit::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string Trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

bool IsPattern(const std::string& item) { return item.find('/') != std::string::npos; }

bool MatchSegments(const std::vector<std::string>& pat, size_t p,
                   const std::vector<std::string>& path, size_t i, std::string* op) {
  if (p == pat.size()) return i == path.size();
  if (pat[p] == "**") {
    for (size_t j = i; j <= path.size(); ++j) {
      if (MatchSegments(pat, p + 1, path, j, op)) return true;
    }
    return false;
  }
  if (i == path.size()) return false;
  if (pat[p] == "{op}") {
    if (!MatchSegments(pat, p + 1, path, i + 1, op)) return false;
    *op = path[i];
    return true;
  }
  return fnmatch(pat[p].c_str(), path[i].c_str(), 0) == 0 &&
         MatchSegments(pat, p + 1, path, i + 1, op);
}

// A file of the tree: its path relative to the root, its group and the op folder the group bound.
struct Classified {
  std::string path, group, op;
};

class Checker {
 public:
  Checker(const fs::path& root, const IncludeRules& rules, std::vector<std::string>& problems)
      : root_(root), rules_(rules), problems_(problems) {}

  IncludeScan Run() {
    IncludeScan scan;
    for (const std::string& file : SourceFiles()) {
      ++scan.files;
      const Classified from = Classify(file);
      if (from.group.empty()) {
        problems_.push_back(file + ": no group of the table claims this file; add it to one");
        continue;
      }
      for (const std::string& included : QuotedIncludes(file)) {
        ++scan.includes;
        CheckOne(from, included);
      }
    }
    for (const KnownViolation& k : rules_.known) {
      if (!used_known_.count(k.line)) {
        problems_.push_back("table line " + std::to_string(k.line) + ": known violation " + k.from +
                            " -> " + k.to +
                            " no longer happens (or is allowed): remove it from the table");
      }
    }
    return scan;
  }

 private:
  std::vector<std::string> SourceFiles() const {
    static const std::set<std::string> kExtensions = {".h",   ".hh",  ".hpp", ".c",  ".cc",
                                                      ".cpp", ".cxx", ".cu",  ".cuh"};
    std::vector<std::string> files;
    for (auto it = fs::recursive_directory_iterator(root_); it != fs::end(it); ++it) {
      const fs::path& p = it->path();
      if (it->is_directory()) {
        if (p.filename().string().rfind('.', 0) == 0 || fs::exists(p / "CMakeCache.txt")) {
          it.disable_recursion_pending();  // hidden folders and build trees are not the source
        }
        continue;
      }
      if (it->is_regular_file() && kExtensions.count(p.extension().string())) {
        files.push_back(fs::relative(p, root_).generic_string());
      }
    }
    return files;
  }

  std::vector<std::string> QuotedIncludes(const std::string& file) const {
    static const std::regex quoted(R"re(^\s*#\s*include\s*"([^"]+)")re");
    std::vector<std::string> out;
    std::ifstream in(root_ / file);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_search(line, m, quoted)) out.push_back(m[1].str());
    }
    return out;
  }

  Classified Classify(const std::string& path) const {
    for (const IncludeGroup& g : rules_.groups) {
      for (const std::string& pattern : g.patterns) {
        std::string op;
        if (MatchPath(pattern, path, &op)) return {path, g.name, op};
      }
    }
    return {path, "", ""};
  }

  // The tree's file a quoted include names, searched as the build does: beside the including
  // file, then from the root, include/ (the public "kjit/...") and templates/ (NVRTC's view).
  std::string Resolve(const std::string& from, const std::string& included) const {
    const fs::path here = fs::path(from).parent_path();
    for (const fs::path& dir : {here, fs::path(), fs::path("include"), fs::path("templates")}) {
      const fs::path candidate = (dir / included).lexically_normal();
      if (fs::is_regular_file(root_ / candidate)) return candidate.generic_string();
    }
    return "";
  }

  // Whether an edge's item covers a file; sets `*op` to the op folder it bound ("" for none).
  bool Covers(const std::string& item, const Classified& file, std::string* op) const {
    if (IsPattern(item)) return MatchPath(item, file.path, op);
    *op = file.op;
    return item == file.group;
  }

  bool Allowed(const Classified& from, const Classified& to) const {
    for (const AllowedEdge& e : rules_.edges) {
      for (const std::string& f : e.from) {
        std::string from_op;
        if (!Covers(f, from, &from_op)) continue;
        for (const std::string& t : e.to) {
          std::string to_op;
          if (!Covers(t, to, &to_op)) continue;
          if (from_op.empty() || to_op.empty() || from_op == to_op) return true;
        }
      }
    }
    return false;
  }

  void CheckOne(const Classified& from, const std::string& included) {
    const std::string where = from.path + ": #include \"" + included + "\"";
    const std::string target = Resolve(from.path, included);
    if (target.empty()) {
      problems_.push_back(where + " names no file of the tree");
      return;
    }
    const Classified to = Classify(target);
    if (to.group.empty()) return;  // reported once, as a file no group claims
    if (Allowed(from, to)) return;
    for (const KnownViolation& k : rules_.known) {
      if (k.from == from.path && k.to == target) {
        used_known_.insert(k.line);
        return;
      }
    }
    problems_.push_back(where + " (" + from.group + " -> " + to.group + ", " + target +
                        ") is not an allowed edge of " + kAllowedIncludesTable);
  }

  const fs::path root_;
  const IncludeRules& rules_;
  std::vector<std::string>& problems_;
  std::set<int> used_known_;
};

}  // namespace

bool MatchPath(const std::string& pattern, const std::string& path, std::string* op) {
  op->clear();
  return MatchSegments(Split(pattern, '/'), 0, Split(path, '/'), 0, op);
}

IncludeRules ParseIncludeRules(const std::string& text, std::vector<std::string>& problems) {
  IncludeRules rules;
  std::set<std::string> groups;
  int number = 0;
  const auto bad = [&](const std::string& why) {
    problems.push_back("table line " + std::to_string(number) + ": " + why);
  };
  const auto known_items = [&](const std::vector<std::string>& items) {
    for (const std::string& item : items) {
      if (!IsPattern(item) && !groups.count(item))
        bad("\"" + item + "\" is no group defined above");
    }
    return !items.empty();
  };
  for (const std::string& raw : Split(text, '\n')) {
    ++number;
    const std::string line = Trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const std::string keyword = line.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
    if (keyword == "group") {
      const size_t colon = rest.find(':');
      const std::string name = Trim(rest.substr(0, colon));
      const std::vector<std::string> patterns =
          colon == std::string::npos ? std::vector<std::string>{} : Words(rest.substr(colon + 1));
      if (name.empty() || IsPattern(name) || patterns.empty()) {
        bad("expected `group NAME: PATTERN...`");
      } else if (!groups.insert(name).second) {
        bad("group " + name + " is defined twice");
      } else {
        rules.groups.push_back({name, patterns});
      }
    } else if (keyword == "allow") {
      const size_t arrow = rest.find("->");
      if (arrow == std::string::npos) {
        bad("expected `allow FROM... -> TO...`");
        continue;
      }
      AllowedEdge edge{Words(rest.substr(0, arrow)), Words(rest.substr(arrow + 2)), number};
      if (!known_items(edge.from) || !known_items(edge.to)) {
        bad("an allow line needs items on both sides of ->");
        continue;
      }
      rules.edges.push_back(std::move(edge));
    } else if (keyword == "known") {
      const size_t arrow = rest.find("->");
      const size_t colon = rest.find(':');
      const std::vector<std::string> from = Words(rest.substr(0, arrow));
      const std::vector<std::string> to = arrow == std::string::npos
                                              ? std::vector<std::string>{}
                                              : Words(rest.substr(arrow + 2, colon - arrow - 2));
      const std::string reason = colon == std::string::npos ? "" : Trim(rest.substr(colon + 1));
      if (arrow == std::string::npos || colon < arrow || from.size() != 1 || to.size() != 1 ||
          reason.empty()) {
        bad("expected `known FILE -> FILE: REASON`");
      } else if (from[0].find_first_of("*{") != std::string::npos ||
                 to[0].find_first_of("*{") != std::string::npos) {
        bad("a known violation names two files exactly, not patterns");
      } else {
        rules.known.push_back({from[0], to[0], reason, number});
      }
    } else {
      bad("unknown statement \"" + keyword + "\" (expected group, allow or known)");
    }
  }
  return rules;
}

IncludeScan CheckIncludes(const fs::path& root, const IncludeRules& rules,
                          std::vector<std::string>& problems) {
  return Checker(root, rules, problems).Run();
}

}  // namespace kjit::testing
