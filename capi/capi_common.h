// What the C API's files share (capi/*_capi.cc, one per op family; capi_common.cc holds what is
// not a template): the handles, a call's status and message reported the C way (Call), the checks
// of handles, pointers and struct sizes, the C structs' enum fields read by Fields, and the
// templates that create, launch and query an op. Private to libkjit_c.so.
#pragma once

#include <cxxabi.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "jit/exit_gate.h"
#include "jit/status_helpers.h"
#include "kjit/kjit.h"
#include "kjit/kjit_c.h"

// Each handle starts with its kind (the type's kKind, which CheckHandle expects), so that one of
// another kind (or a destroyed one, while its memory is still there) passed where this kind is
// expected is an error naming both, not UB.
enum class kjit_handle_kind : uint32_t {
  kDestroyed = 0,
  kRuntime = 0x6b6a7401,
  kRmsNorm,
  kCrossEntropy,
  kLinearCrossEntropy,
  kShardedCrossEntropy,
  kLogProbs,
  kOp,  // kjit_op (capi/op_entry.h): every op by name
};
struct kjit_runtime {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kRuntime;
  kjit_handle_kind kind = kKind;
  kjit::Runtime rt;
};
struct kjit_rms_norm {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kRmsNorm;
  kjit_handle_kind kind = kKind;
  kjit::RmsNorm op;
};
struct kjit_cross_entropy {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kCrossEntropy;
  kjit_handle_kind kind = kKind;
  kjit::CrossEntropy op;
};
struct kjit_linear_cross_entropy {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kLinearCrossEntropy;
  kjit_handle_kind kind = kKind;
  kjit::LinearCrossEntropy op;
};
struct kjit_sharded_cross_entropy {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kShardedCrossEntropy;
  kjit_handle_kind kind = kKind;
  kjit::ShardedCrossEntropy op;
};
struct kjit_log_probs {
  static constexpr kjit_handle_kind kKind = kjit_handle_kind::kLogProbs;
  kjit_handle_kind kind = kKind;
  kjit::LogProbs op;
};

namespace kjit::capi {

// The accepted values of the enum fields that more than one file reads, from 0 (weight_dtype's from
// -1); each family's own are in its file.
inline constexpr const char* kDTypeNames[] = {"KJIT_F32", "KJIT_F16", "KJIT_BF16"};
inline constexpr const char* kWeightDTypeNames[] = {"dtype's", "KJIT_F32", "KJIT_F16", "KJIT_BF16"};
inline constexpr const char* kIndexNames[] = {"KJIT_INT32", "KJIT_INT64"};
inline constexpr const char* kFlagNames[] = {"off", "on"};

// This thread's last error (kjit_last_error), and Fail, which sets it to `message` and returns
// `code`.
extern thread_local std::string last_error;
kjit_status Fail(kjit_status code, std::string_view message) noexcept;

// Runs `body(fn)` (an absl::Status) and reports it the C way: its code, and its message as this
// thread's last error ("" on success). Nothing escapes: an exception becomes KJIT_INTERNAL (or
// KJIT_RESOURCE_EXHAUSTED when host memory ran out), but for the unwinding of a thread that
// pthread_exit() ends under the call (Python ends a daemon thread so when a warning callback
// wants the interpreter while it shuts down): swallowed, it aborted the process ("FATAL:
// exception not rethrown"). Not noexcept, for the same reason.
template <class Body>
kjit_status Call(const char* fn, Body&& body) {
  // exit() on another thread waits for this call before any library's destructors run, and a call
  // made after that waits for the end (jit/exit_gate.h).
  jit::ExitGate::Pass pass;
  try {
    const absl::Status status = body(fn);
    return Fail(static_cast<kjit_status>(status.code()), ToStd(status.message()));
  } catch (const abi::__forced_unwind&) {
    throw;
  } catch (const std::bad_alloc&) {
    return Fail(KJIT_RESOURCE_EXHAUSTED, "out of host memory");
  } catch (const std::exception& e) {
    return Fail(KJIT_INTERNAL,
                fmt::format("{}: internal error, please report it: {}", fn, e.what()));
  } catch (...) {
    return Fail(KJIT_INTERNAL, "internal error (an unknown exception), please report it");
  }
}

// InvalidArgument naming the first NULL of the (name, pointer) pairs.
absl::Status NotNull(const char* fn,
                     std::initializer_list<std::pair<const char*, const void*>> pointers);

// The kind's handle type ("kjit_runtime"); nullptr for kDestroyed or a value no kind has.
const char* KindName(kjit_handle_kind kind);

// `handle` (the argument `name`) is not NULL and is a live handle of its type: InvalidArgument
// naming the kind it is instead (a handle of another kind cast to this type), or saying that it
// is none (destroyed, or not a handle at all).
template <class Handle>
absl::Status CheckHandle(const char* fn, const char* name, const Handle* handle) {
  KJIT_RETURN_IF_ERROR(NotNull(fn, {{name, handle}}));
  kjit_handle_kind kind;
  std::memcpy(&kind, handle, sizeof(kind));  // every handle starts with its kind
  if (kind == Handle::kKind) return absl::OkStatus();
  const char* expected = KindName(Handle::kKind);
  if (const char* other = KindName(kind)) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} is a {} handle; expected a {}", fn, name, other, expected));
  }
  return absl::InvalidArgumentError(fmt::format(
      "{}: {} is not a live {} handle (destroyed already, or not a handle)", fn, name, expected));
}

