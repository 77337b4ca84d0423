#include "autotune/tune_task.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kjit::autotune {

namespace {

using nlohmann::json;

using ops::Name;

const char* Name(TuneTask::Mode m) {
  switch (m) {
    case TuneTask::Mode::kCompile: return "compile";
    case TuneTask::Mode::kTime: return "time";
    case TuneTask::Mode::kCopy: return "copy";
  }
  return "?";
}

absl::StatusOr<Pass> ParsePass(const std::string& name) {
  for (Pass p : {Pass::kForward, Pass::kBackward, Pass::kForwardBackward}) {
    if (name == Name(p)) return p;
  }
  return absl::InvalidArgumentError(fmt::format("pass: \"{}\" is not a pass", name));
}

}  // namespace

std::string TuneTask::ToJson() const {
  json j = {{"mode", Name(mode)}};
  if (mode != Mode::kCopy) {
    j["spec"] = json::parse(ops::SpecToJson(op));
    j["config"] = config;
  }
  if (mode == Mode::kCompile) {
    j["target"] = target;
    return j.dump();
  }
  j["repeats"] = repeats;
  if (mode == Mode::kTime) {
    j["rows"] = rows;
    j["pass"] = Name(pass);
  }
  return j.dump();
}

absl::StatusOr<TuneTask> TuneTask::FromJson(std::string_view text) {
  try {
    const json j = json::parse(text);
    TuneTask t;
    const std::string mode = j.at("mode").get<std::string>();
    bool known = false;
    for (Mode m : {Mode::kCompile, Mode::kTime, Mode::kCopy}) {
      if (mode == Name(m)) t.mode = m, known = true;
    }
    if (!known) {
      return absl::InvalidArgumentError(
          fmt::format("mode: \"{}\" is not compile, time or copy", mode));
    }
    if (t.mode != Mode::kCopy) {
      KJIT_ASSIGN_OR_RETURN(t.op, ops::SpecFromJson(j.at("spec").dump()));
      t.config = j.at("config").get<std::string>();
    }
    if (t.mode == Mode::kCompile) {
      t.target = j.at("target").get<std::string>();
      return t;
    }
    t.repeats = j.at("repeats").get<int>();
    if (t.repeats < 1) return absl::InvalidArgumentError("repeats: must be at least 1");
    if (t.mode == Mode::kTime) {
      t.rows = j.at("rows").get<int64_t>();
      KJIT_ASSIGN_OR_RETURN(t.pass, ParsePass(j.at("pass").get<std::string>()));
      if (t.rows < 1) return absl::InvalidArgumentError("rows: must be at least 1");
    }
    return t;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("tune task: {}", e.what()));
  }
}

std::string TuneAnswer::ToJson() const {
  return json{{"error", error},
              {"key", key},
              {"origin", origin},
              {"path", path},
              {"compile_ms", compile_ms},
              {"median_us", timing.median_us},
              {"p10_us", timing.p10_us},
              {"p90_us", timing.p90_us},
              {"repeats", timing.repeats},
              {"bytes", bytes}}
      .dump();
}

absl::StatusOr<TuneAnswer> TuneAnswer::FromJson(std::string_view text) {
  try {
    const json j = json::parse(text);
    TuneAnswer a;
    a.error = j.at("error").get<std::string>();
    a.key = j.at("key").get<std::string>();
    a.origin = j.at("origin").get<std::string>();
    a.path = j.at("path").get<std::string>();
    a.compile_ms = j.at("compile_ms").get<double>();
    a.timing = {j.at("median_us").get<double>(), j.at("p10_us").get<double>(),
                j.at("p90_us").get<double>(), j.at("repeats").get<int>()};
    a.bytes = j.at("bytes").get<double>();
    return a;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("worker answer: {}", e.what()));
  }
}

}  // namespace kjit::autotune
