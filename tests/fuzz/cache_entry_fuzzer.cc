// libFuzzer target for the disk-cache entry reader (jit/cache_entry.h DecodeEntry), which reads
// bytes anyone with write access to the cache directory could have planted.
//
// Each input is decoded twice: as a whole entry (header, checksum, payload), and as a payload
// wrapped in a valid header with a correct checksum, so mutations reach the metadata JSON and the
// length fields behind the checksum instead of dying on it. Invariant: whatever decodes re-encodes
// to an entry that decodes to the same Binary, and re-encoding that is a fixpoint.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "jit/cache_entry.h"
#include "jit/cache_key.h"

namespace {

using kjit::jit::Binary;

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string WrapPayload(std::string_view payload) {
  std::string out(kjit::jit::kCacheEntryMagic);
  const uint32_t version = static_cast<uint32_t>(kjit::jit::kCacheFormatVersion);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((version >> (8 * i)) & 0xff));
  out.append(4, '\0');  // reserved
  PutU64(out, payload.size());
  PutU64(out, XXH3_64bits(payload.data(), payload.size()));
  out += payload;
  return out;
}

bool Same(const Binary& a, const Binary& b) {
  return a.target == b.target && a.code == b.code && a.lowered_names == b.lowered_names &&
         a.nvrtc_version == b.nvrtc_version && a.options == b.options && a.params == b.params &&
         a.program_name == b.program_name && a.created_unix == b.created_unix && a.log == b.log;
}

void Check(std::string_view bytes) {
  absl::StatusOr<Binary> b = kjit::jit::DecodeEntry(bytes);
  if (!b.ok()) {
    if (b.status().code() != absl::StatusCode::kDataLoss)
      std::abort();  // only DataLoss is documented
    return;
  }
  if (b->code.empty()) std::abort();
  const std::string again = kjit::jit::EncodeEntry(*b);
  absl::StatusOr<Binary> back = kjit::jit::DecodeEntry(again);
  if (!back.ok() || !Same(*b, *back)) std::abort();
  if (kjit::jit::EncodeEntry(*back) != again) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  Check(WrapPayload(bytes));
  return 0;
}
