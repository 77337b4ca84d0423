// The tuning database decides which kernel config a training run launches, and every kjit-tune of
// a user writes to it, so these tests attack it: configs and files that are malformed in every
// field, lookups that must not cross keys, processes merging at once, a held lock, a corrupt file,
// and writes that fail. CPU only; each test gets a fresh TempDir root.
#include "runtime/tuning_db.h"
#include "jit/status_helpers.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ops/common/tuning/search_space.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/tuning/search_space.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/tuning/search_space.h"
#include "runtime/runtime_state.h"
#include "runtime/tuned_configs.h"

namespace kjit::internal {

// The configs' text form is what the database stores: the parsers are tested against it here.
using ops::CrossEntropySearchSpace;
using ops::DefaultCrossEntropyConfig;
using ops::DefaultRmsNormConfig;
using ops::MaxVecForHidden;
using ops::RowShapeSearchSpace;
using ops::Unpruned;

// For failure messages (found by argument-dependent lookup, so outside the anonymous namespace).
static void PrintTo(const TuningRecord& r, std::ostream* os) {
  *os << r.key.device << " " << r.key.op << " " << r.key.dtype << " " << r.key.shape
      << " rows_bucket=" << r.key.rows_bucket << ": " << r.config << " (" << r.median_us << " us)";
}

namespace {

namespace fs = std::filesystem;
using kjit::testing::NamesWithPrefix;
using kjit::testing::ReadFile;
using kjit::testing::ScopedEnv;

// Whether text contains part; without gmock, which this suite does not link.
::testing::AssertionResult Contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" lacks \"" << part << "\"";
}

// Runs body(0) .. body(n - 1) in n forked children at once and returns their exit codes (1000 +
// the signal for one killed by a signal). No gtest in the children: body's result says how it went.
std::vector<int> RunInChildren(int n, const std::function<int(int)>& body) {
  int go[2];
  if (::pipe(go) != 0) return {};
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) {
      ::close(go[1]);
      char c;
      (void)::read(go[0], &c, 1);  // EOF once all are forked, so that they start together
      ::_exit(body(i));
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status));
  }
  return codes;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(std::ofstream(path, std::ios::binary) << bytes) << path;
}

TuningRecord Record(std::string op = "cross_entropy", int64_t rows_bucket = 1024,
                    std::string shape = "vocab=128256") {
  TuningRecord r;
  r.key = {"NVIDIA H200", 90, 13000, 13000, std::move(op), "bf16", std::move(shape), rows_bucket};
  r.config = "vec=8 threads=512 unroll=4 cluster=4 staged=0";
  r.median_us = 812.5;
  r.p10_us = 800.1;  // not exact in binary: the text must still round-trip it
  r.p90_us = 830;
  r.heuristic_us = 1e-7;
  r.runner_up = "vec=8 threads=1024 unroll=4 cluster=2 staged=0";
  r.runner_up_us = 123456.789;
  r.candidates = 37;
  r.failed = 2;
  r.tuned_at = "2026-12-02T21:04:05Z";
  return r;
}

// ---- config parsers ---------------------------------------------------------------------------

template <typename Config>
void ExpectRoundTrips(const std::vector<Config>& configs,
                      absl::StatusOr<Config> (*parse)(std::string_view)) {
  EXPECT_GT(configs.size(), 20u);
  for (const Config& c : configs) {
    absl::StatusOr<Config> parsed = parse(c.ToString());
    ASSERT_TRUE(parsed.ok()) << c.ToString() << ": " << parsed.status();
    EXPECT_EQ(*parsed, c) << c.ToString();
  }
}

TEST(ParseCrossEntropyConfigTest, RoundTripsEveryCandidateAndDefault) {
  std::vector<CrossEntropyConfig> configs;
  for (int64_t vocab : {32000, 128256, 256000}) {
    for (int arch : {80, 90}) {
      for (const CrossEntropyConfig& c : Unpruned(CrossEntropySearchSpace(vocab, 8, arch))) {
        configs.push_back(c);
      }
      configs.push_back(DefaultCrossEntropyConfig(vocab, 4, arch, 4));
    }
  }
  ExpectRoundTrips(configs, &ParseCrossEntropyConfig);
}

