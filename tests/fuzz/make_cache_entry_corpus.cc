// Writes the seed corpus for cache_entry_fuzzer: whole entries made by EncodeEntry (CUBIN- and
// PTX-like, with and without optional metadata), truncations of one, and a bare metadata payload
// (which the fuzzer also tries wrapped in a valid header).
//
//   make_cache_entry_corpus tests/fuzz/corpus/cache_entry
#include <cstdio>
#include <fstream>
#include <string>

#include "jit/cache_entry.h"

namespace {

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  using kjit::jit::Binary;
  using kjit::jit::Target;

  Binary cubin;
  cubin.target = Target{Target::Kind::kCubin, 90, true};
  cubin.code = std::string(
                   "\x7f"
                   "ELF\x02\x01\x01\x33",
                   8) +
               std::string(24, '\0');
  cubin.lowered_names = {{"kjit::rms_norm_forward<kjit::bf16, 4096>", "_Z12rms_norm_fwdv"}};
  cubin.nvrtc_version = "13.0";
  cubin.options = {"--gpu-architecture=sm_90a", "--std=c++17"};
  cubin.params = {{"hidden", "4096"}, {"dtype", "bf16"}};
  cubin.program_name = "rms_norm";
  cubin.created_unix = 1'790'000'000;
  cubin.log = "warning: \"quoted\"\n";
  const std::string full = kjit::jit::EncodeEntry(cubin);
  Write(dir, "cubin_sm90a", full);

  Binary ptx;
  ptx.target = Target{Target::Kind::kPtx, 100, false};
  ptx.code = ".version 8.7\n.target sm_100\n.address_size 64\n";
  ptx.nvrtc_version = "12.8";
  ptx.program_name = "cross_entropy";
  ptx.created_unix = -1;
  Write(dir, "ptx_compute100_minimal", kjit::jit::EncodeEntry(ptx));

  Write(dir, "truncated_header", full.substr(0, 20));
  Write(dir, "truncated_payload", full.substr(0, full.size() / 2));
  Write(dir, "header_only", full.substr(0, kjit::jit::kCacheEntryHeaderSize));
  // The payload alone: the fuzzer wraps it in a header with a correct checksum.
  Write(dir, "payload_only", full.substr(kjit::jit::kCacheEntryHeaderSize));
  return 0;
}
