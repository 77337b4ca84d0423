// libFuzzer target for TuningDb::Parse (runtime/tuning_db.h), which every kjit process runs on
// the tuning database any kjit-tune, hand edit or half-copied home directory may have written, and
// for the op config parsers (ops/<op>/config.h) that read the configs its records store.
//
// Invariants: Parse succeeds or says DataLoss; an accepted database serializes to text that parses
// back to the same records and serializes identically. The config parsers, on the whole input and
// on every stored config, succeed or say InvalidArgument; an accepted config prints back to text
// that parses to the same config.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ops/cross_entropy/config.h"
#include "ops/rms_norm/config.h"
#include "runtime/tuning_db.h"

namespace {

template <typename Config>
void CheckConfigParser(absl::StatusOr<Config> (*parse)(std::string_view), std::string_view text) {
  absl::StatusOr<Config> c = parse(text);
  if (!c.ok()) {
    if (c.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return;
  }
  absl::StatusOr<Config> again = parse(c->ToString());
  if (!again.ok() || !(*again == *c)) std::abort();
}

void CheckConfigParsers(std::string_view text) {
  CheckConfigParser(&kjit::ParseCrossEntropyConfig, text);
  CheckConfigParser(&kjit::ParseRmsNormConfig, text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kjit::internal::TuningDb;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  CheckConfigParsers(text);
  absl::StatusOr<TuningDb> db = TuningDb::Parse(text);
  if (!db.ok()) {
    if (db.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  const std::string serialized = db->Serialize();
  absl::StatusOr<TuningDb> again = TuningDb::Parse(serialized);
  if (!again.ok() || again->records() != db->records() || again->Serialize() != serialized) {
    std::abort();
  }
  for (const kjit::internal::TuningRecord& r : db->records()) {
    CheckConfigParsers(r.config);
    CheckConfigParsers(r.runner_up);
  }
  return 0;
}
