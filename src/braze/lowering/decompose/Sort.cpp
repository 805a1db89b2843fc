/// argsort: the indices that sort x along `dim`, stably, as rank-counting reductions.
/// sort and median gather x's elements at argsort's and median_index's indices.
///   1. rank(i) = #{ j : less(x[j], x[i]) or (same(x[j], x[i]) and j < i) }, NaN the largest
///      value (last ascending, first descending) and NaNs the same value;
///   2. position r takes the index i whose rank is r (ranks are a permutation: exactly one).
/// Step 1 is a masked reduction over an [.., n, n, ..] broadcast, so nothing of size n x n is
/// stored, but its work is quadratic in the sorted length. Step 2 is a scatter of each index
/// to its rank's position: an integer sum into zeros, which combines in place (linear work,
/// exact in any order, each position reached once) where the scatter has more pairs than its
/// reductions take, and is otherwise a second reduction over the broadcast.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <tuple>

namespace braze::decomp {

namespace {
/// x broadcast to [.., n (j), n (i), ..] along `dim` twice: (wide shape, x[j], x[i]).
std::tuple<std::vector<SymExpr>, Node *, Node *> pairViews(GraphBuilder &b, Node *x,
                                                           int64_t dim) {
  std::vector<SymExpr> wide = x->shape();
  wide.insert(wide.begin() + dim, x->shape()[dim]);
  Node *xj = b.expand(b.unsqueeze(x, dim + 1), wide);
  return {wide, xj, b.expand(b.unsqueeze(x, dim), wide)};
}
} // namespace

Node *decomposeArgsort(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  const attrs::Argsort sortAttrs(*n);
  int64_t dim = sortAttrs.dim();
  bool descending = sortAttrs.descending();
  auto [wide, xj, xi] = pairViews(b, x, dim); // [.., n (j or r), n (i), ..]
  auto op = [&](OpKind k, Node *a, Node *c) { return b.binary(k, a, c); };
  Node *j = b.iota(DType::Int64, wide, dim), *i = b.iota(DType::Int64, wide, dim + 1);
  Node *less, *same;
  if (isFloating(x->dtype())) {
    Node *nj = b.unary(OpKind::IsNan, xj), *ni = b.unary(OpKind::IsNan, xi);
    less = descending ? op(OpKind::LogicalOr, op(OpKind::Gt, xj, xi),
                           op(OpKind::LogicalAnd, nj, b.unary(OpKind::LogicalNot, ni)))
                      : op(OpKind::LogicalOr, op(OpKind::Lt, xj, xi),
                           op(OpKind::LogicalAnd, ni, b.unary(OpKind::LogicalNot, nj)));
    same = op(OpKind::LogicalOr, op(OpKind::Eq, xj, xi), op(OpKind::LogicalAnd, nj, ni));
  } else {
    less = op(descending ? OpKind::Gt : OpKind::Lt, xj, xi);
    same = op(OpKind::Eq, xj, xi);
  }
  Node *before = op(OpKind::LogicalOr, less, op(OpKind::LogicalAnd, same, op(OpKind::Lt, j, i)));
  // A count below 2^31 (sortLimitError bounds n) adds in i32: one instruction, not two.
  Node *rank = b.convert(
      b.reduce(OpKind::Sum, b.convert(before, DType::Int32), {dim}, false, DType::Int32),
      DType::Int64);
  int64_t numel = 1, stride = 1;
  for (size_t d = 0; d < x->shape().size(); ++d) {
    numel *= x->shape()[d]->value();
    if (static_cast<int64_t>(d) > dim)
      stride *= x->shape()[d]->value();
  }
  if (GraphBuilder::scatterAccumulates(DType::Int64, "sum", false, numel, numel)) {
    // flat position of (.., rank(i), ..) = flat position of (.., i, ..) + (rank(i) - i) * stride
    Node *at = b.iota(DType::Int64, x->shape(), dim);
    Node *flat = b.reshape(b.iota(DType::Int64, {b.dim(numel)}, 0), x->shape());
    Node *moved = b.sub(rank, at);
    if (stride != 1)
      moved = b.binary(OpKind::Mul, moved, i64(b, stride));
    Node *target = b.add(flat, moved);
    return b.scatter(b.full(0, DType::Int64, x->shape()), target, at, "sum", true);
  }
  Node *ranked = b.expand(b.unsqueeze(rank, dim), wide); // [.., r, i, ..] -> rank(i)
  Node *hit = op(OpKind::Eq, ranked, j);                  // j is r along dim
  return b.reduce(OpKind::Sum, b.where(hit, i, b.scalar(0, DType::Int64)), {dim + 1}, false,
                  DType::Int64);
}

/// sort: x's elements in argsort's order, gathered along dim (argsort's node is shared with
/// the sort's indices once the graph's common subexpressions merge).
Node *decomposeSort(GraphBuilder &b, Node *n) {
  const attrs::Sort a(*n);
  return b.gather(n->operand(0), a.dim(), b.argsort(n->operand(0), a.dim(), a.descending()));
}

/// median: the element at median_index along dim.
Node *decomposeMedian(GraphBuilder &b, Node *n) {
  const attrs::Median a(*n);
  return b.gather(n->operand(0), a.dim(), b.medianIndex(n->operand(0), a.dim(), a.ignore_nan()));
}

/// The lower median's index: position k of the stable ascending order (NaN last), k = (n - 1)
/// / 2, or with ignore_nan (count of non-NaN values - 1) / 2; without it, a row holding a NaN
/// takes its first NaN.
Node *decomposeMedianIndex(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  const attrs::MedianIndex a(*n);
  int64_t dim = a.dim();
  bool nan = isFloating(x->dtype()), ignoreNan = a.ignore_nan();
  Node *order = b.argsort(x, dim, false), *k;
  if (ignoreNan && nan) {
    Node *count = b.reduce(OpKind::Sum,
                           b.convert(b.unary(OpKind::LogicalNot, b.unary(OpKind::IsNan, x)),
                                     DType::Int64),
                           {dim}, true, DType::Int64);
    count = b.binary(OpKind::Maximum, b.sub(count, i64(b, 1)), i64(b, 0));
    k = b.binary(OpKind::FloorDiv, count, i64(b, 2));
  } else {
    k = b.full(static_cast<double>((x->shape()[dim]->value() - 1) / 2), DType::Int64, n->shape());
  }
  Node *index = b.gather(order, dim, k);
  if (ignoreNan || !nan)
    return index;
  Node *isnan = b.unary(OpKind::IsNan, x);
  Node *at = b.where(isnan, b.iota(DType::Int64, x->shape(), dim), i64(b, int64_t(1) << 62));
  return b.where(b.reduce(OpKind::Any, isnan, {dim}, true),
                 b.reduce(OpKind::Amin, at, {dim}, true), index);
}

namespace {
/// mode's value (in x's dtype, bool as i64) and index: count each element's equals along dim;
/// among the most frequent, the smallest value (a masked amin whose filler is the row's
/// largest value, so no sentinel bounds the dtype), and its last position.
std::pair<Node *, Node *> modeOf(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  if (x->dtype() == DType::Bool)
    x = b.convert(x, DType::Int64);
  int64_t dim = attrs::Mode(*n).dim(); // mode's view: mode_index has the same attribute
  auto [wide, xj, xi] = pairViews(b, x, dim);
  Node *count = b.reduce(OpKind::Sum, b.convert(b.binary(OpKind::Eq, xj, xi), DType::Int64),
                         {dim}, false, DType::Int64);
  Node *frequent =
      b.binary(OpKind::Eq, count, b.reduce(OpKind::Amax, count, {dim}, true));
  Node *largest = b.reduce(OpKind::Amax, x, {dim}, true);
  Node *value = b.reduce(OpKind::Amin, b.where(frequent, x, largest), {dim}, true);
  Node *at = b.where(b.binary(OpKind::Eq, x, value), b.iota(DType::Int64, x->shape(), dim),
                     i64(b, -1));
  return {value, b.reduce(OpKind::Amax, at, {dim}, true)};
}
} // namespace

Node *decomposeMode(GraphBuilder &b, Node *n) { return b.convert(modeOf(b, n).first, n->dtype()); }

Node *decomposeModeIndex(GraphBuilder &b, Node *n) { return modeOf(b, n).second; }

} // namespace braze::decomp
