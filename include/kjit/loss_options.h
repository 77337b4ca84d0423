// LossOptions: the options every cross-entropy loss takes, one struct held by CrossEntropySpec,
// ShardedCrossEntropySpec and LinearCrossEntropySpec as `spec.loss`, mirrored once in the C API
// (kjit_loss_options) and once in Python (the same keyword names). An option has one name
// everywhere: these fields, the spec JSON's keys, `kjit compile`'s flags (with dashes), the C
// struct's fields and the Python keywords.
//
// Per row i with target t (capped logits x = softcap * tanh(raw / softcap) when softcap > 0),
// eps = label_smoothing, z = z_loss, V = vocab:
//   lse  = log sum_j exp(x_j)
//   loss = (1 - eps)(lse - x_t) + eps (lse - mean_j x_j) + z lse^2
// Rows whose target is ignore_index get loss 0 and do not count for the mean. reduction keeps
// the per-row losses (none), adds them (sum) or averages them over the valid rows (mean). With
// class weights w (class_weight_dtype set; PyTorch's `weight`), the row's terms are weighed as
// kjit/cross_entropy.h writes out, and the mean divides by the valid rows' summed w_t. argmax and
// entropy ask for per-row outputs (the predicted token; -sum_j p_j ln p_j). The kernels are
// compiled for label_smoothing, z_loss and softcap on or off and take their values at launch: a
// schedule of values costs no compile and no cache entry; switching one on or off compiles anew.
//
//   kjit::LossOptions loss{.ignore_index = -100, .label_smoothing = 0.1f, .z_loss = 1e-4f};
//   KJIT_RETURN_IF_ERROR(kjit::ValidateLossOptions(loss, kjit::DType::kBF16));
//   rt.CrossEntropy({.vocab = 128256, .dtype = kjit::DType::kBF16, .loss = loss});
#pragma once

#include <cstdint>
#include <optional>

#include "kjit/dtype.h"
#include "kjit/status.h"
#include "kjit/tensor.h"

namespace kjit {

// How per-row losses become the loss output: kept per row, summed, or averaged over the rows whose
// target is not ignored.
enum class Reduction { kNone, kSum, kMean };
const char* Name(Reduction r);  // "none", "sum", "mean"

struct LossOptions {
  IndexType target_type = IndexType::kInt64;  // targets (and argmax)
  int64_t ignore_index = -100;                // must fit target_type
  Reduction reduction = Reduction::kMean;
  float label_smoothing = 0;  // eps, in [0, 1)
  float z_loss = 0;           // z, the coefficient of lse^2 (PaLM's z-loss), >= 0
  float softcap = 0;          // 0: off; else > 0, logits become softcap * tanh(x / softcap)
  bool argmax = false;        // launches write the predicted token per row (args.argmax)
  bool entropy = false;       // launches write the softmax's entropy per row (args.entropy)
  // Per-class weights: fp32 or the logits' dtype. Launches then take `class_weight`, a [vocab]
  // vector read on the device, so one compiled program serves every weight vector.
  std::optional<DType> class_weight_dtype;
  bool operator==(const LossOptions&) const = default;
};

// Checks the options for logits of `dtype` without a GPU; InvalidArgument names the bad option
// ("label_smoothing: 1 must be in [0, 1)").
absl::Status ValidateLossOptions(const LossOptions& loss, DType dtype);

}  // namespace kjit
