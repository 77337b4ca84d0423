/* kjit's C API: the same ops as the C++ API (kjit/kjit.h) behind plain C types, for bindings
 * (Python's ctypes, Rust, Julia, JAX FFI) and for C programs. Link libkjit_c.so
 * (find_package(kjit) gives kjit::kjit_c).
 *
 * Rules that hold for every function:
 *  - Nothing throws and nothing aborts: each call returns a kjit_status, and when that is not
 *    KJIT_OK, kjit_last_error() returns a message saying which argument was bad and what was
 *    expected (thread-local, valid until the thread's next kjit call).
 *  - Structs passed in start with `struct_size`: set it with the matching *_init function (which
 *    also sets the defaults) or to sizeof the struct. A size this library does not know is
 *    rejected, so a binding built against another ABI fails clearly instead of misreading memory.
 *  - Enum fields are range-checked, and int32_t flags take 0 or 1: another value is
 *    KJIT_INVALID_ARGUMENT naming the field and the values it accepts.
 *  - Strings and JSON returned through `char** out` are allocated by kjit; free them with
 *    kjit_free. A failed call leaves NULL (or 0) in its outputs, handles included.
 *  - Handles (runtime, ops) are created once and launched many times, from any thread; an op
 *    keeps its runtime alive, so destroy order does not matter. Destroying NULL does nothing. A
 *    handle of one kind passed where another is expected (a kjit_rms_norm* cast to kjit_runtime*)
 *    is KJIT_INVALID_ARGUMENT naming both kinds; a destroy given one leaves it alone and sets the
 *    last error.
 *  - Launches take a CUstream (a cudaStream_t or torch's stream pointer passes straight in; NULL is
 *    the legacy default stream), enqueue work and return: no host synchronization and no
 *    allocation, so they can be captured into CUDA graphs. Device memory is described by
 *    kjit_tensor (rows x cols elements, rows row_stride elements apart) and kjit_index.
 *
 *   kjit_runtime* rt = NULL;
 *   if (kjit_runtime_create(NULL, &rt) != KJIT_OK) fprintf(stderr, "%s\n", kjit_last_error());
 *   kjit_cross_entropy_spec spec;
 *   kjit_cross_entropy_spec_init(&spec);
 *   spec.vocab = 128256;
 *   spec.loss.label_smoothing = 0.1f;
 *   kjit_cross_entropy* ce = NULL;
 *   kjit_cross_entropy_create(rt, &spec, &ce);
 *   kjit_cross_entropy_args args;
 *   kjit_cross_entropy_args_init(&args);
 *   args.logits = (kjit_tensor){logits, KJIT_BF16, rows, 128256, 128256};
 *   ... targets, loss, args.grad = args.logits (in place), workspace ...
 *   kjit_cross_entropy_forward_backward(ce, stream, &args);
 */
#ifndef KJIT_KJIT_C_H_
#define KJIT_KJIT_C_H_

#include <stddef.h>
#include <stdint.h>

#include "kjit/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct's layout or a function's meaning changes. New fields go at the end of a
 * struct, yet only this version's struct_size is accepted: a binding compares kjit_abi_version().
 *   2: cross-entropy class weights (kjit_cross_entropy_spec.class_weight_dtype, class_weight in
 *      kjit_cross_entropy_args and kjit_cross_entropy_backward_args).
 *   3: the per-row extras (issue 35): entropy in both ops' specs, entropy and target_logprob in
 *      their args; class weights in the fused linear op (class_weight_dtype, class_weight).
 *   4: the loss options are one struct, kjit_loss_options, embedded as `loss` in both loss specs;
 *      lse_square_scale is now z_loss.
 *   5: the RL heads (issue 47): kjit_log_probs_* (no existing struct changed).
 *   6: ops by name, kjit_op_* (issue 48): the way every op added from now on is offered (no
 * existing struct changed). */
#define KJIT_C_ABI_VERSION 6

#if defined(__GNUC__)
#define KJIT_C_EXPORT __attribute__((visibility("default")))
#else
#define KJIT_C_EXPORT
#endif

/* The codes of absl::StatusCode, so that a message and its code mean the same in C and C++. */
typedef enum kjit_status {
  KJIT_OK = 0,
  KJIT_CANCELLED = 1,
  KJIT_UNKNOWN = 2,
  KJIT_INVALID_ARGUMENT = 3,
  KJIT_DEADLINE_EXCEEDED = 4,
  KJIT_NOT_FOUND = 5,
  KJIT_ALREADY_EXISTS = 6,
  KJIT_PERMISSION_DENIED = 7,
  KJIT_RESOURCE_EXHAUSTED = 8,
  KJIT_FAILED_PRECONDITION = 9, /* e.g. a launch on a compile-only runtime */
  KJIT_ABORTED = 10,
  KJIT_OUT_OF_RANGE = 11,
  KJIT_UNIMPLEMENTED = 12,
  KJIT_INTERNAL = 13,    /* a bug in kjit: please report the message */
  KJIT_UNAVAILABLE = 14, /* no driver, no GPU, no libnvrtc: the message says how to fix it */
  KJIT_DATA_LOSS = 15,
  KJIT_UNAUTHENTICATED = 16
} kjit_status;

