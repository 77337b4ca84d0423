#include "kjit/log_probs.h"

#include <climits>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "jit/dtype.h"
#include "jit/instantiation.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/program.h"
#include "ops/log_probs/program.h"
#include "runtime/op_kernels.h"
#include "runtime/runtime_state.h"
#include "runtime/tensor_checks.h"
#include "templates/log_probs_params.h"

namespace kjit {

namespace {

constexpr int64_t kMinVocab = 2;
constexpr int64_t kMaxVocab = int64_t{1} << 20;

std::string KernelExpr(const LogProbsSpec& s, const CrossEntropyConfig& c,
                       ops::LogProbsProgram program) {
  const jit::TemplateArgs row = {s.dtype, s.target_type, s.vocab, c.threads, c.vec, c.unroll};
  if (program == ops::LogProbsProgram::kForward) {
    return jit::Instantiate("kjit::log_probs_forward", row, s.entropy);
  }
  return jit::Instantiate("kjit::log_probs_backward", row);
}

}  // namespace

absl::Status ValidateLogProbsSpec(const LogProbsSpec& spec) {
  if (spec.vocab < kMinVocab || spec.vocab > kMaxVocab) {
    return absl::InvalidArgumentError(fmt::format("vocab: {} is out of range, expected {} to {}",
                                                  spec.vocab, kMinVocab, kMaxVocab));
  }
  if (!(spec.temperature > 0) || !std::isfinite(spec.temperature)) {
    return absl::InvalidArgumentError(
        fmt::format("temperature: {} must be a finite number > 0", spec.temperature));
  }
  if (!std::isfinite(1.0f / spec.temperature)) {
    return absl::InvalidArgumentError(
        fmt::format("temperature: {} is too small: 1 / T overflows fp32", spec.temperature));
  }
  if (spec.target_type == IndexType::kInt32 &&
      (spec.ignore_index < INT32_MIN || spec.ignore_index > INT32_MAX)) {
    return absl::InvalidArgumentError(
        fmt::format("ignore_index: {} does not fit the int32 targets", spec.ignore_index));
  }
  if (spec.config) KJIT_RETURN_IF_ERROR(ops::ValidateLogProbsConfig(spec, *spec.config));
  return absl::OkStatus();
}

const char* ops::LogProbsProgramName(LogProbsProgram program) {
  return program == LogProbsProgram::kForward ? "forward" : "backward";
}

CrossEntropyConfig ops::LogProbsConfig(const LogProbsSpec& spec, int arch) {
  if (spec.config) return *spec.config;
  const int elem = static_cast<int>(SizeOf(spec.dtype));
  CrossEntropyConfig c =
      DefaultCrossEntropyConfig(spec.vocab, MaxVecForCrossEntropy(elem), arch, elem);
  c.cluster = 0;
  c.staged = 0;
  return c;
}

absl::Status ops::ValidateLogProbsConfig(const LogProbsSpec& spec,
                                         const CrossEntropyConfig& config) {
  if (config.cluster != 0 || config.staged != 0) {
    return absl::InvalidArgumentError(
        fmt::format("config.cluster: {} (staged {}): the RL heads' kernels stream the row; use "
                    "cluster=0 staged=0",
                    config.cluster, config.staged));
  }
  const CrossEntropySpec as_loss{.vocab = spec.vocab, .dtype = spec.dtype};
  return ValidateCrossEntropyConfig(as_loss, config, /*arch=*/0);
}

namespace {
// What the kernels are compiled for: the temperature and ignore_index are launch arguments, so
// that one program (and cache entry) serves every temperature.
std::map<std::string, std::string> ProgramParams(const LogProbsSpec& spec) {
  return {{"op", "log_probs"},
          {"vocab", std::to_string(spec.vocab)},
          {"dtype", Name(spec.dtype)},
          {"target_type", Name(spec.target_type)},
          {"entropy", spec.entropy ? "true" : "false"}};
}
}  // namespace

std::map<std::string, std::string> ops::LogProbsParams(const LogProbsSpec& spec) {
  std::map<std::string, std::string> params = ProgramParams(spec);
  params["ignore_index"] = std::to_string(spec.ignore_index);
  params["temperature"] = fmt::format("{}", spec.temperature);
  return params;
}

absl::StatusOr<jit::Source> ops::RenderLogProbs(const LogProbsSpec& spec,
                                                const CrossEntropyConfig& config,
                                                LogProbsProgram program) {
  KJIT_RETURN_IF_ERROR(ValidateLogProbsSpec(spec));
  KJIT_RETURN_IF_ERROR(ValidateLogProbsConfig(spec, config));
  std::map<std::string, std::string> params = ProgramParams(spec);
  params["vec"] = std::to_string(config.vec);
  params["threads"] = std::to_string(config.threads);
  params["unroll"] = std::to_string(config.unroll);
  return jit::RenderSource(fmt::format("log_probs.{}", LogProbsProgramName(program)),
                           {"common.cuh", "cross_entropy_params.h", "cross_entropy.cuh",
                            "log_probs_params.h", "log_probs.cuh"},
                           {KernelExpr(spec, config, program)}, std::move(params));
}

absl::StatusOr<std::vector<jit::Source>> ops::RenderLogProbsPrograms(
    const LogProbsSpec& spec, const CrossEntropyConfig& config) {
  KJIT_ASSIGN_OR_RETURN(jit::Source forward,
                        RenderLogProbs(spec, config, LogProbsProgram::kForward));
  KJIT_ASSIGN_OR_RETURN(jit::Source backward,
                        RenderLogProbs(spec, config, LogProbsProgram::kBackward));
  return std::vector<jit::Source>{std::move(forward), std::move(backward)};
}

namespace internal {

// A loaded kernel's key: its config and program ("vec=8 ... staged=0 forward").
struct LogProbsLaunchConfig {
  CrossEntropyConfig config;
  ops::LogProbsProgram program;
  std::string ToString() const { return config.ToString() + " " + LogProbsProgramName(program); }
};

struct LogProbsKernels {
  CrossEntropyConfig config;
  LoadedProgram program;
};

struct LogProbsState {
  LogProbsSpec spec;
  CrossEntropyConfig config;  // the spec's or the heuristic's, for the widest vector
  int arch = 0;
  OpKernels<LogProbsLaunchConfig, LogProbsKernels> kernels;
};

}  // namespace internal

namespace {

absl::StatusOr<const internal::LogProbsKernels*> KernelsFor(const internal::RuntimeState& rt,
                                                            internal::LogProbsState& op, int vec,
                                                            ops::LogProbsProgram program) {
  return op.kernels.Get(
      [&] {
        CrossEntropyConfig c = op.config;
        if (vec < c.vec) {
          const int elem = static_cast<int>(SizeOf(op.spec.dtype));
          c = ops::DefaultCrossEntropyConfig(op.spec.vocab, vec, op.arch, elem);
          c.cluster = c.staged = 0;
        }
        return internal::LogProbsLaunchConfig{c, program};
      },
      [&](const internal::LogProbsLaunchConfig& lc) -> absl::StatusOr<internal::LogProbsKernels> {
        KJIT_ASSIGN_OR_RETURN(jit::Source src, ops::RenderLogProbs(op.spec, lc.config, lc.program));
        KJIT_ASSIGN_OR_RETURN(internal::LoadedProgram loaded, internal::LoadProgram(rt, src));
        return internal::LogProbsKernels{lc.config, std::move(loaded)};
      });
}

// The logits and targets every launch takes; their rows. One block per row: the grid's x
// dimension bounds the rows.
absl::StatusOr<int64_t> CheckLogitsAndTargets(const LogProbsSpec& s, const TensorView& logits,
                                              const IndexView& targets) {
  KJIT_RETURN_IF_ERROR(
      internal::CheckMatrix("logits", logits, s.dtype, internal::kAnyRows, s.vocab));
  if (logits.rows > INT_MAX) {
    return absl::InvalidArgumentError(
        fmt::format("logits: {} rows exceed the {} a launch handles", logits.rows, INT_MAX));
  }
  KJIT_RETURN_IF_ERROR(internal::CheckIndexVector("targets", targets, s.target_type, logits.rows));
  return logits.rows;
}

// An optional fp32 [rows] vector.
absl::Status CheckOptionalRows(std::string_view name, const TensorView& v, int64_t rows) {
  if (v.empty()) return absl::OkStatus();
  return internal::CheckMatrix(name, v, DType::kF32, 1, rows);
}

LogProbsParams BaseParams(const LogProbsSpec& s, const TensorView& logits,
                          const IndexView& targets) {
  LogProbsParams p{};
  p.logits = logits.data;
  p.logits_stride = logits.row_stride;
  p.targets = targets.data;
  p.rows = logits.rows;
  p.ignore_index = s.ignore_index;
  p.inv_temperature = 1.0f / s.temperature;
  return p;
}

}  // namespace

const LogProbsSpec& LogProbs::spec() const { return op_->spec; }
const CrossEntropyConfig& LogProbs::config() const { return op_->config; }

absl::Status LogProbs::Forward(CUstream stream, const LogProbsArgs& a) const {
  const LogProbsSpec& s = op_->spec;
  KJIT_ASSIGN_OR_RETURN(const int64_t rows, CheckLogitsAndTargets(s, a.logits, a.targets));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("logprob", a.logprob, DType::kF32, 1, rows));
  if (s.entropy) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("entropy", a.entropy, DType::kF32, 1, rows));
  } else if (!a.entropy.empty()) {
    return absl::InvalidArgumentError(
        "entropy: given, but the op was made without spec.entropy (its kernel computes none)");
  }
  KJIT_RETURN_IF_ERROR(CheckOptionalRows("lse", a.lse, rows));
  KJIT_RETURN_IF_ERROR(
      internal::CheckDisjoint({{"logprob", a.logprob}, {"entropy", a.entropy}, {"lse", a.lse}},
                              {{"logits", a.logits}, {"targets", internal::BytesOf(a.targets)}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());
  const int vec = internal::WidestVecAlignedAlike(op_->config.vec, a.logits, {});
  KJIT_ASSIGN_OR_RETURN(const internal::LogProbsKernels* k,
                        KernelsFor(*rt_, *op_, vec, ops::LogProbsProgram::kForward));
  LogProbsParams p = BaseParams(s, a.logits, a.targets);
  p.logprob = static_cast<float*>(a.logprob.data);
  p.entropy = static_cast<float*>(a.entropy.data);
  p.lse = static_cast<float*>(a.lse.data);
  return rt_->Launch(k->program.functions.at(0), rows, k->config.threads, stream, &p);
}

absl::Status LogProbs::Backward(CUstream stream, const LogProbsBackwardArgs& a) const {
  const LogProbsSpec& s = op_->spec;
  KJIT_ASSIGN_OR_RETURN(const int64_t rows, CheckLogitsAndTargets(s, a.logits, a.targets));
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("lse", a.lse, DType::kF32, 1, rows));
  KJIT_RETURN_IF_ERROR(CheckOptionalRows("grad_logprob", a.grad_logprob, rows));
  KJIT_RETURN_IF_ERROR(CheckOptionalRows("grad_entropy", a.grad_entropy, rows));
  if (!a.grad_entropy.empty()) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("entropy", a.entropy, DType::kF32, 1, rows));
  } else {
    KJIT_RETURN_IF_ERROR(CheckOptionalRows("entropy", a.entropy, rows));
  }
  KJIT_RETURN_IF_ERROR(internal::CheckMatrix("grad", a.grad, s.dtype, rows, s.vocab));
  if (a.grad.data == a.logits.data && a.grad.row_stride != a.logits.row_stride) {
    return absl::InvalidArgumentError(fmt::format(
        "grad: aliases logits with row_stride {} instead of {} (in place needs the same view)",
        a.grad.row_stride, a.logits.row_stride));
  }
  KJIT_RETURN_IF_ERROR(internal::CheckDisjoint({{"grad", a.grad}},
                                               {{"logits", a.logits},
                                                {"targets", internal::BytesOf(a.targets)},
                                                {"lse", a.lse},
                                                {"entropy", a.entropy},
                                                {"grad_logprob", a.grad_logprob},
                                                {"grad_entropy", a.grad_entropy}},
                                               /*in_place=*/{{"grad", "logits"}}));
  KJIT_RETURN_IF_ERROR(rt_->NeedsDevice());
  const int vec = internal::WidestVecAlignedAlike(op_->config.vec, a.logits, {&a.grad});
  KJIT_ASSIGN_OR_RETURN(const internal::LogProbsKernels* k,
                        KernelsFor(*rt_, *op_, vec, ops::LogProbsProgram::kBackward));
  LogProbsParams p = BaseParams(s, a.logits, a.targets);
  p.lse_in = static_cast<const float*>(a.lse.data);
  p.entropy_in = static_cast<const float*>(a.entropy.data);
  p.grad_logprob = static_cast<const float*>(a.grad_logprob.data);
  p.grad_entropy = static_cast<const float*>(a.grad_entropy.data);
  p.grad = a.grad.data;
  p.grad_stride = a.grad.row_stride;
  return rt_->Launch(k->program.functions.at(0), rows, k->config.threads, stream, &p);
}

absl::StatusOr<BuildInfo> LogProbs::Build() const {
  KJIT_ASSIGN_OR_RETURN(std::vector<jit::Source> sources,
                        ops::RenderLogProbsPrograms(op_->spec, op_->config));
  KJIT_ASSIGN_OR_RETURN(std::vector<jit::Jit::Built> built,
                        rt_->jit->BuildAll(sources, rt_->target));
  BuildInfo info = internal::ToBuildInfo(built);
  info.params = ops::LogProbsParams(op_->spec);
  info.params["config"] = op_->config.ToString();
  return info;
}

absl::StatusOr<kjit::LogProbs> Runtime::LogProbs(const LogProbsSpec& spec) const {
  KJIT_RETURN_IF_ERROR(ValidateLogProbsSpec(spec));
  KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(state_->target, {{"dtype", spec.dtype}}));
  auto op = std::make_shared<internal::LogProbsState>();
  op->spec = spec;
  op->arch = state_->target.arch;
  op->config = ops::LogProbsConfig(spec, op->arch);
  return kjit::LogProbs(state_, op);
}

}  // namespace kjit
