// The C API's ops by name (kjit_op_*, ABI 6): how an op's entry file (capi/<op>_capi.cc) offers the
// op without functions or structs of its own. The file describes the op once, as an OpBinding (its
// kind, its spec JSON both ways, its factory and its passes, each pass's arguments by the C++ args'
// field names), and registers it with KJIT_C_OP; op_entry.cc's entry points find it by the spec
// JSON's "op". Nothing here names an op (tests/ops/one_place_test.cc checks it).
//
//   const OpBinding<Scale, ScaleSpec> kScale{
//       .kind = "scale", .to_json = ToJson, .from_json = ScaleSpecFromJson,
//       .parse_config = ParseScaleConfig, .create = Scale::Create,
//       .passes = {Pass("forward", &Scale::Forward, TensorArg("x", &ScaleArgs::x),
//                       TensorArg("y", &ScaleArgs::y))}};
//   KJIT_C_OP(kScale);
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "capi/capi_common.h"

namespace kjit::capi {

// A launch's named arguments as the C caller gave them, checked: arrays not NULL where counted,
// each name not NULL and given once.
struct NamedArgs {
  std::vector<std::pair<std::string_view, const kjit_tensor*>> tensors;
  std::vector<std::pair<std::string_view, const kjit_index*>> indexes;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};
absl::StatusOr<NamedArgs> ReadNamedArgs(const kjit_op_args& a);

// The number of fields of the aggregate T (boost.pfr's way): the most initializers T{...} takes.
struct AnyField {
  template <class T>
  operator T() const;  // never defined: only asked in unevaluated contexts
};
template <class T, class... Fields>
constexpr int FieldCount() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return FieldCount<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

// One view field of a C++ args struct, by the name the C caller passes it under.
template <class Args>
struct ArgField {
  const char* name;
  TensorView Args::*tensor = nullptr;
  IndexView Args::*index = nullptr;
};
template <class Args>
ArgField<Args> TensorArg(const char* name, TensorView Args::*field) {
  return {name, field, nullptr};
}
template <class Args>
ArgField<Args> IndexArg(const char* name, IndexView Args::*field) {
  return {name, nullptr, field};
}

// What the schema says of a pass.
struct PassSchema {
  std::string name;
  std::vector<std::string> tensors, indexes;
  bool workspace = false;
};

// One pass of Op: its name, its launch with the named arguments converted, its workspace.
template <class Op>
struct PassOf {
  PassSchema schema;
  std::function<absl::Status(const Op&, CUstream, const NamedArgs&)> launch;
  std::function<int64_t(const Op&, int64_t rows)> workspace_bytes;  // null: takes none

