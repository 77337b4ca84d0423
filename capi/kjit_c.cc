// kjit's C API (include/kjit/kjit_c.h) over the C++ API: the C structs are checked (pointers,
// struct_size, enum fields) and converted to the C++ specs and views, and each call's absl::Status,
// or an exception, becomes a kjit_status and this thread's last error message.
#include "kjit/kjit_c.h"

#include <cxxabi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/exit_gate.h"
#include "jit/json_text.h"
#include "jit/status_helpers.h"
#include "kjit/kjit.h"

// Each handle starts with its kind, so that one of another kind (or a destroyed one, while its
// memory is still there) passed where this kind is expected is an error naming both, not UB.
enum class kjit_handle_kind : uint32_t {
  kDestroyed = 0,
  kRuntime = 0x6b6a7401,
  kRmsNorm,
  kCrossEntropy,
  kLinearCrossEntropy,
  kShardedCrossEntropy,
  kLogProbs,
};
struct kjit_runtime {
  kjit_handle_kind kind = kjit_handle_kind::kRuntime;
  kjit::Runtime rt;
};
struct kjit_rms_norm {
  kjit_handle_kind kind = kjit_handle_kind::kRmsNorm;
  kjit::RmsNorm op;
};
struct kjit_cross_entropy {
  kjit_handle_kind kind = kjit_handle_kind::kCrossEntropy;
  kjit::CrossEntropy op;
};
struct kjit_linear_cross_entropy {
  kjit_handle_kind kind = kjit_handle_kind::kLinearCrossEntropy;
  kjit::LinearCrossEntropy op;
};
struct kjit_sharded_cross_entropy {
  kjit_handle_kind kind = kjit_handle_kind::kShardedCrossEntropy;
  kjit::ShardedCrossEntropy op;
};
struct kjit_log_probs {
  kjit_handle_kind kind = kjit_handle_kind::kLogProbs;
  kjit::LogProbs op;
};

namespace kjit {
namespace {

// The header promises absl's codes and the C++ enums' order.
template <class E>
constexpr int Int(E e) {
  return static_cast<int>(e);
}
static_assert(KJIT_OK == Int(absl::StatusCode::kOk) &&
              KJIT_CANCELLED == Int(absl::StatusCode::kCancelled) &&
              KJIT_UNKNOWN == Int(absl::StatusCode::kUnknown) &&
              KJIT_INVALID_ARGUMENT == Int(absl::StatusCode::kInvalidArgument) &&
              KJIT_DEADLINE_EXCEEDED == Int(absl::StatusCode::kDeadlineExceeded) &&
              KJIT_NOT_FOUND == Int(absl::StatusCode::kNotFound) &&
              KJIT_ALREADY_EXISTS == Int(absl::StatusCode::kAlreadyExists) &&
              KJIT_PERMISSION_DENIED == Int(absl::StatusCode::kPermissionDenied) &&
              KJIT_RESOURCE_EXHAUSTED == Int(absl::StatusCode::kResourceExhausted) &&
              KJIT_FAILED_PRECONDITION == Int(absl::StatusCode::kFailedPrecondition) &&
              KJIT_ABORTED == Int(absl::StatusCode::kAborted) &&
              KJIT_OUT_OF_RANGE == Int(absl::StatusCode::kOutOfRange) &&
              KJIT_UNIMPLEMENTED == Int(absl::StatusCode::kUnimplemented) &&
              KJIT_INTERNAL == Int(absl::StatusCode::kInternal) &&
              KJIT_UNAVAILABLE == Int(absl::StatusCode::kUnavailable) &&
              KJIT_DATA_LOSS == Int(absl::StatusCode::kDataLoss) &&
              KJIT_UNAUTHENTICATED == Int(absl::StatusCode::kUnauthenticated));
static_assert(KJIT_F32 == Int(DType::kF32) && KJIT_F16 == Int(DType::kF16) &&
              KJIT_BF16 == Int(DType::kBF16) && KJIT_INT32 == Int(IndexType::kInt32) &&
              KJIT_INT64 == Int(IndexType::kInt64) &&
              KJIT_REDUCTION_NONE == Int(Reduction::kNone) &&
              KJIT_REDUCTION_SUM == Int(Reduction::kSum) &&
              KJIT_REDUCTION_MEAN == Int(Reduction::kMean) &&
              KJIT_CASTING_LLAMA == Int(RmsNormCasting::kLlama) &&
              KJIT_CASTING_GEMMA == Int(RmsNormCasting::kGemma) &&
              KJIT_CASTING_NONE == Int(RmsNormCasting::kNone) &&
              KJIT_WEIGHT_GRAD_ACCUMULATION_FP32 == Int(WeightGradAccumulation::kFloat32) &&
              KJIT_WEIGHT_GRAD_ACCUMULATION_OUTPUT_DTYPE ==
                  Int(WeightGradAccumulation::kOutputDtype));

constexpr const char* kStatusNames[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};
// The accepted values of the enum fields, from 0 (weight_dtype's and class_weight_dtype's from -1).
constexpr const char* kDTypeNames[] = {"KJIT_F32", "KJIT_F16", "KJIT_BF16"};
constexpr const char* kWeightDTypeNames[] = {"dtype's", "KJIT_F32", "KJIT_F16", "KJIT_BF16"};
constexpr const char* kClassWeightDTypeNames[] = {"none", "KJIT_F32", "KJIT_F16", "KJIT_BF16"};
constexpr const char* kIndexNames[] = {"KJIT_INT32", "KJIT_INT64"};
constexpr const char* kReductionNames[] = {"KJIT_REDUCTION_NONE", "KJIT_REDUCTION_SUM",
                                           "KJIT_REDUCTION_MEAN"};
constexpr const char* kCastingNames[] = {"KJIT_CASTING_LLAMA", "KJIT_CASTING_GEMMA",
                                         "KJIT_CASTING_NONE"};
constexpr const char* kAccumulationNames[] = {"KJIT_WEIGHT_GRAD_ACCUMULATION_FP32",
                                              "KJIT_WEIGHT_GRAD_ACCUMULATION_OUTPUT_DTYPE"};
constexpr const char* kFlagNames[] = {"off", "on"};

thread_local std::string last_error;

kjit_status Fail(kjit_status code, std::string_view message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    last_error.clear();  // no memory even for the message
  }
  return code;
}

// Runs `body(fn)` (an absl::Status) and reports it the C way: its code, and its message as this
// thread's last error ("" on success). Nothing escapes: an exception becomes KJIT_INTERNAL (or
// KJIT_RESOURCE_EXHAUSTED when host memory ran out), but for the unwinding of a thread that
// pthread_exit() ends under the call (Python ends a daemon thread so when a warning callback
// wants the interpreter while it shuts down): swallowed, it aborted the process ("FATAL:
// exception not rethrown"). Not noexcept, for the same reason.
template <class Body>
kjit_status Call(const char* fn, Body&& body) {
  // exit() on another thread waits for this call before any library's destructors run, and a call
  // made after that waits for the end (jit/exit_gate.h).
  jit::ExitGate::Pass pass;
  try {
    const absl::Status status = body(fn);
    return Fail(static_cast<kjit_status>(status.code()), ToStd(status.message()));
  } catch (const abi::__forced_unwind&) {
    throw;
  } catch (const std::bad_alloc&) {
    return Fail(KJIT_RESOURCE_EXHAUSTED, "out of host memory");
  } catch (const std::exception& e) {
    return Fail(KJIT_INTERNAL,
                fmt::format("{}: internal error, please report it: {}", fn, e.what()));
  } catch (...) {
    return Fail(KJIT_INTERNAL, "internal error (an unknown exception), please report it");
  }
}

// InvalidArgument naming the first NULL of the (name, pointer) pairs.
absl::Status NotNull(const char* fn,
                     std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, p] : pointers) {
    if (p == nullptr) return absl::InvalidArgumentError(fmt::format("{}: {} is NULL", fn, name));
  }
  return absl::OkStatus();
}

