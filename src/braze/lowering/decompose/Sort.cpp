/// argsort: the indices that sort x along `dim`, stably, as rank-counting reductions.
///   1. rank(i) = #{ j : less(x[j], x[i]) or (same(x[j], x[i]) and j < i) }, NaN the largest
///      value (last ascending, first descending) and NaNs the same value;
///   2. position r takes the index i whose rank is r (ranks are a permutation: exactly one).
/// Both are masked reductions over [.., n, n, ..] broadcasts, so nothing of size n x n is
/// stored, but the work is quadratic in the sorted length.
#include "braze/lowering/decompose/Decompose.h"

namespace braze::decomp {

Node *decomposeArgsort(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  int64_t dim = n->attrs().getInt("dim");
  bool descending = n->attrs().getBool("descending");
  std::vector<SymExpr> wide = x->shape();
  wide.insert(wide.begin() + dim, x->shape()[dim]); // [.., n (j or r), n (i), ..]
  auto op = [&](OpKind k, Node *a, Node *c) { return b.binary(k, a, c); };
  Node *xj = b.expand(b.unsqueeze(x, dim + 1), wide), *xi = b.expand(b.unsqueeze(x, dim), wide);
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
  Node *rank = b.reduce(OpKind::Sum, b.convert(before, DType::Int64), {dim}, false, DType::Int64);
  Node *ranked = b.expand(b.unsqueeze(rank, dim), wide); // [.., r, i, ..] -> rank(i)
  Node *hit = op(OpKind::Eq, ranked, j);                  // j is r along dim
  return b.reduce(OpKind::Sum, b.where(hit, i, b.scalar(0, DType::Int64)), {dim + 1}, false,
                  DType::Int64);
}

} // namespace braze::decomp
