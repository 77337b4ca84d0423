// The cross-entropy programs: launch configs' validity for a spec and GPU, and the rendering of
// the kernels (count, forward, fused forward+backward, backward, gradient rescale, loss reduce;
// and the sharded op's) for the JIT. No GPU needed.
//
// The op's kernels are compiled as several programs, each its own cache entry. A kernel takes 50
// to 220 ms to compile (the fused forward+backward the longest; NVVM and ptxas, hardly the front
// end), and a launch runs at most three of the six: so the first launch compiles only the programs
// it loads, in parallel, and the kernels that do not depend on the whole config are compiled once
// for all the configs that share them (count and reduce once for every config kjit-tune tries).
//
//   KJIT_RETURN_IF_ERROR(ValidateCrossEntropyConfig(spec, config, /*arch=*/90));
//   for (CrossEntropyProgram p : CrossEntropyLaunchPrograms(CrossEntropyLaunch::kForward))
//     KJIT_ASSIGN_OR_RETURN(jit::Source src, RenderCrossEntropy(spec, config, p));
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "jit/instantiation.h"
#include "jit/source.h"
#include "kjit/cross_entropy.h"
#include "kjit/sharded_cross_entropy.h"

namespace kjit::ops {

// InvalidArgument naming the field when `config` cannot run `spec` on GPUs of compute capability
// `arch`; arch 0 (not known yet) checks a staged config as for sm_90.
absl::Status ValidateCrossEntropyConfig(const CrossEntropySpec& spec,
                                        const CrossEntropyConfig& config, int arch);

// The op's programs: each row kernel is one, and the two small kernels that no config changes,
// count and reduce, are one together.
enum class CrossEntropyProgram {
  kCountReduce,      // the valid rows' count (every launch but the rescale's) and, for sum and
                     // mean, the reduce of the per-row losses into one (the forward launches)
  kForward,          // loss (lse, argmax) of a row, streamed
  kForwardBackward,  // loss and gradient; staged, resident or streaming by the config
  kBackward,         // the gradient from a saved lse
  kRescaleGradient,  // CrossEntropy::RescaleGradient
};
// "count_reduce", "forward", "forward_backward", "backward", "rescale_gradient".
const char* CrossEntropyProgramName(CrossEntropyProgram program);

// The launch sequences of the op's API.
enum class CrossEntropyLaunch { kForward, kForwardBackward, kBackward, kRescaleGradient };
// The programs `launch` loads: its row kernel's, then count_reduce (count, the row kernel, and
// reduce for a forward of sum or mean), or the rescale's alone. The longest first: compiled in
// parallel, they start in this order.
std::vector<CrossEntropyProgram> CrossEntropyLaunchPrograms(CrossEntropyLaunch launch);

// The op's parameters as CrossEntropy::Build reports them (no config), the options' values among
// them.
std::map<std::string, std::string> CrossEntropyParams(const CrossEntropySpec& spec);
// What its programs are compiled for, their params (so in their text and cache key): the same,
// but label_smoothing, z_loss and softcap only "on" or "0" (off), since the kernels read
// their values at launch: a schedule of values compiles nothing new.
std::map<std::string, std::string> CrossEntropyProgramParams(const CrossEntropySpec& spec);

// One program: named "cross_entropy.<program>", its params the spec's and the fields of the
// config its kernels take (none for count_reduce, vec for the rescale...), so that the configs
// which share a kernel share its program and cache entry. count_reduce's kernels are count, then
// reduce for sum and mean; the others hold one kernel.
absl::StatusOr<jit::Source> RenderCrossEntropy(const CrossEntropySpec& spec,
                                               const CrossEntropyConfig& config,
                                               CrossEntropyProgram program);
// Every program the op's launches may load with `config`, forward_backward first: what
// CrossEntropy::Build (so `kjit compile` and kjit-tune) prebuilds, so that a later first launch of
// any kind finds them in the cache.
absl::StatusOr<std::vector<jit::Source>> RenderCrossEntropyPrograms(
    const CrossEntropySpec& spec, const CrossEntropyConfig& config);

// The count kernel of a spec's program, with `threads` threads (the sharded op's counts over the
// whole vocab with the same kernel).
std::string CrossEntropyCountExpr(const CrossEntropySpec& spec, int threads);
// The kernel that reduces the per-row losses into one (sum or mean), one block of `threads`.
std::string CrossEntropyReduceExpr(Reduction reduction, int threads);

// The loss kernels' template arguments for a reduction ("kjit::kCeMean"), for the loss terms
// compiled in ("kjit::CeLossTerms<true, false, false>": label smoothing, z-loss, softcap, each on
// or off) and for the class weights' type (their device type, or "kjit::NoClassWeight").
jit::TemplateArg ReductionArg(Reduction reduction);
jit::TemplateArg LossTermsArg(const LossOptions& loss);
jit::TemplateArg ClassWeightArg(const std::optional<DType>& class_weight_dtype);

absl::StatusOr<jit::Source> RenderShardedCrossEntropy(const ShardedCrossEntropySpec& spec,
                                                      const CrossEntropyConfig& config);
// The config the sharded op uses without spec.config: the streaming heuristic for the shard's
// width.
CrossEntropyConfig DefaultShardedCrossEntropyConfig(int64_t width, int vec);

}  // namespace kjit::ops
