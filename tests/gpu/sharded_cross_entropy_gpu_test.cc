// Vocab-parallel cross-entropy on one GPU: the shards of a split run in turn (phase 1 for each,
// the device-side combine, phase 2 for each), and the concatenated gradient and the loss must
// match both the unsharded op and the fp64 reference, with the CE suite's tolerances (which an
// all-zero gradient fails; checked here too). Splits: 128256 in 2 and 4, 50257 in 3 uneven shards,
// 1000 in 4 uneven ones; targets at every shard boundary, 0 and vocab-1, ignored rows (all of
// them, too); every reduction, label smoothing, z-loss, softcap, upstream gradients, in place. The
// all-reduce path is checked on one GPU twice over: the steps a caller's own all-reduce takes
// (StatsOf, RescaleStats) with the reductions done on the host must give the combine's bits, and
// NCCL (dlopen()ed) with a one-rank communicator must give the unsharded result; without NCCL
// that test skips, saying why.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "ops/common/tuning/compare.h"
#include "ops/common/tuning/random_values.h"
#include "ops/cross_entropy/nccl.h"
#include "ops/cross_entropy/tuning/reference.h"
#include "runtime/runtime_state.h"
#include "tests/gpu/gpu_test_env.h"

namespace kjit {
namespace {

struct Case {
  int64_t vocab = 1000;
  std::vector<int64_t> cuts;  // where one shard ends and the next begins
  int64_t rows = 33;
  DType dtype = DType::kBF16;
  IndexType target_type = IndexType::kInt64;
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  float smoothing = 0, z = 0, softcap = 0;
  bool upstream = false;
  bool in_place = false;
  double scale = 1;  // logits ~ normal with this deviation
  bool all_ignored = false;
  bool weighted = false;  // fp32 class weights in [0, 2), every 7th 0

  std::vector<std::pair<int64_t, int64_t>> Shards() const {
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t start = 0;
    for (int64_t end : cuts) {
      out.push_back({start, end});
      start = end;
    }
    out.push_back({start, vocab});
    return out;
  }
  ShardedCrossEntropySpec ShardSpec(std::pair<int64_t, int64_t> shard) const {
    return {.vocab = vocab,
            .shard_start = shard.first,
            .shard_end = shard.second,
            .dtype = dtype,
            .loss = Loss()};
  }
  LossOptions Loss() const {
    return {.target_type = target_type,
            .ignore_index = ignore_index,
            .reduction = reduction,
            .label_smoothing = smoothing,
            .z_loss = z,
            .softcap = softcap,
            .class_weight_dtype = WeightDtype()};
  }
  std::optional<DType> WeightDtype() const {
    return weighted ? std::optional<DType>(DType::kF32) : std::nullopt;
  }
  CrossEntropySpec Unsharded() const { return {.vocab = vocab, .dtype = dtype, .loss = Loss()}; }
  ops::CrossEntropyMath Math() const { return {.vocab = vocab, .dtype = dtype, .loss = Loss()}; }
  int64_t LossSize() const { return reduction == Reduction::kNone ? rows : 1; }
  std::string Describe() const {
    return fmt::format(
        "vocab={} cuts=[{}] rows={} dtype={} targets={} ignore={} reduction={} "
        "eps={} z={} cap={} upstream={} in_place={} scale={} all_ignored={} weighted={}",
        vocab, fmt::join(cuts, ","), rows, Name(dtype), Name(target_type), ignore_index,
        Name(reduction), smoothing, z, softcap, upstream, in_place, scale, all_ignored, weighted);
  }
};

struct Inputs {
  std::vector<double> logits;  // [rows, vocab], as the device holds them
  std::vector<int64_t> targets;
  std::vector<double> upstream;  // empty: none
  std::vector<double> weights;   // [vocab] fp32 class weights; empty: none
};

// Targets cycle through 0, vocab-1 and both sides of every cut, with every 7th row ignored and
// the rest random.
Inputs MakeInputs(const Case& c, uint64_t seed) {
  std::mt19937_64 gen(seed);
  Inputs in;
  in.logits = ops::RandomValues(gen, c.rows * c.vocab, c.scale, 0, c.dtype);
  std::vector<int64_t> special = {0, c.vocab - 1};
  for (int64_t cut : c.cuts) special.insert(special.end(), {cut - 1, cut});
  for (int64_t r = 0; r < c.rows; ++r) {
    int64_t t = static_cast<int64_t>(gen() % c.vocab);
    if (r % 2 == 0) t = special[(r / 2) % special.size()];
    if (r % 7 == 6 || c.all_ignored) t = c.ignore_index;
    in.targets.push_back(t);
  }
  if (c.upstream) {
    std::uniform_real_distribution<double> u(0.25, 2.0);
    for (int64_t i = 0; i < c.LossSize(); ++i) {
      in.upstream.push_back(RoundTo((i % 3 == 2 ? -1 : 1) * u(gen), DType::kF32));
    }
  }
  if (c.weighted) {
    std::uniform_real_distribution<double> u(0.0, 2.0);
    for (int64_t j = 0; j < c.vocab; ++j)
      in.weights.push_back(j % 7 == 3 ? 0.0 : RoundTo(u(gen), DType::kF32));
  }
  return in;
}

struct Outputs {
  std::vector<double> loss, lse, grad;  // the first shard's loss and lse; the whole gradient
  bool shards_agree = true;             // every shard wrote the same loss and lse bytes
};

// How the shards' statistics are reduced between the phases.
enum class Reduce { kCombine, kHostAllReduce, kNccl };

absl::StatusOr<DeviceBuffer> UploadTargets(const Runtime& rt, const Case& c, const Inputs& in) {
  std::vector<unsigned char> bytes(c.rows * SizeOf(c.target_type));
  for (int64_t i = 0; i < c.rows; ++i) {
    if (c.target_type == IndexType::kInt32) {
      const int32_t t = static_cast<int32_t>(in.targets[i]);
      std::memcpy(&bytes[i * 4], &t, 4);
    } else {
      std::memcpy(&bytes[i * 8], &in.targets[i], 8);
    }
  }
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes.size()));
  KJIT_RETURN_IF_ERROR(b.Upload(bytes.data(), bytes.size()));
  return b;
}

