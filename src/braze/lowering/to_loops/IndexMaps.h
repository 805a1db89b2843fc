#pragma once
/// Index remaps for views and broadcasting: each maps an index tuple of the result to one of
/// the operand. They build SymExprs, so the results are simplified and hash-consed. Also the
/// padded-row layout of large stored values.
#include "braze/ir/graph/Graph.h"
#include "braze/ir/sym/SymExpr.h"

#include <vector>

namespace braze {

using Index = std::vector<sym::SymExpr>;

/// Sum of idx[k] * strides[k].
sym::SymExpr linearIndex(sym::SymContext &s, const Index &idx,
                         const std::vector<sym::SymExpr> &strides);
/// Index into an operand of shape `from` broadcast to `to` (trailing-aligned; broadcast dims -> 0).
Index broadcastIndex(sym::SymContext &s, const Index &idx, const std::vector<sym::SymExpr> &to,
                     const std::vector<sym::SymExpr> &from);
/// Index into a tensor of shape `to` that a reshape to `from` reads: both are row-major views of
/// the same elements.
Index reshapeIndex(sym::SymContext &s, const Index &idx, const std::vector<sym::SymExpr> &from,
                   const std::vector<sym::SymExpr> &to);

/// Index into the operand of `view` (a node of the View category: reshape, permute, expand,
/// slice, diagonal, unfold, flip or select) that the view reads at idx, its own index.
Index viewOperandIndex(sym::SymContext &s, const Node &view, const Index &idx);

/// Row-major strides of `shape` with each row padded to whole 16-byte words, for a value of at
/// least 8 MiB (elements of `elementBytes`) whose rows of at least 64 elements are not whole
/// words; empty otherwise (the value is stored row-major). Constant shapes only.
std::vector<sym::SymExpr> paddedRowStrides(sym::SymContext &s,
                                           const std::vector<sym::SymExpr> &shape,
                                           int64_t elementBytes);

} // namespace braze