  // The pass takes a workspace of `bytes(rows)`: its args' workspace and workspace_bytes.
  PassOf&& Workspace(int64_t (Op::*bytes)(int64_t) const) && {
    workspace_bytes = [bytes](const Op& op, int64_t rows) { return (op.*bytes)(rows); };
    return std::move(*this);
  }
};

// The field of `list` of one kind (ArgField::tensor or ::index) named `name`, or list.end().
template <class Args, class View>
auto FieldNamed(const std::vector<ArgField<Args>>& list, View Args::*ArgField<Args>::*kind,
                std::string_view name) {
  return std::find_if(list.begin(), list.end(), [&](const ArgField<Args>& a) {
    return a.*kind != nullptr && name == a.name;
  });
}

// InvalidArgument for a name the pass's args do not have, listing those of its kind it has.
template <class Args>
absl::Status UnknownArgument(const char* kind, std::string_view given, const std::string& pass,
                             const std::vector<ArgField<Args>>& list) {
  std::string names;
  for (const ArgField<Args>& a : list) {
    if ((a.tensor != nullptr) == (std::string_view(kind) == "tensor")) {
      names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", a.name);
    }
  }
  return absl::InvalidArgumentError(
      fmt::format("{}s: \"{}\" is not a {} of the {} pass; it takes {}", kind, given, kind, pass,
                  names.empty() ? std::string("none") : names));
}

// The pass `name` launching `launch` with Args whose view fields are `fields`, every one named:
// the build stops when Args has a field the list leaves out (workspace and workspace_bytes aside,
// which the C args carry), so that a field added to the C++ args is offered or refused knowingly.
template <class Op, class Args, class... Named>
PassOf<Op> Pass(const char* name, absl::Status (Op::*launch)(CUstream, const Args&) const,
                Named... fields) {
  constexpr bool kWorkspace = requires(Args a) {
    a.workspace = nullptr;
    a.workspace_bytes = int64_t{0};
  };
  static_assert(static_cast<int>(sizeof...(Named)) + (kWorkspace ? 2 : 0) == FieldCount<Args>(),
                "name every view field of the args struct");
  std::vector<ArgField<Args>> list{fields...};
  PassSchema schema{.name = name, .workspace = kWorkspace};
  for (const ArgField<Args>& f : list)
    (f.tensor ? schema.tensors : schema.indexes).push_back(f.name);
  auto run = [list, launch, pass = std::string(name)](const Op& op, CUstream stream,
                                                      const NamedArgs& named) -> absl::Status {
    Args args{};
    Fields f;
    for (const auto& [given, tensor] : named.tensors) {
      const auto it = FieldNamed(list, &ArgField<Args>::tensor, given);
      if (it == list.end()) return UnknownArgument("tensor", given, pass, list);
      args.*(it->tensor) = f.Tensor(given, *tensor);
    }
    for (const auto& [given, index] : named.indexes) {
      const auto it = FieldNamed(list, &ArgField<Args>::index, given);
      if (it == list.end()) return UnknownArgument("index", given, pass, list);
      args.*(it->index) = f.Index(given, *index);
    }
    KJIT_RETURN_IF_ERROR(f.status());
    if constexpr (kWorkspace) {
      args.workspace = named.workspace;
      args.workspace_bytes = named.workspace_bytes;
    } else if (named.workspace != nullptr || named.workspace_bytes != 0) {
      return absl::InvalidArgumentError(
          fmt::format("workspace: the {} pass takes none; leave workspace NULL and "
                      "workspace_bytes 0",
                      pass));
    }
    return (op.*launch)(stream, args);
  };
  return {.schema = std::move(schema), .launch = std::move(run)};
}

// The op made by name, whatever its type: what a kjit_op holds.
class NamedOp {
 public:
  virtual ~NamedOp() = default;
  virtual std::string_view kind() const = 0;
  virtual std::string SpecJson() const = 0;
  // InvalidArgument naming the passes for one the op does not have.
  virtual absl::Status Launch(std::string_view pass, CUstream stream,
                              const NamedArgs& args) const = 0;
  virtual absl::StatusOr<int64_t> WorkspaceBytes(std::string_view pass, int64_t rows) const = 0;
  virtual absl::StatusOr<std::string> ConfigFor(int64_t rows) const = 0;
  virtual absl::StatusOr<BuildInfo> Build() const = 0;
};

// What an op's entry file says of it. Spec must be an aggregate whose `config`, if it has one, is
// a std::optional of what parse_config returns.
template <class Op, class Spec>
struct OpBinding {
  const char* kind;                                          // the spec JSON's "op"
  std::string (*to_json)(const Spec&);                       // with "op", without "config"
  absl::StatusOr<Spec> (*from_json)(std::string_view json);  // every field given; validates
  // The spec's config from its text; null for an op whose spec has none.
  std::function<absl::Status(std::string_view text, Spec&)> parse_config;
  absl::StatusOr<Op> (*create)(const Runtime&, const Spec&);
  std::vector<PassOf<Op>> passes;
  std::function<std::string(const Op&, int64_t rows)> config_for;  // null: none
};

// parse_config for a spec whose config is a std::optional<Config>.
template <class Spec, class Config>
std::function<absl::Status(std::string_view, Spec&)> ConfigParser(
    absl::StatusOr<Config> (*parse)(std::string_view)) {
  return [parse](std::string_view text, Spec& spec) -> absl::Status {
    KJIT_ASSIGN_OR_RETURN(spec.config,
                          ParseConfig(std::string(text).c_str(), parse));  // "config: ..."
    return absl::OkStatus();
  };
}

// An entry of the table kjit_op_create looks the kind up in.
struct OpEntry {
  std::string kind;
  // The op of the spec JSON (given fields over the defaults), the "config" parsed apart.
  std::function<absl::StatusOr<std::unique_ptr<NamedOp>>(const Runtime&, std::string_view json,
                                                         std::optional<std::string> config)>
      create;
  std::string defaults_json;  // to_json of the default spec
  bool config = false, config_for = false;
  std::vector<PassSchema> passes;
};

// Adds `entry` to the table (at load time, from KJIT_C_OP); returns true.
bool RegisterOp(OpEntry entry);
// The table, by kind.
const std::vector<OpEntry>& RegisteredOps();

template <class Op, class Spec>
class BoundOp final : public NamedOp {
 public:
  BoundOp(const OpBinding<Op, Spec>& binding, Spec spec, Op op)
      : binding_(binding), spec_(std::move(spec)), op_(std::move(op)) {}
  std::string_view kind() const override { return binding_.kind; }
  std::string SpecJson() const override { return binding_.to_json(spec_); }
  absl::Status Launch(std::string_view pass, CUstream stream,
                      const NamedArgs& args) const override {
    KJIT_ASSIGN_OR_RETURN(const PassOf<Op>* p, Find(pass));
    return p->launch(op_, stream, args);
  }
  absl::StatusOr<int64_t> WorkspaceBytes(std::string_view pass, int64_t rows) const override {
    KJIT_ASSIGN_OR_RETURN(const PassOf<Op>* p, Find(pass));
    KJIT_RETURN_IF_ERROR(CheckRows(rows));
    return p->workspace_bytes ? p->workspace_bytes(op_, rows) : 0;
  }
  absl::StatusOr<std::string> ConfigFor(int64_t rows) const override {
    if (!binding_.config_for) {
      return absl::UnimplementedError(fmt::format(
          "{} has no per-row config (its schema says \"config_for\": false)", binding_.kind));
    }
    KJIT_RETURN_IF_ERROR(CheckRows(rows));
    return binding_.config_for(op_, rows);
  }
  absl::StatusOr<BuildInfo> Build() const override { return op_.Build(); }

