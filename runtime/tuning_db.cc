#include "runtime/tuning_db.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/disk_cache.h"
#include "jit/file_io.h"
#include "jit/json_text.h"
#include "jit/status_helpers.h"

namespace kjit::internal {

namespace {

// Parsing uses std::map objects: ordered_json keeps an object's members in a vector, whose growth
// copies them, recursively, so deeply nested input would overflow the stack.
using Json = nlohmann::json;

constexpr std::string_view kFormat = "kjit-tuning-db";
constexpr int kVersion = 1;
// A record is about 400 bytes, so real databases are far smaller; a bigger file is not ours and is
// not read into memory.
constexpr size_t kMaxFileBytes = size_t{64} << 20;
// The largest power of two an int64_t holds.
constexpr int64_t kMaxRowsBucket = int64_t{1} << 62;

// Everything but the row count: the records FindNearest chooses among.
auto ShapeTie(const TuningKey& k) {
  return std::tie(k.device, k.arch, k.driver, k.nvrtc, k.op, k.dtype, k.shape);
}
// The file's order: a record's neighbours are its other row buckets, in increasing order.
auto KeyTie(const TuningKey& k) { return std::tuple_cat(ShapeTie(k), std::tie(k.rows_bucket)); }
bool KeyBefore(const TuningRecord& r, const TuningKey& k) { return KeyTie(r.key) < KeyTie(k); }

// A bucket's place on the log2 scale (bit_width: log2 + 1 for a power of two), so that differences
// are distances in log2. Defined for any value: Put does not validate.
int Log2Place(int64_t bucket) {
  return static_cast<int>(std::bit_width(static_cast<uint64_t>(bucket)));
}

// Every field of a record under its name in the file, in file order: writing, reading and
// validating all go through this list, so none of them can miss a field.
template <typename Record, typename Visit>
void ForEachField(Record& r, Visit&& visit) {
  visit("device", r.key.device);
  visit("arch", r.key.arch);
  visit("driver", r.key.driver);
  visit("nvrtc", r.key.nvrtc);
  visit("op", r.key.op);
  visit("dtype", r.key.dtype);
  visit("shape", r.key.shape);
  visit("rows_bucket", r.key.rows_bucket);
  visit("config", r.config);
  visit("median_us", r.median_us);
  visit("p10_us", r.p10_us);
  visit("p90_us", r.p90_us);
  visit("heuristic_us", r.heuristic_us);
  visit("runner_up", r.runner_up);
  visit("runner_up_us", r.runner_up_us);
  visit("candidates", r.candidates);
  visit("failed", r.failed);
  visit("tuned_at", r.tuned_at);
}

// A value for an error message: short, and never a recursive dump of deeply nested input.
std::string Describe(const Json& v) {
  if (v.is_structured()) return fmt::format("an {}", v.type_name());  // "an array", "an object"
  std::string s = jit::JsonText(v);
  return s.size() <= 40 ? s : s.substr(0, 40) + "...";
}

absl::Status MustBe(std::string_view name, std::string_view expected, std::string_view got) {
  return absl::InvalidArgumentError(fmt::format("\"{}\" must be {}, got {}", name, expected, got));
}

// ---- reading a field's JSON value (its type) --------------------------------------------------

absl::Status ReadValue(std::string_view name, const Json& v, std::string& out) {
  if (!v.is_string()) return MustBe(name, "a string", Describe(v));
  out = v.get<std::string>();
  return absl::OkStatus();
}

template <std::integral Int>
absl::Status ReadValue(std::string_view name, const Json& v, Int& out) {
  // Checked before get<>, which would wrap an out-of-range value silently.
  const bool fits = v.is_number_unsigned()  ? std::in_range<Int>(v.get<uint64_t>())
                    : v.is_number_integer() ? std::in_range<Int>(v.get<int64_t>())
                                            : false;
  if (!fits) {
    return MustBe(name, fmt::format("an integer of at most {} bits", sizeof(Int) * 8), Describe(v));
  }
  out = v.get<Int>();
  return absl::OkStatus();
}

absl::Status ReadValue(std::string_view name, const Json& v, double& out) {
  if (!v.is_number()) return MustBe(name, "a number", Describe(v));
  out = v.get<double>();
  return absl::OkStatus();
}

// ---- checking a field's value -----------------------------------------------------------------

// "2026-12-02T21:04:05Z". Only the shape is checked: people read it, nothing computes with it.
bool IsUtcTimestamp(std::string_view s) {
  constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:ddZ";
  return s.size() == kShape.size() &&
         std::equal(s.begin(), s.end(), kShape.begin(), [](char c, char shape) {
           return shape == 'd' ? c >= '0' && c <= '9' : c == shape;
         });
}

absl::Status CheckValue(std::string_view name, const std::string& v) {
  if (name == "tuned_at") {
    if (IsUtcTimestamp(v)) return absl::OkStatus();
    return MustBe(name, "a UTC time such as \"2026-12-02T21:04:05Z\"", Describe(v));
  }
  if (!v.empty() || name == "runner_up") return absl::OkStatus();  // none when one config ran
  return MustBe(name, "a non-empty string", "\"\"");
}

absl::Status CheckValue(std::string_view name, int v) {
  return v >= 0 ? absl::OkStatus() : MustBe(name, "an integer >= 0", std::to_string(v));
}

// rows_bucket, the one int64_t field.
absl::Status CheckValue(std::string_view name, int64_t v) {
  const bool power_of_two = v > 0 && std::has_single_bit(static_cast<uint64_t>(v));
  return power_of_two ? absl::OkStatus() : MustBe(name, "a power of two >= 1", std::to_string(v));
}

absl::Status CheckValue(std::string_view name, double v) {
  if (std::isfinite(v) && v >= 0) return absl::OkStatus();
  return MustBe(name, "a finite number >= 0", fmt::to_string(v));
}

absl::Status ValidateRecord(const TuningRecord& r) {
  absl::Status status;
  ForEachField(r, [&](std::string_view name, const auto& v) {
    if (status.ok()) status = CheckValue(name, v);
  });
  return status;
}

// ---- the document -----------------------------------------------------------------------------

absl::StatusOr<TuningRecord> ReadRecord(const Json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(fmt::format("expected an object, got {}", Describe(j)));
  }
  std::vector<std::string_view> names;
  const TuningRecord blank;
  ForEachField(blank, [&](std::string_view name, const auto&) { names.push_back(name); });
  for (const auto& item : j.items()) {
    if (std::find(names.begin(), names.end(), item.key()) == names.end()) {
      return absl::InvalidArgumentError(fmt::format("unknown field {}", Describe(item.key())));
    }
  }
  TuningRecord r;
  absl::Status status;
  ForEachField(r, [&](std::string_view name, auto& field) {
    if (!status.ok()) return;
    auto it = j.find(name);
    status = it == j.end() ? absl::InvalidArgumentError(fmt::format("\"{}\" is missing", name))
                           : ReadValue(name, *it, field);
  });
  KJIT_RETURN_IF_ERROR(status);
  KJIT_RETURN_IF_ERROR(ValidateRecord(r));
  return r;
}

absl::StatusOr<TuningDb> ReadDocument(const Json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("expected a JSON object at the top level, got {}", Describe(j)));
  }
  for (const auto& item : j.items()) {
    const std::string& name = item.key();
    if (name != "format" && name != "version" && name != "records") {
      return absl::InvalidArgumentError(fmt::format("unknown top-level field {}", Describe(name)));
    }
  }
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kFormat) {
    return absl::InvalidArgumentError(
        fmt::format("not a kjit tuning database (\"format\" is not \"{}\")", kFormat));
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != kVersion) {
    return absl::InvalidArgumentError(
        fmt::format("\"version\" is {}; this kjit reads version {}",
                    version == j.end() ? "missing" : Describe(*version), kVersion));
  }
  auto records = j.find("records");
  if (records == j.end() || !records->is_array()) {
    return absl::InvalidArgumentError("\"records\" must be an array");
  }
  TuningDb db;
  for (size_t i = 0; i < records->size(); ++i) {
    absl::StatusOr<TuningRecord> r = ReadRecord((*records)[i]);
    if (!r.ok()) return Annotate(r.status(), fmt::format("record {}", i));
    if (db.Find(r->key)) {
      return absl::InvalidArgumentError(
          fmt::format("record {} has the key of an earlier record ({} {} {} {} rows_bucket={})", i,
                      r->key.device, r->key.op, r->key.dtype, r->key.shape, r->key.rows_bucket));
    }
    db.Put(*r);
  }
  return db;
}

