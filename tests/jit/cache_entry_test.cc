// The entry format must reject anything but a complete, checksummed entry: a torn or flipped
// CUBIN that slipped through would run on the GPU.
#include "jit/cache_entry.h"

#include <xxhash.h>

#include <cstdint>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "jit/cache_key.h"

namespace kjit::jit {
namespace {

Binary MakeBinary() {
  Binary b;
  b.target = ParseTarget("sm_90a").value();
  // Bytes of every value, NULs included: the code is opaque binary.
  for (int i = 0; i < 300; ++i) b.code.push_back(static_cast<char>((i * 37) & 0xff));
  b.lowered_names = {{"kjit::rms_norm_forward<kjit::bf16, 4096>", "_Z15rms_norm_fwdILi4096EEvv"},
                     {"kjit::rms_norm_backward<kjit::bf16, 4096>", "_Z15rms_norm_bwdILi4096EEvv"}};
  b.nvrtc_version = "13.0";
  b.options = {"--gpu-architecture=sm_90a", "--std=c++17"};
  b.params = {{"hidden", "4096"}, {"dtype", "bf16"}};
  b.program_name = "rms_norm_forward";
  b.created_unix = 1'790'000'000;
  b.log = "warning: something \"quoted\"\n";
  b.key = "0123456789abcdef0123456789abcdef";
  return b;
}

void ExpectSameBinary(const Binary& a, const Binary& b) {
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.lowered_names, b.lowered_names);
  EXPECT_EQ(a.nvrtc_version, b.nvrtc_version);
  EXPECT_EQ(a.options, b.options);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.program_name, b.program_name);
  EXPECT_EQ(a.created_unix, b.created_unix);
  EXPECT_EQ(a.log, b.log);
  EXPECT_EQ(a.key, b.key);
}

uint64_t ReadU64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A well-formed header around an arbitrary payload, with a correct checksum, so the tests reach
// the metadata checks behind it.
std::string EntryWithPayload(const std::string& payload) {
  std::string out(kCacheEntryMagic);
  out += std::string("\x02\x00\x00\x00", 4);  // kCacheFormatVersion == 2
  out += std::string(4, '\0');
  PutU64(out, payload.size());
  PutU64(out, XXH3_64bits(payload.data(), payload.size()));
  return out + payload;
}

std::string EntryWithMetadata(const std::string& meta, const std::string& code = "CODE") {
  std::string payload;
  PutU64(payload, meta.size());
  return EntryWithPayload(payload + meta + code);
}

const char* kGoodMeta =
    R"({"target":"sm_90","lowered_names":{},"nvrtc_version":"13.0","options":[],"params":{},)"
    R"("program_name":"p","created_unix":1,"log":"","key":"00112233445566778899aabbccddeeff"})";

TEST(CacheEntryTest, HelperBuildsTheSameLayoutAsEncode) {
  static_assert(kCacheFormatVersion == 2, "update EntryWithPayload's version bytes");
  ASSERT_TRUE(DecodeEntry(EntryWithMetadata(kGoodMeta)).ok());
}

// Issue 18, defect 3: the checksum proves an entry whole, not whose it is. A valid entry copied
// onto another key's file ran as the other shape's kernel until the entry recorded its key.
TEST(CacheEntryTest, AnEntryRecordsItsKeyAndIsRefusedUnderAnother) {
  const std::string mine = "00000000000000000000000000000512";
  const std::string other = "00000000000000000000000000001024";
  const std::string bytes = EncodeEntry(MakeBinary(), mine);

  absl::StatusOr<Binary> back = DecodeEntryFor(bytes, mine);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->key, mine);
  EXPECT_EQ(DecodeEntry(bytes)->key, mine);

  absl::StatusOr<Binary> copied = DecodeEntryFor(bytes, other);
  ASSERT_FALSE(copied.ok());
  EXPECT_EQ(copied.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(copied.status().message(), "corrupt cache entry: it was written for key '" + mine +
                                           "', not " + other +
                                           " (an entry copied or renamed onto another key's file)");

  // The key is behind the checksum: rewriting it in place is caught like any other edit.
  std::string edited = bytes;
  edited.replace(edited.find(mine), mine.size(), other);
  absl::StatusOr<Binary> forged = DecodeEntryFor(edited, other);
  ASSERT_FALSE(forged.ok());
  EXPECT_NE(forged.status().message().find("checksum mismatch"), absl::string_view::npos)
      << forged.status();

  // An entry of the previous format (no key) is refused, not trusted under any name.
  const std::string keyless =
      R"({"target":"sm_90","lowered_names":{},"nvrtc_version":"13.0","options":[],"params":{},)"
      R"("program_name":"p","created_unix":1,"log":""})";
  absl::StatusOr<Binary> old = DecodeEntryFor(EntryWithMetadata(keyless), "");
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("'key'"), absl::string_view::npos) << old.status();
}

