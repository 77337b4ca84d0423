// The fused linear + cross-entropy op's schedule: its validity and the heuristic used without
// tuning (its text form and parser are public, kjit/linear_cross_entropy.h). No GPU needed.
//
//   LinearCrossEntropyConfig c = DefaultLinearCrossEntropyConfig(spec);
//   // c.ToString() starts "chunk=1920 whole=10112" at LLaMA 3's lm_head, bf16
//   c.streams = 3;
//   ValidateLinearCrossEntropyConfig(c);   // InvalidArgument "config.streams: 3 must be 1 ..."
#pragma once

#include <cstdint>

#include "kjit/linear_cross_entropy.h"

namespace kjit::ops {

// The chunks' logits buffers: 0.5 GiB less cuBLASLt's 32 MiB and 1 MiB for the counters and
// per-row losses, so that the workspace beyond the fp32 accumulator stays under 0.5 GiB. Larger
// chunks run faster (fewer passes over the fp32 accumulator: at LLaMA 3's shape and 8192 rows 43.7
// ms at 1024 rows per chunk, 40.2 at 2048, 39.5 at 4096 on the H200), so the heuristic fills the
// budget.
inline constexpr int64_t kLinearCrossEntropyChunkBudgetBytes = int64_t{479} << 20;
inline constexpr int64_t kMaxLinearCrossEntropyChunkRows = 65536;

// InvalidArgument naming the config field that is out of range.
absl::Status ValidateLinearCrossEntropyConfig(const LinearCrossEntropyConfig& c);
// One stream, cuBLASLt's first choices, and the most rows (a multiple of 128, at least 128) whose
// logits fit kLinearCrossEntropyChunkBudgetBytes; with an fp32 accumulator (fp32 accumulation of a
// bf16 or fp16 d_weight), whole_rows: the most rows whose logits fit that budget and the
// accumulator's bytes together.
LinearCrossEntropyConfig DefaultLinearCrossEntropyConfig(const LinearCrossEntropySpec& spec);
// Elements between a chunk buffer's rows: vocab rounded up to whole 16-byte vectors, so that the
// loss kernel reads the widest vectors whatever the vocab.
int64_t ChunkRowStride(int64_t vocab, DType dtype);

}  // namespace kjit::ops