typedef enum kjit_dtype { KJIT_F32 = 0, KJIT_F16 = 1, KJIT_BF16 = 2 } kjit_dtype;
typedef enum kjit_index_type { KJIT_INT32 = 0, KJIT_INT64 = 1 } kjit_index_type;
typedef enum kjit_reduction {
  KJIT_REDUCTION_NONE = 0,
  KJIT_REDUCTION_SUM = 1,
  KJIT_REDUCTION_MEAN = 2
} kjit_reduction;
typedef enum kjit_weight_grad_accumulation {
  KJIT_WEIGHT_GRAD_ACCUMULATION_FP32 = 0, /* an fp32 accumulator, rounded into d_weight once */
  KJIT_WEIGHT_GRAD_ACCUMULATION_OUTPUT_DTYPE = 1 /* straight into d_weight, in its dtype */
} kjit_weight_grad_accumulation;
typedef enum kjit_rms_norm_casting {
  KJIT_CASTING_LLAMA = 0, /* the normalized x is rounded to the dtype before the weight multiply */
  KJIT_CASTING_GEMMA = 1, /* fp32 until the store */
  KJIT_CASTING_NONE = 2   /* all in the dtype, rounded where eager PyTorch would (kjit/rms_norm.h);
                             the weight must have the dtype */
} kjit_rms_norm_casting;

/* rows x cols elements of `dtype` (a kjit_dtype), rows `row_stride` elements apart (>= cols); a
 * vector is one row. data == NULL means "not given" for optional arguments. */
typedef struct kjit_tensor {
  void* data;
  int32_t dtype;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;
} kjit_tensor;

/* A contiguous vector of `size` integers of `type` (a kjit_index_type). */
typedef struct kjit_index {
  void* data;
  int32_t type;
  int64_t size;
} kjit_index;

/* ---- Library ---------------------------------------------------------------------------- */

/* KJIT_C_ABI_VERSION as this library was built; a binding compares it with its own. */
KJIT_C_EXPORT uint32_t kjit_abi_version(void);
/* "0.1.0" (static storage). */
KJIT_C_EXPORT const char* kjit_version(void);
/* "kjit 0.1.0 (NVRTC 13.0, CUDA driver 13.0)", or with "none (why)" in place of what is missing. */
KJIT_C_EXPORT kjit_status kjit_full_version(char** out);
/* The message of this thread's last failed call ("" when none failed). */
KJIT_C_EXPORT const char* kjit_last_error(void);
/* "INVALID_ARGUMENT" for KJIT_INVALID_ARGUMENT... (static storage); "" for a value that is not a
 * kjit_status. */
KJIT_C_EXPORT const char* kjit_status_name(kjit_status status);
/* Frees what kjit returned through a char** out; NULL does nothing. */
KJIT_C_EXPORT void kjit_free(void* p);

/* ---- Runtime ---------------------------------------------------------------------------- */

/* Receives the library's warnings (an unreadable tuning database, an unwritable cache), possibly
 * from several threads at once. */
typedef void (*kjit_warning_fn)(const char* message, void* user_data);

typedef struct kjit_runtime_options {
  uint32_t struct_size;
  int32_t device;        /* CUDA device ordinal; default 0 */
  const char* target;    /* NULL or "": the device's own arch; else "sm_90", "compute_90"... */
  int32_t compile_only;  /* 1: no driver is touched, kernels are built and cached only; needs
                            target */
  int32_t disk_cache;    /* default 1; 0 keeps compiled kernels in memory only */
  const char* cache_dir; /* NULL: $KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit, else ~/.cache/kjit */
  const char* tuning_db; /* NULL: $KJIT_TUNING_DB, else tuning.json in the cache; "off": none */
  int32_t autotune;      /* 1: a launch in an untuned row bucket runs kjit-tune first (seconds) */
  kjit_warning_fn warning; /* NULL: each distinct warning once to stderr */
  void* warning_user_data;
} kjit_runtime_options;

typedef struct kjit_runtime kjit_runtime;

KJIT_C_EXPORT void kjit_runtime_options_init(kjit_runtime_options* options);
/* options NULL: the defaults. KJIT_UNAVAILABLE when there is no driver or GPU, or no libnvrtc (the
 * message says why and what to do); compile-only runtimes need no driver or GPU. */
KJIT_C_EXPORT kjit_status kjit_runtime_create(const kjit_runtime_options* options,
                                              kjit_runtime** out);
KJIT_C_EXPORT void kjit_runtime_destroy(kjit_runtime* runtime);
/* JSON: {"target": "sm_90", "arch": 90, "compile_only": false, "device": {"ordinal": 0,
 * "name": "NVIDIA H200", "compute_capability": 90, "sm_count": 132, "total_memory": ...}}
 * ("device" is null when compile-only). */
KJIT_C_EXPORT kjit_status kjit_runtime_info(const kjit_runtime* runtime, char** json_out);

/* ---- RMSNorm (kjit/rms_norm.h says what it computes) ------------------------------------ */

typedef struct kjit_rms_norm_spec {
  uint32_t struct_size;
  int64_t hidden;         /* 1 .. 65536 */
  int32_t dtype;          /* x, y, residual, dy, dx; default KJIT_BF16 */
  int32_t weight_dtype;   /* -1 (default): dtype */
  float eps;              /* default 1e-6 */
  float weight_offset;    /* 1 for Gemma's (1 + w); default 0 */
  int32_t casting;        /* kjit_rms_norm_casting; default KJIT_CASTING_LLAMA */
  int32_t fused_residual; /* 1: normalize x + residual, writing the sum to residual_out */
  const char* config;     /* NULL or "": tuned or heuristic; else "vec=8 fwd=128x1 bwd=512x1r2" */
} kjit_rms_norm_spec;

