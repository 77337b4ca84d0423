// The C API's shared part that is not a template (capi/capi_common.h): the checks that the C
// header keeps absl's status codes and the C++ enums' values, this thread's last error, the handle
// kinds' names, and the loss options every loss spec holds.
#include "capi/capi_common.h"

#include <cstdlib>

namespace kjit::capi {
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

// The accepted values of the loss options' enum fields, from 0 (class_weight_dtype's from -1).
constexpr const char* kClassWeightDTypeNames[] = {"none", "KJIT_F32", "KJIT_F16", "KJIT_BF16"};
constexpr const char* kReductionNames[] = {"KJIT_REDUCTION_NONE", "KJIT_REDUCTION_SUM",
                                           "KJIT_REDUCTION_MEAN"};

}  // namespace

thread_local std::string last_error;

kjit_status Fail(kjit_status code, std::string_view message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    last_error.clear();  // no memory even for the message
  }
  return code;
}

absl::Status NotNull(const char* fn,
                     std::initializer_list<std::pair<const char*, const void*>> pointers) {
  for (const auto& [name, p] : pointers) {
    if (p == nullptr) return absl::InvalidArgumentError(fmt::format("{}: {} is NULL", fn, name));
  }
  return absl::OkStatus();
}

const char* KindName(kjit_handle_kind kind) {
  switch (kind) {
    case kjit_handle_kind::kRuntime: return "kjit_runtime";
    case kjit_handle_kind::kRmsNorm: return "kjit_rms_norm";
    case kjit_handle_kind::kCrossEntropy: return "kjit_cross_entropy";
    case kjit_handle_kind::kLinearCrossEntropy: return "kjit_linear_cross_entropy";
    case kjit_handle_kind::kShardedCrossEntropy: return "kjit_sharded_cross_entropy";
    case kjit_handle_kind::kLogProbs: return "kjit_log_probs";
    case kjit_handle_kind::kOp: return "kjit_op";
    case kjit_handle_kind::kDestroyed: break;
  }
  return nullptr;
}

absl::Status CheckRows(int64_t rows) {
  if (rows >= 0 && rows <= INT32_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("rows: {} is out of range, expected 0 to {}", rows, INT32_MAX));
}

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

// The structured bindings here and in DefaultLossOptions stop the build when kjit::LossOptions or
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

}  // namespace kjit::capi
