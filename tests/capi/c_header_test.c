/* kjit's C API from a C11 program built with -Wall -Wextra -Werror -pedantic: the header compiles
 * as C, the library links from C, and what needs no GPU answers as documented; exits non-zero
 * naming each wrong value.
 *
 *   kjit_c_header_test                  the checks below (ctest: capi_c_header)
 *   kjit_c_header_test runtime_create   kjit_runtime_create(NULL, ...): prints "<STATUS>:
 * <message>" and exits with the status (tests/capi/capi_test.cc runs it with a missing and with the
 * stub driver) */
#include <kjit/kjit_c.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

static int runtime_create(void) {
  kjit_runtime* rt = NULL;
  kjit_status status = kjit_runtime_create(NULL, &rt);
  printf("%s: %s\n", kjit_status_name(status), kjit_last_error());
  kjit_runtime_destroy(rt);
  return (int)status;
}

int main(int argc, char** argv) {
  kjit_runtime_options options;
  kjit_rms_norm_spec norm;
  kjit_rms_norm_forward_args forward;
  kjit_cross_entropy_spec ce;
  kjit_cross_entropy_args args;
  kjit_linear_cross_entropy_spec lce;
  kjit_linear_cross_entropy_args lce_args;
  kjit_linear_cross_entropy* lce_op = NULL;
  kjit_rms_norm* op = NULL;
  kjit_sharded_cross_entropy_spec sharded;
  kjit_sharded_cross_entropy_args sharded_args;
  kjit_sharded_cross_entropy* sharded_op = NULL;
  float* stats_max = NULL;
  float* stats_sums = NULL;

  if (argc == 2 && strcmp(argv[1], "runtime_create") == 0) return runtime_create();

  check(kjit_abi_version() == KJIT_C_ABI_VERSION, "kjit_abi_version() == KJIT_C_ABI_VERSION");
  check(strcmp(kjit_version(), KJIT_EXPECTED_VERSION) == 0, "kjit_version() is the project's");
  check(strcmp(kjit_status_name(KJIT_OK), "OK") == 0, "kjit_status_name(KJIT_OK)");
  check(strcmp(kjit_status_name(KJIT_UNAVAILABLE), "UNAVAILABLE") == 0,
        "kjit_status_name(KJIT_UNAVAILABLE)");
  check(strcmp(kjit_last_error(), "") == 0, "no error before any call failed");

  kjit_runtime_options_init(&options);
  check(options.struct_size == sizeof options, "options.struct_size");
  check(options.device == 0 && options.target == NULL && options.compile_only == 0 &&
            options.disk_cache == 1 && options.warning == NULL,
        "kjit_runtime_options_init's defaults");

  kjit_rms_norm_spec_init(&norm);
  check(norm.struct_size == sizeof norm, "norm.struct_size");
  check(norm.dtype == KJIT_BF16 && norm.weight_dtype == -1 && norm.eps == 1e-6f &&
            norm.casting == KJIT_CASTING_LLAMA && norm.config == NULL,
        "kjit_rms_norm_spec_init's defaults");

  kjit_rms_norm_forward_args_init(&forward);
  check(forward.struct_size == sizeof forward && forward.x.data == NULL, "forward args init");

  kjit_cross_entropy_spec_init(&ce);
  check(ce.struct_size == sizeof ce, "ce.struct_size");
  check(ce.dtype == KJIT_BF16 && ce.loss.target_type == KJIT_INT64 && ce.loss.ignore_index == -100 &&
            ce.loss.reduction == KJIT_REDUCTION_MEAN && ce.loss.argmax == 0 && ce.loss.class_weight_dtype == -1,
        "kjit_cross_entropy_spec_init's defaults");

  kjit_cross_entropy_args_init(&args);
  check(args.struct_size == sizeof args && args.workspace == NULL && args.class_weight.data == NULL,
        "cross-entropy args init");
  /* The header's example: a view as a compound literal. */
  args.logits = (kjit_tensor){NULL, KJIT_BF16, 2, 128256, 128256};
  check(args.logits.cols == 128256, "a kjit_tensor compound literal");

  kjit_linear_cross_entropy_spec_init(&lce);
  check(lce.struct_size == sizeof lce, "lce.struct_size");
  check(lce.dtype == KJIT_BF16 && lce.weight_grad_dtype == -1 && lce.bias == 0 &&
            lce.loss.target_type == KJIT_INT64 && lce.loss.ignore_index == -100 &&
            lce.loss.reduction == KJIT_REDUCTION_MEAN &&
            lce.weight_grad_accumulation == KJIT_WEIGHT_GRAD_ACCUMULATION_FP32 &&
            lce.config == NULL,
        "kjit_linear_cross_entropy_spec_init's defaults");
  kjit_linear_cross_entropy_args_init(&lce_args);
  check(lce_args.struct_size == sizeof lce_args && lce_args.d_weight.data == NULL &&
            lce_args.accumulate == 0 && lce_args.workspace_bytes == 0,
        "linear cross-entropy args init");
  lce.vocab = 128256;
  lce.hidden = 4096;
  check(kjit_linear_cross_entropy_create(NULL, &lce, &lce_op) == KJIT_INVALID_ARGUMENT &&
            lce_op == NULL,
        "kjit_linear_cross_entropy_create without a runtime is KJIT_INVALID_ARGUMENT");
  check(strcmp(kjit_last_error(), "kjit_linear_cross_entropy_create: runtime is NULL") == 0,
        "the message names the NULL runtime");

  kjit_sharded_cross_entropy_spec_init(&sharded);
  check(sharded.struct_size == sizeof sharded && sharded.dtype == KJIT_BF16 &&
            sharded.loss.reduction == KJIT_REDUCTION_MEAN && sharded.loss.class_weight_dtype == -1 &&
            sharded.config == NULL,
        "kjit_sharded_cross_entropy_spec_init's defaults");
  kjit_sharded_cross_entropy_args_init(&sharded_args);
  check(sharded_args.struct_size == sizeof sharded_args && sharded_args.workspace == NULL,
        "sharded cross-entropy args init");
  sharded.vocab = 128256;
  sharded.shard_start = 64128;
  sharded.shard_end = 128256;
  check(kjit_sharded_cross_entropy_create(NULL, &sharded, &sharded_op) == KJIT_INVALID_ARGUMENT &&
            sharded_op == NULL,
        "kjit_sharded_cross_entropy_create without a runtime is KJIT_INVALID_ARGUMENT");
  check(kjit_sharded_cross_entropy_stats_of(NULL, &sharded_args, 1, &stats_max, &stats_sums) ==
                KJIT_INVALID_ARGUMENT &&
            strcmp(kjit_last_error(), "kjit_sharded_cross_entropy_stats_of: op is NULL") == 0,
        "kjit_sharded_cross_entropy_stats_of names the NULL op");

  check(kjit_rms_norm_create(NULL, &norm, &op) == KJIT_INVALID_ARGUMENT && op == NULL,
        "kjit_rms_norm_create without a runtime is KJIT_INVALID_ARGUMENT");
  check(strcmp(kjit_last_error(), "kjit_rms_norm_create: runtime is NULL") == 0,
        "the message names the NULL argument");

  if (failures != 0) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