template <class Handle>
constexpr kjit_handle_kind kKindOf = kjit_handle_kind::kDestroyed;
template <>
constexpr kjit_handle_kind kKindOf<kjit_runtime> = kjit_handle_kind::kRuntime;
template <>
constexpr kjit_handle_kind kKindOf<kjit_rms_norm> = kjit_handle_kind::kRmsNorm;
template <>
constexpr kjit_handle_kind kKindOf<kjit_cross_entropy> = kjit_handle_kind::kCrossEntropy;
template <>
constexpr kjit_handle_kind kKindOf<kjit_linear_cross_entropy> =
    kjit_handle_kind::kLinearCrossEntropy;
template <>
constexpr kjit_handle_kind kKindOf<kjit_sharded_cross_entropy> =
    kjit_handle_kind::kShardedCrossEntropy;
template <>
constexpr kjit_handle_kind kKindOf<kjit_log_probs> = kjit_handle_kind::kLogProbs;

const char* KindName(kjit_handle_kind kind) {
  switch (kind) {
    case kjit_handle_kind::kRuntime: return "kjit_runtime";
    case kjit_handle_kind::kRmsNorm: return "kjit_rms_norm";
    case kjit_handle_kind::kCrossEntropy: return "kjit_cross_entropy";
    case kjit_handle_kind::kLinearCrossEntropy: return "kjit_linear_cross_entropy";
    case kjit_handle_kind::kShardedCrossEntropy: return "kjit_sharded_cross_entropy";
    case kjit_handle_kind::kLogProbs: return "kjit_log_probs";
    case kjit_handle_kind::kDestroyed: break;
  }
  return nullptr;
}

// `handle` (the argument `name`) is not NULL and is a live handle of its type: InvalidArgument
// naming the kind it is instead (a handle of another kind cast to this type), or saying that it
// is none (destroyed, or not a handle at all).
template <class Handle>
absl::Status CheckHandle(const char* fn, const char* name, const Handle* handle) {
  KJIT_RETURN_IF_ERROR(NotNull(fn, {{name, handle}}));
  kjit_handle_kind kind;
  std::memcpy(&kind, handle, sizeof(kind));  // every handle starts with its kind
  if (kind == kKindOf<Handle>) return absl::OkStatus();
  const char* expected = KindName(kKindOf<Handle>);
  if (const char* other = KindName(kind)) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} is a {} handle; expected a {}", fn, name, other, expected));
  }
  return absl::InvalidArgumentError(fmt::format(
      "{}: {} is not a live {} handle (destroyed already, or not a handle)", fn, name, expected));
}

// kjit_*_destroy: NULL is nothing to do; a handle of another kind is left alone (this thread's
// last error says why) rather than freed as the wrong type.
template <class Handle>
void DestroyHandle(const char* fn, Handle* handle) noexcept {
  if (handle == nullptr) return;
  jit::ExitGate::Pass pass;  // as Call's
  const absl::Status s = CheckHandle(fn, "handle", handle);
  if (!s.ok()) {
    Fail(static_cast<kjit_status>(s.code()), ToStd(s.message()));
    return;
  }
  handle->kind = kjit_handle_kind::kDestroyed;
  delete handle;
}

// An output pointer: not NULL, and cleared first, so that a failed call leaves NULL (or 0) there.
template <class T>
absl::Status Output(const char* fn, const char* name, T* out) {
  KJIT_RETURN_IF_ERROR(NotNull(fn, {{name, out}}));
  *out = T{};
  return absl::OkStatus();
}

template <class T>
constexpr const char* kStructName = nullptr;
template <>
constexpr const char* kStructName<kjit_runtime_options> = "kjit_runtime_options";
template <>
constexpr const char* kStructName<kjit_rms_norm_spec> = "kjit_rms_norm_spec";
template <>
constexpr const char* kStructName<kjit_rms_norm_forward_args> = "kjit_rms_norm_forward_args";
template <>
constexpr const char* kStructName<kjit_rms_norm_backward_args> = "kjit_rms_norm_backward_args";
template <>
constexpr const char* kStructName<kjit_cross_entropy_spec> = "kjit_cross_entropy_spec";
template <>
constexpr const char* kStructName<kjit_cross_entropy_args> = "kjit_cross_entropy_args";
template <>
constexpr const char* kStructName<kjit_cross_entropy_backward_args> =
    "kjit_cross_entropy_backward_args";
template <>
constexpr const char* kStructName<kjit_cross_entropy_rescale_args> =
    "kjit_cross_entropy_rescale_args";
template <>
constexpr const char* kStructName<kjit_linear_cross_entropy_spec> =
    "kjit_linear_cross_entropy_spec";