TEST(ParseCrossEntropyConfigTest, TakesFieldsInAnyOrder) {
  absl::StatusOr<CrossEntropyConfig> c =
      ParseCrossEntropyConfig("cluster=0  unroll=2 staged=0 vec=1 threads=1024 ");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, (CrossEntropyConfig{.vec = 1, .threads = 1024, .unroll = 2, .cluster = 0}));
}

struct Rejection {
  std::string text;
  std::string names;  // what the message must quote: the field, and its value where it has one
};

void ExpectRejected(const std::vector<Rejection>& cases,
                    const std::function<absl::Status(std::string_view)>& parse) {
  for (const Rejection& c : cases) {
    absl::Status s = parse(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text << ": " << s;
    EXPECT_TRUE(Contains(ToStd(s.message()), c.names)) << c.text;
    EXPECT_TRUE(Contains(ToStd(s.message()), "\"" + c.text + "\"")) << c.text;
  }
}

TEST(ParseCrossEntropyConfigTest, RejectsNamingTheFieldAndTheText) {
  ExpectRejected(
      {
          {"vec=3 threads=512 unroll=4 cluster=4 staged=0", "vec=3"},
          {"vec=32 threads=512 unroll=4 cluster=4 staged=0", "vec=32"},
          {"vec=0 threads=512 unroll=4 cluster=4 staged=0", "vec=0"},
          {"vec=8 threads=500 unroll=4 cluster=4 staged=0", "threads=500"},
          {"vec=8 threads=0 unroll=4 cluster=4 staged=0", "threads=0"},
          {"vec=8 threads=2048 unroll=4 cluster=4 staged=0", "threads=2048"},
          {"vec=8 threads=512 unroll=3 cluster=4 staged=0", "unroll=3"},
          {"vec=8 threads=512 unroll=16 cluster=4 staged=0", "unroll=16"},
          {"vec=8 threads=512 unroll=4 cluster=9 staged=0", "cluster=9"},
          {"vec=8 threads=512 unroll=4 cluster=-1 staged=0", "cluster=-1"},
          {"vec=8 threads=512 unroll=4 staged=0", "\"cluster\" is missing"},
          {"vec=8 threads=512 unroll=4 cluster=4", "\"staged\" is missing"},
          {"vec=8 threads=512 unroll=4 cluster=4 staged=2", "staged=2"},
          {"vec=8 threads=512 unroll=4 cluster=0 staged=1", "staged=1"},
          {"", "\"vec\" is missing"},
          {"vec=8 threads=512 unroll=4 cluster=4 staged=0 vec=8", "\"vec\" appears twice"},
          {"vec=8 threads=512 unroll=4 cluster=4 staged=0 chunk=2", "unknown field \"chunk\""},
          {"vec=8x threads=512 unroll=4 cluster=4 staged=0", "vec=8x"},
          {"vec= threads=512 unroll=4 cluster=4 staged=0", "vec=:"},
          {"vec=+8 threads=512 unroll=4 cluster=4 staged=0", "vec=+8"},
          {"vec=99999999999 threads=512 unroll=4 cluster=4 staged=0", "vec=99999999999"},
          {"vec=8 threads unroll=4 cluster=4 staged=0", "\"threads\" is not name=value"},
      },
      [](std::string_view text) { return ParseCrossEntropyConfig(text).status(); });
}

TEST(ParseRmsNormConfigTest, RoundTripsDefaultsAndCandidates) {
  std::vector<RmsNormConfig> configs;
  for (int64_t hidden : {1, 7, 64, 1000, 2048, 4096, 5120, 8192, 65536}) {
    const int vec = MaxVecForHidden(hidden, 2);
    configs.push_back(DefaultRmsNormConfig(hidden, vec));
    for (const RowShape& s : Unpruned(RowShapeSearchSpace(hidden, vec)))
      configs.push_back({vec, s, s});
  }
  ExpectRoundTrips(configs, &ParseRmsNormConfig);
  absl::StatusOr<RmsNormConfig> c = ParseRmsNormConfig("bwd=32x1 fwd=4x32 vec=2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, (RmsNormConfig{.vec = 2, .forward = {4, 32}, .backward = {32, 1}}));
}

TEST(ParseRmsNormConfigTest, RejectsNamingTheFieldAndTheText) {
  ExpectRejected(
      {
          {"vec=3 fwd=256x1 bwd=512x1", "vec=3"},
          {"vec=32 fwd=256x1 bwd=512x1", "vec=32"},
          {"vec=8 fwd=256x2 bwd=512x1", "fwd=256x2"},  // several rows with > 32 threads a row
          {"vec=8 fwd=48x1 bwd=512x1", "fwd=48x1"},    // neither a sub-warp nor whole warps
          {"vec=8 fwd=256x1 bwd=2048x1", "bwd=2048x1"},
          {"vec=8 fwd=32x64 bwd=512x1", "fwd=32x64"},  // 2048 threads a block
          {"vec=8 fwd=16x0 bwd=512x1", "fwd=16x0"},
          {"vec=8 fwd=0x1 bwd=512x1", "fwd=0x1"},
          {"vec=8 fwd=-32x1 bwd=512x1", "fwd=-32x1"},
          {"vec=8 fwd=256x1 bwd=1x2147483647", "bwd=1x2147483647"},  // overflows 32 bits
          {"vec=8 fwd=256 bwd=512x1", "fwd=256:"},
          {"vec=8 fwd=x1 bwd=512x1", "fwd=x1"},
          {"vec=8 fwd=256x bwd=512x1", "fwd=256x:"},
          {"vec=8 fwd=256x1x1 bwd=512x1", "fwd=256x1x1"},
          {"vec=8 fwd=256x1", "\"bwd\" is missing"},
          {"vec=8 fwd=256x1 bwd=512x1 fwd=256x1", "\"fwd\" appears twice"},
          {"vec=8 fwd=256x1 bwd=512x1 threads=256", "unknown field \"threads\""},
      },
      [](std::string_view text) { return ParseRmsNormConfig(text).status(); });
}

// ---- in memory --------------------------------------------------------------------------------

// Issue 45, defect 11: a record that does not parse is ignored with a warning quoting it; the
// database is a file anyone may have written, so the quote is escaped and cut.
TEST(TunedConfigsTest, AnIgnoredRecordsWarningEscapesAndCutsItsText) {
  RuntimeState rt;
  rt.compile_only = true;  // keys without a device's fields
  std::vector<std::string> warnings;
  rt.warnings = [&](std::string_view m) { warnings.emplace_back(m); };
  TuningRecord r = Record("cross_entropy", 64, "vocab=1000");
  r.key = TuningKeyFor(rt, "cross_entropy", "vocab=1000", DType::kBF16, 64);
  r.config = "vec=8\x1b]0;title\x07 threads=" + std::string(100000, '5');
  auto db = std::make_shared<TuningDb>();
  db->Put(r);
  rt.tuning = db;
  TunedConfigs<CrossEntropyConfig> tuned(
      rt, "cross_entropy", "vocab=1000", DType::kBF16, "{}", ParseCrossEntropyConfig,
      [](const CrossEntropyConfig&) { return absl::OkStatus(); });
  EXPECT_FALSE(tuned.For(64, /*may_tune=*/false).has_value());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(warnings[0].starts_with(
      "tuning database record cross_entropy vocab=1000 rows<=64: \"vec=8\\x1b]0;title\\x07 "
      "threads=5"))
      << warnings[0].substr(0, 400);
  EXPECT_EQ(warnings[0].find('\x1b'), std::string::npos);
  EXPECT_LT(warnings[0].size(), 1000u);
}

TEST(TuningDbTest, RowsBucketIsTheNextPowerOfTwo) {
  EXPECT_EQ(RowsBucket(1), 1);
  EXPECT_EQ(RowsBucket(2), 2);
  EXPECT_EQ(RowsBucket(3), 4);
  EXPECT_EQ(RowsBucket(1000), 1024);
  EXPECT_EQ(RowsBucket(1024), 1024);
  EXPECT_EQ(RowsBucket(1025), 2048);
  EXPECT_EQ(RowsBucket(16384 * 8), 131072);
  EXPECT_EQ(RowsBucket(0), 1);
  EXPECT_EQ(RowsBucket(-5), 1);
  EXPECT_EQ(RowsBucket(std::numeric_limits<int64_t>::max()), int64_t{1} << 62);
}

TEST(TuningDbTest, PutSerializeParseRoundTripsInKeyOrder) {
  TuningDb db;
  db.Put(Record("rms_norm+residual", 4096, "hidden=4096"));
  db.Put(Record("cross_entropy", 2048));
  db.Put(Record("cross_entropy", 1));
  TuningRecord replaced = Record("cross_entropy", 2048);
  replaced.config = "vec=8 threads=256 unroll=8 cluster=0 staged=0";
  replaced.runner_up = "";
  db.Put(replaced);
  ASSERT_EQ(db.records().size(), 3u);
  EXPECT_EQ(db.records()[0].key.rows_bucket, 1);
  EXPECT_EQ(db.records()[1], replaced);
  EXPECT_EQ(db.records()[2].key.op, "rms_norm+residual");

  const std::string text = db.Serialize();
  EXPECT_EQ(text.back(), '\n');
  EXPECT_TRUE(Contains(text, "\"format\": \"kjit-tuning-db\""));
  EXPECT_TRUE(Contains(text, "\n      \"device\": \"NVIDIA H200\",\n"));  // one field a line
  absl::StatusOr<TuningDb> parsed = TuningDb::Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->records(), db.records());
  EXPECT_EQ(parsed->Serialize(), text);

  // The same records put in another order serialize identically.
  TuningDb reordered;
  for (auto it = db.records().rbegin(); it != db.records().rend(); ++it) reordered.Put(*it);
  EXPECT_EQ(reordered.Serialize(), text);
  EXPECT_EQ(TuningDb().Serialize(),
            "{\n  \"format\": \"kjit-tuning-db\",\n  \"version\": 1,\n  \"records\": []\n}\n");
}

TEST(TuningDbTest, FindMatchesExactlyIncludingTheRowsBucket) {
  TuningDb db;
  db.Put(Record("cross_entropy", 1024));
  ASSERT_TRUE(db.Find(Record("cross_entropy", 1024).key).has_value());
  EXPECT_EQ(*db.Find(Record("cross_entropy", 1024).key), Record("cross_entropy", 1024));
  EXPECT_FALSE(db.Find(Record("cross_entropy", 2048).key).has_value());
  EXPECT_FALSE(db.Find(Record("cross_entropy", 512).key).has_value());
}

TEST(TuningDbTest, FindNearestTakesTheClosestBucketInLog2AndTheLargerOnATie) {
  TuningDb db;
  for (int64_t bucket : {256, 4096, 16384}) db.Put(Record("cross_entropy", bucket));
  auto nearest = [&](int64_t bucket) -> int64_t {
    std::optional<TuningRecord> r = db.FindNearest(Record("cross_entropy", bucket).key);
    return r ? r->key.rows_bucket : -1;
  };
  EXPECT_EQ(nearest(4096), 4096);   // exact
  EXPECT_EQ(nearest(1), 256);       // below every bucket
  EXPECT_EQ(nearest(512), 256);     // 1 step vs 3
  EXPECT_EQ(nearest(1024), 4096);   // 2 steps either way: the larger
  EXPECT_EQ(nearest(2048), 4096);   // 3 vs 1
  EXPECT_EQ(nearest(8192), 16384);  // 1 step either way: the larger
  EXPECT_EQ(nearest(1 << 20), 16384);
}

TEST(TuningDbTest, LookupsNeverReturnAnotherKeysRecord) {
  const TuningRecord tuned = Record("cross_entropy", 1024);
  TuningDb db;
  db.Put(tuned);
  // Neighbours in the sort order, which a range scan could run into.
  db.Put(Record("cross_entropy", 1024, "vocab=128255"));
  db.Put(Record("cross_entropy", 1024, "vocab=128257"));
  std::vector<std::pair<std::string, std::function<void(TuningKey&)>>> changes = {
      {"device", [](TuningKey& k) { k.device = "NVIDIA H100 80GB HBM3"; }},
      {"arch", [](TuningKey& k) { k.arch = 100; }},
      {"driver", [](TuningKey& k) { k.driver = 12080; }},
      {"nvrtc", [](TuningKey& k) { k.nvrtc = 12080; }},
      {"op", [](TuningKey& k) { k.op = "rms_norm"; }},
      {"dtype", [](TuningKey& k) { k.dtype = "fp16"; }},
      {"shape", [](TuningKey& k) { k.shape = "vocab=32000"; }},
  };
  for (const auto& [field, change] : changes) {
    TuningKey key = tuned.key;
    change(key);
    EXPECT_FALSE(db.Find(key).has_value()) << field;
    EXPECT_FALSE(db.FindNearest(key).has_value()) << field;
  }
  std::optional<TuningRecord> same = db.FindNearest(tuned.key);
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->key, tuned.key);
}