typedef struct kjit_rms_norm_forward_args {
  uint32_t struct_size;
  kjit_tensor x;            /* [rows, hidden] */
  kjit_tensor weight;       /* [hidden] */
  kjit_tensor y;            /* [rows, hidden]; may be x itself */
  kjit_tensor rstd;         /* optional fp32 [rows] */
  kjit_tensor residual;     /* [rows, hidden]; iff fused_residual */
  kjit_tensor residual_out; /* [rows, hidden]; iff fused_residual; may be residual itself */
} kjit_rms_norm_forward_args;

typedef struct kjit_rms_norm_backward_args {
  uint32_t struct_size;
  kjit_tensor dy;        /* [rows, hidden] */
  kjit_tensor x;         /* what the forward normalized (its residual_out when fused) */
  kjit_tensor weight;    /* [hidden] */
  kjit_tensor rstd;      /* fp32 [rows], from the forward */
  kjit_tensor dx;        /* [rows, hidden]; may be dy itself */
  kjit_tensor dw;        /* [hidden], weight dtype */
  kjit_tensor dresidual; /* optional: the gradient reaching residual_out, added into dx */
  void* workspace;       /* device memory of at least kjit_rms_norm_backward_workspace_bytes */
  int64_t workspace_bytes;
} kjit_rms_norm_backward_args;

typedef struct kjit_rms_norm kjit_rms_norm;

KJIT_C_EXPORT void kjit_rms_norm_spec_init(kjit_rms_norm_spec* spec);
KJIT_C_EXPORT void kjit_rms_norm_forward_args_init(kjit_rms_norm_forward_args* args);
KJIT_C_EXPORT void kjit_rms_norm_backward_args_init(kjit_rms_norm_backward_args* args);
/* Checks the spec (KJIT_INVALID_ARGUMENT names the field). On a GPU runtime it also builds and
 * loads the kernels of the common case, so that a compile error surfaces here rather than in the
 * first launch; a compile-only runtime builds nothing until kjit_rms_norm_build. The same holds for
 * kjit_cross_entropy_create and kjit_linear_cross_entropy_create. */
KJIT_C_EXPORT kjit_status kjit_rms_norm_create(const kjit_runtime* runtime,
                                               const kjit_rms_norm_spec* spec, kjit_rms_norm** out);
KJIT_C_EXPORT void kjit_rms_norm_destroy(kjit_rms_norm* op);
KJIT_C_EXPORT kjit_status kjit_rms_norm_forward(const kjit_rms_norm* op, CUstream stream,
                                                const kjit_rms_norm_forward_args* args);
KJIT_C_EXPORT kjit_status kjit_rms_norm_backward(const kjit_rms_norm* op, CUstream stream,
                                                 const kjit_rms_norm_backward_args* args);
/* The queries' `rows` is 0 .. 2^31-1, the rows a launch takes. */
KJIT_C_EXPORT kjit_status kjit_rms_norm_backward_workspace_bytes(const kjit_rms_norm* op,
                                                                 int64_t rows, int64_t* bytes);
/* The config a launch of `rows` uses when pointers allow the widest vectors (text form). */
KJIT_C_EXPORT kjit_status kjit_rms_norm_config_for(const kjit_rms_norm* op, int64_t rows,
                                                   char** config_out);
/* Compiles (or finds in the caches) the op's programs; works on a compile-only runtime. JSON:
 * {"key", "program", "target", "origin": "compiled"|"disk cache"|"memory", "path", "bytes",
 *  "nvrtc", "params": {...}, "kernels": [...], "programs": [{"program", "key", "origin", "path",
 *  "bytes", "kernels"}, ...]}: an op built as several programs (cross-entropy compiles each kernel
 *  apart) is described by its first, sums up the rest (kjit::BuildInfo) and lists each. */
KJIT_C_EXPORT kjit_status kjit_rms_norm_build(const kjit_rms_norm* op, char** json_out);

/* ---- The loss options (kjit/loss_options.h says what each does) --------------------------- */

/* Embedded as `loss` in every loss op's spec, whose *_spec_init sets the defaults and whose
 * struct_size covers it. Errors name a field as "loss.<field>". */
typedef struct kjit_loss_options {
  int32_t target_type;   /* targets and argmax; default KJIT_INT64 */
  int32_t reduction;     /* kjit_reduction; default KJIT_REDUCTION_MEAN */
  int64_t ignore_index;  /* default -100 */
  float label_smoothing; /* [0, 1) */
  float z_loss;          /* the z-loss coefficient: adds z_loss * lse^2 per row; >= 0 */
  float softcap;         /* 0: off */
  int32_t argmax;        /* 1: launches write the predicted token per row (args.argmax) */
  int32_t entropy;       /* 1: launches write the softmax's entropy per row (args.entropy) */
  /* Per-class weights (PyTorch's `weight`): -1 (default) none; else KJIT_F32 or the logits'
   * dtype, and launches take class_weight. */
  int32_t class_weight_dtype;
} kjit_loss_options;

/* ---- Cross-entropy (kjit/cross_entropy.h says what it computes) ------------------------- */

typedef struct kjit_cross_entropy_spec {
  uint32_t struct_size;
  int64_t vocab; /* 2 .. 1,048,576 */
  int32_t dtype; /* logits and gradient; default KJIT_BF16 */
  kjit_loss_options loss;
  /* NULL or "": tuned or heuristic; else "vec=8 threads=256 unroll=4 cluster=6 staged=1" */
  const char* config;
} kjit_cross_entropy_spec;

