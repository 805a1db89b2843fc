/// cdist and pdist: ||a_i - b_j||_p as a broadcast difference reduced over the feature dim:
/// p = 0 counts the non-zero differences, 1 sums |d|, 2 is sqrt(sum d^2), inf the largest |d|,
/// any other p (sum |d|^p)^(1/p). cdist's matrix-product form (p = 2) is eager's:
/// [-2a, |a|^2, 1] · [b, 1, |b|^2]ᵀ, clamped at 0, square-rooted. pdist takes each row's
/// distances to the rows after it from the full [N, N] matrix and concatenates them.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <cmath>

namespace braze::decomp {

namespace {

/// ||a - b||_p over the last dim of the broadcast difference.
Node *pairwise(GraphBuilder &b, Node *x, Node *y, double p) {
  Node *diff = b.sub(x, y);
  int64_t last = diff->rank() - 1;
  DType t = diff->dtype();
  if (p == 0)
    return b.reduce(OpKind::Sum, b.convert(b.binary(OpKind::Ne, diff, b.scalar(0, t)), t),
                    {last}, false);
  Node *mag = b.unary(OpKind::Abs, diff);
  if (p == 1)
    return b.reduce(OpKind::Sum, mag, {last}, false);
  if (p == 2)
    return b.unary(OpKind::Sqrt, b.reduce(OpKind::Sum, b.mul(diff, diff), {last}, false));
  if (std::isinf(p))
    return b.reduce(OpKind::Amax, mag, {last}, false);
  Node *sum = b.reduce(OpKind::Sum, b.binary(OpKind::Pow, mag, b.scalar(p, t)), {last}, false);
  return b.binary(OpKind::Pow, sum, b.scalar(1.0 / p, t));
}

} // namespace

Node *decomposeCdist(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *y = n->operand(1);
  int64_t r = x->rank();
  const attrs::Cdist a(*n);
  double p = a.p();
  // Both operands over the result's batch dims.
  std::vector<SymExpr> xs(n->shape().begin(), n->shape().end() - 2), ys = xs;
  xs.insert(xs.end(), x->shape().end() - 2, x->shape().end());
  ys.insert(ys.end(), y->shape().end() - 2, y->shape().end());
  x = b.expand(x, xs);
  y = b.expand(y, ys);
  if (!a.matmul_form())
    return pairwise(b, b.unsqueeze(x, r - 1), b.unsqueeze(y, r - 2), p);
  DType t = x->dtype();
  Node *xn = b.reduce(OpKind::Sum, b.mul(x, x), {r - 1}, true);
  Node *yn = b.reduce(OpKind::Sum, b.mul(y, y), {r - 1}, true);
  Node *xa = b.concat({b.mul(x, b.scalar(-2, t)), xn, b.full(1, t, xn->shape())}, r - 1);
  Node *ya = b.concat({y, b.full(1, t, yn->shape()), yn}, r - 1);
  std::vector<int64_t> swap;
  for (int64_t i = 0; i < r - 2; ++i)
    swap.push_back(i);
  swap.push_back(r - 1);
  swap.push_back(r - 2);
  Node *prod = b.matmul(xa, b.permute(ya, swap));
  return b.unary(OpKind::Sqrt, b.binary(OpKind::Maximum, prod, b.scalar(0, t)));
}

Node *decomposePdist(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  int64_t rows = x->shape()[0]->value();
  DType t = x->dtype();
  if (rows < 2 || x->shape()[1]->isConst(0)) // no pairs, or distances between empty rows
    return b.full(0, t, n->shape());
  Node *full = pairwise(b, b.unsqueeze(x, 1), b.unsqueeze(x, 0), attrs::Pdist(*n).p());
  std::vector<Node *> parts;
  for (int64_t i = 0; i + 1 < rows; ++i)
    parts.push_back(b.slice(b.select(full, 0, i), 0, i + 1, rows, 1));
  return parts.size() == 1 ? parts[0] : b.concat(parts, 0);
}

} // namespace braze::decomp