TEST(CacheEntryTest, RoundTrip) {
  const Binary b = MakeBinary();
  absl::StatusOr<Binary> back = DecodeEntry(EncodeEntry(b));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameBinary(b, *back);
}

TEST(CacheEntryTest, RoundTripMinimalAndPtx) {
  Binary b;
  b.target = ParseTarget("compute_90").value();
  b.code = ".version 8.0\n";
  b.created_unix = -5;  // before 1970 is odd but representable
  absl::StatusOr<Binary> back = DecodeEntry(EncodeEntry(b));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameBinary(b, *back);
}

TEST(CacheEntryTest, HeaderLayout) {
  const std::string e = EncodeEntry(MakeBinary());
  ASSERT_GT(e.size(), kCacheEntryHeaderSize);
  EXPECT_EQ(e.substr(0, 8), "KJITCACH");
  EXPECT_EQ(e.substr(8, 4), std::string("\x02\x00\x00\x00", 4));  // version 2, little-endian
  EXPECT_EQ(e.substr(12, 4), std::string(4, '\0'));
  EXPECT_EQ(ReadU64(e, 16), e.size() - kCacheEntryHeaderSize);
  EXPECT_EQ(ReadU64(e, 24), XXH3_64bits(e.data() + 32, e.size() - 32));
  // The code is the tail, after the metadata.
  const uint64_t meta_size = ReadU64(e, 32);
  EXPECT_EQ(e.substr(40 + meta_size), MakeBinary().code);
}

TEST(CacheEntryTest, EveryTruncationIsRejected) {
  const std::string e = EncodeEntry(MakeBinary());
  for (size_t len = 0; len < e.size(); ++len) {
    absl::StatusOr<Binary> r = DecodeEntry(std::string_view(e).substr(0, len));
    ASSERT_FALSE(r.ok()) << "accepted a prefix of " << len << " of " << e.size() << " bytes";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << len;
    EXPECT_NE(r.status().message().find("truncated"), absl::string_view::npos) << r.status();
  }
}

TEST(CacheEntryTest, TruncationMessageGivesBothSizes) {
  const std::string e = EncodeEntry(MakeBinary());
  absl::StatusOr<Binary> r = DecodeEntry(std::string_view(e).substr(0, 100));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("header says " + std::to_string(e.size() - 32) +
                                      " payload bytes, file has 68"),
            absl::string_view::npos)
      << r.status();
}

TEST(CacheEntryTest, TrailingBytesAreRejected) {
  absl::StatusOr<Binary> r = DecodeEntry(EncodeEntry(MakeBinary()) + "x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
}

TEST(CacheEntryTest, EverySingleBitFlipIsRejected) {
  // Every bit of header, metadata and code: the entry is small enough to flip them all.
  const std::string e = EncodeEntry(MakeBinary());
  const uint64_t meta_end = 40 + ReadU64(e, 32);
  ASSERT_LT(meta_end, e.size());  // there are code bytes after the metadata to flip too
  int flips = 0;
  for (size_t pos = 0; pos < e.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = e;
      bad[pos] = static_cast<char>(bad[pos] ^ (1 << bit));
      absl::StatusOr<Binary> r = DecodeEntry(bad);
      ASSERT_FALSE(r.ok()) << "accepted a flip of bit " << bit << " at byte " << pos;
      ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
      ++flips;
    }
  }
  EXPECT_EQ(flips, static_cast<int>(e.size() * 8));
}

