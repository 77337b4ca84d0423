#include "runtime/tuning.h"

#include <fmt/format.h>

#include "jit/nvrtc.h"
#include "runtime/runtime.h"
#include "runtime/runtime_state.h"

namespace kjit {

std::string TuningOp(const RmsNormSpec& spec) {
  return spec.fused_residual ? "rms_norm+residual" : "rms_norm";
}
std::string TuningOp(const CrossEntropySpec&) { return "cross_entropy"; }

std::string TuningShape(const RmsNormSpec& spec) {
  std::string s = fmt::format("hidden={}", spec.hidden);
  if (spec.casting == RmsNormCasting::kGemma) s += " gemma";
  if (spec.weight_dtype && *spec.weight_dtype != spec.dtype) {
    s += fmt::format(" weight={}", Name(*spec.weight_dtype));
  }
  return s;
}

std::string TuningShape(const CrossEntropySpec& spec) {
  std::string s = fmt::format("vocab={}", spec.vocab);
  if (spec.softcap > 0) s += " softcap";
  if (spec.label_smoothing > 0) s += " smoothing";
  if (spec.lse_square_scale > 0) s += " z_loss";
  if (spec.argmax) s += " argmax";
  return s;
}

namespace internal {

autotune::TuningKey TuningKeyFor(const RuntimeState& rt, const std::string& op,
                                 const std::string& shape, DType dtype, int64_t rows) {
  autotune::TuningKey k{.op = op, .dtype = Name(dtype), .shape = shape,
                        .rows_bucket = autotune::RowsBucket(rows)};
  if (rt.compile_only) return k;
  k.device = rt.device.name;
  k.arch = rt.target.arch;
  k.driver = rt.driver->version();
  if (auto nvrtc = jit::Nvrtc::Get(); nvrtc.ok()) {
    k.nvrtc = (*nvrtc)->version().major * 1000 + (*nvrtc)->version().minor * 10;
  }
  return k;
}

}  // namespace internal

autotune::TuningKey TuningKeyFor(const Runtime& rt, const RmsNormSpec& spec, int64_t rows) {
  return internal::TuningKeyFor(rt.state(), TuningOp(spec), TuningShape(spec), spec.dtype, rows);
}
autotune::TuningKey TuningKeyFor(const Runtime& rt, const CrossEntropySpec& spec, int64_t rows) {
  return internal::TuningKeyFor(rt.state(), TuningOp(spec), TuningShape(spec), spec.dtype, rows);
}

}  // namespace kjit
