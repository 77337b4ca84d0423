// CeilDiv: how many blocks, tiles or vectors of `b` cover `a` items, the last one partly filled.
//
//   const int64_t blocks = CeilDiv(rows, rows_per_block);   // CeilDiv(4097, 1024) == 5
#pragma once

#include <cstdint>

namespace kjit::ops {

constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace kjit::ops