// ---- parsing untrusted text -------------------------------------------------------------------

// A valid one-record database as JSON, for tests to break.
nlohmann::json ValidJson() {
  TuningDb db;
  db.Put(Record());
  db.Put(Record("rms_norm", 64, "hidden=4096"));
  return nlohmann::json::parse(db.Serialize());
}

struct BadText {
  std::string name;
  std::string text;
  std::string says;  // a part of the message
};

std::vector<BadText> BadTexts() {
  auto with = [](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = ValidJson();
    change(j);
    return j.dump();
  };
  const std::string valid = ValidJson().dump(2);
  return {
      {"empty", "", "not valid JSON"},
      {"truncated", valid.substr(0, valid.size() / 2), "not valid JSON"},
      {"not an object", "[1, 2]", "expected a JSON object"},
      {"other format", with([](auto& j) { j["format"] = "kjit-cache"; }), "\"format\""},
      {"no format", with([](auto& j) { j.erase("format"); }), "\"format\""},
      {"newer version", with([](auto& j) { j["version"] = 2; }), "\"version\" is 2"},
      {"version as text", with([](auto& j) { j["version"] = "1"; }), "\"version\""},
      {"records not an array", with([](auto& j) { j["records"] = nlohmann::json::object(); }),
       "\"records\""},
      {"unknown top-level field", with([](auto& j) { j["comment"] = 1; }), "\"comment\""},
      {"record not an object", with([](auto& j) { j["records"][1] = 5; }), "record 1: expected"},
      {"bucket not a power of two", with([](auto& j) { j["records"][1]["rows_bucket"] = 48; }),
       "record 1: \"rows_bucket\""},
      {"bucket zero", with([](auto& j) { j["records"][0]["rows_bucket"] = 0; }),
       "record 0: \"rows_bucket\""},
      {"bucket past int64",
       with([](auto& j) { j["records"][0]["rows_bucket"] = uint64_t{1} << 63; }),
       "record 0: \"rows_bucket\""},
      {"arch as text", with([](auto& j) { j["records"][0]["arch"] = "90"; }),
       "record 0: \"arch\" must be an integer"},
      {"arch fractional", with([](auto& j) { j["records"][0]["arch"] = 9.5; }), "\"arch\""},
      {"driver past int", with([](auto& j) { j["records"][0]["driver"] = int64_t{1} << 40; }),
       "\"driver\""},
      {"failed negative", with([](auto& j) { j["records"][0]["failed"] = -1; }), "\"failed\""},
      {"median negative", with([](auto& j) { j["records"][0]["median_us"] = -3.5; }),
       "\"median_us\""},
      {"p90 as bool", with([](auto& j) { j["records"][0]["p90_us"] = true; }), "\"p90_us\""},
      {"empty device", with([](auto& j) { j["records"][0]["device"] = ""; }), "\"device\""},
      {"empty config", with([](auto& j) { j["records"][1]["config"] = ""; }),
       "record 1: \"config\""},
      {"shape as array", with([](auto& j) { j["records"][0]["shape"] = nlohmann::json::array(); }),
       "\"shape\" must be a string, got an array"},
      {"bad time", with([](auto& j) { j["records"][0]["tuned_at"] = "2026-12-02 21:04"; }),
       "\"tuned_at\""},
      {"missing field", with([](auto& j) { j["records"][1].erase("candidates"); }),
       "record 1: \"candidates\" is missing"},
      {"unknown field", with([](auto& j) { j["records"][0]["gpu"] = "x"; }),
       "record 0: unknown field \"gpu\""},
      {"repeated key", with([](auto& j) { j["records"][1] = j["records"][0]; }),
       "record 1 has the key of an earlier record"},
      {"huge number", R"({"format": "kjit-tuning-db", "version": 1e999, "records": []})",
       "not valid JSON"},
      {"deep nesting", std::string(100000, '[') + std::string(100000, ']'),
       "expected a JSON object"},
  };
}

