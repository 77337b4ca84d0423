// Kernel arguments of the RL heads' kernels (log_probs.cuh), shared verbatim by the host
// (ops/log_probs/log_probs.cc) and the device so that they cannot drift. Strides are in elements.
//
//   kjit::LogProbsParams p{...};
//   void* args[] = {&p};
//   cuLaunchKernel(fn, rows, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
#pragma once

namespace kjit {

// One block per row. The forward reads logits and targets and writes logprob, entropy (when the
// kernel computes it) and lse (when not null); the backward reads logits, targets, lse_in, and the
// upstream gradients that are not null (entropy_in with grad_entropy), and writes grad.
struct LogProbsParams {
  const void* logits;  // [rows, vocab]
  long long logits_stride;
  const void* targets;  // [rows], int32 or int64
  long long rows;
  long long ignore_index;
  float inv_temperature;       // 1 / T, applied to each logit as it is read
  float* logprob;              // forward: [rows], z_t / T - lse; 0 for an ignored row
  float* entropy;              // forward: [rows], H(softmax(z / T)); 0 for an ignored row
  float* lse;                  // forward: [rows] or null, lse(z / T)
  const float* lse_in;         // backward: [rows], the forward's lse
  const float* entropy_in;     // backward: [rows], the forward's entropy (with grad_entropy)
  const float* grad_logprob;   // backward: [rows] or null (no log-prob term)
  const float* grad_entropy;   // backward: [rows] or null (no entropy term)
  void* grad;                  // backward: [rows, vocab]; may be logits itself (in place)
  long long grad_stride;
};

}  // namespace kjit
