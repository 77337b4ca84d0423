// Reads the fields of a JSON object that came from outside: an op spec given to `kjit-tune --spec`
// (by a user, or by a runtime with KJIT_AUTOTUNE) or handed to a tuner's worker. Every field must
// be present with its JSON type; an integer must be a JSON integer that fits int64_t and a float a
// number that fits a float; every error names the field. (nlohmann's get<T>() would truncate
// 4096.5, wrap 1e20 and 2^64-1, and say "type must be number, but is string" without the field.)
// Shared by the ops' OpTrait::FromJson so that they refuse bad JSON with the same messages.
//
//   KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
//   KJIT_ASSIGN_OR_RETURN(int64_t hidden, in.Int("hidden"));  // "hidden: 4096.5 is not an integer"
//   KJIT_RETURN_IF_ERROR(in.NoOthers("rms_norm", {"op"}));    // "hiden: is not a field of ..."
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kjit/dtype.h"
#include "kjit/status.h"

namespace kjit::ops {

class JsonFields {
 public:
  // InvalidArgument unless `j` is a JSON object; `j` must outlive the JsonFields.
  static absl::StatusOr<JsonFields> Of(const nlohmann::json& j);

  // Whether an optional field is there; either way it counts as one of the op's fields.
  bool Has(std::string_view name);
  // Each an InvalidArgument "<name>: ..." when the field is missing or not of its kind.
  absl::StatusOr<int64_t> Int(std::string_view name);
  absl::StatusOr<float> Float(std::string_view name);
  absl::StatusOr<bool> Bool(std::string_view name);
  absl::StatusOr<std::string> String(std::string_view name);
  absl::StatusOr<DType> DTypeOf(std::string_view name);  // a string ParseDType accepts
  // InvalidArgument naming a field that none of the above asked for and that is not in `also`: a
  // field of another op, or a typo, that would otherwise be ignored. `what` names the object.
  absl::Status NoOthers(std::string_view what, std::initializer_list<std::string_view> also) const;
  // A spec's validation error about a float field that Float read as another value than the one
  // given, with what was given beside the float it became, as `kjit compile`'s flags say it:
  // "label_smoothing: 1 must be in [0, 1)" of 0.9999999999 becomes "label_smoothing: 0.9999999999
  // (1 as a float) must be in [0, 1)". Other statuses as they are.
  //   KJIT_RETURN_IF_ERROR(in.WithGiven(ValidateCrossEntropySpec(s)));
  absl::Status WithGiven(const absl::Status& status) const;

 private:
  explicit JsonFields(const nlohmann::json& j) : j_(&j) {}
  // The field's value, or InvalidArgument "<name>: is missing".
  absl::StatusOr<const nlohmann::json*> Get(std::string_view name);

  struct Rounded {
    std::string given;     // the JSON's number, as Shown
    std::string as_float;  // the float it became, as a message shows it
  };

  const nlohmann::json* j_;
  std::set<std::string, std::less<>> asked_;             // the op's fields, present or not
  std::map<std::string, Rounded, std::less<>> rounded_;  // by field
};

// The JSON text of a spec (the public *SpecFromJson functions' argument), or InvalidArgument "op
// spec: not valid JSON: ...".
absl::StatusOr<nlohmann::json> ParseSpecJson(std::string_view text);

// A message that starts by naming a field ("dtype: 'x' is not supported") without that name, for
// a caller that names the field (or the flag) it came from itself; other messages as they are.
std::string_view WithoutField(std::string_view message);
// The status with its message naming `name` instead of the field it named, e.g. the "dtype: ..." of
// ParseDType as "--weight-dtype: ..."; OK stays OK.
absl::Status Renamed(const absl::Status& status, std::string_view name);

}  // namespace kjit::ops
