// The bytes of one disk-cache entry: a Binary with a header that lets a reader prove the file is
// whole and ours before anything in it is trusted (a torn or flipped CUBIN would run on the GPU).
//
//   offset  size  field (little-endian)
//        0     8  magic "KJITCACH"
//        8     4  format version (kCacheFormatVersion)
//       12     4  reserved, 0
//       16     8  payload length (the file is exactly 32 + this many bytes)
//       24     8  XXH3-64 of the payload
//       32        payload: u64 metadata length, metadata JSON, then the code bytes
//
// The metadata holds the key the entry was written under, inside the checksum: a whole, valid
// entry copied or renamed onto another key's file (another shape's kernel) is caught by
// DecodeEntryFor, as the checksum alone cannot.
//
//   std::string bytes = EncodeEntry(binary, key);
//   KJIT_ASSIGN_OR_RETURN(Binary back, DecodeEntryFor(bytes, key));  // DataLoss: "checksum ..."
//
// DecodeEntry accepts any bytes: every size is checked before it is used, nothing throws, and
// anything short of a complete, checksummed, well-typed entry with a parsable target and non-empty
// code is DataLoss with the reason. Metadata strings should be UTF-8 (JSON); invalid bytes are
// stored as U+FFFD rather than failing the write.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "jit/binary.h"
#include "kjit/status.h"

namespace kjit::jit {

inline constexpr std::string_view kCacheEntryMagic = "KJITCACH";
inline constexpr size_t kCacheEntryHeaderSize = 32;

// The entry of `binary` stored under `key`; the one-argument form records binary.key.
std::string EncodeEntry(const Binary& binary, std::string_view key);
std::string EncodeEntry(const Binary& binary);
// Any well-formed entry; the Binary's key is the one it records.
absl::StatusOr<Binary> DecodeEntry(std::string_view bytes);
// DecodeEntry, and DataLoss unless the entry records `key`: what a reader of the file named by
// `key` must use.
absl::StatusOr<Binary> DecodeEntryFor(std::string_view bytes, std::string_view key);

}  // namespace kjit::jit
