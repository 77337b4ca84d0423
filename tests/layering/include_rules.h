// The include checker behind tests/layering/layering_test.cc: reads a table of allowed include
// edges (tests/layering/allowed_includes.txt), scans every C++/CUDA file under a source root,
// resolves each quoted #include to a file of that tree and reports every include the table does not
// allow, every file no group of the table claims, and every "known violation" entry that no longer
// happens (so the list of violations only shrinks).
//
//   std::vector<std::string> problems;
//   const IncludeRules rules = ParseIncludeRules(ReadFile(root / kAllowedIncludesTable), problems);
//   const IncludeScan scan = CheckIncludes(root, rules, problems);
//   for (const auto& p : problems) std::cout << p << "\n";   // "jit/a.cc: #include ..."
//
// The table's syntax (one statement a line, `#` starts a comment):
//
//   group NAME: PATTERN...          files matching a pattern belong to NAME; a file belongs to the
//                                   first group (in table order) that matches it
//   allow FROM... -> TO...          a file matching a FROM item may include one matching a TO item
//   known FILE -> FILE: REASON      one exact edge that is wrong today, allowed until removed
//
// An item is a group's name or a path pattern (it holds a '/'). In a pattern, `*` matches within
// one path segment, a `**` segment any number of segments, and a `{op}` segment one folder name
// that is bound: where both sides of an edge bind `{op}`, the edge holds only within one folder.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kjit::testing {

inline constexpr char kAllowedIncludesTable[] = "tests/layering/allowed_includes.txt";

struct IncludeGroup {
  std::string name;
  std::vector<std::string> patterns;
};

struct AllowedEdge {
  std::vector<std::string> from, to;  // group names or path patterns
  int line = 0;
};

struct KnownViolation {
  std::string from, to, reason;
  int line = 0;
};

struct IncludeRules {
  std::vector<IncludeGroup> groups;
  std::vector<AllowedEdge> edges;
  std::vector<KnownViolation> known;
};

// Parses the table's text; each malformed line adds a problem naming its line number.
IncludeRules ParseIncludeRules(const std::string& text, std::vector<std::string>& problems);

// Whether `path` (relative, '/'-separated) matches `pattern`; sets `*op` to the folder a `{op}`
// segment matched, or "" where the pattern has none.
bool MatchPath(const std::string& pattern, const std::string& path, std::string* op);

struct IncludeScan {
  int files = 0;
  int includes = 0;
};

// Scans the C++/CUDA files under `root` (skipping hidden folders and build trees) and checks each
// quoted include against `rules`, adding one problem per offence.
IncludeScan CheckIncludes(const std::filesystem::path& root, const IncludeRules& rules,
                          std::vector<std::string>& problems);

}  // namespace kjit::testing
