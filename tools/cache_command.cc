// `kjit cache ls|verify|clear|prune`: inspect and maintain the disk cache.
#include <filesystem>
#include <string>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/disk_cache.h"
#include "jit/json_text.h"
#include "jit/printable.h"
#include "jit/source.h"
#include "tools/commands.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct CacheFlags {
  std::string action;
  bool json = false;
};

int RunCache(const CacheFlags& f) {
  auto options = jit::DiskCache::Options::FromEnvironment();
  if (!options.ok()) return Fail(options.status());
  // Open would create it: a mistyped KJIT_CACHE_DIR would be made, and listed as "0 entries". (A
  // dangling symlink is left to Open, which names it.)
  std::error_code ec;
  if (!options->dir.empty() &&
      !std::filesystem::exists(std::filesystem::symlink_status(options->dir, ec))) {
    return Fail(absl::NotFoundError(fmt::format(
        "cache {}: {} does not exist, so nothing is cached there (the cache is $KJIT_CACHE_DIR, "
        "else $XDG_CACHE_HOME/kjit, else ~/.cache/kjit)",
        f.action, options->dir)));
  }
  auto cache = jit::DiskCache::Open(*options);
  if (!cache.ok()) return Fail(cache.status());
  if (f.action == "clear" || f.action == "prune") {
    auto removed = f.action == "clear" ? cache->Clear() : cache->Prune();
    if (!removed.ok()) return Fail(removed.status());
    if (f.json) {
      fmt::print("{}\n",
                 jit::JsonText(nlohmann::json{{"dir", cache->dir()}, {"removed", *removed}}, 2));
    } else {
      fmt::print("{}: removed {} file(s)\n", jit::Printable(cache->dir()), *removed);
    }
    return 0;
  }
  const auto entries = cache->List();
  int invalid = 0;
  uint64_t bytes = 0;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : entries) {
    bytes += e.size_bytes;
    if (!e.valid) ++invalid;
    nlohmann::json j = {
        {"key", e.key}, {"bytes", e.size_bytes}, {"mtime", e.mtime_unix}, {"valid", e.valid}};
    if (!e.valid) j["problem"] = e.problem;
    if (e.binary) {
      j["target"] = e.binary->target.ToString();
      j["program"] = e.binary->program_name;
      j["params"] = e.binary->params;
      j["nvrtc"] = e.binary->nvrtc_version;
    }
    list.push_back(std::move(j));
    if (!f.json && (f.action == "ls" || !e.valid)) {
      // An entry's parameters are its file's bytes: a crafted one (checksummed anew) holds any.
      fmt::print(
          "{} {:>9} {:<10} {}\n", jit::Printable(e.key), e.size_bytes,
          e.binary ? jit::Printable(e.binary->target.ToString()) : "-",
          jit::Printable(e.valid ? jit::FormatParams(e.binary->params) : "INVALID: " + e.problem));
    }
  }
  if (f.json) {
    // JsonText: the directory (and problems naming it) may hold any bytes, not only UTF-8.
    fmt::print("{}\n", jit::JsonText(nlohmann::json{{"dir", cache->dir()},
                                                    {"read_only", cache->read_only()},
                                                    {"entries", list},
                                                    {"bytes", bytes},
                                                    {"invalid", invalid}},
                                     2));
  } else {
    fmt::print("{}: {} entries, {} bytes, {} invalid{}\n", jit::Printable(cache->dir()),
               entries.size(), bytes, invalid, cache->read_only() ? " (read-only)" : "");
  }
  return f.action == "verify" && invalid > 0 ? 1 : 0;
}

}  // namespace

Command AddCacheCommand(CLI::App& app) {
  auto f = std::make_shared<CacheFlags>();
  CLI::App* cmd = app.add_subcommand(
      "cache",
      "Inspect the kernel cache ($KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit, else ~/.cache/kjit)");
  cmd->add_option("action", f->action,
                  "ls: list entries; verify: check every entry (exit 1 if any is "
                  "corrupt); clear: remove all; prune: remove corrupt, stale "
                  "temporary and over-cap entries")
      ->required()
      ->check(CLI::IsMember({"ls", "verify", "clear", "prune"}));
  cmd->add_flag("--json", f->json, "Print JSON");
  return [f] { return RunCache(*f); };
}

}  // namespace kjit::tools