template <>
constexpr const char* kStructName<kjit_linear_cross_entropy_args> =
    "kjit_linear_cross_entropy_args";
template <>
constexpr const char* kStructName<kjit_linear_cross_entropy_rescale_args> =
    "kjit_linear_cross_entropy_rescale_args";
template <>
constexpr const char* kStructName<kjit_sharded_cross_entropy_spec> =
    "kjit_sharded_cross_entropy_spec";
template <>
constexpr const char* kStructName<kjit_sharded_cross_entropy_args> =
    "kjit_sharded_cross_entropy_args";
template <>
constexpr const char* kStructName<kjit_log_probs_spec> = "kjit_log_probs_spec";
template <>
constexpr const char* kStructName<kjit_log_probs_args> = "kjit_log_probs_args";
template <>
constexpr const char* kStructName<kjit_log_probs_backward_args> = "kjit_log_probs_backward_args";

// The struct `name` points to was made for this library's layout of T.
template <class T>
absl::Status CheckSize(const char* fn, const char* name, const T& s) {
  if (s.struct_size == sizeof(T)) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format(
      "{}: {}->struct_size is {}, but {} is {} bytes in this library (kjit C ABI version {}); "
      "set it with {}_init",
      fn, name, s.struct_size, kStructName<T>, sizeof(T), KJIT_C_ABI_VERSION, kStructName<T>));
}

// Reads the enum and flag fields of the C structs (and the dtypes of their views), keeping the
// first that is out of range as an InvalidArgument naming the field and the values it accepts.
class Fields {
 public:
  // `value` when it is one of first, first + 1, ... (as many as `names`), else `first`.
  int Choice(std::initializer_list<std::string_view> name, int32_t value,
             std::span<const char* const> names, int first = 0) {
    const int64_t index = int64_t{value} - first;
    if (index >= 0 && index < std::ssize(names)) return value;
    if (!status_.ok()) return first;
    std::string field, accepted;
    for (std::string_view part : name) field += (field.empty() ? "" : ".") + std::string(part);
    for (int i = 0; i < std::ssize(names); ++i) {
      const char* separator = i == 0 ? "" : i + 1 < std::ssize(names) ? ", " : " or ";
      accepted += fmt::format("{}{} ({})", separator, first + i, names[i]);
    }
    status_ = absl::InvalidArgumentError(
        fmt::format("{}: {} is out of range; expected {}", field, value, accepted));
    return first;
  }
  bool Flag(const char* name, int32_t value) { return Choice({name}, value, kFlagNames) != 0; }
  DType Dtype(std::initializer_list<std::string_view> name, int32_t value) {
    return static_cast<DType>(Choice(name, value, kDTypeNames));
  }
  TensorView Tensor(std::string_view name, const kjit_tensor& t) {
    return {t.data, Dtype({name, "dtype"}, t.dtype), t.rows, t.cols, t.row_stride};
  }
  IndexView Index(std::string_view name, const kjit_index& i) {
    return {i.data, static_cast<IndexType>(Choice({name, "type"}, i.type, kIndexNames)), i.size};
  }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// A spec's config text (NULL or "": none) read by the op's parser.
template <class Config>
absl::StatusOr<std::optional<Config>> ParseConfig(
    const char* text, absl::StatusOr<Config> (*parse)(std::string_view)) {
  if (text == nullptr || *text == '\0') return std::optional<Config>();
  absl::StatusOr<Config> config = parse(text);
  if (!config.ok()) return Annotate(config.status(), "config");
  return std::optional<Config>(*std::move(config));
}

// A row count for the queries: what a launch takes.
absl::Status CheckRows(int64_t rows) {
  if (rows >= 0 && rows <= INT32_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("rows: {} is out of range, expected 0 to {}", rows, INT32_MAX));
}

// `text` in malloc'd memory (kjit_free frees it) for a char** output.
absl::Status Return(std::string_view text, char** out) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) return absl::ResourceExhaustedError("out of host memory");
  std::memcpy(copy, text.data(), text.size());
  copy[text.size()] = '\0';
  *out = copy;
  return absl::OkStatus();
}

absl::Status ReturnBuild(const absl::StatusOr<BuildInfo>& b, char** json_out) {
  if (!b.ok()) return b.status();
  return Return(b->ToJson(), json_out);
}

absl::StatusOr<RuntimeOptions> ToOptions(const kjit_runtime_options& o) {
  Fields f;
  RuntimeOptions cpp{.device = o.device,
                     .target = o.target != nullptr ? o.target : "",
                     .compile_only = f.Flag("compile_only", o.compile_only),
                     .disk_cache = f.Flag("disk_cache", o.disk_cache),
                     .cache_dir = o.cache_dir != nullptr ? o.cache_dir : "",
                     .tuning_db = o.tuning_db != nullptr ? o.tuning_db : "",
                     .autotune = f.Flag("autotune", o.autotune)};
  KJIT_RETURN_IF_ERROR(f.status());
  if (o.warning != nullptr) {
    cpp.warnings = [warn = o.warning, data = o.warning_user_data](std::string_view message) {
      warn(std::string(message).c_str(), data);
    };
  }
  return cpp;
}

absl::StatusOr<RmsNormSpec> ToSpec(const kjit_rms_norm_spec& c) {
  Fields f;
  const int weight_dtype = f.Choice({"weight_dtype"}, c.weight_dtype, kWeightDTypeNames, -1);
  RmsNormSpec spec{
      .hidden = c.hidden,
      .dtype = f.Dtype({"dtype"}, c.dtype),
      .weight_dtype = weight_dtype < 0 ? std::nullopt : std::optional(DType(weight_dtype)),
      .eps = c.eps,
      .weight_offset = c.weight_offset,
      .casting = RmsNormCasting(f.Choice({"casting"}, c.casting, kCastingNames)),
      .fused_residual = f.Flag("fused_residual", c.fused_residual)};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseRmsNormConfig));
  return spec;
}