typedef struct kjit_cross_entropy_args {
  uint32_t struct_size;
  kjit_tensor logits;      /* [rows, vocab] */
  kjit_index targets;      /* [rows] */
  kjit_tensor loss;        /* fp32: [rows] for reduction none, else [1] */
  kjit_tensor lse;         /* optional fp32 [rows] */
  kjit_index argmax;       /* [rows]; iff spec.loss.argmax */
  kjit_tensor grad;        /* forward_backward: [rows, vocab]; may be logits (in place) */
  kjit_tensor grad_output; /* optional fp32 upstream gradient, read on the device: [1] (sum,
                              mean) or [rows] (none) */
  void* workspace;         /* device memory of at least kjit_cross_entropy_workspace_bytes */
  int64_t workspace_bytes;
  kjit_tensor class_weight; /* [vocab] (one row) in spec.loss.class_weight_dtype, read on the
                               device; iff that is not -1 */
  kjit_tensor entropy; /* fp32 [rows]; iff spec.loss.entropy: -sum p ln p of the row's softmax */
  kjit_tensor target_logprob; /* optional fp32 [rows]: x_t - lse, 0 for an ignored row */
} kjit_cross_entropy_args;

typedef struct kjit_cross_entropy_backward_args {
  uint32_t struct_size;
  kjit_tensor logits;      /* [rows, vocab] */
  kjit_index targets;      /* [rows] */
  kjit_tensor lse;         /* fp32 [rows], saved by a forward */
  kjit_tensor grad_output; /* optional, as for forward_backward */
  kjit_tensor grad;        /* [rows, vocab]; may be logits (in place) */
  void* workspace;
  int64_t workspace_bytes;
  kjit_tensor class_weight; /* as for forward_backward: the forward's weights */
} kjit_cross_entropy_backward_args;

/* For an autograd backward that learns the upstream gradient only after forward_backward wrote the
 * gradient: grad, computed with grad_output = `applied`, becomes the gradient for `grad_output`.
 * Rows whose grad_output equals applied are not touched, so the usual case (both 1, or both the
 * same loss scale) costs one small launch, not a pass over the gradient. It takes no class weights:
 * they scale both gradients alike. */
typedef struct kjit_cross_entropy_rescale_args {
  uint32_t struct_size;
  kjit_tensor grad;        /* [rows, vocab], written by forward_backward */
  kjit_tensor grad_output; /* fp32 [1] or [rows]: the upstream gradient */
  kjit_tensor applied;     /* fp32, grad_output's shape: what forward_backward used; NULL: 1 */
} kjit_cross_entropy_rescale_args;

typedef struct kjit_cross_entropy kjit_cross_entropy;

KJIT_C_EXPORT void kjit_cross_entropy_spec_init(kjit_cross_entropy_spec* spec);
KJIT_C_EXPORT void kjit_cross_entropy_args_init(kjit_cross_entropy_args* args);
KJIT_C_EXPORT void kjit_cross_entropy_backward_args_init(kjit_cross_entropy_backward_args* args);
KJIT_C_EXPORT void kjit_cross_entropy_rescale_args_init(kjit_cross_entropy_rescale_args* args);
KJIT_C_EXPORT kjit_status kjit_cross_entropy_create(const kjit_runtime* runtime,
                                                    const kjit_cross_entropy_spec* spec,
                                                    kjit_cross_entropy** out);
KJIT_C_EXPORT void kjit_cross_entropy_destroy(kjit_cross_entropy* op);
/* Loss (and lse, argmax); args->grad must be empty. */
KJIT_C_EXPORT kjit_status kjit_cross_entropy_forward(const kjit_cross_entropy* op, CUstream stream,
                                                     const kjit_cross_entropy_args* args);
/* Loss and gradient in one pass over the logits (and lse, argmax). */
KJIT_C_EXPORT kjit_status kjit_cross_entropy_forward_backward(const kjit_cross_entropy* op,
                                                              CUstream stream,
                                                              const kjit_cross_entropy_args* args);
/* The gradient from the lse a forward saved. */
KJIT_C_EXPORT kjit_status kjit_cross_entropy_backward(const kjit_cross_entropy* op, CUstream stream,
                                                      const kjit_cross_entropy_backward_args* args);
KJIT_C_EXPORT kjit_status kjit_cross_entropy_rescale_gradient(
    const kjit_cross_entropy* op, CUstream stream, const kjit_cross_entropy_rescale_args* args);
KJIT_C_EXPORT kjit_status kjit_cross_entropy_workspace_bytes(const kjit_cross_entropy* op,
                                                             int64_t rows, int64_t* bytes);
/* fused 1: the forward_backward config; 0: forward and backward's. */
KJIT_C_EXPORT kjit_status kjit_cross_entropy_config_for(const kjit_cross_entropy* op, int64_t rows,
                                                        int32_t fused, char** config_out);
KJIT_C_EXPORT kjit_status kjit_cross_entropy_build(const kjit_cross_entropy* op, char** json_out);

/* ---- Linear + cross-entropy (kjit/linear_cross_entropy.h says what it computes) ----------
 * lm_head and the loss fused: from the hidden states to the loss and the gradients of the hidden
 * states, the weight and the bias, in chunks of rows, in memory that does not grow with the rows.
 * The GEMMs run in cuBLASLt (loaded at run time: a GPU runtime's create fails with
 * KJIT_FAILED_PRECONDITION, saying how to fix it, when there is none). */

