#include "runtime/tensor_checks.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::internal {

namespace {
// Larger than any device allocation; keeps every span computation far from overflow.
constexpr int64_t kMaxViewBytes = int64_t{1} << 48;
}  // namespace

absl::Status CheckMatrix(std::string_view name, const TensorView& t, DType dtype, int64_t rows,
                         int64_t cols) {
  if (t.data == nullptr) return absl::InvalidArgumentError(fmt::format("{}: null pointer", name));
  if (t.dtype != dtype) {
    return absl::InvalidArgumentError(
        fmt::format("{}: dtype is {}, expected {}", name, Name(t.dtype), Name(dtype)));
  }
  if (reinterpret_cast<uintptr_t>(t.data) % SizeOf(dtype) != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: pointer {} is not aligned to its {}-byte elements", name, t.data, SizeOf(dtype)));
  }
  if (rows == kAnyRows ? t.rows < 1 : t.rows != rows) {
    return absl::InvalidArgumentError(
        rows == kAnyRows ? fmt::format("{}: rows is {}, expected at least 1", name, t.rows)
                         : fmt::format("{}: rows is {}, expected {}", name, t.rows, rows));
  }
  if (t.cols != cols) {
    return absl::InvalidArgumentError(
        fmt::format("{}: cols is {}, expected {}", name, t.cols, cols));
  }
  if (t.row_stride < t.cols) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: row_stride {} is shorter than the row ({} elements)", name, t.row_stride, t.cols));
  }
  // Launch grids and the kernels' row counters are 32-bit, and the overlap checks compute each
  // view's byte span: refuse sizes those cannot hold before anything multiplies them.
  if (t.rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        fmt::format("{}: rows is {}, more than the {} a launch handles", name, t.rows, INT32_MAX));
  }
  int64_t span = 0;
  if (__builtin_mul_overflow(t.rows - 1, t.row_stride, &span) ||
      __builtin_add_overflow(span, t.cols, &span) ||
      __builtin_mul_overflow(span, static_cast<int64_t>(SizeOf(dtype)), &span) ||
      span > kMaxViewBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} rows of row_stride {} span more than {} bytes (2^48, beyond any device's memory)",
        name, t.rows, t.row_stride, kMaxViewBytes));
  }
  return absl::OkStatus();
}

bool PartiallyOverlaps(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr || a.data == b.data) return false;
  // The views may not have been checked yet: a span that overflows (huge rows or stride) reaches
  // the end of the address space instead of wrapping (signed overflow is undefined behaviour).
  auto span = [](const TensorView& t) {
    const auto begin = reinterpret_cast<uintptr_t>(t.data);
    int64_t elems = 0, bytes = 0;
    uintptr_t end = 0;
    if (__builtin_mul_overflow(t.rows - 1, t.row_stride, &elems) ||
        __builtin_add_overflow(elems, t.cols, &elems) ||
        __builtin_mul_overflow(elems, static_cast<int64_t>(SizeOf(t.dtype)), &bytes) || bytes < 0 ||
        __builtin_add_overflow(begin, static_cast<uintptr_t>(bytes), &end)) {
      end = UINTPTR_MAX;
    }
    return std::pair(begin, end);
  };
  auto [a0, a1] = span(a);
  auto [b0, b1] = span(b);
  if (!(a0 < b1 && b0 < a1)) return false;
  // Views of one strided buffer may interleave without sharing an element (two column ranges of
  // the same rows): compare the columns they cover within a row.
  const auto elem = static_cast<intptr_t>(SizeOf(a.dtype));
  if (a.dtype != b.dtype || a.row_stride != b.row_stride || (b0 > a0 ? b0 - a0 : a0 - b0) % elem) {
    return true;
  }
  const intptr_t s = a.row_stride;
  const intptr_t d = (static_cast<intptr_t>(b0) - static_cast<intptr_t>(a0)) / elem;
  const intptr_t r = ((d % s) + s) % s;  // b's first column relative to a's rows
  auto hits = [&](intptr_t start) { return start < a.cols && 0 < start + b.cols; };
  return hits(r) || hits(r - s);
}

absl::Status CheckNoPartialOverlap(std::string_view a_name, const TensorView& a,
                                   std::string_view b_name, const TensorView& b) {
  if (PartiallyOverlaps(a, b)) {
    return absl::InvalidArgumentError(
        fmt::format("{}: overlaps {} (only exact in-place aliasing is allowed)", a_name, b_name));
  }
  return absl::OkStatus();
}