// kjit_*_destroy: NULL is nothing to do; a handle of another kind is left alone (this thread's
// last error says why) rather than freed as the wrong type.
template <class Handle>
void DestroyHandle(const char* fn, Handle* handle) noexcept {
  if (handle == nullptr) return;
  jit::ExitGate::Pass pass;  // as Call's
  const absl::Status s = CheckHandle(fn, "handle", handle);
  if (!s.ok()) {
    Fail(static_cast<kjit_status>(s.code()), ToStd(s.message()));
    return;
  }
  handle->kind = kjit_handle_kind::kDestroyed;
  delete handle;
}

// An output pointer: not NULL, and cleared first, so that a failed call leaves NULL (or 0) there.
template <class T>
absl::Status Output(const char* fn, const char* name, T* out) {
  KJIT_RETURN_IF_ERROR(NotNull(fn, {{name, out}}));
  *out = T{};
  return absl::OkStatus();
}

// Each C struct's name, for CheckSize: specialized in the file of the struct's op family.
template <class T>
constexpr const char* kStructName = nullptr;

// The struct `name` points to was made for this library's layout of T.
template <class T>
absl::Status CheckSize(const char* fn, const char* name, const T& s) {
  if (s.struct_size == sizeof(T)) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format(
      "{}: {}->struct_size is {}, but {} is {} bytes in this library (kjit C ABI version {}); "
      "set it with {}_init",
      fn, name, s.struct_size, kStructName<T>, sizeof(T), KJIT_C_ABI_VERSION, kStructName<T>));
}

// Reads the enum and flag fields of the C structs (and the dtypes of their views), keeping the
// first that is out of range as an InvalidArgument naming the field and the values it accepts.
class Fields {
 public:
  // `value` when it is one of first, first + 1, ... (as many as `names`), else `first`.
  int Choice(std::initializer_list<std::string_view> name, int32_t value,
             std::span<const char* const> names, int first = 0) {
    const int64_t index = int64_t{value} - first;
    if (index >= 0 && index < std::ssize(names)) return value;
    if (!status_.ok()) return first;
    std::string field, accepted;
    for (std::string_view part : name) field += (field.empty() ? "" : ".") + std::string(part);
    for (int i = 0; i < std::ssize(names); ++i) {
      const char* separator = i == 0 ? "" : i + 1 < std::ssize(names) ? ", " : " or ";
      accepted += fmt::format("{}{} ({})", separator, first + i, names[i]);
    }
    status_ = absl::InvalidArgumentError(
        fmt::format("{}: {} is out of range; expected {}", field, value, accepted));
    return first;
  }
  bool Flag(const char* name, int32_t value) { return Choice({name}, value, kFlagNames) != 0; }
  DType Dtype(std::initializer_list<std::string_view> name, int32_t value) {
    return static_cast<DType>(Choice(name, value, kDTypeNames));
  }
  TensorView Tensor(std::string_view name, const kjit_tensor& t) {
    return {t.data, Dtype({name, "dtype"}, t.dtype), t.rows, t.cols, t.row_stride};
  }
  IndexView Index(std::string_view name, const kjit_index& i) {
    return {i.data, static_cast<IndexType>(Choice({name, "type"}, i.type, kIndexNames)), i.size};
  }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// A spec's config text (NULL or "": none) read by the op's parser.
template <class Config>
absl::StatusOr<std::optional<Config>> ParseConfig(
    const char* text, absl::StatusOr<Config> (*parse)(std::string_view)) {
  if (text == nullptr || *text == '\0') return std::optional<Config>();
  absl::StatusOr<Config> config = parse(text);
  if (!config.ok()) return Annotate(config.status(), "config");
  return std::optional<Config>(*std::move(config));
}

// A row count for the queries: what a launch takes.
absl::Status CheckRows(int64_t rows);

// `text` in malloc'd memory (kjit_free frees it) for a char** output.
absl::Status Return(std::string_view text, char** out);

absl::Status ReturnBuild(const absl::StatusOr<BuildInfo>& b, char** json_out);

// The loss options of every loss spec; a bad field is named "loss.<field>".
LossOptions ToCpp(Fields& f, const kjit_loss_options& c);

// LossOptions' defaults as the C struct, for the loss specs' *_spec_init.
kjit_loss_options DefaultLossOptions();

// The op of a C spec on `rt`, for CreateOp: each defined in its op family's file.
absl::StatusOr<kjit::RmsNorm> MakeOp(const Runtime& rt, const kjit_rms_norm_spec& c);
absl::StatusOr<kjit::CrossEntropy> MakeOp(const Runtime& rt, const kjit_cross_entropy_spec& c);
absl::StatusOr<kjit::LinearCrossEntropy> MakeOp(const Runtime& rt,
                                                const kjit_linear_cross_entropy_spec& c);
absl::StatusOr<kjit::ShardedCrossEntropy> MakeOp(const Runtime& rt,
                                                 const kjit_sharded_cross_entropy_spec& c);
absl::StatusOr<kjit::LogProbs> MakeOp(const Runtime& rt, const kjit_log_probs_spec& c);

// kjit_*_create: the op of `spec` on `runtime`, as a new handle in *out.
template <class Handle, class Spec>
kjit_status CreateOp(const char* fn, const kjit_runtime* runtime, const Spec* spec, Handle** out) {
  return Call(fn, [&](const char*) -> absl::Status {
    KJIT_RETURN_IF_ERROR(Output(fn, "out", out));
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "runtime", runtime));
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"spec", spec}}));
    KJIT_RETURN_IF_ERROR(CheckSize(fn, "spec", *spec));
    KJIT_ASSIGN_OR_RETURN(auto op, MakeOp(runtime->rt, *spec));
    *out = new Handle{.op = std::move(op)};
    return absl::OkStatus();
  });
}