typedef struct kjit_linear_cross_entropy_spec {
  uint32_t struct_size;
  int64_t vocab;             /* 2 .. 1,048,576 */
  int64_t hidden;            /* 1 .. 65536 */
  int32_t dtype;             /* hidden states, weight, bias, d_hidden; default KJIT_BF16 */
  int32_t weight_grad_dtype; /* d_weight and d_bias: -1 (default) dtype, or KJIT_F32 */
  int32_t bias;              /* 1: logits = h W^T + b, and launches take bias */
  kjit_loss_options loss;
  int32_t weight_grad_accumulation; /* kjit_weight_grad_accumulation; default FP32 */
  /* NULL or "": tuned or heuristic; else
   * "chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0" (chunk: the rows
   * whose logits exist at once; whole: a launch of at most this many rows is one chunk, 0: never;
   * streams 2: each chunk's loss beside the next chunk's logits GEMM). */
  const char* config;
} kjit_linear_cross_entropy_spec;

typedef struct kjit_linear_cross_entropy_args {
  uint32_t struct_size;
  kjit_tensor hidden_states; /* [rows, hidden], any row_stride >= hidden */
  kjit_tensor weight;        /* [vocab, hidden], the lm_head's */
  kjit_tensor bias;          /* [vocab] (one row); iff spec.bias */
  kjit_index targets;        /* [rows] */
  kjit_tensor loss;          /* fp32: [rows] for reduction none, else [1] */
  kjit_tensor lse;           /* optional fp32 [rows] */
  kjit_index argmax;         /* [rows] in loss.target_type; iff spec.loss.argmax */
  kjit_tensor grad_output;   /* forward_backward: optional fp32 upstream gradient, read on the
                                device: [1] (sum, mean) or [rows] (none) */
  /* forward_backward's outputs, each optional (left empty, its GEMM is not run); forward takes
   * none of them. */
  kjit_tensor d_hidden; /* [rows, hidden] in dtype, always overwritten */
  kjit_tensor d_weight; /* [vocab, hidden] in the weight-gradient dtype */
  kjit_tensor d_bias;   /* [vocab] in the weight-gradient dtype; only with spec.bias */
  int32_t accumulate;   /* 1: d_weight and d_bias get the gradients added to what they hold */
  void* workspace;      /* 256-byte aligned device memory of at least
                           kjit_linear_cross_entropy_workspace_bytes */
  int64_t workspace_bytes;
  kjit_tensor entropy;        /* fp32 [rows]; iff spec.loss.entropy */
  kjit_tensor target_logprob; /* optional fp32 [rows]: x_t - lse, 0 for an ignored row */
  kjit_tensor class_weight; /* [vocab] (one row) in spec.loss.class_weight_dtype; iff that is set */
} kjit_linear_cross_entropy_args;

/* Gradients forward_backward computed for upstream gradient `applied` (NULL: 1) become, in place,
 * the gradients for `grad_output`: round(x * fp32(g / a)) per element; where g == a (compared on
 * the device) nothing is read or written, so the usual case costs one small launch per gradient.
 * Sum and mean only; not for gradients forward_backward accumulated into. */
typedef struct kjit_linear_cross_entropy_rescale_args {
  uint32_t struct_size;
  kjit_tensor d_hidden; /* as forward_backward wrote them; each optional */
  kjit_tensor d_weight;
  kjit_tensor d_bias;
  kjit_tensor grad_output; /* fp32 [1] */
  kjit_tensor applied;     /* fp32 [1]: what forward_backward used; NULL: 1 */
} kjit_linear_cross_entropy_rescale_args;

typedef struct kjit_linear_cross_entropy kjit_linear_cross_entropy;

KJIT_C_EXPORT void kjit_linear_cross_entropy_spec_init(kjit_linear_cross_entropy_spec* spec);
KJIT_C_EXPORT void kjit_linear_cross_entropy_args_init(kjit_linear_cross_entropy_args* args);
KJIT_C_EXPORT void kjit_linear_cross_entropy_rescale_args_init(
    kjit_linear_cross_entropy_rescale_args* args);
KJIT_C_EXPORT kjit_status kjit_linear_cross_entropy_create(
    const kjit_runtime* runtime, const kjit_linear_cross_entropy_spec* spec,
    kjit_linear_cross_entropy** out);
KJIT_C_EXPORT void kjit_linear_cross_entropy_destroy(kjit_linear_cross_entropy* op);
/* The loss (and lse, argmax) alone: grad_output and the gradient outputs must be empty. */
KJIT_C_EXPORT kjit_status
kjit_linear_cross_entropy_forward(const kjit_linear_cross_entropy* op, CUstream stream,
                                  const kjit_linear_cross_entropy_args* args);
/* The loss and the gradients asked for, in one pass over the chunks. */
KJIT_C_EXPORT kjit_status
kjit_linear_cross_entropy_forward_backward(const kjit_linear_cross_entropy* op, CUstream stream,
                                           const kjit_linear_cross_entropy_args* args);
KJIT_C_EXPORT kjit_status
kjit_linear_cross_entropy_rescale_gradients(const kjit_linear_cross_entropy* op, CUstream stream,
                                            const kjit_linear_cross_entropy_rescale_args* args);