 private:
  absl::StatusOr<const PassOf<Op>*> Find(std::string_view pass) const {
    std::string names;
    for (const PassOf<Op>& p : binding_.passes) {
      if (p.schema.name == pass) return &p;
      names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", p.schema.name);
    }
    return absl::InvalidArgumentError(
        fmt::format("pass: \"{}\" is not a pass of {}; it has {}", pass, binding_.kind, names));
  }

  const OpBinding<Op, Spec>& binding_;  // a static of the op's entry file
  Spec spec_;
  Op op_;
};

// The spec JSON `json` laid over `defaults` (both objects; nlohmann-free for the entry files).
absl::StatusOr<std::string> OverDefaults(std::string_view defaults, std::string_view json);

template <class Op, class Spec>
OpEntry EntryOf(const OpBinding<Op, Spec>& b) {
  OpEntry e{.kind = b.kind,
            .defaults_json = b.to_json(Spec{}),
            .config = static_cast<bool>(b.parse_config),
            .config_for = static_cast<bool>(b.config_for)};
  for (const PassOf<Op>& p : b.passes) e.passes.push_back(p.schema);
  e.create = [&b, defaults = e.defaults_json](
                 const Runtime& rt, std::string_view json,
                 std::optional<std::string> config) -> absl::StatusOr<std::unique_ptr<NamedOp>> {
    KJIT_ASSIGN_OR_RETURN(const std::string full, OverDefaults(defaults, json));
    KJIT_ASSIGN_OR_RETURN(Spec spec, b.from_json(full));
    if (config) {
      if (!b.parse_config) {
        return absl::InvalidArgumentError(fmt::format("config: {} takes no config", b.kind));
      }
      KJIT_RETURN_IF_ERROR(b.parse_config(*config, spec));
    }
    KJIT_ASSIGN_OR_RETURN(Op op, b.create(rt, spec));
    return std::unique_ptr<NamedOp>(new BoundOp<Op, Spec>(b, std::move(spec), std::move(op)));
  };
  return e;
}

// Registers the OpBinding `binding` (a namespace-scope constant of the op's entry file) at load.
#define KJIT_C_OP(binding)                           \
  [[maybe_unused]] const bool binding##_registered = \
      ::kjit::capi::RegisterOp(::kjit::capi::EntryOf(binding))

}  // namespace kjit::capi

// The handle of an op made by name.
struct kjit_op {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kOp;
  kjit_handle_kind kind = kKind;
  std::unique_ptr<kjit::capi::NamedOp> op;
};
