#include "tools/op_flags.h"

#include "tools/targets.h"

namespace kjit::tools {

OpFlagOptions::OpFlagOptions(ops::FlagCommand command)
    : command_(command), flags_(ops::CommandFlags(command)) {
  for (const ops::CommandFlag& f : flags_) values_[f.info.name].text = f.info.default_text;
}

void OpFlagOptions::AddOptions(CLI::App* cmd,
                               const std::function<bool(const ops::FlagInfo&)>& which) {
  for (const ops::CommandFlag& flag : flags_) {
    const ops::FlagInfo& f = flag.info;
    if (!which(f)) continue;
    ops::FlagValue& v = values_[f.name];
    switch (f.kind) {
      case ops::FlagKind::kInt:
        cmd->add_option(f.name, v.integer, f.help)->check(CLI::Range(f.min, f.max));
        break;
      case ops::FlagKind::kFloat: cmd->add_option(f.name, v.real, f.help); break;
      case ops::FlagKind::kText: {
        CLI::Option* o = cmd->add_option(f.name, v.text, f.help)->check(CLI::IsMember(f.choices));
        if (!f.default_text.empty()) o->capture_default_str();
        break;
      }
      case ops::FlagKind::kDType:
        cmd->add_option(f.name, v.text, f.help)->check(DTypeValidator());
        break;
      case ops::FlagKind::kSwitch: cmd->add_flag(f.name, v.on, f.help); break;
    }
  }
}

void OpFlagOptions::Record(const CLI::App& cmd) {
  given_.clear();
  for (const ops::CommandFlag& f : flags_) {
    if (cmd.count(f.info.name) > 0) given_.emplace_back(f.info.name, values_.at(f.info.name));
  }
}

std::vector<std::pair<std::string, std::string>> OpFlagOptions::DTypeFlags() const {
  std::vector<std::pair<std::string, std::string>> dtypes;
  for (const ops::CommandFlag& f : flags_) {
    if (f.info.kind == ops::FlagKind::kDType) {
      dtypes.emplace_back(f.info.name, values_.at(f.info.name).text);
    }
  }
  return dtypes;
}

}  // namespace kjit::tools
