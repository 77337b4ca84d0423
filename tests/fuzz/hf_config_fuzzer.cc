// libFuzzer target for ParseHfConfig (autotune/model_config.h): `kjit-tune --config` reads a
// config.json from wherever the user points it.
//
// Invariants: success or InvalidArgument only; a parsed config has positive sizes and finite,
// non-negative eps and soft-cap.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "autotune/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kjit::autotune::ModelConfig> m = kjit::autotune::ParseHfConfig(text, "fuzz.json");
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (m->hidden_size <= 0 || m->vocab_size <= 0) std::abort();
  if (!std::isfinite(m->rms_norm_eps) || m->rms_norm_eps < 0) std::abort();
  if (!std::isfinite(m->final_logit_softcapping) || m->final_logit_softcapping < 0) std::abort();
  return 0;
}