TEST(TuningDbTest, ParseRejectsEveryMalformedDocumentAsDataLoss) {
  for (const BadText& bad : BadTexts()) {
    absl::StatusOr<TuningDb> db = TuningDb::Parse(bad.text);
    EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << bad.name << ": " << db.status();
    EXPECT_TRUE(Contains(ToStd(db.status().message()), bad.says)) << bad.name;
  }
  // Deep nesting inside a record: named by its type, never dumped (recursively) into the message.
  std::string deep = ValidJson().dump();
  const std::string arch = "\"arch\":90";
  ASSERT_NE(deep.find(arch), std::string::npos);
  deep.replace(deep.find(arch), arch.size(),
               "\"arch\":" + std::string(100000, '[') + std::string(100000, ']'));
  absl::StatusOr<TuningDb> db = TuningDb::Parse(deep);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(ToStd(db.status().message()), "\"arch\" must be an integer"));
  EXPECT_LT(db.status().message().size(), 200u);
}

// ---- files ------------------------------------------------------------------------------------

class TuningDbFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    root_ = tmp_.path();
    path_ = root_ + "/tuning.json";
  }
  // Temp files left beside the database (a failed or killed write).
  std::vector<std::string> Temps() const { return NamesWithPrefix(root_, ".tmp-tuning.json-"); }

  testing::TempDir tmp_{"kjit_tuning_db_test"};
  std::string root_;
  std::string path_;
};

