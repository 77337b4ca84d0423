// The C API's cross-entropy entry points (kjit_cross_entropy_*): the spec and the forward,
// backward and rescale arguments converted to the C++ ones, the launches and the queries.
#include "capi/capi_common.h"

namespace kjit::capi {

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

namespace {

absl::StatusOr<CrossEntropySpec> ToSpec(const kjit_cross_entropy_spec& c) {
  Fields f;
  CrossEntropySpec spec{
      .vocab = c.vocab, .dtype = f.Dtype({"dtype"}, c.dtype), .loss = ToCpp(f, c.loss)};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseCrossEntropyConfig));
  return spec;
}

}  // namespace

absl::StatusOr<kjit::CrossEntropy> MakeOp(const Runtime& rt, const kjit_cross_entropy_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const CrossEntropySpec spec, ToSpec(c));
  return rt.CrossEntropy(spec);
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

}  // namespace kjit::capi

void kjit_cross_entropy_spec_init(kjit_cross_entropy_spec* spec) {
  if (spec == nullptr) return;
  const kjit::CrossEntropySpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .dtype = static_cast<int32_t>(d.dtype),
           .loss = kjit::capi::DefaultLossOptions(),
           .config = nullptr};
}

void kjit_cross_entropy_args_init(kjit_cross_entropy_args* args) { kjit::capi::InitArgs(args); }

void kjit_cross_entropy_backward_args_init(kjit_cross_entropy_backward_args* args) {
  kjit::capi::InitArgs(args);
}

void kjit_cross_entropy_rescale_args_init(kjit_cross_entropy_rescale_args* args) {
  kjit::capi::InitArgs(args);
}

kjit_status kjit_cross_entropy_create(const kjit_runtime* runtime,
                                      const kjit_cross_entropy_spec* spec,
                                      kjit_cross_entropy** out) {
  return kjit::capi::CreateOp(__func__, runtime, spec, out);
}

void kjit_cross_entropy_destroy(kjit_cross_entropy* op) { kjit::capi::DestroyHandle(__func__, op); }

kjit_status kjit_cross_entropy_forward(const kjit_cross_entropy* op, CUstream stream,
                                       const kjit_cross_entropy_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::Forward);
}

kjit_status kjit_cross_entropy_forward_backward(const kjit_cross_entropy* op, CUstream stream,
                                                const kjit_cross_entropy_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::ForwardBackward);
}

kjit_status kjit_cross_entropy_backward(const kjit_cross_entropy* op, CUstream stream,
                                        const kjit_cross_entropy_backward_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::Backward);
}

kjit_status kjit_cross_entropy_rescale_gradient(const kjit_cross_entropy* op, CUstream stream,
                                                const kjit_cross_entropy_rescale_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::CrossEntropy::RescaleGradient);
}

kjit_status kjit_cross_entropy_workspace_bytes(const kjit_cross_entropy* op, int64_t rows,
                                               int64_t* bytes) {
  return kjit::capi::QueryOp(__func__, op, "bytes", bytes, [&](const kjit::CrossEntropy& ce) {
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
    *bytes = ce.WorkspaceBytes(rows);
    return absl::OkStatus();
  });
}

kjit_status kjit_cross_entropy_config_for(const kjit_cross_entropy* op, int64_t rows, int32_t fused,
                                          char** config_out) {
  return kjit::capi::QueryOp(
      __func__, op, "config_out", config_out, [&](const kjit::CrossEntropy& ce) {
        KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
        kjit::capi::Fields f;
        const bool fused_pass = f.Flag("fused", fused);
        KJIT_RETURN_IF_ERROR(f.status());
        return kjit::capi::Return(ce.ConfigFor(rows, fused_pass).ToString(), config_out);
      });
}

kjit_status kjit_cross_entropy_build(const kjit_cross_entropy* op, char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out, [&](const kjit::CrossEntropy& ce) {
    return kjit::capi::ReturnBuild(ce.Build(), json_out);
  });
}
