// Internal: an op's tuned configs, one per rows bucket, read from the runtime's tuning database
// the first time a launch needs that bucket (the nearest tuned bucket of the same key, since a
// batch size near a tuned one runs best with its config). A record that does not parse or does
// not fit this op is ignored with one warning: the heuristic runs instead.
//
//   TunedConfigs<CrossEntropyConfig> tuned(rt, "cross_entropy", "vocab=128256", DType::kBF16,
//                                          ParseCrossEntropyConfig, validate);
//   std::optional<CrossEntropyConfig> c = tuned.For(rows);   // with the op's lock held
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

  TunedConfigs(const RuntimeState& rt, std::string op, std::string shape, DType dtype, Parse parse,
               Validate validate)
      : rt_(rt), op_(std::move(op)), shape_(std::move(shape)), dtype_(dtype),
        parse_(std::move(parse)), validate_(std::move(validate)) {}

  // Not thread-safe: the op calls it under its own lock.
  std::optional<Config> For(int64_t rows) {
    if (rt_.tuning == nullptr) return std::nullopt;
    const autotune::TuningKey key = TuningKeyFor(rt_, op_, shape_, dtype_, rows);
    auto [it, inserted] = by_bucket_.try_emplace(key.rows_bucket);
    if (inserted) it->second = Lookup(key);
    return it->second;
  }

 private:
  std::optional<Config> Lookup(const autotune::TuningKey& key) const {
    const std::optional<autotune::TuningRecord> r = rt_.tuning->FindNearest(key);
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
  Parse parse_;
  Validate validate_;
  std::map<int64_t, std::optional<Config>> by_bucket_;
};

}  // namespace kjit::internal