TEST(CacheEntryTest, ReasonsNameTheProblem) {
  const std::string e = EncodeEntry(MakeBinary());
  auto message = [](const std::string& bytes) {
    absl::StatusOr<Binary> r = DecodeEntry(bytes);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  std::string bad_magic = e;
  bad_magic[0] = 'X';
  EXPECT_NE(message(bad_magic).find("bad magic"), std::string::npos);
  std::string bad_version = e;
  bad_version[8] = 1;  // the format before entries recorded their key
  EXPECT_NE(message(bad_version).find("format version 1, this kjit reads version 2"),
            std::string::npos);
  std::string bad_reserved = e;
  bad_reserved[13] = 1;
  EXPECT_NE(message(bad_reserved).find("reserved"), std::string::npos);
  std::string bad_code = e;
  bad_code.back() ^= 1;
  EXPECT_NE(message(bad_code).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(message("").find("truncated"), std::string::npos);
}

TEST(CacheEntryTest, BadMetadataBehindAValidChecksumIsRejected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {"[1,2]", "not a JSON object"},
      {"{}", "'target'"},
      {R"({"target":"sm_9x","lowered_names":{},"nvrtc_version":"","options":[],"params":{},)"
       R"("program_name":"","created_unix":1,"log":""})",
       "does not parse"},
      {R"({"target":"sm_90","lowered_names":{"a":1},"nvrtc_version":"","options":[],)"
       R"("params":{},"program_name":"","created_unix":1,"log":""})",
       "lowered_names"},
      {R"({"target":"sm_90","lowered_names":{},"nvrtc_version":"","options":"--x",)"
       R"("params":{},"program_name":"","created_unix":1,"log":""})",
       "options"},
      {R"({"target":"sm_90","lowered_names":{},"nvrtc_version":"","options":[],)"
       R"("params":{},"program_name":"","created_unix":1.5,"log":""})",
       "created_unix"},
      {R"({"target":"sm_90","lowered_names":{},"nvrtc_version":"","options":[],)"
       R"("params":{},"program_name":"","created_unix":18446744073709551615,"log":""})",
       "created_unix"},
      {R"({"target":"sm_90","lowered_names":{},"nvrtc_version":"","options":[],)"
       R"("params":{},"program_name":"","created_unix":1})",
       "'log'"},
      {"{\"target\":\"\xff\"}", "not valid JSON"},   // invalid UTF-8 in a string
      {std::string(100000, '['), "not valid JSON"},  // deep nesting must not blow the stack
  };
  for (const auto& [meta, reason] : cases) {
    absl::StatusOr<Binary> r = DecodeEntry(EntryWithMetadata(meta));
    ASSERT_FALSE(r.ok()) << meta.substr(0, 80);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(reason), absl::string_view::npos)
        << r.status() << " wanted " << reason;
  }
}

TEST(CacheEntryTest, EmptyCodeOrOversizedMetadataLengthIsRejected) {
  absl::StatusOr<Binary> no_code = DecodeEntry(EntryWithMetadata(kGoodMeta, ""));
  ASSERT_FALSE(no_code.ok());
  EXPECT_NE(no_code.status().message().find("empty"), absl::string_view::npos);

  std::string payload;
  PutU64(payload, ~uint64_t{0});  // metadata length that would overflow 8 + length
  payload += "{}";
  absl::StatusOr<Binary> huge = DecodeEntry(EntryWithPayload(payload));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("metadata length"), absl::string_view::npos);

  absl::StatusOr<Binary> short_payload = DecodeEntry(EntryWithPayload("abc"));
  ASSERT_FALSE(short_payload.ok());
  EXPECT_EQ(short_payload.status().code(), absl::StatusCode::kDataLoss);
}

TEST(CacheEntryTest, HeaderLengthsNearUint64MaxDoNotOverflow) {
  std::string e = EncodeEntry(MakeBinary());
  for (int i = 16; i < 24; ++i) e[i] = '\xff';
  absl::StatusOr<Binary> r = DecodeEntry(e);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), absl::string_view::npos);
}

TEST(CacheEntryTest, InvalidUtf8InMetadataIsReplacedNotThrown) {
  Binary b = MakeBinary();
  b.log = "bad byte \xff here";
  absl::StatusOr<Binary> back = DecodeEntry(EncodeEntry(b));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->log, "bad byte \xef\xbf\xbd here");  // U+FFFD
  EXPECT_EQ(back->code, b.code);
}

TEST(CacheEntryTest, RandomInputNeverThrowsOrPasses) {
  // A smoke fuzz: random blobs, and random edits of the metadata with the checksum recomputed so
  // the JSON and field checks see hostile input.
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 2000; ++i) {
    std::string blob(rng() % 200, '\0');
    for (char& c : blob) c = static_cast<char>(rng());
    if (i % 2 == 0 && blob.size() >= 8) blob.replace(0, 8, kCacheEntryMagic);
    EXPECT_FALSE(DecodeEntry(blob).ok());
  }
  const std::string meta = kGoodMeta;
  int accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string m = meta;
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      m[rng() % m.size()] = "{}[]\":,0a\\\xff"[rng() % 12];
    }
    absl::StatusOr<Binary> r = DecodeEntry(EntryWithMetadata(m));
    if (r.ok()) {
      ++accepted;  // an edit that kept the JSON valid and well typed (e.g. inside a string)
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    }
  }
  EXPECT_LT(accepted, 2000);
}

}  // namespace
}  // namespace kjit::jit
