// The C API's ops by name (kjit_op_*, capi/op_entry.h): the table the ops' entry files register in,
// the schema written from it, and the entry points, which find the op by its spec JSON's "op" and
// hand the named arguments to its binding.
#include "capi/op_entry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

namespace kjit::capi {

template <>
constexpr const char* kStructName<kjit_op_args> = "kjit_op_args";

namespace {

std::vector<OpEntry>& Table() {
  static std::vector<OpEntry> table;
  return table;
}

absl::StatusOr<nlohmann::json> ParseObject(std::string_view what, std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(fmt::format("{}: not valid JSON: {}", what, text));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: expected a JSON object ({{\"op\": ...}}), got {}", what, text));
  }
  return j;
}

std::string Kinds() {
  std::string kinds;
  for (const OpEntry& e : Table())
    kinds += fmt::format("{}\"{}\"", kinds.empty() ? "" : ", ", e.kind);
  return kinds;
}

// The op and the config of a spec JSON.
absl::StatusOr<std::unique_ptr<NamedOp>> Create(const Runtime& rt, std::string_view text) {
  KJIT_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject("spec_json", text));
  const auto op = j.find("op");
  if (op == j.end() || !op->is_string()) {
    return absl::InvalidArgumentError(
        fmt::format("op: {}; expected the op's name as a string, one of {}",
                    op == j.end() ? "is missing" : op->dump() + " is not a string", Kinds()));
  }
  const std::string kind = op->get<std::string>();
  const auto entry = std::find_if(Table().begin(), Table().end(),
                                  [&](const OpEntry& e) { return e.kind == kind; });
  if (entry == Table().end()) {
    return absl::InvalidArgumentError(fmt::format(
        "op: \"{}\" is not an op of kjit_op_create; expected one of {}", kind, Kinds()));
  }
  std::optional<std::string> config;
  if (const auto c = j.find("config"); c != j.end()) {
    if (!c->is_string()) {
      return absl::InvalidArgumentError(
          fmt::format("config: {} is not a string (a config's text form)", c->dump()));
    }
    config = c->get<std::string>();
    j.erase("config");
  }
  return entry->create(rt, j.dump(), std::move(config));
}

}  // namespace

bool RegisterOp(OpEntry entry) {
  std::vector<OpEntry>& table = Table();
  const auto at =
      std::lower_bound(table.begin(), table.end(), entry.kind,
                       [](const OpEntry& e, const std::string& k) { return e.kind < k; });
  if (at != table.end() && at->kind == entry.kind) {  // two entry files bind one kind: a bug
    std::fprintf(stderr, "kjit: the C API binds the op \"%s\" twice\n", entry.kind.c_str());
    std::abort();
  }
  table.insert(at, std::move(entry));
  return true;
}

const std::vector<OpEntry>& RegisteredOps() { return Table(); }

absl::StatusOr<std::string> OverDefaults(std::string_view defaults, std::string_view json) {
  KJIT_ASSIGN_OR_RETURN(nlohmann::json full, ParseObject("defaults", defaults));
  KJIT_ASSIGN_OR_RETURN(const nlohmann::json given, ParseObject("spec_json", json));
  for (const auto& [key, value] : given.items()) full[key] = value;
  return full.dump();
}

absl::StatusOr<NamedArgs> ReadNamedArgs(const kjit_op_args& a) {
  NamedArgs named{.workspace = a.workspace, .workspace_bytes = a.workspace_bytes};
  std::set<std::string_view> seen;
  const auto name = [&](const char* array, int i, const char* n) -> absl::Status {
    if (n == nullptr) {
      return absl::InvalidArgumentError(fmt::format("{}[{}].name is NULL", array, i));
    }
    if (!seen.insert(n).second) {
      return absl::InvalidArgumentError(
          fmt::format("{}[{}].name: \"{}\" is given twice", array, i, n));
    }
    return absl::OkStatus();
  };
  for (const auto& [array, count_name, count, given] :
       {std::tuple("tensors", "tensor_count", a.tensor_count, static_cast<const void*>(a.tensors)),
        std::tuple("indexes", "index_count", a.index_count, static_cast<const void*>(a.indexes))}) {
    if (count < 0) {
      return absl::InvalidArgumentError(fmt::format("{}: {} is negative", count_name, count));
    }
    if (count > 0 && given == nullptr) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {}, but {} is NULL", count_name, count, array));
    }
  }
  for (int i = 0; i < a.tensor_count; ++i) {
    KJIT_RETURN_IF_ERROR(name("tensors", i, a.tensors[i].name));
    named.tensors.emplace_back(a.tensors[i].name, &a.tensors[i].tensor);
  }
  for (int i = 0; i < a.index_count; ++i) {
    KJIT_RETURN_IF_ERROR(name("indexes", i, a.indexes[i].name));
    named.indexes.emplace_back(a.indexes[i].name, &a.indexes[i].index);
  }
  return named;
}

}  // namespace kjit::capi