// The loss options of every loss spec; a bad field is named "loss.<field>". The structured
// bindings here and in DefaultLossOptions stop the build when kjit::LossOptions or
// kjit_loss_options gains a field the other lacks.
LossOptions ToCpp(Fields& f, const kjit_loss_options& c) {
  const auto& [target_type, reduction, ignore_index, label_smoothing, z_loss, softcap, argmax,
               entropy, class_weight_dtype] = c;
  const int weights =
      f.Choice({"loss", "class_weight_dtype"}, class_weight_dtype, kClassWeightDTypeNames, -1);
  return {.target_type = IndexType(f.Choice({"loss", "target_type"}, target_type, kIndexNames)),
          .ignore_index = ignore_index,
          .reduction = Reduction(f.Choice({"loss", "reduction"}, reduction, kReductionNames)),
          .label_smoothing = label_smoothing,
          .z_loss = z_loss,
          .softcap = softcap,
          .argmax = f.Flag("loss.argmax", argmax),
          .entropy = f.Flag("loss.entropy", entropy),
          .class_weight_dtype = weights < 0 ? std::nullopt : std::optional(DType(weights))};
}

// LossOptions' defaults as the C struct, for the loss specs' *_spec_init.
kjit_loss_options DefaultLossOptions() {
  const auto [target_type, ignore_index, reduction, label_smoothing, z_loss, softcap, argmax,
              entropy, class_weight_dtype] = LossOptions{};
  return {
      .target_type = static_cast<int32_t>(target_type),
      .reduction = static_cast<int32_t>(reduction),
      .ignore_index = ignore_index,
      .label_smoothing = label_smoothing,
      .z_loss = z_loss,
      .softcap = softcap,
      .argmax = argmax,
      .entropy = entropy,
      .class_weight_dtype = class_weight_dtype ? static_cast<int32_t>(*class_weight_dtype) : -1};
}

absl::StatusOr<CrossEntropySpec> ToSpec(const kjit_cross_entropy_spec& c) {
  Fields f;
  CrossEntropySpec spec{
      .vocab = c.vocab, .dtype = f.Dtype({"dtype"}, c.dtype), .loss = ToCpp(f, c.loss)};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseCrossEntropyConfig));
  return spec;
}

absl::StatusOr<LinearCrossEntropySpec> ToSpec(const kjit_linear_cross_entropy_spec& c) {
  Fields f;
  const int weight_grad_dtype =
      f.Choice({"weight_grad_dtype"}, c.weight_grad_dtype, kWeightDTypeNames, -1);
  LinearCrossEntropySpec spec{
      .vocab = c.vocab,
      .hidden = c.hidden,
      .dtype = f.Dtype({"dtype"}, c.dtype),
      .weight_grad_dtype =
          weight_grad_dtype < 0 ? std::nullopt : std::optional(DType(weight_grad_dtype)),
      .bias = f.Flag("bias", c.bias),
      .loss = ToCpp(f, c.loss),
      .weight_grad_accumulation = WeightGradAccumulation(
          f.Choice({"weight_grad_accumulation"}, c.weight_grad_accumulation, kAccumulationNames))};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseLinearCrossEntropyConfig));
  return spec;
}

absl::StatusOr<ShardedCrossEntropySpec> ToSpec(const kjit_sharded_cross_entropy_spec& c) {
  Fields f;
  ShardedCrossEntropySpec spec{.vocab = c.vocab,
                               .shard_start = c.shard_start,
                               .shard_end = c.shard_end,
                               .dtype = f.Dtype({"dtype"}, c.dtype),
                               .loss = ToCpp(f, c.loss)};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseCrossEntropyConfig));
  return spec;
}

absl::StatusOr<LogProbsSpec> ToSpec(const kjit_log_probs_spec& c) {
  Fields f;
  LogProbsSpec spec{.vocab = c.vocab,
                    .dtype = f.Dtype({"dtype"}, c.dtype),
                    .target_type = IndexType(f.Choice({"target_type"}, c.target_type, kIndexNames)),
                    .ignore_index = c.ignore_index,
                    .temperature = c.temperature,
                    .entropy = f.Flag("entropy", c.entropy)};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseCrossEntropyConfig));
  return spec;
}

absl::StatusOr<kjit::LogProbs> MakeOp(const Runtime& rt, const kjit_log_probs_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const LogProbsSpec spec, ToSpec(c));
  return rt.LogProbs(spec);
}

absl::StatusOr<kjit::RmsNorm> MakeOp(const Runtime& rt, const kjit_rms_norm_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const RmsNormSpec spec, ToSpec(c));
  return rt.RmsNorm(spec);
}
absl::StatusOr<kjit::CrossEntropy> MakeOp(const Runtime& rt, const kjit_cross_entropy_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const CrossEntropySpec spec, ToSpec(c));
  return rt.CrossEntropy(spec);
}
absl::StatusOr<kjit::LinearCrossEntropy> MakeOp(const Runtime& rt,
                                                const kjit_linear_cross_entropy_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const LinearCrossEntropySpec spec, ToSpec(c));
  return rt.LinearCrossEntropy(spec);
}

absl::StatusOr<kjit::ShardedCrossEntropy> MakeOp(const Runtime& rt,
                                                 const kjit_sharded_cross_entropy_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const ShardedCrossEntropySpec spec, ToSpec(c));
  return rt.ShardedCrossEntropy(spec);
}

// kjit_*_create: the op of `spec` on `runtime`, as a new handle in *out.
template <class Handle, class Spec>
kjit_status CreateOp(const char* fn, const kjit_runtime* runtime, const Spec* spec, Handle** out) {
  return Call(fn, [&](const char*) -> absl::Status {
    KJIT_RETURN_IF_ERROR(Output(fn, "out", out));
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "runtime", runtime));
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"spec", spec}}));
    KJIT_RETURN_IF_ERROR(CheckSize(fn, "spec", *spec));
    KJIT_ASSIGN_OR_RETURN(auto op, MakeOp(runtime->rt, *spec));
    *out = new Handle{.op = std::move(op)};
    return absl::OkStatus();
  });
}

