/// Binary search and histograms as counting reductions:
///   search_sorted(seq, v)[.., k] = #{ m : !(seq[.., m] >= v[.., k]) }   (left)
///                                  #{ m : !(seq[.., m] >  v[.., k]) }   (right)
/// which is the index a binary search returns in a sorted seq (NaN compares false, so it counts
/// as below every value, as eager's search does); a sorter gathers seq into order first.
///   histogram(x)[b] = #{ e in x : min <= e <= max and min(trunc((e - min) * bins / width),
///                                                       bins - 1) == b }
/// with min, max and width = max - min in x's dtype, as eager's kernel computes them (for an
/// integer x, in i64 with min and max truncated to integers, as eager's CUDA kernel does).
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <cmath>

namespace braze::decomp {

Node *decomposeSearchSorted(GraphBuilder &b, Node *n) {
  Node *seq = n->operand(0), *values = n->operand(1);
  const attrs::SearchSorted a(*n);
  if (a.sorter())
    seq = b.gather(seq, seq->rank() - 1, n->operand(2));
  // values [.., K] -> [.., K, 1]; seq [M] or [.., M] -> [.., 1, M]
  Node *v = b.unsqueeze(values, values->rank());
  Node *s = seq->rank() == 1 ? seq : b.unsqueeze(seq, seq->rank() - 1);
  Node *hit = b.binary(a.right() ? OpKind::Gt : OpKind::Ge, s, v);
  return b.reduce(OpKind::Sum, b.unary(OpKind::LogicalNot, hit), {values->rank()}, false,
                  n->dtype());
}

Node *decomposeHistogram(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  DType t = x->dtype();
  const attrs::Histogram a(*n);
  int64_t bins = a.bins(), count = 1;
  for (const SymExpr &d : x->shape())
    count *= d->value();
  if (count == 0)
    return b.full(0.0, t, n->shape());
  Node *flat = b.reshape(x, {b.dim(count)});
  double min = a.min(), max = a.max();
  Node *pos = nullptr;
  if (isIntegral(t)) { // exact: the range truncated to integers, the bin in i64
    flat = b.convert(flat, DType::Int64);
    min = std::trunc(min), max = std::trunc(max);
  }
  Node *lo = b.scalar(min, flat->dtype()), *hi = b.scalar(max, flat->dtype());
  Node *inside = b.binary(OpKind::LogicalAnd, b.binary(OpKind::Ge, flat, lo),
                          b.binary(OpKind::Le, flat, hi));
  Node *scaled = b.mul(b.sub(flat, lo), b.scalar(static_cast<double>(bins), flat->dtype()));
  if (isIntegral(t))
    pos = b.truncDiv(scaled, b.sub(hi, lo));
  else
    pos = b.convert(b.div(scaled, b.sub(hi, lo)), DType::Int64);
  pos = b.binary(OpKind::Minimum, pos, i64(b, bins - 1));
  Node *which = b.iota(DType::Int64, {b.dim(1), b.dim(bins)}, 1);
  Node *hit = b.binary(OpKind::LogicalAnd, b.unsqueeze(inside, 1),
                       b.binary(OpKind::Eq, b.unsqueeze(pos, 1), which));
  return b.convert(b.reduce(OpKind::Sum, hit, {0}, false, DType::Int64), t);
}

} // namespace braze::decomp
