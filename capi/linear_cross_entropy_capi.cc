// The C API's fused linear + cross-entropy entry points (kjit_linear_cross_entropy_*): the spec
// and the launch and rescale arguments converted to the C++ ones, the launches and the queries.
#include "capi/capi_common.h"

namespace kjit::capi {

template <>
constexpr const char* kStructName<kjit_linear_cross_entropy_spec> =
    "kjit_linear_cross_entropy_spec";
template <>
constexpr const char* kStructName<kjit_linear_cross_entropy_args> =
    "kjit_linear_cross_entropy_args";
template <>
constexpr const char* kStructName<kjit_linear_cross_entropy_rescale_args> =
    "kjit_linear_cross_entropy_rescale_args";

namespace {

constexpr const char* kAccumulationNames[] = {"KJIT_WEIGHT_GRAD_ACCUMULATION_FP32",
                                              "KJIT_WEIGHT_GRAD_ACCUMULATION_OUTPUT_DTYPE"};

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

}  // namespace

absl::StatusOr<kjit::LinearCrossEntropy> MakeOp(const Runtime& rt,
                                                const kjit_linear_cross_entropy_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const LinearCrossEntropySpec spec, ToSpec(c));
  return rt.LinearCrossEntropy(spec);
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

}  // namespace kjit::capi

void kjit_linear_cross_entropy_spec_init(kjit_linear_cross_entropy_spec* spec) {
  if (spec == nullptr) return;
  const kjit::LinearCrossEntropySpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .hidden = d.hidden,
           .dtype = static_cast<int32_t>(d.dtype),
           .weight_grad_dtype = -1,
           .bias = d.bias,
           .loss = kjit::capi::DefaultLossOptions(),
           .weight_grad_accumulation = static_cast<int32_t>(d.weight_grad_accumulation),
           .config = nullptr};
}

void kjit_linear_cross_entropy_args_init(kjit_linear_cross_entropy_args* args) {
  kjit::capi::InitArgs(args);
}

void kjit_linear_cross_entropy_rescale_args_init(kjit_linear_cross_entropy_rescale_args* args) {
  kjit::capi::InitArgs(args);
}

kjit_status kjit_linear_cross_entropy_create(const kjit_runtime* runtime,
                                             const kjit_linear_cross_entropy_spec* spec,
                                             kjit_linear_cross_entropy** out) {
  return kjit::capi::CreateOp(__func__, runtime, spec, out);
}

void kjit_linear_cross_entropy_destroy(kjit_linear_cross_entropy* op) {
  kjit::capi::DestroyHandle(__func__, op);
}

kjit_status kjit_linear_cross_entropy_forward(const kjit_linear_cross_entropy* op, CUstream stream,
                                              const kjit_linear_cross_entropy_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::LinearCrossEntropy::Forward);
}

kjit_status kjit_linear_cross_entropy_forward_backward(const kjit_linear_cross_entropy* op,
                                                       CUstream stream,
                                                       const kjit_linear_cross_entropy_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args,
                              &kjit::LinearCrossEntropy::ForwardBackward);
}

kjit_status kjit_linear_cross_entropy_rescale_gradients(
    const kjit_linear_cross_entropy* op, CUstream stream,
    const kjit_linear_cross_entropy_rescale_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args,
                              &kjit::LinearCrossEntropy::RescaleGradients);
}

kjit_status kjit_linear_cross_entropy_workspace_bytes(const kjit_linear_cross_entropy* op,
                                                      int64_t rows, int64_t* bytes) {
  return kjit::capi::QueryOp(__func__, op, "bytes", bytes,
                             [&](const kjit::LinearCrossEntropy& lce) {
                               KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
                               *bytes = lce.WorkspaceBytes(rows);
                               return absl::OkStatus();
                             });
}

kjit_status kjit_linear_cross_entropy_accumulator_bytes(const kjit_linear_cross_entropy* op,
                                                        int64_t rows, int64_t* bytes) {
  return kjit::capi::QueryOp(__func__, op, "bytes", bytes,
                             [&](const kjit::LinearCrossEntropy& lce) {
                               KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
                               *bytes = lce.AccumulatorBytes(rows);
                               return absl::OkStatus();
                             });
}

kjit_status kjit_linear_cross_entropy_config_for(const kjit_linear_cross_entropy* op, int64_t rows,
                                                 char** config_out) {
  return kjit::capi::QueryOp(
      __func__, op, "config_out", config_out, [&](const kjit::LinearCrossEntropy& lce) {
        KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
        return kjit::capi::Return(lce.ConfigFor(rows).ToString(), config_out);
      });
}

kjit_status kjit_linear_cross_entropy_build(const kjit_linear_cross_entropy* op, char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out,
                             [&](const kjit::LinearCrossEntropy& lce) {
                               return kjit::capi::ReturnBuild(lce.Build(), json_out);
                             });
}