absl::StatusOr<DeviceBuffer> Poisoned(const Runtime& rt, size_t bytes) {
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes));
  KJIT_RETURN_IF_ERROR(b.Fill(0xFF));  // NaN in every float type: an unwritten output shows
  return b;
}

// The reductions a caller's own all-reduce would do, done on the host over the shards' workspaces:
// max, RescaleStats on each, then the sums added in shard order in fp32, as the combine does.
absl::Status HostAllReduce(const Runtime& rt, const std::vector<ShardedCrossEntropy>& ops,
                           const std::vector<DeviceBuffer>& workspaces, int64_t rows) {
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  auto copy = [&](float* host, float* device, int64_t n, bool to_device) {
    const auto d = reinterpret_cast<CUdeviceptr>(device);
    const size_t bytes = n * sizeof(float);
    return to_device ? cu.Check(cu.cuMemcpyHtoD(d, host, bytes), "cuMemcpyHtoD")
                     : cu.Check(cu.cuMemcpyDtoH(host, d, bytes), "cuMemcpyDtoH");
  };
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize"));
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t n = pass == 0 ? rows : 3 * rows;
    std::vector<float> total(n, pass == 0 ? -INFINITY : 0.0f), part(n);
    for (size_t i = 0; i < ops.size(); ++i) {
      const ShardStatsView v = ops[i].StatsOf(workspaces[i].data(), rows);
      KJIT_RETURN_IF_ERROR(copy(part.data(), pass == 0 ? v.max : v.sums, n, false));
      for (int64_t k = 0; k < n; ++k)
        total[k] = pass == 0 ? std::max(total[k], part[k]) : total[k] + part[k];
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const ShardStatsView v = ops[i].StatsOf(workspaces[i].data(), rows);
      KJIT_RETURN_IF_ERROR(copy(total.data(), pass == 0 ? v.max : v.sums, n, true));
      if (pass == 0) KJIT_RETURN_IF_ERROR(ops[i].RescaleStats(nullptr, workspaces[i].data(), rows));
    }
    KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Outputs> RunSharded(const Runtime& rt, const Case& c, const Inputs& in, Reduce how,
                                   NcclComm comm = nullptr) {
  const int64_t R = c.rows, V = c.vocab;
  const size_t es = SizeOf(c.dtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_logits, UploadValues(rt, in.logits, c.dtype));
  std::optional<DeviceBuffer> d_grad;
  if (!c.in_place) {
    KJIT_ASSIGN_OR_RETURN(d_grad, Poisoned(rt, R * V * es));
  }
  char* grad_base = static_cast<char*>(c.in_place ? d_logits.data() : d_grad->data());
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_targets, UploadTargets(rt, c, in));
  std::optional<DeviceBuffer> d_up;
  if (c.upstream) {
    KJIT_ASSIGN_OR_RETURN(d_up, UploadValues(rt, in.upstream, DType::kF32));
  }

  std::optional<DeviceBuffer> d_weights;
  TensorView class_weight;
  if (c.weighted) {
    KJIT_ASSIGN_OR_RETURN(d_weights, UploadValues(rt, in.weights, DType::kF32));
    class_weight = TensorView::Vector(d_weights->data(), DType::kF32, V);
  }

  std::vector<ShardedCrossEntropy> ops;
  std::vector<DeviceBuffer> ws, loss, lse;
  std::vector<ShardedCrossEntropyArgs> args;
  for (const auto& shard : c.Shards()) {
    KJIT_ASSIGN_OR_RETURN(ShardedCrossEntropy op, rt.ShardedCrossEntropy(c.ShardSpec(shard)));
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer w, Poisoned(rt, op.WorkspaceBytes(R)));
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer l, Poisoned(rt, c.LossSize() * sizeof(float)));
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer s, Poisoned(rt, R * sizeof(float)));
    const int64_t width = shard.second - shard.first;
    // Column slices of the whole rows: strided, and misaligned where a shard starts at an odd
    // class.
    args.push_back(
        {.logits = TensorView::Matrix(static_cast<char*>(d_logits.data()) + shard.first * es,
                                      c.dtype, R, width, V),
         .targets = IndexView::Of(d_targets.data(), c.target_type, R),
         .loss = TensorView::Vector(l.data(), DType::kF32, c.LossSize()),
         .lse = TensorView::Vector(s.data(), DType::kF32, R),
         .grad = TensorView::Matrix(grad_base + shard.first * es, c.dtype, R, width, V),
         .grad_output = c.upstream ? TensorView::Vector(d_up->data(), DType::kF32, c.LossSize())
                                   : TensorView{},
         .class_weight = class_weight,
         .workspace = w.data(),
         .workspace_bytes = op.WorkspaceBytes(R)});
    ops.push_back(std::move(op));
    ws.push_back(std::move(w));
    loss.push_back(std::move(l));
    lse.push_back(std::move(s));
  }
  for (size_t i = 0; i < ops.size(); ++i)
    KJIT_RETURN_IF_ERROR(ops[i].ComputeStats(nullptr, args[i]));
  if (how == Reduce::kCombine) {
    std::vector<ShardedCrossEntropy::Shard> shards;
    for (size_t i = 0; i < ops.size(); ++i) shards.push_back({&ops[i], ws[i].data()});
    KJIT_RETURN_IF_ERROR(ShardedCrossEntropy::CombineStats(nullptr, shards, R));
  } else if (how == Reduce::kHostAllReduce) {
    KJIT_RETURN_IF_ERROR(HostAllReduce(rt, ops, ws, R));
  } else {
    if (ops.size() != 1) return absl::InvalidArgumentError("one NCCL rank takes one shard");
    KJIT_RETURN_IF_ERROR(ops[0].AllReduceStats(nullptr, ws[0].data(), R, comm));
  }
  for (size_t i = 0; i < ops.size(); ++i) KJIT_RETURN_IF_ERROR(ops[i].Finish(nullptr, args[i]));
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize (kernel fault?)"));

  Outputs out;
  KJIT_ASSIGN_OR_RETURN(out.loss, DownloadValues(loss[0], DType::kF32));
  KJIT_ASSIGN_OR_RETURN(out.lse, DownloadValues(lse[0], DType::kF32));
  for (size_t i = 1; i < ops.size(); ++i) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> l, DownloadValues(loss[i], DType::kF32));
    KJIT_ASSIGN_OR_RETURN(std::vector<double> s, DownloadValues(lse[i], DType::kF32));
    auto same_bits = [](const std::vector<double>& a, const std::vector<double>& b) {
      return a.size() == b.size() &&
             std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
    };
    out.shards_agree &= same_bits(l, out.loss) && same_bits(s, out.lse);
  }
  KJIT_ASSIGN_OR_RETURN(out.grad, DownloadValues(c.in_place ? d_logits : *d_grad, c.dtype));
  return out;
}