// The JSON document in text; its error says where the syntax breaks.
absl::StatusOr<Json> ParseJson(std::string_view text) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e999
    return absl::InvalidArgumentError(fmt::format("not valid JSON ({})", e.what()));
  }
}

// The database in `text`, or DataLoss with `source` in front: bad bytes in the file, whichever
// step caught them.
absl::StatusOr<TuningDb> ParseText(std::string_view text, std::string_view source) {
  absl::StatusOr<Json> j = ParseJson(text);
  absl::StatusOr<TuningDb> db = j.ok() ? ReadDocument(*j) : j.status();
  if (db.ok()) return db;
  return absl::DataLossError(fmt::format("{}: {}", source, ToStd(db.status().message())));
}

// ---- files ------------------------------------------------------------------------------------

// The database at path: empty when there is no file, DataLoss when its bytes are not one, another
// error when it cannot be read.
absl::StatusOr<TuningDb> ReadDb(const std::string& path) {
  // ReadRegularFile opens non-blocking: a FIFO at the path must not hang a training run.
  absl::StatusOr<std::string> text = jit::ReadRegularFile(path, kMaxFileBytes);
  if (absl::IsNotFound(text.status())) return TuningDb();
  KJIT_RETURN_IF_ERROR(Annotate(text.status(), "tuning db"));
  if (text->size() > kMaxFileBytes) {
    return absl::DataLossError(fmt::format(
        "tuning db {}: over {} bytes, more than a tuning database holds", path, kMaxFileBytes));
  }
  return ParseText(*text, fmt::format("tuning db {}", path));
}

}  // namespace

