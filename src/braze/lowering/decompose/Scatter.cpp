/// scatter(self, target, src) as masked reductions over the flattened source (fused: the
/// [N, M] mask is never materialized). With N = numel(self), M = numel(src), k < N, i < M:
///   hit[k, i]  = (target[i] == k)            (targets checked against [0, N) at run time)
///   count[k]   = sum_i hit[k, i]
///   last[k]    = max_i (hit[k, i] ? i : -1)  (the last source element aimed at k)
///   overwrite: out[k] = last[k] >= 0 ? src[last[k]] : self[k]
///   sum/prod:  out[k] = self[k] (+|*) reduce_i (hit ? src[i] : 0|1), or the reduction alone
///              where count > 0 and self is excluded
///   amax/amin: out[k] = reduce_i (hit ? src[i] : base[k]) with base = src[last[k]] (itself
///              one of the reduced values), then combined with self[k] when it is included
///   mean:      out[k] = (sum (+ self[k])) / (count (+ 1)), floor division for integers
/// Positions no source reaches keep self[k] in every mode. Bool tensors compute in i64.
/// Half-precision sum/prod/mean with a `max_hits` bound H instead follow eager's kernels, which
/// add the values aimed at k one at a time in source order, rounding after each:
///   rank[i]  = #{j < i : target[j] == target[i]}
///   acc_0[k] = self[k] (included) or 0|1;  acc_{s+1}[k] = acc_s[k] (+|*) the source with
///              target k and rank s, where there is one      (s < H)
/// Without the bound, half precision accumulates in f32 and rounds once (eager's scatter
/// kernels). The work is quadratic (N x M, times H for the ordered form); the builder caps N x M.
///
/// The other scatter-like ops become scatter: their targets are self's flat positions
/// P = iota(numel(self)) shaped like self, indexed as the op indexes self, so that a gather
/// or take of P brings the same bounds checks and negative-index rules as eager's op.
///   scatter_dim:      target = gather(P, dim, index), src cut to index's shape (one index per
///                     line with overwrite: where(P == target, src, self), no pairs)
///   index_reduce:     target = take(P, dim, index with negatives moved out of range)
///   put:              target = take(flat P, 0, index) (negatives wrap)
///   diagonal_scatter: target = diagonal(P, offset, dim1, dim2)
#include "braze/lowering/decompose/Decompose.h"