absl::StatusOr<Outputs> RunUnsharded(const Runtime& rt, const Case& c, const Inputs& in) {
  KJIT_ASSIGN_OR_RETURN(CrossEntropy ce, rt.CrossEntropy(c.Unsharded()));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_logits, UploadValues(rt, in.logits, c.dtype));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_grad, Poisoned(rt, d_logits.size()));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_targets, UploadTargets(rt, c, in));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_loss, Poisoned(rt, c.LossSize() * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_lse, Poisoned(rt, c.rows * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_ws, Poisoned(rt, ce.WorkspaceBytes(c.rows)));
  std::optional<DeviceBuffer> d_up, d_weights;
  if (c.upstream) {
    KJIT_ASSIGN_OR_RETURN(d_up, UploadValues(rt, in.upstream, DType::kF32));
  }
  if (c.weighted) {
    KJIT_ASSIGN_OR_RETURN(d_weights, UploadValues(rt, in.weights, DType::kF32));
  }
  KJIT_RETURN_IF_ERROR(ce.ForwardBackward(
      nullptr,
      {.logits = TensorView::Matrix(d_logits.data(), c.dtype, c.rows, c.vocab),
       .targets = IndexView::Of(d_targets.data(), c.target_type, c.rows),
       .loss = TensorView::Vector(d_loss.data(), DType::kF32, c.LossSize()),
       .lse = TensorView::Vector(d_lse.data(), DType::kF32, c.rows),
       .grad = TensorView::Matrix(d_grad.data(), c.dtype, c.rows, c.vocab),
       .grad_output =
           c.upstream ? TensorView::Vector(d_up->data(), DType::kF32, c.LossSize()) : TensorView{},
       .class_weight =
           c.weighted ? TensorView::Vector(d_weights->data(), DType::kF32, c.vocab) : TensorView{},
       .workspace = d_ws.data(),
       .workspace_bytes = ce.WorkspaceBytes(c.rows)}));
  const jit::Driver& cu = *kjit::internal::StateOf(rt).driver;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize (kernel fault?)"));
  Outputs out;
  KJIT_ASSIGN_OR_RETURN(out.loss, DownloadValues(d_loss, DType::kF32));
  KJIT_ASSIGN_OR_RETURN(out.lse, DownloadValues(d_lse, DType::kF32));
  KJIT_ASSIGN_OR_RETURN(out.grad, DownloadValues(d_grad, c.dtype));
  return out;
}

