// Internal: an op's tuned configs, one per rows bucket, read from the runtime's tuning database
// the first time a launch needs that bucket (the nearest tuned bucket of the same key, since a
// batch size near a tuned one runs best with its config). A record that does not parse or does
// not fit this op is ignored with one warning: the heuristic runs instead.
//
//   TunedConfigs<CrossEntropyConfig> tuned(rt, spec, "", ParseCrossEntropyConfig, validate);
//   std::optional<CrossEntropyConfig> c = tuned.For(rows, /*may_tune=*/true);  // op's lock held
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "runtime/runtime_state.h"
#include "runtime/tuning.h"

namespace kjit::internal {

template <typename Config>
class TunedConfigs {
 public:
  using Parse = std::function<absl::StatusOr<Config>(std::string_view)>;
  using Validate = std::function<absl::Status(const Config&)>;

  // `op`: the record's op name, "" for TuningOp(spec).
  TunedConfigs(const RuntimeState& rt, const OpSpec& spec, std::string op, Parse parse,
               Validate validate)
      : rt_(rt),
        op_(op.empty() ? std::visit([](const auto& s) { return TuningOp(s); }, spec) : std::move(op)),
        shape_(std::visit([](const auto& s) { return TuningShape(s); }, spec)),
        dtype_(std::visit([](const auto& s) { return s.dtype; }, spec)), spec_json_(SpecToJson(spec)),
        parse_(std::move(parse)), validate_(std::move(validate)) {}

  // Not thread-safe: the op calls it under its own lock. With KJIT_AUTOTUNE and may_tune (the
  // stream is not capturing), a bucket without a record is tuned first, once.
  std::optional<Config> For(int64_t rows, bool may_tune) {
    const autotune::TuningKey key = TuningKeyFor(rt_, op_, shape_, dtype_, rows);
    if (auto it = by_bucket_.find(key.rows_bucket); it != by_bucket_.end()) return it->second;
    std::shared_ptr<const autotune::TuningDb> db = rt_.Tuning();
    const bool tune = rt_.autotune && (db == nullptr || !db->Find(key));
    if (tune && !may_tune) return Lookup(db.get(), key);  // not remembered: tune at a later launch
    if (tune) {
      rt_.TuneNow(spec_json_, rows);
      db = rt_.Tuning();
    }
    return by_bucket_[key.rows_bucket] = Lookup(db.get(), key);
  }

 private:
  std::optional<Config> Lookup(const autotune::TuningDb* db, const autotune::TuningKey& key) const {
    if (db == nullptr) return std::nullopt;
    const std::optional<autotune::TuningRecord> r = db->FindNearest(key);
    if (!r) return std::nullopt;
    absl::StatusOr<Config> c = parse_(r->config);
    absl::Status fits = c.ok() ? validate_(*c) : c.status();
    if (!fits.ok()) {
      fmt::print(stderr, "kjit: warning: tuning database record {} {} rows<={}: \"{}\" ignored: {}\n",
                 r->key.op, r->key.shape, r->key.rows_bucket, r->config, ToStd(fits.message()));
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
