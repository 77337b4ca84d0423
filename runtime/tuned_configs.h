// Internal: an op's tuned configs, one per rows bucket, read from the runtime's tuning database
// the first time a launch needs that bucket (the nearest tuned bucket of the same key, since a
// batch size near a tuned one runs best with its config). A record that does not parse or does
// not fit this op is ignored with one warning: the heuristic runs instead.
//
//   TunedConfigs<CrossEntropyConfig> tuned(rt, "cross_entropy", "vocab=128256", DType::kBF16,
//                                          spec_json, ParseCrossEntropyConfig, validate);
//   std::optional<CrossEntropyConfig> c = tuned.For(rows, /*may_tune=*/true);  // op's lock held
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "kjit/dtype.h"
#include "runtime/runtime_state.h"

namespace kjit::internal {

// The tuning database's key for an op's records at `rows` on this runtime's GPU (the device fields
// empty for a compile-only runtime). The tuner writes under these keys and the ops look them up.
TuningKey TuningKeyFor(const RuntimeState& rt, const std::string& op, const std::string& shape,
                       DType dtype, int64_t rows);

template <typename Config>
class TunedConfigs {
 public:
  using Parse = std::function<absl::StatusOr<Config>(std::string_view)>;
  using Validate = std::function<absl::Status(const Config&)>;

  // `op`, `shape` and `dtype`: the records' key fields (ops/registry.h names them); `spec_json`:
  // the op as `kjit-tune --spec` takes it, for KJIT_AUTOTUNE.
  TunedConfigs(const RuntimeState& rt, std::string op, std::string shape, DType dtype,
               std::string spec_json, Parse parse, Validate validate)
      : rt_(rt),
        op_(std::move(op)),
        shape_(std::move(shape)),
        dtype_(dtype),
        spec_json_(std::move(spec_json)),
        parse_(std::move(parse)),
        validate_(std::move(validate)) {}

  // Not thread-safe: the op calls it under its own lock. With KJIT_AUTOTUNE and may_tune (the
  // stream is not capturing), a bucket without a record is tuned first, once.
  std::optional<Config> For(int64_t rows, bool may_tune) {
    const TuningKey key = TuningKeyFor(rt_, op_, shape_, dtype_, rows);
    if (auto it = by_bucket_.find(key.rows_bucket); it != by_bucket_.end()) return it->second;
    std::shared_ptr<const TuningDb> db = rt_.Tuning();
    const bool tune = rt_.autotune && (db == nullptr || !db->Find(key));
    if (tune && !may_tune) return Lookup(db.get(), key);  // not remembered: tune at a later launch
    if (tune) {
      rt_.TuneNow(spec_json_, rows);
      db = rt_.Tuning();
    }
    return by_bucket_[key.rows_bucket] = Lookup(db.get(), key);
  }

 private:
  std::optional<Config> Lookup(const TuningDb* db, const TuningKey& key) const {
    if (db == nullptr) return std::nullopt;
    const std::optional<TuningRecord> r = db->FindNearest(key);
    if (!r) return std::nullopt;
    absl::StatusOr<Config> c = parse_(r->config);
    absl::Status fits = c.ok() ? validate_(*c) : c.status();
    if (!fits.ok()) {
      rt_.Warn(fmt::format("tuning database record {} {} rows<={}: {} ignored: {}",
                           jit::Printable(r->key.op), jit::Printable(r->key.shape),
                           r->key.rows_bucket, jit::Quoted(r->config),
                           jit::Printable(ToStd(fits.message()))));
      return std::nullopt;
    }
    return *c;
  }

  const RuntimeState& rt_;
  std::string op_, shape_;
  DType dtype_;
  std::string spec_json_;
  Parse parse_;
  Validate validate_;
  std::map<int64_t, std::optional<Config>> by_bucket_;
};

}  // namespace kjit::internal