absl::Status CheckNoOverlap(std::string_view a_name, const TensorView& a, std::string_view b_name,
                            const TensorView& b) {
  if (!a.empty() && a.data == b.data) {
    return absl::InvalidArgumentError(fmt::format("{}: must not alias {}", a_name, b_name));
  }
  return CheckNoPartialOverlap(a_name, a, b_name, b);
}

TensorView BytesOf(const IndexView& v) {
  return v.empty() ? TensorView{} : BytesOf(v.data, v.size * static_cast<int64_t>(SizeOf(v.type)));
}

TensorView BytesOf(const void* data, int64_t bytes) {
  // Whole fp32 elements: every buffer an op takes is a multiple of 4 bytes.
  return TensorView::Vector(const_cast<void*>(data), DType::kF32, (bytes + 3) / 4);
}

absl::Status CheckDisjoint(
    std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs,
    std::initializer_list<std::pair<std::string_view, std::string_view>> in_place) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (auto earlier = outputs.begin(); earlier != out; ++earlier) {
      KJIT_RETURN_IF_ERROR(CheckNoOverlap(out->name, out->view, earlier->name, earlier->view));
    }
    for (const NamedView& in : inputs) {
      const bool may_alias = std::find(in_place.begin(), in_place.end(),
                                       std::pair(out->name, in.name)) != in_place.end();
      KJIT_RETURN_IF_ERROR(may_alias ? CheckNoPartialOverlap(out->name, out->view, in.name, in.view)
                                     : CheckNoOverlap(out->name, out->view, in.name, in.view));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckIndexVector(std::string_view name, const IndexView& v, IndexType type,
                              int64_t size) {
  if (v.data == nullptr) return absl::InvalidArgumentError(fmt::format("{}: null pointer", name));
  if (v.type != type) {
    return absl::InvalidArgumentError(
        fmt::format("{}: type is {}, expected {}", name, Name(v.type), Name(type)));
  }
  if (reinterpret_cast<uintptr_t>(v.data) % SizeOf(type) != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: pointer {} is not aligned to its {}-byte elements", name, v.data, SizeOf(type)));
  }
  if (v.size != size) {
    return absl::InvalidArgumentError(
        fmt::format("{}: size is {}, expected {}", name, v.size, size));
  }
  return absl::OkStatus();
}

absl::Status CheckWorkspace(const void* workspace, int64_t workspace_bytes, int64_t needed,
                            std::string_view needed_expr) {
  if (workspace == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("workspace: null; pass {} = {} bytes of device memory", needed_expr, needed));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return absl::InvalidArgumentError("workspace: must be 16-byte aligned");
  }
  if (workspace_bytes < needed) {
    return absl::InvalidArgumentError(fmt::format("workspace_bytes: {} is too small, need {} = {}",
                                                  workspace_bytes, needed_expr, needed));
  }
  return absl::OkStatus();
}

int WidestAlignedVec(int max_vec, std::initializer_list<const TensorView*> views) {
  int vec = max_vec;
  for (const TensorView* t : views) {
    if (t == nullptr || t->data == nullptr) continue;
    const auto addr = reinterpret_cast<uintptr_t>(t->data);
    while (vec > 1 &&
           (addr % (vec * SizeOf(t->dtype)) != 0 || (t->rows > 1 && t->row_stride % vec != 0))) {
      vec /= 2;
    }
  }
  return vec;
}

int WidestVecAlignedAlike(int max_vec, const TensorView& lead,
                          std::initializer_list<const TensorView*> alike) {
  int vec = max_vec;
  for (const TensorView* t : alike) {
    if (t == nullptr || t->data == nullptr || lead.data == nullptr) continue;
    // Element offsets and strides, both views holding elements of lead's size (the ops check).
    const auto offset =
        static_cast<int64_t>(reinterpret_cast<uintptr_t>(t->data) / SizeOf(t->dtype)) -
        static_cast<int64_t>(reinterpret_cast<uintptr_t>(lead.data) / SizeOf(lead.dtype));
    const int64_t stride_gap = t->rows > 1 ? t->row_stride - lead.row_stride : 0;
    while (vec > 1 && (offset % vec != 0 || stride_gap % vec != 0)) vec /= 2;
  }
  return vec;
}

}  // namespace kjit::internal
