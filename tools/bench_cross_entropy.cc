// `kjit bench --op cross_entropy`: the fused loss and gradient (mean reduction, gradient written in
// place into the logits) and the forward alone, checked on sampled rows against the fp64 reference
// before timing, for the heuristic's config and (--sweep) every candidate. The logits are restored
// from a pristine copy before every timed repeat (untimed), so each repeat sees the same random
// logits.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autotune/cross_entropy_reference.h"
#include "autotune/host_convert.h"
#include "tools/bench.h"

namespace kjit::tools {

namespace {

// A cheap generator: the logits of a large benchmark are billions of values.
class XorShift {
 public:
  explicit XorShift(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t Next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * ((Next() >> 11) * 0x1p-53); }

 private:
  uint64_t s_;
};

// The rows checked against the reference: the first and last few.
std::vector<int64_t> SampleRows(int64_t rows) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    if (r < 16 || r >= rows - 16) out.push_back(r);
  }
  return out;
}

}  // namespace

absl::StatusOr<nlohmann::json> BenchCrossEntropy(
    const Runtime& rt, autotune::GpuTimer& timer, DType dtype, int64_t vocab, int64_t rows,
    int repeats, double copy_gbps,
    const std::vector<std::optional<autotune::CrossEntropyConfig>>& configs) {
  const CrossEntropySpec spec{.vocab = vocab, .dtype = dtype, .target_type = IndexType::kInt64,
                              .reduction = Reduction::kMean};
  KJIT_ASSIGN_OR_RETURN(CrossEntropy heuristic, rt.CrossEntropy(spec));
  const size_t es = SizeOf(dtype);
  const size_t row_bytes = vocab * es;
  const std::vector<int64_t> sample = SampleRows(rows);
  std::vector<double> sample_logits;
  std::vector<unsigned char> image(rows * row_bytes);
  std::vector<int64_t> targets(rows);
  XorShift rng(0x5eed);
  std::vector<double> row(vocab);
  for (int64_t r = 0, next_sample = 0; r < rows; ++r) {
    // Logits spread over [-8, 8): a softmax neither flat nor one-hot.
    for (double& v : row) v = rng.Uniform(-8, 8);
    const std::vector<unsigned char> enc = autotune::Encode(row, dtype);
    std::memcpy(&image[r * row_bytes], enc.data(), row_bytes);
    targets[r] = static_cast<int64_t>(rng.Next() % vocab);
    if (next_sample < static_cast<int64_t>(sample.size()) && sample[next_sample] == r) {
      const std::vector<double> rounded = autotune::Decode(enc, dtype);
      sample_logits.insert(sample_logits.end(), rounded.begin(), rounded.end());
      ++next_sample;
    }
  }
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer pristine, DeviceBuffer::Create(rt, image.size()));
  KJIT_RETURN_IF_ERROR(pristine.Upload(image.data(), image.size()));
  image.clear();
  image.shrink_to_fit();
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer work, DeviceBuffer::Create(rt, pristine.size()));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_targets, DeviceBuffer::Create(rt, rows * sizeof(int64_t)));
  KJIT_RETURN_IF_ERROR(d_targets.Upload(targets.data(), d_targets.size()));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer loss, DeviceBuffer::Create(rt, sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(rt, rows * sizeof(float)));
  const int64_t workspace_bytes = heuristic.WorkspaceBytes(rows);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::Create(rt, workspace_bytes));

  const jit::Driver& cu = *rt.driver();
  auto restore = [&] {
    return cu.Check(cu.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(work.data()),
                                         reinterpret_cast<CUdeviceptr>(pristine.data()),
                                         pristine.size(), nullptr),
                    "cuMemcpyDtoDAsync");
  };
  const TensorView logits = TensorView::Matrix(work.data(), dtype, rows, vocab);
  const CrossEntropyArgs both{.logits = logits,
                              .targets = IndexView::Of(d_targets.data(), IndexType::kInt64, rows),
                              .loss = TensorView::Vector(loss.data(), DType::kF32, 1),
                              .lse = TensorView::Vector(lse.data(), DType::kF32, rows),
                              .grad = logits,  // in place
                              .workspace = workspace.data(),
                              .workspace_bytes = workspace_bytes};
  CrossEntropyArgs forward = both;
  forward.logits = TensorView::Matrix(pristine.data(), dtype, rows, vocab);
  forward.grad = {};

  const autotune::CrossEntropyMath math{.vocab = vocab, .dtype = dtype,
                                        .reduction = Reduction::kNone};
  const std::vector<double> scale(sample.size(), 1.0 / rows);
  std::vector<int64_t> sample_targets;
  for (int64_t r : sample) sample_targets.push_back(targets[r]);
  const auto ref = autotune::CrossEntropyReference(math, static_cast<int64_t>(sample.size()),
                                                   sample_logits, sample_targets, &scale, true);
  const double logit_bytes = static_cast<double>(rows) * row_bytes;
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& config : configs) {
    CrossEntropySpec s = spec;
    s.config = config;
    KJIT_ASSIGN_OR_RETURN(CrossEntropy ce, rt.CrossEntropy(s));
    // Check before timing: the gradient and lse of the sampled rows. The mean's gradient is the
    // per-row gradient scaled by 1 / rows (every target is valid).
    KJIT_RETURN_IF_ERROR(restore());
    KJIT_RETURN_IF_ERROR(lse.Fill(0xFF));
    KJIT_RETURN_IF_ERROR(ce.ForwardBackward(nullptr, both));
    std::vector<double> grad, lse_out;
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> all_lse, DownloadValues(lse, DType::kF32));
    for (int64_t r : sample) {
      KJIT_ASSIGN_OR_RETURN(std::vector<double> g,
                            DownloadValues(work, dtype, r * row_bytes, row_bytes));
      grad.insert(grad.end(), g.begin(), g.end());
      lse_out.push_back(all_lse[r]);
    }
    std::string problems;
    for (const auto& [name, r] :
         autotune::CheckCrossEntropy(math, {.lse = &lse_out, .grad = &grad}, ref)) {
      if (!r.ok) problems += "\n  " + r.Describe(name);
    }
    if (!problems.empty()) {
      return absl::InternalError(fmt::format("cross_entropy vocab={} rows={} {}: wrong results:{}",
                                             vocab, rows, ce.config().ToString(), problems));
    }

    KJIT_ASSIGN_OR_RETURN(
        autotune::Timing t_both,
        timer.Time(repeats, [&] { return ce.ForwardBackward(nullptr, both); }, restore));
    KJIT_ASSIGN_OR_RETURN(autotune::Timing t_fwd,
                          timer.Time(repeats, [&] { return ce.Forward(nullptr, forward); }));
    auto entry = [&](const char* pass, const autotune::Timing& t, double bytes) {
      return BenchEntry({.op = "cross_entropy", .pass = pass,
                         .shape = fmt::format("vocab={} rows={}", vocab, rows),
                         .config = ce.config().ToString(), .dtype = dtype,
                         .heuristic = !config.has_value(), .bytes = bytes,
                         .extra = {{"vocab", vocab},
                                   {"rows", rows},
                                   {"extra_device_bytes", workspace_bytes},
                                   {"checked_rows", sample.size()}}},
                        t, copy_gbps);
    };
    // Fewest bytes: forward+backward in place reads and writes the logits once; forward reads them.
    entries.push_back(entry("forward_backward", t_both, 2 * logit_bytes));
    entries.push_back(entry("forward", t_fwd, logit_bytes));
  }
  return entries;
}

// The heuristic's config, then (when sweeping) every candidate but the heuristic's.
std::vector<std::optional<autotune::CrossEntropyConfig>> CrossEntropyConfigs(const Runtime& rt,
                                                                            DType dtype,
                                                                            int64_t vocab,
                                                                            bool sweep) {
  std::vector<std::optional<autotune::CrossEntropyConfig>> out = {std::nullopt};
  if (!sweep) return out;
  const int vec = autotune::MaxVecForCrossEntropy(static_cast<int>(SizeOf(dtype)));
  const int arch = rt.target().arch;
  const autotune::CrossEntropyConfig base = autotune::DefaultCrossEntropyConfig(vocab, vec, arch);
  for (const auto& c : autotune::CrossEntropyConfigCandidates(vocab, vec, arch)) {
    if (!(c == base)) out.push_back(c);
  }
  return out;
}

}  // namespace kjit::tools
