#include "ops/common/json_fields.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"

namespace kjit::ops {

namespace {

// A value as an error shows it: a scalar's JSON, cut short (on a UTF-8 boundary) when long, so that
// a megabyte string does not become a megabyte message; an array or object by its kind only.
std::string Shown(const nlohmann::json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  constexpr size_t kMax = 40;
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() <= kMax) return text;
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

// A key from the input as an error names it: escaped, and cut short as a value is.
std::string ShownKey(std::string_view key) {
  constexpr size_t kMax = 40;
  return jit::Printable(key.substr(0, kMax)) + (key.size() > kMax ? "..." : "");
}

absl::Status Invalid(std::string_view name, std::string_view problem) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", name, problem));
}

}  // namespace

absl::StatusOr<JsonFields> JsonFields::Of(const nlohmann::json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("op spec: must be a JSON object, got {}", Shown(j)));
  }
  return JsonFields(j);
}

absl::StatusOr<nlohmann::json> ParseSpecJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(fmt::format("op spec: not valid JSON: {}", text));
  }
  return j;
}

bool JsonFields::Has(std::string_view name) {
  asked_.emplace(name);
  return j_->contains(name);
}

absl::StatusOr<const nlohmann::json*> JsonFields::Get(std::string_view name) {
  asked_.emplace(name);
  const auto it = j_->find(name);
  if (it == j_->end()) return Invalid(name, "is missing");
  return &*it;
}

absl::StatusOr<int64_t> JsonFields::Int(std::string_view name) {
  KJIT_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_number()) return Invalid(name, fmt::format("must be a number, got {}", Shown(*v)));
  // 4096.5 and 1e20 alike: a count or an index is written as a JSON integer.
  if (v->is_number_float()) return Invalid(name, fmt::format("{} is not an integer", Shown(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return Invalid(name, fmt::format("{} is out of range", Shown(*v)));
  }
  return v->get<int64_t>();
}

absl::StatusOr<float> JsonFields::Float(std::string_view name) {
  KJIT_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_number()) return Invalid(name, fmt::format("must be a number, got {}", Shown(*v)));
  const double d = v->get<double>();  // JSON has no NaN or infinity
  if (std::fabs(d) > FLT_MAX) return Invalid(name, fmt::format("{} is out of range", Shown(*v)));
  const float f = static_cast<float>(d);
  // A value the float no longer says (0.9999999999 is 1, 1e-50 is 0): kept for WithGiven. The
  // float's shortest text read back is the value a message shows; 0.1 reads back as 0.1.
  std::string as_float = fmt::format("{}", f);
  if (std::strtod(as_float.c_str(), nullptr) != d) {
    rounded_.insert_or_assign(std::string(name), Rounded{Shown(*v), std::move(as_float)});
  }
  return f;
}

absl::Status JsonFields::WithGiven(const absl::Status& status) const {
  if (status.ok()) return status;
  const std::string_view message = ToStd(status.message());
  for (const auto& [name, r] : rounded_) {
    const std::string prefix = fmt::format("{}: {} ", name, r.as_float);
    if (message.starts_with(prefix)) {
      return absl::Status(status.code(), fmt::format("{}: {} ({} as a float) {}", name, r.given,
                                                     r.as_float, message.substr(prefix.size())));
    }
  }
  return status;
}

absl::StatusOr<bool> JsonFields::Bool(std::string_view name) {
  KJIT_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_boolean()) {
    return Invalid(name, fmt::format("must be true or false, got {}", Shown(*v)));
  }
  return v->get<bool>();
}

absl::StatusOr<std::string> JsonFields::String(std::string_view name) {
  KJIT_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(name));
  if (!v->is_string()) return Invalid(name, fmt::format("must be a string, got {}", Shown(*v)));
  return v->get<std::string>();
}

absl::StatusOr<DType> JsonFields::DTypeOf(std::string_view name) {
  KJIT_ASSIGN_OR_RETURN(const std::string text, String(name));
  absl::StatusOr<DType> t = ParseDType(text);
  if (!t.ok()) return Renamed(t.status(), name);
  return *t;
}

absl::Status JsonFields::NoOthers(std::string_view what,
                                  std::initializer_list<std::string_view> also) const {
  for (const auto& [name, value] : j_->items()) {
    if (asked_.contains(name) || std::find(also.begin(), also.end(), name) != also.end()) continue;
    std::vector<std::string_view> fields(also);
    fields.insert(fields.end(), asked_.begin(), asked_.end());
    return Invalid(ShownKey(name), fmt::format("is not a field of {} (its fields: {})", what,
                                               fmt::join(fields, ", ")));
  }
  return absl::OkStatus();
}

std::string_view WithoutField(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == 0 || colon == std::string_view::npos) return message;
  for (char c : message.substr(0, colon)) {
    const bool field_char = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '_' || c == '.';
    if (!field_char) return message;
  }
  return message.substr(colon + 2);
}

absl::Status Renamed(const absl::Status& status, std::string_view name) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      fmt::format("{}: {}", name, WithoutField(ToStd(status.message()))));
}

}  // namespace kjit::ops
