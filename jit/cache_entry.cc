#include "jit/cache_entry.h"

#include <xxhash.h>

#include <cstdint>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/cache_key.h"
#include "jit/json_text.h"

namespace kjit::jit {

namespace {

using nlohmann::json;

// Explicit byte order, so an entry means the same on every host that shares a cache.
void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
// Callers check that `at + N <= bytes.size()` first.
uint32_t GetU32(std::string_view bytes, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return v;
}
uint64_t GetU64(std::string_view bytes, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return v;
}

absl::Status Corrupt(std::string_view reason) {
  return absl::DataLossError(fmt::format("corrupt cache entry: {}", reason));
}

// The metadata accessors check types first: nlohmann's get<>() throws on a mismatch.
std::optional<std::string> GetString(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_string()) return std::nullopt;
  return it->get_ref<const std::string&>();
}

std::optional<std::map<std::string, std::string>> GetStringMap(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_object()) return std::nullopt;
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) return std::nullopt;
    out.emplace(k, v.get_ref<const std::string&>());
  }
  return out;
}

std::optional<std::vector<std::string>> GetStringList(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || !it->is_array()) return std::nullopt;
  std::vector<std::string> out;
  for (const json& v : *it) {
    if (!v.is_string()) return std::nullopt;
    out.push_back(v.get_ref<const std::string&>());
  }
  return out;
}

std::optional<int64_t> GetInt64(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end()) return std::nullopt;
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  return std::nullopt;
}

absl::StatusOr<Binary> DecodeMetadata(std::string_view text) {
  json meta = json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded()) return Corrupt("metadata is not valid JSON");
  if (!meta.is_object()) return Corrupt("metadata is not a JSON object");

  Binary b;
  auto target = GetString(meta, "target");
  if (!target) return Corrupt("metadata field 'target' is missing or not a string");
  absl::StatusOr<Target> parsed = ParseTarget(*target);
  if (!parsed.ok()) return Corrupt(fmt::format("metadata target '{}' does not parse", *target));
  b.target = *parsed;

  auto lowered = GetStringMap(meta, "lowered_names");
  auto params = GetStringMap(meta, "params");
  auto options = GetStringList(meta, "options");
  auto nvrtc_version = GetString(meta, "nvrtc_version");
  auto program_name = GetString(meta, "program_name");
  auto log = GetString(meta, "log");
  auto created = GetInt64(meta, "created_unix");
  auto key = GetString(meta, "key");
  if (!lowered) return Corrupt("metadata field 'lowered_names' is not an object of strings");
  if (!params) return Corrupt("metadata field 'params' is not an object of strings");
  if (!options) return Corrupt("metadata field 'options' is not an array of strings");
  if (!nvrtc_version) return Corrupt("metadata field 'nvrtc_version' is missing or not a string");
  if (!program_name) return Corrupt("metadata field 'program_name' is missing or not a string");
  if (!log) return Corrupt("metadata field 'log' is missing or not a string");
  if (!created) return Corrupt("metadata field 'created_unix' is missing or not an int64");
  if (!key) return Corrupt("metadata field 'key' is missing or not a string");
  b.lowered_names = std::move(*lowered);
  b.params = std::move(*params);
  b.options = std::move(*options);
  b.nvrtc_version = std::move(*nvrtc_version);
  b.program_name = std::move(*program_name);
  b.log = std::move(*log);
  b.created_unix = *created;
  b.key = std::move(*key);
  return b;
}