/* The device memory a launch of `rows` needs (the weight-gradient accumulator included). */
KJIT_C_EXPORT kjit_status kjit_linear_cross_entropy_workspace_bytes(
    const kjit_linear_cross_entropy* op, int64_t rows, int64_t* bytes);
/* The part of that the fp32 weight-gradient accumulator takes at `rows` (0 without one: output
   dtype accumulation, an fp32 d_weight, or rows that fit one chunk). */
KJIT_C_EXPORT kjit_status kjit_linear_cross_entropy_accumulator_bytes(
    const kjit_linear_cross_entropy* op, int64_t rows, int64_t* bytes);
KJIT_C_EXPORT kjit_status kjit_linear_cross_entropy_config_for(const kjit_linear_cross_entropy* op,
                                                               int64_t rows, char** config_out);
KJIT_C_EXPORT kjit_status kjit_linear_cross_entropy_build(const kjit_linear_cross_entropy* op,
                                                          char** json_out);

/* ---- Vocab-parallel cross-entropy (kjit/sharded_cross_entropy.h says what it computes) -----
 * For tensor-parallel training, where each rank holds the logits of its classes [shard_start,
 * shard_end) only: the loss and each shard's gradient equal kjit_cross_entropy's on the whole
 * row. Three steps on one stream, none synchronizing with the host:
 *   1. kjit_sharded_cross_entropy_compute_stats: the shard's per-row statistics, in the workspace;
 *   2. the reduction across the shards, one of
 *        kjit_sharded_cross_entropy_all_reduce_stats  NCCL over a communicator the caller made
 *            (an ncclComm_t: NCCL's own, or the one under torch.distributed's NCCL group);
 *        your own collectives: all-reduce the `max` floats of kjit_sharded_cross_entropy_stats_of
 *            with max, kjit_sharded_cross_entropy_rescale_stats, then all-reduce its `sums`
 *            (3 * rows floats) with sum;
 *        kjit_sharded_cross_entropy_combine_stats  the shards of one process (one GPU);
 *   3. kjit_sharded_cross_entropy_finish: the loss (the same on every rank) and, when args.grad
 *      is given, the shard's gradient.
 * kjit_sharded_cross_entropy_run does 1 to 3 with NCCL. Every rank passes the same targets (classes
 * of the whole vocab) and, with class weights, the whole [vocab] weight vector. No argmax or
 * entropy in sharded mode.
 *
 *   kjit_sharded_cross_entropy_spec spec;
 *   kjit_sharded_cross_entropy_spec_init(&spec);
 *   spec.vocab = 128256; spec.shard_start = rank * 32064; spec.shard_end = spec.shard_start +
 * 32064; kjit_sharded_cross_entropy_create(rt, &spec, &ce);
 *   ... args.logits = the shard's [rows, 32064] logits, targets, loss, grad, workspace ...
 *   kjit_sharded_cross_entropy_run(ce, stream, &args, (void*)nccl_comm);
 */

typedef struct kjit_sharded_cross_entropy_spec {
  uint32_t struct_size;
  int64_t vocab;       /* the whole vocabulary, 2 .. 1,048,576 */
  int64_t shard_start; /* this rank's classes: [shard_start, shard_end), not empty */
  int64_t shard_end;
  int32_t dtype; /* logits and gradient; default KJIT_BF16 */
  /* Smoothing and class weights span the whole vocab; argmax and entropy are refused (the sharded
   * op has neither). */
  kjit_loss_options loss;
  /* NULL or "": the heuristic; else "vec=8 threads=256 unroll=4 cluster=0 staged=0" */
  const char* config;
} kjit_sharded_cross_entropy_spec;

typedef struct kjit_sharded_cross_entropy_args {
  uint32_t struct_size;
  kjit_tensor logits;      /* [rows, shard_end - shard_start]: the shard's columns */
  kjit_index targets;      /* [rows], classes of the whole vocab */
  kjit_tensor loss;        /* fp32: [rows] for reduction none, else [1]; the whole row's loss */
  kjit_tensor lse;         /* optional fp32 [rows]: the whole row's lse */
  kjit_tensor grad;        /* finish: optional [rows, width], the shard's gradient; may be logits */
  kjit_tensor grad_output; /* optional fp32 upstream gradient: [1] (sum, mean) or [rows] (none) */
  kjit_tensor class_weight; /* [vocab] (the whole vocab's) iff spec.class_weight_dtype is set */
  void* workspace;          /* 16-byte aligned device memory of at least
                               kjit_sharded_cross_entropy_workspace_bytes; one per shard, holding
                               the statistics from compute_stats to finish */
  int64_t workspace_bytes;
} kjit_sharded_cross_entropy_args;

typedef struct kjit_sharded_cross_entropy kjit_sharded_cross_entropy;

KJIT_C_EXPORT void kjit_sharded_cross_entropy_spec_init(kjit_sharded_cross_entropy_spec* spec);
KJIT_C_EXPORT void kjit_sharded_cross_entropy_args_init(kjit_sharded_cross_entropy_args* args);
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_create(
    const kjit_runtime* runtime, const kjit_sharded_cross_entropy_spec* spec,
    kjit_sharded_cross_entropy** out);
KJIT_C_EXPORT void kjit_sharded_cross_entropy_destroy(kjit_sharded_cross_entropy* op);
/* Step 1: the shard's statistics (and the valid-row count) into args->workspace. */
KJIT_C_EXPORT kjit_status
kjit_sharded_cross_entropy_compute_stats(const kjit_sharded_cross_entropy* op, CUstream stream,
                                         const kjit_sharded_cross_entropy_args* args);
