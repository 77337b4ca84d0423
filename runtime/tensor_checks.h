// Internal: argument checks shared by the ops, each naming the argument it rejects.
//
//   KJIT_RETURN_IF_ERROR(CheckMatrix("x", args.x, spec.dtype, kAnyRows, spec.hidden));
#pragma once

#include <cstdint>
#include <string_view>

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

// The widest vector width <= max_vec (a power of two) for which every view's pointer and stride
// allow aligned access of that many elements.
int WidestAlignedVec(int max_vec, std::initializer_list<const TensorView*> views);

}  // namespace kjit::internal
