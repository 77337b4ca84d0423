// The fused linear + cross-entropy op's schedule: its text form (as the tuning database stores
// it), its validity, and the heuristic used without tuning. No GPU needed.
//
//   KJIT_ASSIGN_OR_RETURN(LinearCrossEntropyConfig c, ParseLinearCrossEntropyConfig(
//       "chunk=1024 streams=2 logits_algo=0 d_hidden_algo=1 d_weight_algo=0"));
//   DefaultLinearCrossEntropyConfig(spec);   // chunk=1024 for vocab 128256 in bf16
#pragma once

#include <cstdint>
#include <string_view>

#include "kjit/linear_cross_entropy.h"

namespace kjit::ops {

// The chunk's logits buffers the heuristic aims at: big GEMMs, a fraction of an 80 GB GPU.
inline constexpr int64_t kLinearCrossEntropyChunkBudgetBytes = int64_t{256} << 20;
inline constexpr int64_t kMaxLinearCrossEntropyChunkRows = 65536;

absl::StatusOr<LinearCrossEntropyConfig> ParseLinearCrossEntropyConfig(std::string_view text);
// InvalidArgument naming the config field that is out of range.
absl::Status ValidateLinearCrossEntropyConfig(const LinearCrossEntropyConfig& c);
// One stream, cuBLASLt's first choices, and the most rows (a multiple of 128, at least 128) whose
// logits fit kLinearCrossEntropyChunkBudgetBytes.
LinearCrossEntropyConfig DefaultLinearCrossEntropyConfig(const LinearCrossEntropySpec& spec);
// Elements between a chunk buffer's rows: vocab rounded up to whole 16-byte vectors, so that the
// loss kernel reads the widest vectors whatever the vocab.
int64_t ChunkRowStride(int64_t vocab, DType dtype);

}  // namespace kjit::ops