namespace braze::decomp {

namespace {

int64_t numel(const Node *x) {
  int64_t n = 1;
  for (SymExpr d : x->shape())
    n *= d->value();
  return n;
}

/// Self's flat positions shaped like `shape` ([1] for a 0-d self).
Node *positions(GraphBuilder &b, std::vector<SymExpr> shape) {
  int64_t n = 1;
  for (SymExpr d : shape)
    n *= d->value();
  if (shape.empty())
    shape.push_back(b.dim(1));
  return b.reshape(b.iota(DType::Int64, {b.dim(n)}, 0), shape);
}

/// Eager rounds a half-precision sum, product or mean after each value in source order; the
/// scatter follows it for up to `k` values per element (the builder checked k).
int64_t orderedHits(const Node *n, const std::string &mode, int64_t k) {
  DType t = n->dtype();
  bool ordered = (t == DType::Float16 || t == DType::BFloat16) &&
                 (mode == "sum" || mode == "prod" || mode == "mean");
  return ordered ? std::max<int64_t>(k, 1) : 0;
}

} // namespace

Node *decomposeScatterDim(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *index = n->operand(1), *src = n->operand(2);
  const AttrMap &a = n->attrs();
  const std::string &mode = a.getString("mode");
  int64_t dim = a.getInt("dim"), k = numel(index);
  if (k == 0)
    return self;
  if (self->rank() == 0) {
    Node *target = b.gather(positions(b, {}), 0, b.reshape(index, {b.dim(k)}));
    Node *s = b.slice(b.reshape(src, {b.dim(std::max<int64_t>(numel(src), 1))}), 0, 0, k, 1);
    return b.scatter(self, target, s, mode, a.getBool("include_self"));
  }
  Node *pos = positions(b, self->shape());
  Node *target = b.gather(pos, dim, index);
  for (int64_t d = 0; d < index->rank(); ++d)
    if (index->shape()[d]->value() != src->shape()[d]->value())
      src = b.slice(src, d, 0, index->shape()[d]->value(), 1);
  bool oneHot = mode == "overwrite";
  for (int64_t d = 0; d < self->rank(); ++d)
    oneHot &= index->shape()[d]->value() == (d == dim ? 1 : self->shape()[d]->value());
  if (oneHot) {
    // One index per line along dim (a loss's one-hot gradient): each element is compared with
    // its line's target, in one pass at any size; the gather rejects an index out of range.
    Node *hit = b.binary(OpKind::Eq, pos, b.expand(target, self->shape()));
    return b.where(hit, b.expand(src, self->shape()), self);
  }
  // Eager's scatter kernels accumulate half precision in f32 with self included and round once.
  return b.scatter(self, target, src, mode, a.getBool("include_self"));
}

Node *decomposeIndexReduce(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *index = n->operand(1), *source = n->operand(2);
  const AttrMap &a = n->attrs();
  int64_t dim = a.getInt("dim"), k = numel(index);
  if (k == 0)
    return self;
  Node *pos = positions(b, self->shape());
  int64_t size = pos->shape()[dim]->value();
  Node *idx = b.convert(b.reshape(index, {b.dim(k)}), DType::Int64);
  // take wraps negative indices; eager's index_reduce rejects them: move them out of range.
  idx = b.where(b.binary(OpKind::Lt, idx, b.scalar(0, DType::Int64)),
                b.scalar(static_cast<double>(size), DType::Int64), idx);
  Node *target = b.take(pos, dim, idx);
  const std::string &mode = a.getString("mode");
  return b.scatter(self, target, b.reshape(source, target->shape()), mode,
                   a.getBool("include_self"), orderedHits(n, mode, k));
}

Node *decomposePut(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *index = n->operand(1), *source = n->operand(2);
  int64_t k = numel(index);
  if (k == 0)
    return self;
  SymExpr kDim = b.dim(k);
  Node *target = b.take(b.iota(DType::Int64, {b.dim(numel(self))}, 0), 0, b.reshape(index, {kDim}));
  std::string mode = n->attrs().getBool("accumulate") ? "sum" : "overwrite";
  return b.scatter(self, target, b.reshape(source, {kDim}), mode, true, orderedHits(n, mode, k));
}

Node *decomposeDiagonalScatter(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *src = n->operand(1);
  const AttrMap &a = n->attrs();
  if (numel(src) == 0)
    return self;
  Node *target = b.diagonal(positions(b, self->shape()), a.getInt("offset"), a.getInt("dim1"),
                            a.getInt("dim2"));
  return b.scatter(self, target, src, "overwrite", true);
}

Node *decomposeScatter(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *target = n->operand(1), *src = n->operand(2);
  const std::string &mode = n->attrs().getString("mode");
  bool includeSelf = n->attrs().getBool("include_self");
  DType out = n->dtype();
  int64_t numelOut = 1, numelSrc = 1;
  for (SymExpr d : self->shape())
    numelOut *= d->value();
  for (SymExpr d : src->shape())
    numelSrc *= d->value();
  if (numelSrc == 0)
    return self;
  SymExpr nDim = b.dim(numelOut), mDim = b.dim(numelSrc);
  DType t = out == DType::Bool ? DType::Int64 : out;
  Node *selfFlat = b.convert(b.reshape(self, {nDim}), t);
  Node *srcFlat = b.convert(b.reshape(src, {mDim}), t);
  Node *tgt = b.convert(b.reshape(target, {mDim}), DType::Int64);
  // Bounds check: a negative target becomes N, and take rejects every entry outside [0, N).
  Node *zero64 = b.scalar(0, DType::Int64);
  Node *outside = b.where(b.binary(OpKind::Lt, tgt, zero64),
                          b.scalar(static_cast<double>(numelOut), DType::Int64), tgt);
  tgt = b.take(b.iota(DType::Int64, {nDim}, 0), 0, outside);

  std::vector<SymExpr> pairs{nDim, mDim};
  Node *hit = b.binary(OpKind::Eq, b.expand(b.reshape(tgt, {b.dim(1), mDim}), pairs),
                       b.iota(DType::Int64, pairs, 0));
  Node *srcWide = b.expand(b.reshape(srcFlat, {b.dim(1), mDim}), pairs);
  Node *count = b.reduce(OpKind::Sum, b.convert(hit, DType::Int64), {1}, false, DType::Int64);
  Node *reached = b.binary(OpKind::Gt, count, zero64);
  auto lastSource = [&]() {
    Node *pos = b.where(hit, b.iota(DType::Int64, pairs, 1), b.scalar(-1, DType::Int64));
    return b.reduce(OpKind::Amax, pos, {1}, false, DType::Int64);
  };
  auto finish = [&](Node *r) { return b.reshape(b.convert(r, out), self->shape()); };

  if (mode == "overwrite") {
    Node *last = lastSource();
    Node *value = b.take(srcFlat, 0, b.binary(OpKind::Maximum, last, zero64));
    return finish(b.where(reached, value, selfFlat));
  }
  if (mode == "amax" || mode == "amin") {
    Node *base = b.take(srcFlat, 0, b.binary(OpKind::Maximum, lastSource(), zero64));
    Node *baseWide = b.expand(b.reshape(base, {nDim, b.dim(1)}), pairs);
    Node *r = b.reduce(mode == "amax" ? OpKind::Amax : OpKind::Amin,
                       b.where(hit, srcWide, baseWide), {1}, false, t);
    // Where every source element hits k, base was never reduced: fold self in explicitly.
    if (includeSelf)
      r = b.binary(mode == "amax" ? OpKind::Maximum : OpKind::Minimum, selfFlat, r);
    return finish(b.where(reached, r, selfFlat));
  }
  bool isProd = mode == "prod";
  Node *identity = b.scalar(isProd ? 1.0 : 0.0, t);
  Node *r = nullptr;
  int64_t maxHits = n->attrs().has("max_hits") ? n->attrs().getInt("max_hits") : 0;
  if (maxHits > 0 && (t == DType::Float16 || t == DType::BFloat16)) {
    std::vector<SymExpr> square{mDim, mDim};
    Node *tgtRow = b.expand(b.reshape(tgt, {b.dim(1), mDim}), square);
    Node *tgtCol = b.expand(b.reshape(tgt, {mDim, b.dim(1)}), square);
    Node *earlier = b.binary(OpKind::Lt, b.iota(DType::Int64, square, 1),
                             b.iota(DType::Int64, square, 0));
    Node *same = b.binary(OpKind::LogicalAnd, b.binary(OpKind::Eq, tgtRow, tgtCol), earlier);
    Node *rank = b.reduce(OpKind::Sum, b.convert(same, DType::Int64), {1}, false, DType::Int64);
    Node *rankWide = b.expand(b.reshape(rank, {b.dim(1), mDim}), pairs);
    Node *acc = includeSelf ? selfFlat : b.expand(identity, {nDim});
    for (int64_t s = 0; s < maxHits; ++s) {
      Node *pick = b.binary(OpKind::LogicalAnd, hit,
                            b.binary(OpKind::Eq, rankWide, b.scalar(static_cast<double>(s),
                                                                    DType::Int64)));
      Node *present = b.reduce(OpKind::Any, pick, {1}, false);
      // At most one element is picked, so this sum is exact.
      Node *value = b.reduce(OpKind::Sum, b.where(pick, srcWide, b.scalar(0.0, t)), {1}, false, t);
      acc = b.where(present, isProd ? b.mul(acc, value) : b.add(acc, value), acc);
    }
    r = acc;
  } else {
    // Half precision accumulates in f32 with self included and rounds once, as eager's
    // scatter kernels do.
    DType acc = computeType(t);
    r = b.reduce(isProd ? OpKind::Prod : OpKind::Sum, b.where(hit, srcWide, identity), {1},
                 false, acc);
    if (includeSelf) {
      Node *selfAcc = b.convert(selfFlat, acc);
      r = isProd ? b.mul(selfAcc, r) : b.add(selfAcc, r);
    }
    r = b.convert(r, t);
  }
  if (mode == "mean") {
    Node *c = includeSelf ? b.add(count, b.scalar(1, DType::Int64)) : count;
    c = b.convert(c, t);
    r = isFloating(t) ? b.div(r, c) : b.binary(OpKind::FloorDiv, r, c);
  }
  return finish(b.where(reached, r, selfFlat));
}

} // namespace braze::decomp
