// The C API's vocab-parallel cross-entropy entry points (kjit_sharded_cross_entropy_*): the spec
// and the arguments converted to the C++ ones, each step (statistics, their all-reduce or
// combination, the finish) and the whole run, and the queries.
#include "capi/capi_common.h"

#include <string>
#include <vector>

namespace kjit::capi {

template <>
constexpr const char* kStructName<kjit_sharded_cross_entropy_spec> =
    "kjit_sharded_cross_entropy_spec";
template <>
constexpr const char* kStructName<kjit_sharded_cross_entropy_args> =
    "kjit_sharded_cross_entropy_args";

namespace {

absl::StatusOr<ShardedCrossEntropySpec> ToSpec(const kjit_sharded_cross_entropy_spec& c) {
  Fields f;
  ShardedCrossEntropySpec spec{.vocab = c.vocab,
                               .shard_start = c.shard_start,
                               .shard_end = c.shard_end,
                               .dtype = f.Dtype({"dtype"}, c.dtype),
                               .loss = ToCpp(f, c.loss)};
  KJIT_RETURN_IF_ERROR(f.status());
  KJIT_ASSIGN_OR_RETURN(spec.config, ParseConfig(c.config, ParseCrossEntropyConfig));
  return spec;
}

}  // namespace

absl::StatusOr<kjit::ShardedCrossEntropy> MakeOp(const Runtime& rt,
                                                 const kjit_sharded_cross_entropy_spec& c) {
  KJIT_ASSIGN_OR_RETURN(const ShardedCrossEntropySpec spec, ToSpec(c));
  return rt.ShardedCrossEntropy(spec);
}
ShardedCrossEntropyArgs ToCpp(Fields& f, const kjit_sharded_cross_entropy_args& a) {
  return {KJIT_VIEW(logits), KJIT_INDEX(targets),    KJIT_VIEW(loss),         KJIT_VIEW(lse),
          KJIT_VIEW(grad),   KJIT_VIEW(grad_output), KJIT_VIEW(class_weight), KJIT_WORKSPACE};
}

}  // namespace kjit::capi

void kjit_sharded_cross_entropy_spec_init(kjit_sharded_cross_entropy_spec* spec) {
  if (spec == nullptr) return;
  const kjit::ShardedCrossEntropySpec d;
  *spec = {.struct_size = sizeof(*spec),
           .vocab = d.vocab,
           .shard_start = d.shard_start,
           .shard_end = d.shard_end,
           .dtype = static_cast<int32_t>(d.dtype),
           .loss = kjit::capi::DefaultLossOptions(),
           .config = nullptr};
}

void kjit_sharded_cross_entropy_args_init(kjit_sharded_cross_entropy_args* args) {
  kjit::capi::InitArgs(args);
}

kjit_status kjit_sharded_cross_entropy_create(const kjit_runtime* runtime,
                                              const kjit_sharded_cross_entropy_spec* spec,
                                              kjit_sharded_cross_entropy** out) {
  return kjit::capi::CreateOp(__func__, runtime, spec, out);
}

void kjit_sharded_cross_entropy_destroy(kjit_sharded_cross_entropy* op) {
  kjit::capi::DestroyHandle(__func__, op);
}

kjit_status kjit_sharded_cross_entropy_compute_stats(const kjit_sharded_cross_entropy* op,
                                                     CUstream stream,
                                                     const kjit_sharded_cross_entropy_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::ShardedCrossEntropy::ComputeStats);
}

kjit_status kjit_sharded_cross_entropy_all_reduce_stats(const kjit_sharded_cross_entropy* op,
                                                        CUstream stream, void* workspace,
                                                        int64_t rows, void* nccl_comm) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(
        kjit::capi::NotNull(fn, {{"workspace", workspace}, {"nccl_comm", nccl_comm}}));
    return op->op.AllReduceStats(stream, workspace, rows, static_cast<kjit::NcclComm>(nccl_comm));
  });
}