int64_t RowsBucket(int64_t rows) {
  if (rows > kMaxRowsBucket) return kMaxRowsBucket;  // bit_ceil would overflow
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(rows, 1))));
}

std::string TuningDb::DefaultPath() {
  if (const char* v = std::getenv("KJIT_TUNING_DB"); v != nullptr && *v != '\0') return v;
  const std::string dir = jit::DiskCache::DefaultDirectory();
  return dir.empty() ? "" : dir + "/tuning.json";
}

absl::StatusOr<TuningDb> TuningDb::Load(const std::string& path) {
  absl::StatusOr<TuningDb> db = ReadDb(path);
  if (db.status().code() != absl::StatusCode::kDataLoss) return db;
  return absl::DataLossError(fmt::format(
      "{}; fix: delete it, or tune again (kjit-tune sets a corrupt database aside and starts a "
      "new one)",
      ToStd(db.status().message())));
}

absl::StatusOr<TuningDb> TuningDb::Parse(std::string_view text) {
  return ParseText(text, "tuning db");
}

std::string TuningDb::Serialize() const {
  // Ordered: the fields in the order of the struct, which reads better than alphabetical.
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson records = OrderedJson::array();
  for (const TuningRecord& r : records_) {
    OrderedJson j = OrderedJson::object();
    ForEachField(r, [&](const char* name, const auto& v) { j[name] = v; });
    records.push_back(std::move(j));
  }
  OrderedJson db = OrderedJson::object();
  db["format"] = std::string(kFormat);
  db["version"] = kVersion;
  db["records"] = std::move(records);
  // replace: Put does not validate, and invalid UTF-8 must not make this throw.
  return jit::JsonText(db, 2) + "\n";
}