/* Step 2 over NCCL: `nccl_comm` is an ncclComm_t of the ranks that hold the shards (libnccl is
 * opened on first use: $KJIT_NCCL_LIBRARY, else libnccl.so.2, then libnccl.so). Everything is
 * checked (rows, workspace, a compile-only runtime: FAILED_PRECONDITION) before the first
 * all-reduce is issued, so that a rank that fails never leaves its peers waiting in one. */
KJIT_C_EXPORT kjit_status
kjit_sharded_cross_entropy_all_reduce_stats(const kjit_sharded_cross_entropy* op, CUstream stream,
                                            void* workspace, int64_t rows, void* nccl_comm);
/* Step 2 with your own all-reduces: where the statistics lie in `workspace` (pointer arithmetic
 * only, nothing is read): *max_out, `rows` floats to all-reduce with max, then (after
 * kjit_sharded_cross_entropy_rescale_stats) *sums_out, 3 * rows floats to all-reduce with sum. */
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_stats_of(const kjit_sharded_cross_entropy* op,
                                                              void* workspace, int64_t rows,
                                                              float** max_out, float** sums_out);
/* Rescales the shard's sums from its own max to the all-reduced one (between the two all-reduces).
 */
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_rescale_stats(
    const kjit_sharded_cross_entropy* op, CUstream stream, void* workspace, int64_t rows);
/* Step 2 for `count` shards held by this process (1 .. 32, checked before the arrays are read),
 * which tile [0, vocab) in order, each after its compute_stats on `stream`: afterwards each
 * shard's finish gives what it would after the all-reduces. The shards must be of one problem
 * (specs alike but for the shard), of one runtime, each with a workspace of its own. */
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_combine_stats(
    CUstream stream, const kjit_sharded_cross_entropy* const* ops, void* const* workspaces,
    int32_t count, int64_t rows);
/* Step 3: the loss (and lse) of the whole rows, and the shard's gradient when args->grad is given.
 */
KJIT_C_EXPORT kjit_status
kjit_sharded_cross_entropy_finish(const kjit_sharded_cross_entropy* op, CUstream stream,
                                  const kjit_sharded_cross_entropy_args* args);
/* compute_stats, all_reduce_stats and finish. */
KJIT_C_EXPORT kjit_status
kjit_sharded_cross_entropy_run(const kjit_sharded_cross_entropy* op, CUstream stream,
                               const kjit_sharded_cross_entropy_args* args, void* nccl_comm);
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_workspace_bytes(
    const kjit_sharded_cross_entropy* op, int64_t rows, int64_t* bytes);
/* The config every launch of the op uses (text form; fixed when the op is made). */
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_config(const kjit_sharded_cross_entropy* op,
                                                            char** config_out);
KJIT_C_EXPORT kjit_status kjit_sharded_cross_entropy_build(const kjit_sharded_cross_entropy* op,
                                                           char** json_out);

/* ---- RL heads (kjit/log_probs.h says what they compute) ---------------------------------
 * Per-token log softmax(z / T)[target] and, when asked, the entropy of softmax(z / T), fp32 per
 * row (0 for an ignored row), and their gradient with respect to the logits for per-row upstream
 * gradients of both (either absent). The temperature is applied as each logit is read. */

typedef struct kjit_log_probs_spec {
  uint32_t struct_size;
  int64_t vocab;        /* 2 .. 1,048,576 */
  int32_t dtype;        /* logits and gradient; default KJIT_BF16 */
  int32_t target_type;  /* default KJIT_INT64 */
  int64_t ignore_index; /* default -100 */
  float temperature;    /* T > 0, finite; default 1 */
  int32_t entropy;      /* 1: forward writes args.entropy */
  /* NULL or "": the heuristic; else "vec=8 threads=256 unroll=4 cluster=0 staged=0" */
  const char* config;
} kjit_log_probs_spec;

typedef struct kjit_log_probs_args {
  uint32_t struct_size;
  kjit_tensor logits;  /* [rows, vocab] */
  kjit_index targets;  /* [rows] */
  kjit_tensor logprob; /* fp32 [rows] */
  kjit_tensor entropy; /* fp32 [rows]; iff spec.entropy */
  kjit_tensor lse;     /* optional fp32 [rows]: lse(z / T), what backward needs */
} kjit_log_probs_args;

typedef struct kjit_log_probs_backward_args {
  uint32_t struct_size;
  kjit_tensor logits;       /* [rows, vocab], as the forward read them */
  kjit_index targets;       /* [rows] */
  kjit_tensor lse;          /* fp32 [rows], the forward's */
  kjit_tensor entropy;      /* fp32 [rows], the forward's; iff grad_entropy */
  kjit_tensor grad_logprob; /* optional fp32 [rows] */
  kjit_tensor grad_entropy; /* optional fp32 [rows] */
  kjit_tensor grad;         /* [rows, vocab]; may be logits (in place) */
} kjit_log_probs_backward_args;

typedef struct kjit_log_probs kjit_log_probs;

