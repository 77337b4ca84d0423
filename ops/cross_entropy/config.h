// Cross-entropy launch configs (kjit/cross_entropy.h, which declares their parser): what fits a
// vocab and GPU, their text form, and the heuristic that picks one without tuning.
//
//   CrossEntropyConfig c = DefaultCrossEntropyConfig(/*vocab=*/128256, /*vec=*/8, /*arch=*/90,
//                                                    /*elem_bytes=*/2);
//   // c.ToString() == "vec=8 threads=256 unroll=4 cluster=6 staged=1"
//   // ParseCrossEntropyConfig(c.ToString()) == c
#pragma once

#include <cstdint>
#include <string>

#include "kjit/cross_entropy.h"
#include "templates/cross_entropy_params.h"

namespace kjit {

namespace ops {

// Vectors of the row each thread of the fused op holds in registers (0 when it streams).
int64_t ResidentVectors(const CrossEntropyConfig& c, int64_t vocab);
// Whether those fit without spilling: the share's registers + kCeOtherRegisters
// (templates/cross_entropy_params.h) within a thread's 255, and times the threads within an SM's
// kCeRegistersPerSm.
bool ResidentFits(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes);
// Staged: the columns each block of the cluster stages (a multiple of vec; the kernel's
// CeStageLayout::kChunk), and the dynamic shared memory that takes.
int64_t StagedChunk(const CrossEntropyConfig& c, int64_t vocab);
int64_t StagedSharedBytes(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes);
// Why a staged config cannot run for this vocab and element size on GPUs of compute capability
// `arch`, or "" when it can.
std::string StagedUnfit(const CrossEntropyConfig& c, int64_t vocab, int elem_bytes, int arch);

// Four vector loads in flight per streaming thread, or fewer when a thread has fewer to read.
int StreamingUnroll(int64_t vocab, int vec, int threads);

// The widest vector an element size allows (16 bytes); the alignment of the actual pointers and
// strides may lower it. The vocab need not be a multiple: the rest of a row is read by scalars.
int MaxVecForCrossEntropy(int elem_bytes);

constexpr int kMaxRegistersPerThread = 255;
// Clusters of more than one block, and bulk copies, need this compute capability.
constexpr int kMinClusterArch = 90;
// The shared memory a block may opt in to on GPUs of compute capability `arch` (sm_90 and newer).
int MaxSharedBytesPerBlock(int arch);

// A sound default for elements of `elem_bytes` on a GPU of compute capability `arch` (e.g. 90):
// where the GPU has bulk copies and vectors are 16 bytes, the row staged in the shared memory of
// the smallest cluster (blocks of 256 threads) whose shares let an SM hold three blocks; else the
// row resident in at most 8 vectors per thread, in one block of up to 512 threads or a cluster of
// up to 8 such blocks where the GPU has clusters; otherwise streaming, with threads so that each
// walks about 32 vectors of a row (32 to 512, so that two blocks fit an SM) and four loads in
// flight.
CrossEntropyConfig DefaultCrossEntropyConfig(int64_t vocab, int vec, int arch, int elem_bytes);

}  // namespace ops
}  // namespace kjit
