// Internal: argument checks shared by the ops, each naming the argument it rejects, so that every
// op words the same problem the same way.
//
//   KJIT_RETURN_IF_ERROR(CheckMatrix("x", args.x, spec.dtype, kAnyRows, spec.hidden));
//   KJIT_RETURN_IF_ERROR(CheckDisjoint({{"y", a.y}, {"rstd", a.rstd}}, {{"x", a.x}},
//                                      /*in_place=*/{{"y", "x"}}));
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "kjit/status.h"
#include "kjit/tensor.h"

namespace kjit::internal {

inline constexpr int64_t kAnyRows = -1;

// data non-null and aligned to its element, dtype as expected, rows >= 1 (or == rows when given),
// cols as expected, row_stride >= cols, rows <= 2^31-1 and a byte span under 2^48 (so no size
// computation on the view can overflow).
absl::Status CheckMatrix(std::string_view name, const TensorView& t, DType dtype, int64_t rows,
                         int64_t cols);

// True when [a, a+bytes) and [b, b+bytes) intersect but do not coincide; ops allow exact aliasing
// (in place) where documented and reject partial overlap.
bool PartiallyOverlaps(const TensorView& a, const TensorView& b);

// InvalidArgument "<a_name>: overlaps <b_name>" when the views partially overlap (exact aliasing
// passes: in place).
absl::Status CheckNoPartialOverlap(std::string_view a_name, const TensorView& a,
                                   std::string_view b_name, const TensorView& b);
// As above, and exact aliasing is refused too ("<a_name>: must not alias <b_name>").
absl::Status CheckNoOverlap(std::string_view a_name, const TensorView& a, std::string_view b_name,
                            const TensorView& b);

// A named argument of an op for the overlap checks: a tensor, or a vector or workspace as bytes.
struct NamedView {
  std::string_view name;
  TensorView view;  // empty: absent, overlaps nothing
};
// An index vector or `bytes` of raw device memory as a view of the bytes they span.
TensorView BytesOf(const IndexView& v);
TensorView BytesOf(const void* data, int64_t bytes);

// Outputs may not overlap each other or any input: "<output>: overlaps <other>", or "<output>: must
// not alias <other>" for the same address. Between two outputs the later one is named. The
// (output, input) pairs in `in_place` may alias exactly (the same view: in place) but not overlap
// partially.
absl::Status CheckDisjoint(
    std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs,
    std::initializer_list<std::pair<std::string_view, std::string_view>> in_place = {});

// An index vector: non-null, of `type`, aligned to its elements, `size` long.
absl::Status CheckIndexVector(std::string_view name, const IndexView& v, IndexType type,
                              int64_t size);

// A workspace: non-null, 16-byte aligned device memory of at least `needed` bytes;
// `needed_expr` says how the caller gets that size ("WorkspaceBytes(rows)").
absl::Status CheckWorkspace(const void* workspace, int64_t workspace_bytes, int64_t needed,
                            std::string_view needed_expr);

// The widest vector width <= max_vec (a power of two) for which every view's pointer and stride
// allow aligned access of that many elements.
int WidestAlignedVec(int max_vec, std::initializer_list<const TensorView*> views);

// The widest vector width <= max_vec (a power of two) at which each row of every view in `alike`
// is as far past a vector boundary as the same row of `lead`. Kernels that start each row's vectors
// at its first boundary (the cross-entropy kernels' CeLayout) then move all of them by whole
// vectors, whatever the row length or the views' offsets; only views that differ in their offset
// or row stride narrow it. Null views are skipped.
int WidestVecAlignedAlike(int max_vec, const TensorView& lead,
                          std::initializer_list<const TensorView*> alike);

}  // namespace kjit::internal
