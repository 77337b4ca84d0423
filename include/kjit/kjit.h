// kjit: JIT-specialized fused kernels for LLM fine-tuning. The one header users include; it needs
// no CUDA headers (CUstream is declared as cuda.h declares it).
//
//   #include <kjit/kjit.h>       // find_package(kjit) + kjit::kjit, or pkg-config kjit
//   auto rt = kjit::Runtime::Create();                       // absl::StatusOr<kjit::Runtime>
//   auto norm = rt->RmsNorm({.hidden = 4096, .dtype = kjit::DType::kBF16});
//   norm->Forward(stream, {.x = x, .weight = w, .y = y, .rstd = rstd});
#pragma once

#include "kjit/cross_entropy.h"
#include "kjit/device_buffer.h"
#include "kjit/device_info.h"
#include "kjit/dtype.h"
#include "kjit/host_convert.h"
#include "kjit/linear_cross_entropy.h"
#include "kjit/log_probs.h"
#include "kjit/loss_options.h"
#include "kjit/rms_norm.h"
#include "kjit/runtime.h"
#include "kjit/sharded_cross_entropy.h"
#include "kjit/status.h"
#include "kjit/stream.h"
#include "kjit/tensor.h"
#include "kjit/version.h"