TEST_F(TuningDbFileTest, LoadOfAMissingFileIsAnEmptyDatabase) {
  absl::StatusOr<TuningDb> db = TuningDb::Load(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_TRUE(db->records().empty());
  EXPECT_FALSE(fs::exists(path_));  // loading creates nothing
}

TEST_F(TuningDbFileTest, LoadOfACorruptFileIsDataLossNamingThePath) {
  for (const BadText& bad : BadTexts()) {
    WriteFile(path_, bad.text);
    absl::StatusOr<TuningDb> db = TuningDb::Load(path_);
    EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << bad.name << ": " << db.status();
    EXPECT_TRUE(Contains(ToStd(db.status().message()), path_)) << bad.name;
    EXPECT_TRUE(Contains(ToStd(db.status().message()), bad.says)) << bad.name;
  }
}

TEST_F(TuningDbFileTest, LoadOfADirectoryIsAnErrorNotAnEmptyDatabase) {
  ASSERT_TRUE(fs::create_directory(path_));
  absl::StatusOr<TuningDb> db = TuningDb::Load(path_);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition) << db.status();
  EXPECT_TRUE(Contains(ToStd(db.status().message()), path_));
}

TEST_F(TuningDbFileTest, UpsertCreatesPrivateDirectoriesAndMergesByKey) {
  const std::string dir = root_ + "/a/b";
  const std::string path = dir + "/tuning.json";
  absl::StatusOr<TuningDb::UpsertResult> first =
      TuningDb::Upsert(path, {Record("cross_entropy", 1024), Record("cross_entropy", 2048)});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->written, 2);
  EXPECT_EQ(first->warning, "");
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "the database is readable by others";

  TuningRecord faster = Record("cross_entropy", 2048);
  faster.config = "vec=8 threads=1024 unroll=2 cluster=0 staged=0";
  faster.median_us = 700;
  absl::StatusOr<TuningDb::UpsertResult> second =
      TuningDb::Upsert(path, {faster, Record("rms_norm", 64, "hidden=4096")});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->written, 3);

  absl::StatusOr<TuningDb> db = TuningDb::Load(path);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_EQ(db->records().size(), 3u);
  EXPECT_EQ(db->Find(faster.key), faster);
  EXPECT_EQ(db->Find(Record("cross_entropy", 1024).key), Record("cross_entropy", 1024));
  EXPECT_EQ(ReadFile(path), db->Serialize());
  EXPECT_TRUE(NamesWithPrefix(dir, ".tmp-tuning.json-").empty());
}