// The launches' arguments as the C++ ops take them: each view converted by Fields and named by
// its field (`.x = f.Tensor("x", a.x)`), so that a message names the C field exactly.
#define KJIT_VIEW(field) .field = f.Tensor(#field, a.field)
#define KJIT_INDEX(field) .field = f.Index(#field, a.field)
#define KJIT_WORKSPACE .workspace = a.workspace, .workspace_bytes = a.workspace_bytes
RmsNormForwardArgs ToCpp(Fields& f, const kjit_rms_norm_forward_args& a) {
  return {KJIT_VIEW(x),    KJIT_VIEW(weight),   KJIT_VIEW(y),
          KJIT_VIEW(rstd), KJIT_VIEW(residual), KJIT_VIEW(residual_out)};
}
RmsNormBackwardArgs ToCpp(Fields& f, const kjit_rms_norm_backward_args& a) {
  return {KJIT_VIEW(dy), KJIT_VIEW(x),  KJIT_VIEW(weight),    KJIT_VIEW(rstd),
          KJIT_VIEW(dx), KJIT_VIEW(dw), KJIT_VIEW(dresidual), KJIT_WORKSPACE};
}
// The per-row extras both fused ops' args have (ABI 3), set on the C++ args.
template <class Args, class CArgs>
Args WithExtras(Fields& f, const CArgs& a, Args args) {
  args.entropy = f.Tensor("entropy", a.entropy);
  args.target_logprob = f.Tensor("target_logprob", a.target_logprob);
  return args;
}
CrossEntropyArgs ToCpp(Fields& f, const kjit_cross_entropy_args& a) {
  return WithExtras(
      f, a,
      CrossEntropyArgs{KJIT_VIEW(logits), KJIT_INDEX(targets), KJIT_VIEW(loss), KJIT_VIEW(lse),
                       KJIT_INDEX(argmax), KJIT_VIEW(grad), KJIT_VIEW(grad_output),
                       KJIT_VIEW(class_weight), KJIT_WORKSPACE});
}
CrossEntropyBackwardArgs ToCpp(Fields& f, const kjit_cross_entropy_backward_args& a) {
  return {KJIT_VIEW(logits), KJIT_INDEX(targets),     KJIT_VIEW(lse), KJIT_VIEW(grad_output),
          KJIT_VIEW(grad),   KJIT_VIEW(class_weight), KJIT_WORKSPACE};
}
CrossEntropyRescaleArgs ToCpp(Fields& f, const kjit_cross_entropy_rescale_args& a) {
  return {KJIT_VIEW(grad), KJIT_VIEW(grad_output), KJIT_VIEW(applied)};
}
LinearCrossEntropyArgs ToCpp(Fields& f, const kjit_linear_cross_entropy_args& a) {
  return WithExtras(
      f, a,
      LinearCrossEntropyArgs{KJIT_VIEW(hidden_states), KJIT_VIEW(weight), KJIT_VIEW(bias),
                             KJIT_INDEX(targets), KJIT_VIEW(loss), KJIT_VIEW(lse),
                             KJIT_INDEX(argmax), KJIT_VIEW(class_weight), KJIT_VIEW(grad_output),
                             KJIT_VIEW(d_hidden), KJIT_VIEW(d_weight), KJIT_VIEW(d_bias),
                             .accumulate = f.Flag("accumulate", a.accumulate), KJIT_WORKSPACE});
}
LinearCrossEntropyRescaleArgs ToCpp(Fields& f, const kjit_linear_cross_entropy_rescale_args& a) {
  return {KJIT_VIEW(d_hidden), KJIT_VIEW(d_weight), KJIT_VIEW(d_bias), KJIT_VIEW(grad_output),
          KJIT_VIEW(applied)};
}
ShardedCrossEntropyArgs ToCpp(Fields& f, const kjit_sharded_cross_entropy_args& a) {
  return {KJIT_VIEW(logits), KJIT_INDEX(targets),    KJIT_VIEW(loss),         KJIT_VIEW(lse),
          KJIT_VIEW(grad),   KJIT_VIEW(grad_output), KJIT_VIEW(class_weight), KJIT_WORKSPACE};
}
LogProbsArgs ToCpp(Fields& f, const kjit_log_probs_args& a) {
  return {KJIT_VIEW(logits), KJIT_INDEX(targets), KJIT_VIEW(logprob), KJIT_VIEW(entropy),
          KJIT_VIEW(lse)};
}
LogProbsBackwardArgs ToCpp(Fields& f, const kjit_log_probs_backward_args& a) {
  return {KJIT_VIEW(logits),       KJIT_INDEX(targets),     KJIT_VIEW(lse), KJIT_VIEW(entropy),
          KJIT_VIEW(grad_logprob), KJIT_VIEW(grad_entropy), KJIT_VIEW(grad)};
}
#undef KJIT_VIEW
#undef KJIT_INDEX
#undef KJIT_WORKSPACE

// A launch: `op` and `args` checked, then the C++ op's `launch` with the converted arguments.
template <class Handle, class Args, class Op, class CppArgs>
kjit_status LaunchOp(const char* fn, const Handle* op, CUstream stream, const Args* args,
                     absl::Status (Op::*launch)(CUstream, const CppArgs&) const) {
  return Call(fn, [&](const char*) -> absl::Status {
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"args", args}}));
    KJIT_RETURN_IF_ERROR(CheckSize(fn, "args", *args));
    Fields f;
    const CppArgs cpp = ToCpp(f, *args);
    KJIT_RETURN_IF_ERROR(f.status());
    return (op->op.*launch)(stream, cpp);
  });
}

// A query of an op: the output `out_name` and `op` checked (the output cleared), then
// `query(C++ op)`.
template <class Handle, class Out, class Query>
kjit_status QueryOp(const char* fn, const Handle* op, const char* out_name, Out* out,
                    Query&& query) {
  return Call(fn, [&](const char*) -> absl::Status {
    KJIT_RETURN_IF_ERROR(Output(fn, out_name, out));
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "op", op));
    return query(op->op);
  });
}

// *args zeroed, with its struct_size set: the *_init of the structs whose defaults are all zero.
template <class Args>
void InitArgs(Args* args) {
  if (args != nullptr) *args = Args{.struct_size = sizeof(Args)};
}

}  // namespace
}  // namespace kjit

// ---- Library ----------------------------------------------------------------------------------

uint32_t kjit_abi_version(void) { return KJIT_C_ABI_VERSION; }

const char* kjit_version(void) { return KJIT_VERSION; }

kjit_status kjit_full_version(char** out) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::Output(fn, "out", out));
    return kjit::Return(kjit::FullVersionString(), out);
  });
}

const char* kjit_last_error(void) { return kjit::last_error.c_str(); }

const char* kjit_status_name(kjit_status status) {
  const int code = static_cast<int>(status);
  return code >= 0 && code < std::ssize(kjit::kStatusNames) ? kjit::kStatusNames[code] : "";
}

void kjit_free(void* p) { std::free(p); }