KJIT_C_EXPORT void kjit_log_probs_spec_init(kjit_log_probs_spec* spec);
KJIT_C_EXPORT void kjit_log_probs_args_init(kjit_log_probs_args* args);
KJIT_C_EXPORT void kjit_log_probs_backward_args_init(kjit_log_probs_backward_args* args);
/* Checks the spec; kernels are built on first use (or by kjit_log_probs_build). */
KJIT_C_EXPORT kjit_status kjit_log_probs_create(const kjit_runtime* runtime,
                                                const kjit_log_probs_spec* spec,
                                                kjit_log_probs** out);
KJIT_C_EXPORT void kjit_log_probs_destroy(kjit_log_probs* op);
/* The per-row outputs; nothing else is written (an old or reference policy's pass). */
KJIT_C_EXPORT kjit_status kjit_log_probs_forward(const kjit_log_probs* op, CUstream stream,
                                                 const kjit_log_probs_args* args);
/* The gradient from the forward's lse (and entropy) for the upstream gradients given. */
KJIT_C_EXPORT kjit_status kjit_log_probs_backward(const kjit_log_probs* op, CUstream stream,
                                                  const kjit_log_probs_backward_args* args);
/* The config every launch uses with the widest vectors (text form). */
KJIT_C_EXPORT kjit_status kjit_log_probs_config(const kjit_log_probs* op, char** config_out);
KJIT_C_EXPORT kjit_status kjit_log_probs_build(const kjit_log_probs* op, char** json_out);

/* ---- Ops by name (ABI 6) -----------------------------------------------------------------
 * Every op added after the RL heads is offered here only, with no functions or structs of its own;
 * RMSNorm is offered here too, beside its functions above (kjit_op_schema lists the ops).
 * An op is made from its spec as JSON, the same JSON `kjit-tune --spec` and `kjit compile --json`
 * take ({"op": "rms_norm", "hidden": 4096, "dtype": "bf16"}): "op" names it, a field left out takes
 * the C++ spec's default, "config" (a string) overrides the tuned or heuristic config, and an
 * unknown field is KJIT_INVALID_ARGUMENT naming it. A launch names its pass ("forward") and passes
 * its arguments by the C++ args struct's field names; an argument not given is empty, as in the
 * op's own structs. The rules above hold: a bad name or value is KJIT_INVALID_ARGUMENT saying what
 * the op takes.
 *
 *   kjit_op* norm = NULL;
 *   kjit_op_create(rt, "{\"op\": \"rms_norm\", \"hidden\": 4096}", &norm);
 *   kjit_named_tensor t[] = {{"x", x}, {"weight", w}, {"y", y}};
 *   kjit_op_args args;
 *   kjit_op_args_init(&args);
 *   args.tensors = t;
 *   args.tensor_count = 3;
 *   kjit_op_launch(norm, "forward", stream, &args);
 */

typedef struct kjit_named_tensor {
  const char* name; /* the C++ args' field: "x" */
  kjit_tensor tensor;
} kjit_named_tensor;

typedef struct kjit_named_index {
  const char* name; /* "targets" */
  kjit_index index;
} kjit_named_index;

typedef struct kjit_op_args {
  uint32_t struct_size;
  const kjit_named_tensor* tensors; /* tensor_count of them, each name at most once */
  int32_t tensor_count;
  const kjit_named_index* indexes; /* index_count of them, each name at most once */
  int32_t index_count;
  void* workspace; /* for a pass that takes one: at least kjit_op_workspace_bytes */
  int64_t workspace_bytes;
} kjit_op_args;

typedef struct kjit_op kjit_op;

/* JSON: {"abi_version": 6, "ops": [{"op": "rms_norm", "spec": {the defaults, "op" included},
 * "config": true (whether "config" is taken), "config_for": true (whether kjit_op_config_for
 * answers), "passes": [{"pass": "forward", "tensors": ["x", ...], "indexes": [...],
 * "workspace": false}, ...]}, ...]}, the ops in name order. */
KJIT_C_EXPORT kjit_status kjit_op_schema(char** json_out);
KJIT_C_EXPORT void kjit_op_args_init(kjit_op_args* args);
/* Checks the spec (KJIT_INVALID_ARGUMENT names the field) and makes the op, as the op's own create
 * does (a GPU runtime builds the common case's kernels now). */
KJIT_C_EXPORT kjit_status kjit_op_create(const kjit_runtime* runtime, const char* spec_json,
                                         kjit_op** out);
KJIT_C_EXPORT void kjit_op_destroy(kjit_op* op);
/* The op's spec as JSON, every field given (what kjit_op_create would make again). */
KJIT_C_EXPORT kjit_status kjit_op_spec(const kjit_op* op, char** json_out);
KJIT_C_EXPORT kjit_status kjit_op_launch(const kjit_op* op, const char* pass, CUstream stream,
                                         const kjit_op_args* args);
/* The workspace a launch of `pass` over `rows` (0 .. 2^31-1) needs; 0 for a pass that takes none.
 */
KJIT_C_EXPORT kjit_status kjit_op_workspace_bytes(const kjit_op* op, const char* pass, int64_t rows,
                                                  int64_t* bytes);
/* The config a launch of `rows` uses (text form); KJIT_UNIMPLEMENTED for an op whose schema says
 * "config_for": false. */
KJIT_C_EXPORT kjit_status kjit_op_config_for(const kjit_op* op, int64_t rows, char** config_out);
/* As the ops' *_build: compiles (or finds in the caches) the op's programs; works compile-only. */
KJIT_C_EXPORT kjit_status kjit_op_build(const kjit_op* op, char** json_out);

#ifdef __cplusplus
}
#endif

#endif /* KJIT_KJIT_C_H_ */
