// kjit: JIT-specialized fused kernels for LLM fine-tuning. The one header users include.
//
//   #include "runtime/kjit.h"      // installed as <prefix>/include/kjit/runtime/kjit.h
//   auto rt = kjit::Runtime::Create();                       // absl::StatusOr<kjit::Runtime>
//   auto norm = rt->RmsNorm({.hidden = 4096, .dtype = kjit::DType::kBF16});
//   norm->Forward(stream, {.x = x, .weight = w, .y = y, .rstd = rstd});
#pragma once

#include "jit/dtype.h"
#include "jit/status.h"
#include "runtime/cross_entropy.h"
#include "runtime/rms_norm.h"
#include "runtime/runtime.h"
#include "runtime/sharded_cross_entropy.h"
#include "runtime/tensor.h"
#include "runtime/version.h"
