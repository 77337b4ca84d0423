// Uses an installed kjit's C API the way a binding would: kjit::kjit_c (libkjit_c.so) and
// <kjit/kjit_c.h> only. A compile-only runtime builds the RMSNorm kernels for sm_90 and the program
// prints the build's JSON.
#include <cstdio>

#include <kjit/kjit_c.h>

int main() {
  if (kjit_abi_version() != KJIT_C_ABI_VERSION) {
    std::fprintf(stderr, "c_api: ABI %u, header %d\n", kjit_abi_version(), KJIT_C_ABI_VERSION);
    return 1;
  }
  kjit_runtime_options options;
  kjit_runtime_options_init(&options);
  options.target = "sm_90";
  options.compile_only = 1;
  kjit_rms_norm_spec spec;
  kjit_rms_norm_spec_init(&spec);
  spec.hidden = 4096;
  kjit_runtime* rt = nullptr;
  kjit_rms_norm* norm = nullptr;
  char* json = nullptr;
  if (kjit_runtime_create(&options, &rt) != KJIT_OK ||
      kjit_rms_norm_create(rt, &spec, &norm) != KJIT_OK ||
      kjit_rms_norm_build(norm, &json) != KJIT_OK) {
    std::fprintf(stderr, "c_api: %s\n", kjit_last_error());
    return 1;
  }
  std::printf("%s\n", json);
  kjit_free(json);
  kjit_rms_norm_destroy(norm);
  kjit_runtime_destroy(rt);
  return 0;
}