std::optional<TuningRecord> TuningDb::Find(const TuningKey& key) const {
  auto it = std::lower_bound(records_.begin(), records_.end(), key, KeyBefore);
  if (it == records_.end() || !(it->key == key)) return std::nullopt;
  return *it;
}

std::optional<TuningRecord> TuningDb::FindNearest(const TuningKey& key) const {
  TuningKey first = key;
  first.rows_bucket = std::numeric_limits<int64_t>::min();
  auto it = std::lower_bound(records_.begin(), records_.end(), first, KeyBefore);
  const int want = Log2Place(RowsBucket(key.rows_bucket));
  const TuningRecord* best = nullptr;
  int best_distance = 0;
  // The candidates are adjacent, in increasing rows_bucket: `<=` lets the larger bucket win a tie.
  for (; it != records_.end() && ShapeTie(it->key) == ShapeTie(key); ++it) {
    const int distance = std::abs(Log2Place(it->key.rows_bucket) - want);
    if (best == nullptr || distance <= best_distance) {
      best = &*it;
      best_distance = distance;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

void TuningDb::Put(const TuningRecord& record) {
  auto it = std::lower_bound(records_.begin(), records_.end(), record.key, KeyBefore);
  if (it != records_.end() && it->key == record.key) {
    *it = record;
  } else {
    records_.insert(it, record);
  }
}

absl::StatusOr<TuningDb::UpsertResult> TuningDb::Upsert(const std::string& path,
                                                        const std::vector<TuningRecord>& records,
                                                        std::chrono::milliseconds lock_timeout) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "tuning db: no path (DefaultPath() found no directory; set KJIT_TUNING_DB)");
  }
  for (size_t i = 0; i < records.size(); ++i) {
    KJIT_RETURN_IF_ERROR(Annotate(ValidateRecord(records[i]),
                                  fmt::format("tuning db {}: record {} to save", path, i)));
  }
  KJIT_RETURN_IF_ERROR(Annotate(jit::MakePrivateDirs(jit::ParentDir(path)), "tuning db"));
  absl::StatusOr<jit::FileLock> lock = jit::LockFile(path + ".lock", lock_timeout);
  if (absl::IsDeadlineExceeded(lock.status())) {
    return absl::DeadlineExceededError(fmt::format(
        "tuning db: {} (another kjit-tune saving its results?); try again when it is done",
        ToStd(lock.status().message())));
  }
  KJIT_RETURN_IF_ERROR(Annotate(lock.status(), "tuning db"));

  // Under the lock, the file cannot change until we replace it.
  absl::StatusOr<TuningDb> db = ReadDb(path);
  UpsertResult result;
  std::string aside;
  if (db.status().code() == absl::StatusCode::kDataLoss) {
    aside = fmt::format("{}.corrupt-{}", path, static_cast<int64_t>(std::time(nullptr)));
    KJIT_RETURN_IF_ERROR(Annotate(jit::RenamePath(path, aside),
                                  fmt::format("tuning db: cannot move corrupt {} aside", path)));
    result.warning = fmt::format("{}; moved it to {} and started {} afresh",
                                 ToStd(db.status().message()), aside, path);
    db = TuningDb();
  }
  KJIT_RETURN_IF_ERROR(db.status());
  for (const TuningRecord& r : records) db->Put(r);
  // 0600: the database tells which GPUs and models a user runs.
  if (absl::Status s = jit::WriteFileAtomically(path, db->Serialize(), 0600); !s.ok()) {
    if (!aside.empty()) (void)jit::RenamePath(aside, path);  // as it was, corrupt or not
    return s;
  }
  result.written = static_cast<int>(db->records().size());
  return result;
}

}  // namespace kjit::internal