// ---- Runtime ----------------------------------------------------------------------------------

void kjit_runtime_options_init(kjit_runtime_options* options) {
  if (options == nullptr) return;
  const kjit::RuntimeOptions d;
  *options = {.struct_size = sizeof(*options),
              .device = d.device,
              .target = nullptr,
              .compile_only = d.compile_only,
              .disk_cache = d.disk_cache,
              .cache_dir = nullptr,
              .tuning_db = nullptr,
              .autotune = d.autotune,
              .warning = nullptr,
              .warning_user_data = nullptr};
}

kjit_status kjit_runtime_create(const kjit_runtime_options* options, kjit_runtime** out) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::Output(fn, "out", out));
    kjit_runtime_options defaults;
    kjit_runtime_options_init(&defaults);
    const kjit_runtime_options& o = options != nullptr ? *options : defaults;
    KJIT_RETURN_IF_ERROR(kjit::CheckSize(fn, "options", o));
    KJIT_ASSIGN_OR_RETURN(const kjit::RuntimeOptions cpp, kjit::ToOptions(o));
    KJIT_RETURN_IF_ERROR(kjit::Runtime::CheckToolchain(cpp.compile_only));
    KJIT_ASSIGN_OR_RETURN(kjit::Runtime rt, kjit::Runtime::Create(cpp));
    *out = new kjit_runtime{.rt = std::move(rt)};
    return absl::OkStatus();
  });
}

void kjit_runtime_destroy(kjit_runtime* runtime) { kjit::DestroyHandle(__func__, runtime); }

kjit_status kjit_runtime_info(const kjit_runtime* runtime, char** json_out) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::Output(fn, "json_out", json_out));
    KJIT_RETURN_IF_ERROR(kjit::CheckHandle(fn, "runtime", runtime));
    const kjit::Runtime& rt = runtime->rt;
    nlohmann::json info = {{"target", rt.target()},
                           {"arch", rt.arch()},
                           {"compile_only", rt.compile_only()},
                           {"device", nullptr}};
    if (!rt.compile_only()) {
      const kjit::DeviceInfo& d = rt.device();
      info["device"] = {{"ordinal", d.ordinal},
                        {"name", d.name},
                        {"compute_capability", d.compute_capability()},
                        {"sm_count", d.sm_count},
                        {"total_memory", d.total_memory}};
    }
    return kjit::Return(kjit::jit::JsonText(info), json_out);
  });
}

// ---- RMSNorm ----------------------------------------------------------------------------------

void kjit_rms_norm_spec_init(kjit_rms_norm_spec* spec) {
  if (spec == nullptr) return;
  const kjit::RmsNormSpec d;
  *spec = {.struct_size = sizeof(*spec),
           .hidden = d.hidden,
           .dtype = static_cast<int32_t>(d.dtype),
           .weight_dtype = -1,
           .eps = d.eps,
           .weight_offset = d.weight_offset,
           .casting = static_cast<int32_t>(d.casting),
           .fused_residual = d.fused_residual,
           .config = nullptr};
}

void kjit_rms_norm_forward_args_init(kjit_rms_norm_forward_args* args) { kjit::InitArgs(args); }

void kjit_rms_norm_backward_args_init(kjit_rms_norm_backward_args* args) { kjit::InitArgs(args); }

kjit_status kjit_rms_norm_create(const kjit_runtime* runtime, const kjit_rms_norm_spec* spec,
                                 kjit_rms_norm** out) {
  return kjit::CreateOp(__func__, runtime, spec, out);
}

void kjit_rms_norm_destroy(kjit_rms_norm* op) { kjit::DestroyHandle(__func__, op); }

kjit_status kjit_rms_norm_forward(const kjit_rms_norm* op, CUstream stream,
                                  const kjit_rms_norm_forward_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::RmsNorm::Forward);
}

kjit_status kjit_rms_norm_backward(const kjit_rms_norm* op, CUstream stream,
                                   const kjit_rms_norm_backward_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::RmsNorm::Backward);
}

kjit_status kjit_rms_norm_backward_workspace_bytes(const kjit_rms_norm* op, int64_t rows,
                                                   int64_t* bytes) {
  return kjit::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::RmsNorm& norm) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    *bytes = norm.BackwardWorkspaceBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_rms_norm_config_for(const kjit_rms_norm* op, int64_t rows, char** config_out) {
  return kjit::QueryOp(__func__, op, "config_out", config_out, [&](const kjit::RmsNorm& norm) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    return kjit::Return(norm.ConfigFor(rows).ToString(), config_out);
  });
}

kjit_status kjit_rms_norm_build(const kjit_rms_norm* op, char** json_out) {
  return kjit::QueryOp(__func__, op, "json_out", json_out, [&](const kjit::RmsNorm& norm) {
    return kjit::ReturnBuild(norm.Build(), json_out);
  });
}

// ---- Cross-entropy ----------------------------------------------------------------------------

void kjit_cross_entropy_spec_init(kjit_cross_entropy_spec* spec) {
  if (spec == nullptr) return;
  const kjit::CrossEntropySpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .dtype = static_cast<int32_t>(d.dtype),
           .loss = kjit::DefaultLossOptions(),
           .config = nullptr};
}

void kjit_cross_entropy_args_init(kjit_cross_entropy_args* args) { kjit::InitArgs(args); }

void kjit_cross_entropy_backward_args_init(kjit_cross_entropy_backward_args* args) {
  kjit::InitArgs(args);
}

void kjit_cross_entropy_rescale_args_init(kjit_cross_entropy_rescale_args* args) {
  kjit::InitArgs(args);
}

kjit_status kjit_cross_entropy_create(const kjit_runtime* runtime,
                                      const kjit_cross_entropy_spec* spec,
                                      kjit_cross_entropy** out) {
  return kjit::CreateOp(__func__, runtime, spec, out);
}

void kjit_cross_entropy_destroy(kjit_cross_entropy* op) { kjit::DestroyHandle(__func__, op); }

kjit_status kjit_cross_entropy_forward(const kjit_cross_entropy* op, CUstream stream,
                                       const kjit_cross_entropy_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::Forward);
}

kjit_status kjit_cross_entropy_forward_backward(const kjit_cross_entropy* op, CUstream stream,
                                                const kjit_cross_entropy_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::ForwardBackward);
}

