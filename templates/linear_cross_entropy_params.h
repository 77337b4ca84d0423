// Kernel arguments of the fused linear + cross-entropy op's own kernels, shared verbatim by the
// host (ops/linear_cross_entropy/linear_cross_entropy.cc) and the device
// (linear_cross_entropy.cuh). Plain C++ both compilers read. Strides are in elements.
//
//   kjit::LinearCrossEntropyScaleParams p{counters, grad_output, scale};
//   void* args[] = {&p};
//   cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
#pragma once

#include "cross_entropy_params.h"

namespace kjit {

// The upstream gradient each chunk's sum-reduced loss applies: grad_output[0] (1 when null),
// divided by the whole batch's valid rows for the mean, one IEEE division as the unfused mean's.
struct LinearCrossEntropyScaleParams {
  const CrossEntropyCounters* counters;
  const float* grad_output;  // [1] or null
  float* scale;              // [1]
};

// x = round(x * (g / a)) over a [rows, cols] matrix, g = grad_output[0], a = applied[0] (1 when
// null); nothing when g == a.
struct LinearCrossEntropyRescaleParams {
  const float* grad_output;  // [1]
  const float* applied;      // [1] or null
  void* x;
  long long rows;
  long long cols;
  long long stride;
};

// out = round(acc (+ out when accumulating)) over a [rows, cols] matrix; acc is contiguous.
struct LinearCrossEntropyStoreParams {
  const float* acc;
  void* out;
  long long rows;
  long long cols;
  long long out_stride;
};

}  // namespace kjit
