// Kernel arguments of the cross-entropy kernels and the layout of the caller's workspace, shared
// verbatim by the host (ops/cross_entropy/cross_entropy.cc) and the device (cross_entropy.cuh) so
// that they cannot drift. Plain C++ both compilers read. Strides are in elements.
//
//   kjit::CrossEntropyRowParams p{...};
//   void* args[] = {&p};
//   cuLaunchKernel(fn, rows, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
//   // later, in stream order: the first 8 bytes of the workspace are a CrossEntropyCounters
#pragma once

namespace kjit {

enum CrossEntropyReduction { kCeNone = 0, kCeSum = 1, kCeMean = 2 };

// The fused op's resident layout (cross_entropy_resident): a thread holds its share of the row in
// registers plus about kCeOtherRegisters more (measured: about 30), and an SM has
// kCeRegistersPerSm. The host prunes configs with these; the kernel derives its launch bounds.
constexpr int kCeOtherRegisters = 32;
constexpr int kCeRegistersPerSm = 65536;

// The workspace starts with these counters. The count kernel, the first of every launch sequence,
// rewrites them from the targets alone, so after the op they describe its last launch.
struct CrossEntropyCounters {
  unsigned int valid_rows;         // targets in [0, vocab) other than ignore_index
  unsigned int out_of_range_rows;  // neither ignore_index nor in [0, vocab): treated as ignored
  float mean_divisor;              // valid_rows, or with class weights the valid rows' weights summed
  float class_weight_total;        // with class weights and label smoothing: all vocab weights summed
};

// Reductions sum and mean keep one fp32 loss per row in the workspace from this byte offset on.
constexpr long long kCrossEntropyRowLossOffset = 16;

struct CrossEntropyCountParams {
  const void* targets;       // [rows], int32 or int64
  long long rows;
  long long ignore_index;
  const void* class_weight;  // [vocab] when the op has class weights
  CrossEntropyCounters* counters;
};

// One block per row. The forward kernel reads logits, targets and (with a gradient) grad_output and
// counters; the backward kernel reads lse_in instead of computing it.
struct CrossEntropyRowParams {
  const void* logits;
  long long logits_stride;
  const void* targets;
  long long rows;
  long long ignore_index;
  float label_smoothing;                 // epsilon, when kSmoothing
  float z_loss;                          // z-loss coefficient, when kZLoss
  float softcap;                         // cap, when kSoftcap
  float* row_loss;                       // [rows]: the loss output (none) or the workspace's losses
  float* lse;                            // [rows] or null
  void* argmax;                          // [rows] in the target type, when kArgmax
  const float* lse_in;                   // backward from a saved lse: [rows]
  const float* grad_output;              // null (1), [1] (sum, mean) or [rows] (none)
  const CrossEntropyCounters* counters;  // valid_rows divides the mean's gradient
  void* grad;                            // [rows, vocab]; may be logits itself (in place)
  long long grad_stride;
  const void* class_weight;              // [vocab] (the whole vocab) when the op has class weights
  long long class_weight_offset;         // the class of the first column (a vocab shard's start)
  float* entropy;                        // [rows], when kEntropy: the softmax's entropy
  float* target_logprob;                 // [rows] or null: x_t - lse, 0 for an ignored row
};

// CrossEntropy::RescaleGradient: block b rescales tile t = b % tiles of row b / tiles, the
// vectors [t * tile_vectors, (t + 1) * tile_vectors) of the row's whole vectors, and the last tile
// the scalar tail after them too.
struct CrossEntropyRescaleParams {
  void* grad;                // [rows, vocab], rewritten in place
  long long grad_stride;
  const float* grad_output;  // [1] or [rows]: g
  const float* applied;      // grad_output's shape, or null (1): a
  int per_row;               // 1: one g (and a) per row; 0: one for every row
  int tiles;                 // blocks per row
  int tile_vectors;          // vectors per block, a multiple of the block's threads
};

struct CrossEntropyReduceParams {
  const float* row_loss;  // [rows]
  long long rows;
  const CrossEntropyCounters* counters;
  float* loss;            // [1]
};

}  // namespace kjit
