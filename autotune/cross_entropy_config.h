// Launch configurations of the cross-entropy kernels, the heuristic that picks one without tuning,
// and the loss reduction shared by the op (runtime/cross_entropy.h) and its reference.
//
// One block handles one row: `threads` threads stream it in vectors of `vec` elements (16 bytes at
// most), each thread issuing `unroll` vector loads before it uses them.
//
//   CrossEntropyConfig c = DefaultCrossEntropyConfig(/*vocab=*/128256, /*vec=*/8);
//   // c.ToString() == "vec=8 threads=512 unroll=4"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kjit {

// How per-row losses become the loss output: kept per row, summed, or averaged over the rows whose
// target is not ignored.
enum class Reduction { kNone, kSum, kMean };
const char* Name(Reduction r);  // "none", "sum", "mean"

namespace autotune {

struct CrossEntropyConfig {
  int vec = 1;        // elements per vector access; a power of two, at most 16 bytes
  int threads = 256;  // per row (one row per block): a multiple of 32, at most 1024
  int unroll = 4;     // vector loads in flight per thread: 1, 2, 4 or 8
  std::string ToString() const;  // "vec=8 threads=1024 unroll=4"
  bool operator==(const CrossEntropyConfig&) const = default;
};

// The widest vector an element size allows (16 bytes); the alignment of the actual pointers and
// strides may lower it. The vocab need not be a multiple: the rest of a row is read by scalars.
int MaxVecForCrossEntropy(int elem_bytes);

// A sound default: threads so that each walks about 32 vectors of a row (32 to 512, so that two
// blocks fit an SM), and four loads in flight when the row is long enough.
CrossEntropyConfig DefaultCrossEntropyConfig(int64_t vocab, int vec);

// Every config worth timing for a vocab and vector width: 128 to 1024 threads, unroll 1 to 8, where
// each thread walks at least one full unroll batch and at most 256 vectors.
std::vector<CrossEntropyConfig> CrossEntropyConfigCandidates(int64_t vocab, int vec);

}  // namespace autotune
}  // namespace kjit