absl::StatusOr<Binary> Decode(std::string_view bytes) {
  if (bytes.size() < kCacheEntryHeaderSize) {
    return Corrupt(fmt::format("truncated: {} bytes is shorter than the {}-byte header",
                               bytes.size(), kCacheEntryHeaderSize));
  }
  if (bytes.substr(0, kCacheEntryMagic.size()) != kCacheEntryMagic) {
    return Corrupt("bad magic (not a kjit cache entry)");
  }
  uint32_t version = GetU32(bytes, 8);
  if (version != static_cast<uint32_t>(kCacheFormatVersion)) {
    return Corrupt(
        fmt::format("format version {}, this kjit reads version {}", version, kCacheFormatVersion));
  }
  if (uint32_t reserved = GetU32(bytes, 12); reserved != 0) {
    return Corrupt(fmt::format("reserved header field is {:#x}, expected 0", reserved));
  }
  const uint64_t payload_size = GetU64(bytes, 16);
  const uint64_t actual_payload = bytes.size() - kCacheEntryHeaderSize;
  if (payload_size != actual_payload) {
    // Compare payload sizes, not header+payload, so a huge header value cannot overflow.
    if (payload_size > actual_payload) {
      return Corrupt(fmt::format("truncated: header says {} payload bytes, file has {}",
                                 payload_size, actual_payload));
    }
    return Corrupt(fmt::format("trailing bytes: header says {} payload bytes, file has {}",
                               payload_size, actual_payload));
  }
  std::string_view payload = bytes.substr(kCacheEntryHeaderSize);
  const uint64_t checksum = GetU64(bytes, 24);
  if (uint64_t actual = XXH3_64bits(payload.data(), payload.size()); actual != checksum) {
    return Corrupt(
        fmt::format("checksum mismatch (header {:016x}, payload {:016x})", checksum, actual));
  }
  if (payload.size() < 8) return Corrupt("payload is shorter than its metadata length field");
  const uint64_t meta_size = GetU64(payload, 0);
  if (meta_size > payload.size() - 8) {
    return Corrupt(
        fmt::format("metadata length {} exceeds the {}-byte payload", meta_size, payload.size()));
  }
  KJIT_ASSIGN_OR_RETURN(Binary b, DecodeMetadata(payload.substr(8, meta_size)));
  std::string_view code = payload.substr(8 + meta_size);
  if (code.empty()) return Corrupt("the binary code is empty");
  b.code.assign(code);
  return b;
}

}  // namespace

std::string EncodeEntry(const Binary& binary, std::string_view key) {
  json meta = {
      {"target", binary.target.ToString()},
      {"lowered_names", binary.lowered_names},
      {"nvrtc_version", binary.nvrtc_version},
      {"options", binary.options},
      {"params", binary.params},
      {"program_name", binary.program_name},
      {"created_unix", binary.created_unix},
      {"log", binary.log},
      {"key", key},
  };
  // JsonText replaces invalid UTF-8 instead of throwing (an odd byte in an NVRTC log must not lose
  // the entry, and exceptions must not cross the API).
  const std::string meta_text = JsonText(meta);

  // Built in place (the code can be tens of MB): header with the checksum left 0, then the
  // payload, then the checksum patched in.
  std::string out;
  out.reserve(kCacheEntryHeaderSize + 8 + meta_text.size() + binary.code.size());
  out += kCacheEntryMagic;
  PutU32(out, static_cast<uint32_t>(kCacheFormatVersion));
  PutU32(out, 0);  // reserved
  PutU64(out, 8 + meta_text.size() + binary.code.size());
  PutU64(out, 0);  // checksum, below
  PutU64(out, meta_text.size());
  out += meta_text;
  out += binary.code;
  std::string checksum;
  PutU64(checksum,
         XXH3_64bits(out.data() + kCacheEntryHeaderSize, out.size() - kCacheEntryHeaderSize));
  out.replace(24, 8, checksum);
  return out;
}

std::string EncodeEntry(const Binary& binary) { return EncodeEntry(binary, binary.key); }

absl::StatusOr<Binary> DecodeEntry(std::string_view bytes) {
  // The checks above are meant to make this unreachable; the catch keeps a missed nlohmann or
  // allocation exception from crossing the API on hostile input.
  try {
    return Decode(bytes);
  } catch (const std::exception& e) {
    return Corrupt(fmt::format("unreadable: {}", e.what()));
  } catch (...) {
    return Corrupt("unreadable");
  }
}

absl::StatusOr<Binary> DecodeEntryFor(std::string_view bytes, std::string_view key) {
  KJIT_ASSIGN_OR_RETURN(Binary b, DecodeEntry(bytes));
  if (b.key != key) {
    return Corrupt(fmt::format(
        "it was written for key '{}', not {} (an entry copied or renamed onto another key's file)",
        b.key, key));
  }
  return b;
}

}  // namespace kjit::jit