kjit_status kjit_cross_entropy_backward(const kjit_cross_entropy* op, CUstream stream,
                                        const kjit_cross_entropy_backward_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::Backward);
}

kjit_status kjit_cross_entropy_rescale_gradient(const kjit_cross_entropy* op, CUstream stream,
                                                const kjit_cross_entropy_rescale_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::RescaleGradient);
}

kjit_status kjit_cross_entropy_workspace_bytes(const kjit_cross_entropy* op, int64_t rows,
                                               int64_t* bytes) {
  return kjit::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::CrossEntropy& ce) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    *bytes = ce.WorkspaceBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_cross_entropy_config_for(const kjit_cross_entropy* op, int64_t rows, int32_t fused,
                                          char** config_out) {
  return kjit::QueryOp(__func__, op, "config_out", config_out, [&](const kjit::CrossEntropy& ce) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    kjit::Fields f;
    const bool fused_pass = f.Flag("fused", fused);
    KJIT_RETURN_IF_ERROR(f.status());
    return kjit::Return(ce.ConfigFor(rows, fused_pass).ToString(), config_out);
  });
}

kjit_status kjit_cross_entropy_build(const kjit_cross_entropy* op, char** json_out) {
  return kjit::QueryOp(__func__, op, "json_out", json_out, [&](const kjit::CrossEntropy& ce) {
    return kjit::ReturnBuild(ce.Build(), json_out);
  });
}

// ---- Linear + cross-entropy -------------------------------------------------------------------

void kjit_linear_cross_entropy_spec_init(kjit_linear_cross_entropy_spec* spec) {
  if (spec == nullptr) return;
  const kjit::LinearCrossEntropySpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .hidden = d.hidden,
           .dtype = static_cast<int32_t>(d.dtype),
           .weight_grad_dtype = -1,
           .bias = d.bias,
           .loss = kjit::DefaultLossOptions(),
           .weight_grad_accumulation = static_cast<int32_t>(d.weight_grad_accumulation),
           .config = nullptr};
}

void kjit_linear_cross_entropy_args_init(kjit_linear_cross_entropy_args* args) {
  kjit::InitArgs(args);
}

void kjit_linear_cross_entropy_rescale_args_init(kjit_linear_cross_entropy_rescale_args* args) {
  kjit::InitArgs(args);
}

kjit_status kjit_linear_cross_entropy_create(const kjit_runtime* runtime,
                                             const kjit_linear_cross_entropy_spec* spec,
                                             kjit_linear_cross_entropy** out) {
  return kjit::CreateOp(__func__, runtime, spec, out);
}

void kjit_linear_cross_entropy_destroy(kjit_linear_cross_entropy* op) {
  kjit::DestroyHandle(__func__, op);
}

kjit_status kjit_linear_cross_entropy_forward(const kjit_linear_cross_entropy* op, CUstream stream,
                                              const kjit_linear_cross_entropy_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::LinearCrossEntropy::Forward);
}

kjit_status kjit_linear_cross_entropy_forward_backward(const kjit_linear_cross_entropy* op,
                                                       CUstream stream,
                                                       const kjit_linear_cross_entropy_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::LinearCrossEntropy::ForwardBackward);
}

kjit_status kjit_linear_cross_entropy_rescale_gradients(
    const kjit_linear_cross_entropy* op, CUstream stream,
    const kjit_linear_cross_entropy_rescale_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::LinearCrossEntropy::RescaleGradients);
}

kjit_status kjit_linear_cross_entropy_workspace_bytes(const kjit_linear_cross_entropy* op,
                                                      int64_t rows, int64_t* bytes) {
  return kjit::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::LinearCrossEntropy& lce) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    *bytes = lce.WorkspaceBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_linear_cross_entropy_accumulator_bytes(const kjit_linear_cross_entropy* op,
                                                        int64_t rows, int64_t* bytes) {
  return kjit::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::LinearCrossEntropy& lce) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    *bytes = lce.AccumulatorBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_linear_cross_entropy_config_for(const kjit_linear_cross_entropy* op, int64_t rows,
                                                 char** config_out) {
  return kjit::QueryOp(__func__, op, "config_out", config_out,
                       [&](const kjit::LinearCrossEntropy& lce) {
                         KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
                         return kjit::Return(lce.ConfigFor(rows).ToString(), config_out);
                       });
}

kjit_status kjit_linear_cross_entropy_build(const kjit_linear_cross_entropy* op, char** json_out) {
  return kjit::QueryOp(__func__, op, "json_out", json_out,
                       [&](const kjit::LinearCrossEntropy& lce) {
                         return kjit::ReturnBuild(lce.Build(), json_out);
                       });
}

// ---- Vocab-parallel cross-entropy -------------------------------------------------------------

void kjit_sharded_cross_entropy_spec_init(kjit_sharded_cross_entropy_spec* spec) {
  if (spec == nullptr) return;
  const kjit::ShardedCrossEntropySpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .shard_start = d.shard_start,
           .shard_end = d.shard_end,
           .dtype = static_cast<int32_t>(d.dtype),
           .loss = kjit::DefaultLossOptions(),
           .config = nullptr};
}

void kjit_sharded_cross_entropy_args_init(kjit_sharded_cross_entropy_args* args) {
  kjit::InitArgs(args);
}

kjit_status kjit_sharded_cross_entropy_create(const kjit_runtime* runtime,
                                              const kjit_sharded_cross_entropy_spec* spec,
                                              kjit_sharded_cross_entropy** out) {
  return kjit::CreateOp(__func__, runtime, spec, out);
}

void kjit_sharded_cross_entropy_destroy(kjit_sharded_cross_entropy* op) {
  kjit::DestroyHandle(__func__, op);
}

kjit_status kjit_sharded_cross_entropy_compute_stats(const kjit_sharded_cross_entropy* op,
                                                     CUstream stream,
                                                     const kjit_sharded_cross_entropy_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::ShardedCrossEntropy::ComputeStats);
}

kjit_status kjit_sharded_cross_entropy_all_reduce_stats(const kjit_sharded_cross_entropy* op,
                                                        CUstream stream, void* workspace,
                                                        int64_t rows, void* nccl_comm) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::NotNull(fn, {{"workspace", workspace}, {"nccl_comm", nccl_comm}}));
    return op->op.AllReduceStats(stream, workspace, rows, static_cast<kjit::NcclComm>(nccl_comm));
  });
}

