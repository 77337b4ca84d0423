// The ops' own flags of one command (OpTrait::Flags, merged by ops/registry.h's CommandFlags) as
// CLI11 options, and the values given: how `kjit compile`, `kjit bench` and `kjit-tune` offer an
// op's flags without naming the op.
//
//   OpFlagOptions flags(ops::FlagCommand::kCompile);
//   flags.AddOptions(cmd, [](const ops::FlagInfo& f) { return f.kind == ops::FlagKind::kInt; });
//   flags.Record(*cmd);                                     // in its final callback
//   for (const auto& [name, value] : flags.given()) ops::ApplyFlag(spec, command, name, value);
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "ops/registry.h"

namespace kjit::tools {

class OpFlagOptions {
 public:
  explicit OpFlagOptions(ops::FlagCommand command);

  // Adds the flags `which` picks as options of `cmd`, in CommandFlags' order.
  void AddOptions(CLI::App* cmd, const std::function<bool(const ops::FlagInfo&)>& which);
  // Every flag of the command, whether given or not.
  const std::vector<ops::CommandFlag>& flags() const { return flags_; }
  // Notes which flags `cmd` was given (call it once CLI11 has parsed, in a final callback);
  // given() then lists them in CommandFlags' order, with their values.
  void Record(const CLI::App& cmd);
  const std::vector<std::pair<std::string, ops::FlagValue>>& given() const { return given_; }
  // (name, dtype text) of every dtype flag, "" when not given: for CheckDTypesForArch.
  std::vector<std::pair<std::string, std::string>> DTypeFlags() const;
  ops::FlagCommand command() const { return command_; }

 private:
  ops::FlagCommand command_;
  std::vector<ops::CommandFlag> flags_;
  std::map<std::string, ops::FlagValue> values_;  // by name: stable for CLI11 to write into
  std::vector<std::pair<std::string, ops::FlagValue>> given_;
};

}  // namespace kjit::tools
