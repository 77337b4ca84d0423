// The C API's RMSNorm entry points (kjit_rms_norm_*): the spec and the forward and backward
// arguments converted to the C++ ones, the launches and the queries.
#include "capi/capi_common.h"
#include "capi/op_entry.h"

namespace kjit::capi {

template <>
constexpr const char* kStructName<kjit_rms_norm_spec> = "kjit_rms_norm_spec";
template <>
constexpr const char* kStructName<kjit_rms_norm_forward_args> = "kjit_rms_norm_forward_args";
template <>
constexpr const char* kStructName<kjit_rms_norm_backward_args> = "kjit_rms_norm_backward_args";

namespace {

constexpr const char* kCastingNames[] = {"KJIT_CASTING_LLAMA", "KJIT_CASTING_GEMMA",
                                         "KJIT_CASTING_NONE"};

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

}  // namespace

absl::StatusOr<kjit::RmsNorm> MakeOp(const Runtime& rt, const kjit_rms_norm_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const RmsNormSpec spec, ToSpec(c));
  return rt.RmsNorm(spec);
}
RmsNormForwardArgs ToCpp(Fields& f, const kjit_rms_norm_forward_args& a) {
  return {KJIT_VIEW(x),    KJIT_VIEW(weight),   KJIT_VIEW(y),
          KJIT_VIEW(rstd), KJIT_VIEW(residual), KJIT_VIEW(residual_out)};
}
RmsNormBackwardArgs ToCpp(Fields& f, const kjit_rms_norm_backward_args& a) {
  return {KJIT_VIEW(dy), KJIT_VIEW(x),  KJIT_VIEW(weight),    KJIT_VIEW(rstd),
          KJIT_VIEW(dx), KJIT_VIEW(dw), KJIT_VIEW(dresidual), KJIT_WORKSPACE};
}

}  // namespace kjit::capi

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

void kjit_rms_norm_forward_args_init(kjit_rms_norm_forward_args* args) {
  kjit::capi::InitArgs(args);
}

void kjit_rms_norm_backward_args_init(kjit_rms_norm_backward_args* args) {
  kjit::capi::InitArgs(args);
}

kjit_status kjit_rms_norm_create(const kjit_runtime* runtime, const kjit_rms_norm_spec* spec,
                                 kjit_rms_norm** out) {
  return kjit::capi::CreateOp(__func__, runtime, spec, out);
}

void kjit_rms_norm_destroy(kjit_rms_norm* op) { kjit::capi::DestroyHandle(__func__, op); }

kjit_status kjit_rms_norm_forward(const kjit_rms_norm* op, CUstream stream,
                                  const kjit_rms_norm_forward_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::RmsNorm::Forward);
}

kjit_status kjit_rms_norm_backward(const kjit_rms_norm* op, CUstream stream,
                                   const kjit_rms_norm_backward_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::RmsNorm::Backward);
}

kjit_status kjit_rms_norm_backward_workspace_bytes(const kjit_rms_norm* op, int64_t rows,
                                                   int64_t* bytes) {
  return kjit::capi::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::RmsNorm& norm) {
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
    *bytes = norm.BackwardWorkspaceBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_rms_norm_config_for(const kjit_rms_norm* op, int64_t rows, char** config_out) {
  return kjit::capi::QueryOp(
      __func__, op, "config_out", config_out, [&](const kjit::RmsNorm& norm) {
        KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
        return kjit::capi::Return(norm.ConfigFor(rows).ToString(), config_out);
      });
}

kjit_status kjit_rms_norm_build(const kjit_rms_norm* op, char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out, [&](const kjit::RmsNorm& norm) {
    return kjit::capi::ReturnBuild(norm.Build(), json_out);
  });
}

// RMSNorm by name too (kjit_op_*, capi/op_entry.h): {"op": "rms_norm", ...}.
namespace kjit::capi {
namespace {

const OpBinding<kjit::RmsNorm, RmsNormSpec> kRmsNormByName{
    .kind = "rms_norm",
    .to_json = kjit::ToJson,
    .from_json = RmsNormSpecFromJson,
    .parse_config = ConfigParser<RmsNormSpec>(ParseRmsNormConfig),
    .create = [](const Runtime& rt, const RmsNormSpec& s) { return rt.RmsNorm(s); },
    .passes = {Pass("forward", &kjit::RmsNorm::Forward, TensorArg("x", &RmsNormForwardArgs::x),
                    TensorArg("weight", &RmsNormForwardArgs::weight),
                    TensorArg("y", &RmsNormForwardArgs::y),
                    TensorArg("rstd", &RmsNormForwardArgs::rstd),
                    TensorArg("residual", &RmsNormForwardArgs::residual),
                    TensorArg("residual_out", &RmsNormForwardArgs::residual_out)),
               Pass("backward", &kjit::RmsNorm::Backward, TensorArg("dy", &RmsNormBackwardArgs::dy),
                    TensorArg("x", &RmsNormBackwardArgs::x),
                    TensorArg("weight", &RmsNormBackwardArgs::weight),
                    TensorArg("rstd", &RmsNormBackwardArgs::rstd),
                    TensorArg("dx", &RmsNormBackwardArgs::dx),
                    TensorArg("dw", &RmsNormBackwardArgs::dw),
                    TensorArg("dresidual", &RmsNormBackwardArgs::dresidual))
                   .Workspace(&kjit::RmsNorm::BackwardWorkspaceBytes)},
    .config_for = [](const kjit::RmsNorm& op,
                     int64_t rows) { return op.ConfigFor(rows).ToString(); }};
KJIT_C_OP(kRmsNormByName);

}  // namespace
}  // namespace kjit::capi