// The sharded result against the fp64 reference and against the unsharded op. The check must be
// able to fail: an all-zero gradient and one entry pushed past its tolerance are rejected.
void ExpectMatches(const Case& c, const Inputs& in, const Outputs& sharded,
                   const Outputs& unsharded) {
  ops::CrossEntropyMath math = c.Math();
  math.class_weight = in.weights;
  const ops::CrossEntropyResult ref = ops::CrossEntropyReference(
      math, c.rows, in.logits, in.targets, c.upstream ? &in.upstream : nullptr, true);
  EXPECT_TRUE(sharded.shards_agree) << "the shards wrote different losses or lse";
  for (const Outputs* out : {&sharded, &unsharded}) {
    const char* who = out == &sharded ? "sharded" : "unsharded";
    for (const auto& [name, r] : ops::CheckCrossEntropy(
             math, {.loss = &out->loss, .lse = &out->lse, .grad = &out->grad}, ref)) {
      EXPECT_TRUE(r.ok) << who << " vs the fp64 reference: " << r.Describe(name);
    }
  }
  // Against the unsharded op: each is within the reference's tolerance, so within twice of it.
  const ops::CrossEntropyTolerances tol = ops::CrossEntropyTolerancesFor(c.dtype);
  std::vector<double> atol = ops::CrossEntropyGradAtol(math, ref, tol);
  for (double& a : atol) a *= 2;
  const ops::CompareResult g =
      ops::Compare(sharded.grad, unsharded.grad, {2 * tol.grad.rtol, 2 * tol.grad.atol}, atol);
  EXPECT_TRUE(g.ok) << "sharded vs unsharded: " << g.Describe("grad");
  std::vector<double> loss_atol(ref.loss_terms.size());
  for (size_t i = 0; i < loss_atol.size(); ++i)
    loss_atol[i] = 2 * tol.loss_atol_per_terms * ref.loss_terms[i];
  const ops::CompareResult l =
      ops::Compare(sharded.loss, unsharded.loss, {2 * tol.loss.rtol, 2 * tol.loss.atol}, loss_atol);
  EXPECT_TRUE(l.ok) << "sharded vs unsharded: " << l.Describe("loss");

  if (c.all_ignored) return;
  const std::vector<double> zeros(sharded.grad.size(), 0.0);
  EXPECT_FALSE(ops::CheckCrossEntropy(math, {.grad = &zeros}, ref)[0].second.ok)
      << "the gradient check accepts an all-zero gradient";
  for (size_t k = sharded.grad.size() / 2; k < sharded.grad.size(); ++k) {
    if (!std::isfinite(ref.grad[k]) || ref.grad[k] == 0) continue;
    std::vector<double> bad = sharded.grad;
    bad[k] =
        ref.grad[k] + 1.5 * (tol.grad.atol + atol[k] / 2 + tol.grad.rtol * std::fabs(ref.grad[k]));
    EXPECT_FALSE(ops::CheckCrossEntropy(math, {.grad = &bad}, ref)[0].second.ok)
        << "the gradient check accepts a perturbed entry at " << k;
    break;
  }
}