// The launches' arguments as the C++ ops take them: each family's ToCpp(Fields&, const C args&),
// which LaunchOp finds in this namespace through Fields, converts each view by Fields and names it
// by its field (`.x = f.Tensor("x", a.x)`), so that a message names the C field exactly.
#define KJIT_VIEW(field) .field = f.Tensor(#field, a.field)
#define KJIT_INDEX(field) .field = f.Index(#field, a.field)
#define KJIT_WORKSPACE .workspace = a.workspace, .workspace_bytes = a.workspace_bytes

// The per-row extras both fused ops' args have (ABI 3), set on the C++ args.
template <class Args, class CArgs>
Args WithExtras(Fields& f, const CArgs& a, Args args) {
  args.entropy = f.Tensor("entropy", a.entropy);
  args.target_logprob = f.Tensor("target_logprob", a.target_logprob);
  return args;
}

// A launch: `op` and `args` checked, then the C++ op's `launch` with the converted arguments.
template <class Handle, class Args, class Op, class CppArgs>
kjit_status LaunchOp(const char* fn, const Handle* op, CUstream stream, const Args* args,
                     absl::Status (Op::*launch)(CUstream, const CppArgs&) const) {
  return Call(fn, [&](const char*) -> absl::Status {
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "op", op));
    KJIT_RETURN_IF_ERROR(NotNull(fn, {{"args", args}}));
    KJIT_RETURN_IF_ERROR(CheckSize(fn, "args", *args));
    Fields f;
    const CppArgs cpp = ToCpp(f, *args);
    KJIT_RETURN_IF_ERROR(f.status());
    return (op->op.*launch)(stream, cpp);
  });
}

// A query of an op: the output `out_name` and `op` checked (the output cleared), then
// `query(C++ op)`.
template <class Handle, class Out, class Query>
kjit_status QueryOp(const char* fn, const Handle* op, const char* out_name, Out* out,
                    Query&& query) {
  return Call(fn, [&](const char*) -> absl::Status {
    KJIT_RETURN_IF_ERROR(Output(fn, out_name, out));
    KJIT_RETURN_IF_ERROR(CheckHandle(fn, "op", op));
    return query(op->op);
  });
}

// *args zeroed, with its struct_size set: the *_init of the structs whose defaults are all zero.
template <class Args>
void InitArgs(Args* args) {
  if (args != nullptr) *args = Args{.struct_size = sizeof(Args)};
}

}  // namespace kjit::capi
