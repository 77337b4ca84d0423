// The tuning database: the fastest launch config the autotuner measured for each op, shape and
// GPU, kept in one JSON file that every process of a user shares, so that a run with a tuned shape
// launches the measured config instead of the heuristic's (ops/<op>/config.h).
//
// A record applies only where everything it was measured under matches (TuningKey): the device,
// driver and NVRTC, the op, dtype and compile-time shape, and the row count rounded up to a power
// of two. The file (DefaultPath(), mode 0600) is rewritten whole through a rename, so a reader sees
// the old or the new database, and merges from concurrent tuners are serialized by a flock.
//
//   KJIT_ASSIGN_OR_RETURN(TuningDb db, TuningDb::Load(TuningDb::DefaultPath()));
//   TuningKey key{"NVIDIA H200", 90, 13000, 13000, "cross_entropy", "bf16", "vocab=128256",
//                 RowsBucket(rows)};
//   if (std::optional<TuningRecord> r = db.FindNearest(key)) {
//     KJIT_ASSIGN_OR_RETURN(CrossEntropyConfig c, ParseCrossEntropyConfig(r->config));
//   }
//   ... after tuning: TuningDb::Upsert(TuningDb::DefaultPath(), {record}) ...
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/status.h"

namespace kjit::internal {

// Everything that makes a tuned config valid: change any field and the entry does not apply.
struct TuningKey {
  std::string device;       // "NVIDIA H200"
  int arch = 0;             // compute capability, 90
  int driver = 0;           // cuDriverGetVersion, e.g. 13000
  int nvrtc = 0;            // NVRTC major*1000 + minor*10, e.g. 13000
  std::string op;           // "cross_entropy", "rms_norm", "rms_norm+residual"
  std::string dtype;        // "bf16"
  std::string shape;        // the op's compile-time shape: "vocab=128256", "hidden=4096"
  int64_t rows_bucket = 0;  // RowsBucket(rows)
  bool operator==(const TuningKey&) const = default;
};

// A record is valid (Parse accepts it, Upsert writes it) when device, op, dtype, shape and config
// are non-empty, the ints are >= 0, rows_bucket is a power of two, the times are finite and >= 0,
// and tuned_at has exactly the form below. What config means is the op's business
// (Parse*Config); the database only stores it.
struct TuningRecord {
  TuningKey key;
  std::string config;  // the op config's ToString()
  double median_us = 0, p10_us = 0, p90_us = 0;
  double heuristic_us = 0;  // the heuristic default's median in the same run (0: not timed)
  std::string runner_up;    // second-best config ("" when only one ran)
  double runner_up_us = 0;
  int candidates = 0;    // configs timed
  int failed = 0;        // configs that failed (compile, crash, hang, wrong result)
  std::string tuned_at;  // ISO-8601 UTC, e.g. "2026-12-02T21:04:05Z"
  bool operator==(const TuningRecord&) const = default;
};

// The smallest power of two >= rows (rows >= 1), so a new batch size near a tuned one reuses it.
int64_t RowsBucket(int64_t rows);

class TuningDb {
 public:
  // How long Upsert waits for another process's merge by default; a merge takes milliseconds.
  static constexpr std::chrono::milliseconds kDefaultLockTimeout{10'000};

  // $KJIT_TUNING_DB, else tuning.json in the kernel cache's directory
  // (jit::DiskCache::DefaultDirectory(), which follows KJIT_CACHE_DIR); "" when neither is known.
  static std::string DefaultPath();

  // Missing file: an empty database. Malformed, wrong format or version, an invalid record, or
  // too big to be ours: DataLoss naming the path and what is wrong (which record, which field).
  // A file that cannot be read (permissions, a directory): that error, naming the path.
  static absl::StatusOr<TuningDb> Load(const std::string& path);
  // What Load does after reading; never crashes or throws, whatever the bytes.
  static absl::StatusOr<TuningDb> Parse(std::string_view text);
  // Human-readable JSON, records sorted by key for stable diffs, ending with a newline.
  std::string Serialize() const;

  // Sorted by key.
  const std::vector<TuningRecord>& records() const { return records_; }
  // Exact match, rows_bucket included.
  std::optional<TuningRecord> Find(const TuningKey& key) const;
  // The record for the same key at the nearest tuned rows bucket (distance in log2; ties go to the
  // larger bucket), or nullopt.
  std::optional<TuningRecord> FindNearest(const TuningKey& key) const;
  // Adds or replaces (same key) in memory; not validated (Upsert validates what it writes).
  void Put(const TuningRecord& record);

  struct UpsertResult {
    int written = 0;      // records in the file now: those merged in and those kept
    std::string warning;  // e.g. a corrupt file that was set aside
  };
  // Merges records into the file at path, safely against concurrent processes: an exclusive flock
  // on path + ".lock" (DeadlineExceeded after lock_timeout), a re-read of the current file, then
  // same-key records replaced and the whole file written to a temp file beside it, fsynced and
  // renamed over it. A corrupt file (DataLoss from Load) is renamed aside to
  // path + ".corrupt-<unix time>" and rebuilt from `records`; the warning names both paths. Missing
  // directories are created 0700. An invalid record is InvalidArgument naming its index and field,
  // and nothing is written. Any error (unwritable directory, disk full) leaves the old file intact.
  static absl::StatusOr<UpsertResult> Upsert(
      const std::string& path, const std::vector<TuningRecord>& records,
      std::chrono::milliseconds lock_timeout = kDefaultLockTimeout);

 private:
  std::vector<TuningRecord> records_;
};

}  // namespace kjit::internal