kjit_status kjit_sharded_cross_entropy_stats_of(const kjit_sharded_cross_entropy* op,
                                                void* workspace, int64_t rows, float** max_out,
                                                float** sums_out) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::Output(fn, "max_out", max_out));
    KJIT_RETURN_IF_ERROR(kjit::capi::Output(fn, "sums_out", sums_out));
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::capi::NotNull(fn, {{"workspace", workspace}}));
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
    const kjit::ShardStatsView v = op->op.StatsOf(workspace, rows);
    *max_out = v.max;
    *sums_out = v.sums;
    return absl::OkStatus();
  });
}

kjit_status kjit_sharded_cross_entropy_rescale_stats(const kjit_sharded_cross_entropy* op,
                                                     CUstream stream, void* workspace,
                                                     int64_t rows) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::capi::NotNull(fn, {{"workspace", workspace}}));
    return op->op.RescaleStats(stream, workspace, rows);
  });
}

kjit_status kjit_sharded_cross_entropy_combine_stats(CUstream stream,
                                                     const kjit_sharded_cross_entropy* const* ops,
                                                     void* const* workspaces, int32_t count,
                                                     int64_t rows) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::NotNull(fn, {{"ops", ops}, {"workspaces", workspaces}}));
    // Before the arrays are read: a count past their end would read past them.
    constexpr int32_t kMax = kjit::ShardedCrossEntropy::kMaxCombinedShards;
    if (count < 1 || count > kMax) {
      return absl::InvalidArgumentError(
          fmt::format("{}: count: {} shards, expected 1 to {}", fn, count, kMax));
    }
    std::vector<kjit::ShardedCrossEntropy::Shard> shards;
    for (int32_t i = 0; i < count; ++i) {
      const std::string name = fmt::format("ops[{}]", i);
      KJIT_RETURN_IF_ERROR(kjit::capi::CheckHandle(fn, name.c_str(), ops[i]));
      const std::string ws = fmt::format("workspaces[{}]", i);
      KJIT_RETURN_IF_ERROR(kjit::capi::NotNull(fn, {{ws.c_str(), workspaces[i]}}));
      shards.push_back({.op = &ops[i]->op, .workspace = workspaces[i]});
    }
    return kjit::ShardedCrossEntropy::CombineStats(stream, shards, rows);
  });
}

kjit_status kjit_sharded_cross_entropy_finish(const kjit_sharded_cross_entropy* op, CUstream stream,
                                              const kjit_sharded_cross_entropy_args* args) {
  return kjit::capi::LaunchOp(__func__, op, stream, args, &kjit::ShardedCrossEntropy::Finish);
}

kjit_status kjit_sharded_cross_entropy_run(const kjit_sharded_cross_entropy* op, CUstream stream,
                                           const kjit_sharded_cross_entropy_args* args,
                                           void* nccl_comm) {
  return kjit::capi::Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(kjit::capi::NotNull(fn, {{"args", args}, {"nccl_comm", nccl_comm}}));
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckSize(fn, "args", *args));
    kjit::capi::Fields f;
    const kjit::ShardedCrossEntropyArgs cpp = kjit::capi::ToCpp(f, *args);
    KJIT_RETURN_IF_ERROR(f.status());
    return op->op.Run(stream, cpp, static_cast<kjit::NcclComm>(nccl_comm));
  });
}

kjit_status kjit_sharded_cross_entropy_workspace_bytes(const kjit_sharded_cross_entropy* op,
                                                       int64_t rows, int64_t* bytes) {
  return kjit::capi::QueryOp(__func__, op, "bytes", bytes,
                             [&](const kjit::ShardedCrossEntropy& ce) {
                               KJIT_RETURN_IF_ERROR(kjit::capi::CheckRows(rows));
                               *bytes = ce.WorkspaceBytes(rows);
                               return absl::OkStatus();
                             });
}

kjit_status kjit_sharded_cross_entropy_config(const kjit_sharded_cross_entropy* op,
                                              char** config_out) {
  return kjit::capi::QueryOp(__func__, op, "config_out", config_out,
                             [&](const kjit::ShardedCrossEntropy& ce) {
                               return kjit::capi::Return(ce.config().ToString(), config_out);
                             });
}

kjit_status kjit_sharded_cross_entropy_build(const kjit_sharded_cross_entropy* op,
                                             char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out,
                             [&](const kjit::ShardedCrossEntropy& ce) {
                               return kjit::capi::ReturnBuild(ce.Build(), json_out);
                             });
}