// Compiles every program the cases need in parallel, into the disk cache the GPU runtime reads.
void Prebuild(const Runtime& rt, const std::vector<Case>& cases) {
  std::vector<std::function<void(const Runtime&)>> jobs;
  for (const Case& c : cases) {
    jobs.push_back([c](const Runtime& cpu) {
      if (auto ce = cpu.CrossEntropy(c.Unsharded()); ce.ok()) (void)ce->Build();
    });
    for (const auto& shard : c.Shards()) {
      jobs.push_back([c, shard](const Runtime& cpu) {
        if (auto op = cpu.ShardedCrossEntropy(c.ShardSpec(shard)); op.ok()) (void)op->Build();
      });
    }
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers(
      std::min<size_t>(jobs.size(), std::thread::hardware_concurrency()));
  for (std::thread& w : workers) {
    w = std::thread([&] {
      auto cpu = Runtime::Create({.target = rt.target(), .compile_only = true});
      for (size_t i; cpu.ok() && (i = next++) < jobs.size();) jobs[i](*cpu);
    });
  }
  for (std::thread& w : workers) w.join();
}

void RunAll(const Runtime& rt, const std::vector<Case>& cases, uint64_t seed) {
  Prebuild(rt, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.Describe());
    const Inputs in = MakeInputs(c, seed + i);
    auto sharded = RunSharded(rt, c, in, Reduce::kCombine);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    auto unsharded = RunUnsharded(rt, c, in);
    ASSERT_TRUE(unsharded.ok()) << unsharded.status();
    ExpectMatches(c, in, *sharded, *unsharded);
  }
  fmt::print("checked {} cases\n", cases.size());
}

const std::vector<DType> kDtypes = {DType::kBF16, DType::kF16, DType::kF32};

TEST(ShardedCrossEntropyGpu, SplitsMatchUnshardedAndReference) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (DType t : kDtypes) {
    cases.push_back({.vocab = 128256, .cuts = {64128}, .rows = 64, .dtype = t});
    cases.push_back({.vocab = 128256,
                     .cuts = {32064, 64128, 96192},
                     .rows = 64,
                     .dtype = t,
                     .in_place = true,
                     .scale = 30});
    cases.push_back({.vocab = 50257,
                     .cuts = {16000, 33333},
                     .rows = 129,
                     .dtype = t,
                     .reduction = Reduction::kSum});
    cases.push_back({.vocab = 1000,
                     .cuts = {250, 501, 750},
                     .rows = 257,
                     .dtype = t,
                     .reduction = Reduction::kNone,
                     .in_place = true});
  }
  RunAll(rt, cases, 100);
}

