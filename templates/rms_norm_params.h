// Kernel arguments of the RMSNorm kernels, shared verbatim by the host (ops/rms_norm/rms_norm.cc)
// and the device (rms_norm.cuh) so that the layout cannot drift. Plain C: NVRTC and the host
// compiler both read it. Strides are in elements; the host checks every pointer and stride before
// a launch.
//
//   kjit::RmsNormForwardParams p{...};
//   void* args[] = {&p};
//   cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, args, nullptr);
#pragma once

namespace kjit {

struct RmsNormForwardParams {
  const void* x;
  long long x_stride;
  const void* residual;      // null unless the residual add is fused
  long long residual_stride;
  void* residual_out;        // x + residual, the next layer's residual (may alias residual)
  long long residual_out_stride;
  const void* weight;
  void* y;
  long long y_stride;
  float* rstd;               // [rows], fp32, for backward
  long long rows;
  float eps;
  float weight_offset;       // 0, or 1 for Gemma's (1 + w)
};

struct RmsNormBackwardParams {
  const void* dy;
  long long dy_stride;
  const void* x;             // the normalized input: x, or residual_out when the add was fused
  long long x_stride;
  const void* weight;
  const float* rstd;
  const void* dresidual;     // null, or the gradient reaching residual_out, added to dx
  long long dresidual_stride;
  void* dx;                  // may alias dy (in place)
  long long dx_stride;
  float* dw_partial;         // [partial_rows][hidden] fp32 workspace, one row per row group
  long long rows;
  float weight_offset;
};

struct RmsNormDwReduceParams {
  const float* dw_partial;   // [partial_rows][hidden]
  long long partial_rows;
  void* dw;                  // [hidden], in the weight's dtype
};

}  // namespace kjit