TEST_F(TuningDbFileTest, UpsertRejectsAnInvalidRecordAndWritesNothing) {
  ASSERT_TRUE(TuningDb::Upsert(path_, {Record()}).ok());
  const std::string before = ReadFile(path_);
  TuningRecord bad = Record("rms_norm", 48, "hidden=4096");
  absl::StatusOr<TuningDb::UpsertResult> r =
      TuningDb::Upsert(path_, {Record("rms_norm", 64, "hidden=4096"), bad});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(Contains(ToStd(r.status().message()), "record 1"));
  EXPECT_TRUE(Contains(ToStd(r.status().message()), "\"rows_bucket\""));
  TuningRecord undated = Record();
  undated.tuned_at = "";
  EXPECT_TRUE(Contains(ToStd(TuningDb::Upsert(path_, {undated}).status().message()), "tuned_at"));
  EXPECT_EQ(ReadFile(path_), before);
}

TEST_F(TuningDbFileTest, UpsertSetsACorruptFileAsideAndRebuildsWithAWarning) {
  const std::string corrupt = "{\"format\": \"kjit-tuning-db\", \"version\": 1, \"records\": [{";
  WriteFile(path_, corrupt);
  absl::StatusOr<TuningDb::UpsertResult> r = TuningDb::Upsert(path_, {Record()});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->written, 1);
  std::vector<std::string> aside = NamesWithPrefix(root_, "tuning.json.corrupt-");
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(ReadFile(root_ + "/" + aside[0]), corrupt);
  EXPECT_TRUE(Contains(r->warning, path_));
  EXPECT_TRUE(Contains(r->warning, root_ + "/" + aside[0]));
  absl::StatusOr<TuningDb> db = TuningDb::Load(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(db->records(), std::vector<TuningRecord>{Record()});
}

