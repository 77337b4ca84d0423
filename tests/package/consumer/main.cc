// Uses an installed kjit the way a training job would, without a GPU and with nothing but the
// public header: a compile-only runtime builds the RMSNorm kernels for LLaMA 3.1 8B for sm_90 and
// prints where the binary lies. Linking kjit installs kjit-tune as the default tuner
// (KJIT_AUTOTUNE), through kjit's link interface or kjit.pc: without it the consumer fails.
#include <cstdio>

#include <kjit/kjit.h>

int main() {
  if (kjit::DefaultTuner() == nullptr) {
    std::fprintf(stderr, "consumer: no default tuner: KJIT_AUTOTUNE would launch untuned\n");
    return 1;
  }
  auto rt = kjit::Runtime::Create({.target = "sm_90", .compile_only = true});
  if (!rt.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(rt.status().message()).c_str());
    return 1;
  }
  auto norm = rt->RmsNorm({.hidden = 4096, .dtype = kjit::DType::kBF16, .eps = 1e-5f});
  if (!norm.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(norm.status().message()).c_str());
    return 1;
  }
  auto built = norm->Build();
  if (!built.ok()) {
    std::fprintf(stderr, "consumer: %s\n", std::string(built.status().message()).c_str());
    return 1;
  }
  std::printf("%s built %zu bytes for %s (%s)\n", kjit::VersionString().c_str(), built->bytes,
              built->target.c_str(), built->origin.c_str());
  return built->bytes > 0 ? 0 : 1;
}