// Every option alone and together, for every reduction, on uneven splits; index types, upstream
// gradients, in place and peaked softmax rotate across the combinations.
TEST(ShardedCrossEntropyGpu, EveryOptionAndReduction) {
  KJIT_REQUIRE_GPU(rt);
  std::vector<Case> cases;
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    for (int bits = 0; bits < 8; ++bits) {
      const int n = static_cast<int>(cases.size());
      Case c{.vocab = n % 2 ? 50257 : 1000, .rows = n % 2 ? 17 : 67, .reduction = red};
      c.cuts = c.vocab == 1000 ? std::vector<int64_t>{250, 501, 750}
                               : std::vector<int64_t>{16000, 33333};
      c.dtype = kDtypes[n % 3];
      c.smoothing = (bits & 1) ? 0.1f : 0.0f;
      c.z = (bits & 2) ? 1e-3f : 0.0f;
      c.softcap = (bits & 4) ? 7.5f : 0.0f;
      c.target_type = n % 2 ? IndexType::kInt32 : IndexType::kInt64;
      c.upstream = n % 3 != 0;
      c.in_place = n % 4 == 1;
      c.scale = n % 4 == 3 ? 30.0 : 1.0;
      cases.push_back(c);
      c.weighted = true;  // class weights: the target's weight may live in another shard
      cases.push_back(c);
    }
  }
  // ignore_index naming a real class, and every row ignored (mean: NaN, as unsharded).
  cases.push_back({.vocab = 1000, .cuts = {500}, .ignore_index = 0});
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    cases.push_back(
        {.vocab = 1000, .cuts = {333, 500}, .rows = 9, .reduction = red, .all_ignored = true});
  }
  RunAll(rt, cases, 500);
}

// What a caller's own all-reduce does (max over StatsOf().max, RescaleStats, sum over .sums)
// gives the device combine's bits.
TEST(ShardedCrossEntropyGpu, OwnAllReduceStepsGiveTheCombinesBits) {
  KJIT_REQUIRE_GPU(rt);
  const std::vector<Case> cases = {
      {.vocab = 50257, .cuts = {16000, 33333}, .rows = 33, .smoothing = 0.1f, .z = 1e-4f},
      {.vocab = 1000,
       .cuts = {250, 501, 750},
       .rows = 40,
       .dtype = DType::kF32,
       .reduction = Reduction::kNone,
       .softcap = 10.0f,
       .scale = 30}};
  Prebuild(rt, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].Describe());
    const Inputs in = MakeInputs(cases[i], 900 + i);
    auto combined = RunSharded(rt, cases[i], in, Reduce::kCombine);
    auto host = RunSharded(rt, cases[i], in, Reduce::kHostAllReduce);
    ASSERT_TRUE(combined.ok()) << combined.status();
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(host->loss, combined->loss);
    EXPECT_EQ(host->lse, combined->lse);
    EXPECT_EQ(host->grad, combined->grad);
    // And the combine is repeatable, bit for bit.
    auto again = RunSharded(rt, cases[i], in, Reduce::kCombine);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->grad, combined->grad);
    EXPECT_EQ(again->loss, combined->loss);
  }
}

// The NCCL path end to end on one GPU: a one-rank communicator over libnccl opened with dlopen,
// the whole vocab as the one shard.
TEST(ShardedCrossEntropyGpu, NcclOneRankAllReduce) {
  KJIT_REQUIRE_GPU(rt);
  auto nccl = Nccl::Get();
  if (!nccl.ok()) GTEST_SKIP() << "no NCCL: " << ToStd(nccl.status().message());
  fmt::print("NCCL {} from {}\n", (*nccl)->version(), (*nccl)->path());
  ASSERT_EQ(kjit::internal::StateOf(rt).driver->cuCtxSetCurrent(kjit::internal::StateOf(rt).ctx),
            CUDA_SUCCESS);
  auto id = (*nccl)->GetUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = (*nccl)->CommInitRank(1, *id, 0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (const Case& c :
       {Case{.vocab = 128256, .rows = 64, .smoothing = 0.1f}, Case{.vocab = 50257,
                                                              .rows = 33,
                                                              .dtype = DType::kF16,
                                                              .reduction = Reduction::kNone,
                                                              .z = 1e-4f,
                                                              .upstream = true}}) {
    SCOPED_TRACE(c.Describe());
    const Inputs in = MakeInputs(c, 1234);
    auto sharded = RunSharded(rt, c, in, Reduce::kNccl, *comm);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    auto unsharded = RunUnsharded(rt, c, in);
    ASSERT_TRUE(unsharded.ok()) << unsharded.status();
    ExpectMatches(c, in, *sharded, *unsharded);
  }
  EXPECT_TRUE((*nccl)->CommDestroy(*comm).ok());
}

}  // namespace
}  // namespace kjit