TEST_F(TuningDbFileTest, EightProcessesUpsertingAtOnceLoseNothing) {
  constexpr int kProcesses = 8, kUpserts = 25;
  const std::vector<int> codes = RunInChildren(kProcesses, [&](int p) {
    for (int i = 0; i < kUpserts; ++i) {
      // Two records a merge, one of them rewritten by the next merge: replacing counts too.
      TuningRecord latest = Record("rms_norm", 1, fmt::format("hidden={}", p));
      latest.candidates = i;
      const std::vector<TuningRecord> records = {
          Record("cross_entropy", int64_t{1} << i, fmt::format("vocab={}", p)), latest};
      absl::StatusOr<TuningDb::UpsertResult> r =
          TuningDb::Upsert(path_, records, std::chrono::seconds(60));
      if (!r.ok() || !r->warning.empty()) return 10 + i;
    }
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(kProcesses, 0));

  absl::StatusOr<TuningDb> db = TuningDb::Load(path_);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(db->records().size(), size_t{kProcesses * (kUpserts + 1)});
  for (int p = 0; p < kProcesses; ++p) {
    for (int i = 0; i < kUpserts; ++i) {
      EXPECT_TRUE(
          db->Find(Record("cross_entropy", int64_t{1} << i, fmt::format("vocab={}", p)).key))
          << p << " " << i;
    }
    std::optional<TuningRecord> latest =
        db->Find(Record("rms_norm", 1, fmt::format("hidden={}", p)).key);
    ASSERT_TRUE(latest.has_value()) << p;
    EXPECT_EQ(latest->candidates, kUpserts - 1) << p;
  }
  EXPECT_TRUE(Temps().empty());
}

TEST_F(TuningDbFileTest, UpsertTimesOutWhileAnotherHolderHasTheLock) {
  ASSERT_TRUE(TuningDb::Upsert(path_, {Record()}).ok());
  const std::string before = ReadFile(path_);
  // flock excludes every other open of the file, in this process too: this one stands for another
  // kjit-tune's.
  const int held = ::open((path_ + ".lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TuningDb::UpsertResult> blocked = TuningDb::Upsert(
      path_, {Record("rms_norm", 64, "hidden=4096")}, std::chrono::milliseconds(100));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kDeadlineExceeded) << blocked.status();
  EXPECT_TRUE(Contains(ToStd(blocked.status().message()), path_ + ".lock"));
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_EQ(ReadFile(path_), before);

  ::close(held);
  absl::StatusOr<TuningDb::UpsertResult> after =
      TuningDb::Upsert(path_, {Record("rms_norm", 64, "hidden=4096")}, std::chrono::seconds(10));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->written, 2);
}