using kjit::capi::Call;
using kjit::capi::CheckHandle;
using kjit::capi::NotNull;
using kjit::capi::Output;

kjit_status kjit_op_schema(char** json_out) {
  return Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(Output(fn, "json_out", json_out));
    nlohmann::json ops = nlohmann::json::array();
    for (const kjit::capi::OpEntry& e : kjit::capi::RegisteredOps()) {
      nlohmann::json passes = nlohmann::json::array();
      for (const kjit::capi::PassSchema& p : e.passes) {
        passes.push_back({{"pass", p.name},
                          {"tensors", p.tensors},
                          {"indexes", p.indexes},
                          {"workspace", p.workspace}});
      }
      ops.push_back({{"op", e.kind},
                     {"spec", nlohmann::json::parse(e.defaults_json)},
                     {"config", e.config},
                     {"config_for", e.config_for},
                     {"passes", std::move(passes)}});
    }
    const nlohmann::json schema = {{"abi_version", KJIT_C_ABI_VERSION}, {"ops", std::move(ops)}};
    return kjit::capi::Return(schema.dump(), json_out);
  });
}

void kjit_op_args_init(kjit_op_args* args) { kjit::capi::InitArgs(args); }

kjit_status kjit_op_create(const kjit_runtime* runtime, const char* spec_json, kjit_op** out) {
  return Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(Output(fn, "out", out));
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "runtime", runtime));
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"spec_json", spec_json}}));
    KJIT_ASSIGN_OR_RETURN(auto op, kjit::capi::Create(runtime->rt, spec_json));
    *out = new kjit_op{.op = std::move(op)};
    return absl::OkStatus();
  });
}

void kjit_op_destroy(kjit_op* op) { kjit::capi::DestroyHandle(__func__, op); }

kjit_status kjit_op_spec(const kjit_op* op, char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out, [&](const auto& named) {
    return kjit::capi::Return(named->SpecJson(), json_out);
  });
}

kjit_status kjit_op_launch(const kjit_op* op, const char* pass, CUstream stream,
                           const kjit_op_args* args) {
  return Call(__func__, [&](const char* fn) -> absl::Status {
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"pass", pass}, {"args", args}}));
    KJIT_RETURN_IF_ERROR(kjit::capi::CheckSize(fn, "args", *args));
    KJIT_ASSIGN_OR_RETURN(const kjit::capi::NamedArgs named, kjit::capi::ReadNamedArgs(*args));
    return op->op->Launch(pass, stream, named);
  });
}

kjit_status kjit_op_workspace_bytes(const kjit_op* op, const char* pass, int64_t rows,
                                    int64_t* bytes) {
  const char* fn = __func__;
  return kjit::capi::QueryOp(fn, op, "bytes", bytes, [&](const auto& named) -> absl::Status {
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"pass", pass}}));
    KJIT_ASSIGN_OR_RETURN(*bytes, named->WorkspaceBytes(pass, rows));
    return absl::OkStatus();
  });
}

kjit_status kjit_op_config_for(const kjit_op* op, int64_t rows, char** config_out) {
  return kjit::capi::QueryOp(
      __func__, op, "config_out", config_out, [&](const auto& named) -> absl::Status {
        KJIT_ASSIGN_OR_RETURN(const std::string config, named->ConfigFor(rows));
        return kjit::capi::Return(config, config_out);
      });
}

kjit_status kjit_op_build(const kjit_op* op, char** json_out) {
  return kjit::capi::QueryOp(__func__, op, "json_out", json_out, [&](const auto& named) {
    return kjit::capi::ReturnBuild(named->Build(), json_out);
  });
}
