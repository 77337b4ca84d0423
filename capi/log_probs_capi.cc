// The C API's RL heads' entry points (kjit_log_probs_*): the target tokens' log-probabilities
// (and entropy) per row, their spec and arguments converted to the C++ ones, the launches and the
// queries.
#include "capi/capi_common.h"

namespace kjit::capi {

template <>
constexpr const char* kStructName<kjit_log_probs_spec> = "kjit_log_probs_spec";
template <>
constexpr const char* kStructName<kjit_log_probs_args> = "kjit_log_probs_args";
template <>
constexpr const char* kStructName<kjit_log_probs_backward_args> = "kjit_log_probs_backward_args";

namespace {

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

}  // namespace

absl::StatusOr<kjit::LogProbs> MakeOp(const Runtime& rt, const kjit_log_probs_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const LogProbsSpec spec, ToSpec(c));
  return rt.LogProbs(spec);
}
LogProbsArgs ToCpp(Fields& f, const kjit_log_probs_args& a) {
  return {KJIT_VIEW(logits), KJIT_INDEX(targets), KJIT_VIEW(logprob), KJIT_VIEW(entropy),
          KJIT_VIEW(lse)};
}
LogProbsBackwardArgs ToCpp(Fields& f, const kjit_log_probs_backward_args& a) {
  return {KJIT_VIEW(logits),       KJIT_INDEX(targets),     KJIT_VIEW(lse), KJIT_VIEW(entropy),
          KJIT_VIEW(grad_logprob), KJIT_VIEW(grad_entropy), KJIT_VIEW(grad)};
}

}  // namespace kjit::capi

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

void kjit_log_probs_args_init(kjit_log_probs_args* args) { kjit::capi::InitArgs(args); }

void kjit_log_probs_backward_args_init(kjit_log_probs_backward_args* args) {
  kjit::capi::InitArgs(args);
}

kjit_status kjit_log_probs_create(const kjit_runtime* runtime, const kjit_log_probs_spec* spec,
                                  kjit_log_probs** out) {
  return kjit::capi::CreateOp(__func__, runtime, spec, out);
}

void kjit_log_probs_destroy(kjit_log_probs* op) { kjit::capi::DestroyHandle(__func__, op); }

kjit_status kjit_log_probs_forward(const kjit_log_probs* op, CUstream stream,
                                   const kjit_log_probs_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::LogProbs::Forward);
}

kjit_status kjit_log_probs_backward(const kjit_log_probs* op, CUstream stream,
                                    const kjit_log_probs_backward_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::LogProbs::Backward);
}

kjit_status kjit_log_probs_config(const kjit_log_probs* op, char** config_out) {
  return kjit::capi::QueryOp(__func__, op, "config_out", config_out, [&](const kjit::LogProbs& lp) {
    return kjit::capi::Return(lp.config().ToString(), config_out);
  });
}

kjit_status kjit_log_probs_build(const kjit_log_probs* op, char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out, [&](const kjit::LogProbs& lp) {
    return kjit::capi::ReturnBuild(lp.Build(), json_out);
  });
}