TEST_F(TuningDbFileTest, UpsertBeneathARegularFileFails) {
  // A directory that cannot exist, whoever runs the test (root ignores permission bits).
  WriteFile(root_ + "/file", "x");
  const std::string path = root_ + "/file/tuning.json";
  absl::StatusOr<TuningDb::UpsertResult> r = TuningDb::Upsert(path, {Record()});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(Contains(ToStd(r.status().message()), root_ + "/file"));
  EXPECT_EQ(ReadFile(root_ + "/file"), "x");
}

TEST_F(TuningDbFileTest, AFailedWriteLeavesTheOldFileIntact) {
  ASSERT_TRUE(TuningDb::Upsert(path_, {Record()}).ok());
  const std::string before = ReadFile(path_);
  // The child may not grow a file past the old database's size: the write of the bigger merged
  // database fails part way (EFBIG, as a full disk would), even for root.
  const std::vector<int> codes = RunInChildren(1, [&](int) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{before.size(), before.size()};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 1;
    std::vector<TuningRecord> more;
    for (int i = 0; i < 50; ++i) more.push_back(Record("rms_norm", int64_t{1} << i, "hidden=4096"));
    absl::StatusOr<TuningDb::UpsertResult> r = TuningDb::Upsert(path_, more);
    if (r.ok()) return 2;
    const std::string message(r.status().message());
    return message.find(path_) != std::string::npos && message.find("write") != std::string::npos
               ? 0
               : 3;
  });
  EXPECT_EQ(codes, std::vector<int>{0});
  EXPECT_EQ(ReadFile(path_), before);
  EXPECT_TRUE(Temps().empty()) << Temps()[0];
}

TEST(TuningDbPathTest, DefaultPathFollowsTheEnvironment) {
  {
    ScopedEnv db("KJIT_TUNING_DB", "/somewhere/tuned.json");
    ScopedEnv cache("KJIT_CACHE_DIR", "/cache");
    EXPECT_EQ(TuningDb::DefaultPath(), "/somewhere/tuned.json");
  }
  ScopedEnv db("KJIT_TUNING_DB", nullptr);
  ScopedEnv cache("KJIT_CACHE_DIR", "/cache");
  EXPECT_EQ(TuningDb::DefaultPath(), "/cache/tuning.json");
}

}  // namespace
}  // namespace kjit::internal
