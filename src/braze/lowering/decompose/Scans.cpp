/// Inclusive scans as masked reductions over a broadcast view (fused: nothing is materialized):
///   cumsum(x)[j]       = sum_k  (k <= j ? x[k] : 0)
///   cumprod(x)[j]      = prod_k (k <= j ? x[k] : 1)
///   logcumsumexp(x)[j] = m[j] + log(sum_k (k <= j ? exp(x[k] - m[j]) : 0)),
///                        m[j] = max_k (k <= j ? x[k] : -inf)  (a prefix max, so no underflow)
///   cummax(x)[i]       = max_j (j <= i ? x[j] : x[0])  (x[0] is in every prefix), and its
///                        index the last j <= i with x[j] equal to it (or both NaN); cummin
///                        likewise.
/// The work is quadratic in the scanned length.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <cmath>

namespace braze::decomp {

namespace {
/// A scan's broadcast over [.., n (i), n (k), ..] along `d`: x[k], k, and the mask k <= i.
struct Prefix {
  Node *xs, *k, *mask;
};

Prefix prefixOf(GraphBuilder &b, Node *x, int64_t d) {
  std::vector<SymExpr> wide = x->shape();
  wide.insert(wide.begin() + d, x->shape()[d]);
  Node *xs = b.expand(b.unsqueeze(x, d), wide);
  Node *k = b.iota(DType::Int64, wide, d + 1);
  return {xs, k, b.binary(OpKind::Le, k, b.iota(DType::Int64, wide, d))};
}
} // namespace

Node *decomposeScan(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  if (x->rank() == 0)
    return x;
  int64_t d = attrs::CumSum(*n).dim(); // cumsum's view: cumprod and logcumsumexp have its dim
  Prefix p = prefixOf(b, x, d);
  Node *xs = p.xs, *mask = p.mask;
  DType t = x->dtype();
  auto masked = [&](Node *v, double identity) { return b.where(mask, v, b.scalar(identity, t)); };
  if (n->op() == OpKind::CumSum)
    return b.reduce(OpKind::Sum, masked(xs, 0.0), {d + 1}, false, t);
  if (n->op() == OpKind::CumProd)
    return b.reduce(OpKind::Prod, masked(xs, 1.0), {d + 1}, false, t);
  {
    Node *m = b.reduce(OpKind::Amax, masked(xs, -INFINITY), {d + 1}, true);
    // A prefix of -inf gives m = -inf; subtract 0 there instead so the result stays -inf.
    Node *finite = b.unary(OpKind::IsInf, m);
    Node *shift = b.where(finite, b.scalar(0.0, t), m);
    Node *e = b.unary(OpKind::Exp, b.sub(xs, shift));
    Node *s = b.reduce(OpKind::Sum, masked(e, 0.0), {d + 1}, false);
    return b.add(b.unary(OpKind::Log, s), b.squeeze(shift, {d + 1}));
  }
}

namespace {
/// cum_extreme's values and indices over [.., n (i), n (j), ..] with j <= i.
std::pair<Node *, Node *> cumExtremeOf(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  const attrs::CumExtreme a(*n); // cum_extreme_index has the same attributes
  bool max = a.max();
  int64_t d = a.dim();
  DType t = x->dtype() == DType::Bool ? DType::UInt8 : x->dtype();
  Node *zeros = b.full(0.0, DType::Int64, x->shape());
  for (const SymExpr &e : x->shape())
    if (e->isConst(0)) // nothing to scan
      return {x, zeros};
  x = b.convert(x, t);
  auto [xj, j, mask] = prefixOf(b, x, d);
  Node *first = b.unsqueeze(b.slice(x, d, 0, 1, 1), d + 1);
  Node *values = b.reduce(max ? OpKind::Amax : OpKind::Amin, b.where(mask, xj, first), {d + 1},
                          false);
  Node *ve = b.unsqueeze(values, d + 1);
  Node *hit = b.binary(OpKind::Eq, xj, ve);
  if (isFloating(t))
    hit = b.binary(OpKind::LogicalOr, hit,
                   b.binary(OpKind::LogicalAnd, b.unary(OpKind::IsNan, xj),
                            b.unary(OpKind::IsNan, ve)));
  Node *at = b.where(b.binary(OpKind::LogicalAnd, mask, hit), j, i64(b, -1));
  return {values, b.reduce(OpKind::Amax, at, {d + 1}, false)};
}
} // namespace

Node *decomposeCumExtreme(GraphBuilder &b, Node *n) {
  return b.convert(cumExtremeOf(b, n).first, n->dtype());
}

Node *decomposeCumExtremeIndex(GraphBuilder &b, Node *n) { return cumExtremeOf(b, n).second; }

} // namespace braze::decomp