kjit_status kjit_sharded_cross_entropy_stats_of(const kjit_sharded_cross_entropy* op,
                                                void* workspace, int64_t rows, float** max_out,
                                                float** sums_out) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::Output(fn, "max_out", max_out));
    KJIT_RETURN_IF_ERROR(kjit::Output(fn, "sums_out", sums_out));
    KJIT_RETURN_IF_ERROR(kjit::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::NotNull(fn, {{"workspace", workspace}}));
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    const kjit::ShardStatsView v = op->op.StatsOf(workspace, rows);
    *max_out = v.max;
    *sums_out = v.sums;
    return absl::OkStatus();
  });
}

kjit_status kjit_sharded_cross_entropy_rescale_stats(const kjit_sharded_cross_entropy* op,
                                                     CUstream stream, void* workspace,
                                                     int64_t rows) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::NotNull(fn, {{"workspace", workspace}}));
    return op->op.RescaleStats(stream, workspace, rows);
  });
}

kjit_status kjit_sharded_cross_entropy_combine_stats(CUstream stream,
                                                     const kjit_sharded_cross_entropy* const* ops,
                                                     void* const* workspaces, int32_t count,
                                                     int64_t rows) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::NotNull(fn, {{"ops", ops}, {"workspaces", workspaces}}));
    // Before the arrays are read: a count past their end would read past them.
    constexpr int32_t kMax = kjit::ShardedCrossEntropy::kMaxCombinedShards;
    if (count < 1 || count > kMax) {
      return absl::InvalidArgumentError(
          fmt::format("{}: count: {} shards, expected 1 to {}", fn, count, kMax));
    }
    std::vector<kjit::ShardedCrossEntropy::Shard> shards;
    for (int32_t i = 0; i < count; ++i) {
      const std::string name = fmt::format("ops[{}]", i);
      KJIT_RETURN_IF_ERROR(kjit::CheckHandle(fn, name.c_str(), ops[i]));
      const std::string ws = fmt::format("workspaces[{}]", i);
      KJIT_RETURN_IF_ERROR(kjit::NotNull(fn, {{ws.c_str(), workspaces[i]}}));
      shards.push_back({.op = &ops[i]->op, .workspace = workspaces[i]});
    }
    return kjit::ShardedCrossEntropy::CombineStats(stream, shards, rows);
  });
}

kjit_status kjit_sharded_cross_entropy_finish(const kjit_sharded_cross_entropy* op, CUstream stream,
                                              const kjit_sharded_cross_entropy_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::ShardedCrossEntropy::Finish);
}

kjit_status kjit_sharded_cross_entropy_run(const kjit_sharded_cross_entropy* op, CUstream stream,
                                           const kjit_sharded_cross_entropy_args* args,
                                           void* nccl_comm) {
  return kjit::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::NotNull(fn, {{"args", args}, {"nccl_comm", nccl_comm}}));
    KJIT_RETURN_IF_ERROR(kjit::CheckSize(fn, "args", *args));
    kjit::Fields f;
    const kjit::ShardedCrossEntropyArgs cpp = kjit::ToCpp(f, *args);
    KJIT_RETURN_IF_ERROR(f.status());
    return op->op.Run(stream, cpp, static_cast<kjit::NcclComm>(nccl_comm));
  });
}

kjit_status kjit_sharded_cross_entropy_workspace_bytes(const kjit_sharded_cross_entropy* op,
                                                       int64_t rows, int64_t* bytes) {
  return kjit::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::ShardedCrossEntropy& ce) {
    KJIT_RETURN_IF_ERROR(kjit::CheckRows(rows));
    *bytes = ce.WorkspaceBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_sharded_cross_entropy_config(const kjit_sharded_cross_entropy* op,
                                              char** config_out) {
  return kjit::QueryOp(__func__, op, "config_out", config_out,
                       [&](const kjit::ShardedCrossEntropy& ce) {
                         return kjit::Return(ce.config().ToString(), config_out);
                       });
}

kjit_status kjit_sharded_cross_entropy_build(const kjit_sharded_cross_entropy* op,
                                             char** json_out) {
  return kjit::QueryOp(
      __func__, op, "json_out", json_out,
      [&](const kjit::ShardedCrossEntropy& ce) { return kjit::ReturnBuild(ce.Build(), json_out); });
}

// ---- RL heads ---------------------------------------------------------------------------------

void kjit_log_probs_spec_init(kjit_log_probs_spec* spec) {
  if (spec == nullptr) return;
  const kjit::LogProbsSpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .dtype = static_cast<int32_t>(d.dtype),
           .target_type = static_cast<int32_t>(d.target_type),
           .ignore_index = d.ignore_index,
           .temperature = d.temperature,
           .entropy = d.entropy,
           .config = nullptr};
}

void kjit_log_probs_args_init(kjit_log_probs_args* args) { kjit::InitArgs(args); }

void kjit_log_probs_backward_args_init(kjit_log_probs_backward_args* args) { kjit::InitArgs(args); }

kjit_status kjit_log_probs_create(const kjit_runtime* runtime, const kjit_log_probs_spec* spec,
                                  kjit_log_probs** out) {
  return kjit::CreateOp(__func__, runtime, spec, out);
}

void kjit_log_probs_destroy(kjit_log_probs* op) { kjit::DestroyHandle(__func__, op); }

kjit_status kjit_log_probs_forward(const kjit_log_probs* op, CUstream stream,
                                   const kjit_log_probs_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::LogProbs::Forward);
}

kjit_status kjit_log_probs_backward(const kjit_log_probs* op, CUstream stream,
                                    const kjit_log_probs_backward_args* args) {
  return kjit::LaunchOp(__func__, op, stream, args, &kjit::LogProbs::Backward);
}

kjit_status kjit_log_probs_config(const kjit_log_probs* op, char** config_out) {
  return kjit::QueryOp(__func__, op, "config_out", config_out, [&](const kjit::LogProbs& lp) {
    return kjit::Return(lp.config().ToString(), config_out);
  });
}

kjit_status kjit_log_probs_build(const kjit_log_probs* op, char** json_out) {
  return kjit::QueryOp(__func__, op, "json_out", json_out, [&](const kjit::LogProbs& lp) {
    return kjit::ReturnBuild(lp.Build(), json_out);
  });
}
