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
/// kernels). The work is quadratic (N x M, times H for the ordered form); the builder caps N x M,
/// but for scatters that combine in place (GraphBuilder::scatterCombinesInPlace): above the cap,
/// sum, prod, amax and amin of f32, f64, i32 and i64 with self included stay whole (to_loops
/// combines each source value in place), and the other modes, half precision and a left-out
/// self are built from those (combinedInPlace).
///
/// The other scatter-like ops become scatter: their targets are self's flat positions
/// P = iota(numel(self)) shaped like self, indexed as the op indexes self, so that a gather
/// or take of P brings the same bounds checks and negative-index rules as eager's op.
///   scatter_dim:      target = gather(P, dim, index), src cut to index's shape (one index per
///                     line with overwrite: where(iota along dim == index, src, self), no
///                     pairs and no P)
///   index_reduce:     target = take(P, dim, index with negatives moved out of range)
///   put:              target = take(flat P, 0, index) (negatives wrap)
///   diagonal_scatter: target = diagonal(P, offset, dim1, dim2)
///   index_put:        target = P[i0, i1, ...] (advanced indexing; negatives wrap), values
///                     broadcast to it; without accumulate into consecutive dims, no scatter:
///                     each position of those dims takes the values of the last index entry
///                     naming it ([positions, entries] pairs, indexPutLastWrite)
///   as_strided_scatter: target = offset + sum_d iota_d * stride_d over the view's size
/// The mask-driven ops need no scatter: their k-th masked element takes the source at the
/// count of trues before it (a cumulative sum), so their work is linear after the scan:
///   mask_put:         where(mask, values (broadcast, or taken through the count), self), the
///                     number of trues checked against the values' length at run time
///   masked_scatter:   where(mask, source.flatten()[count - 1], self)
///   nonzero_static:   row j = the coordinates of the k with mask[k] and count-before(k) == j
///                     (a [size, numel] comparison reduced by amax), or fill
/// as_strided (a view read as a copy) is a take from flat x at offset + sum_d iota_d * stride_d.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>
#include <limits>

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

/// offset + sum_d iota_d * stride_d over `shape`: the flat positions of a strided view.
Node *stridedPositions(GraphBuilder &b, const std::vector<SymExpr> &shape, const IntList &stride,
                       int64_t offset) {
  Node *pos = b.full(static_cast<double>(offset), DType::Int64, shape);
  for (size_t d = 0; d < stride.size(); ++d)
    if (stride[d] != 0 && !shape[d]->isConst(1))
      pos = b.add(pos, b.mul(b.iota(DType::Int64, shape, static_cast<int64_t>(d)),
                             b.scalar(static_cast<double>(stride[d]), DType::Int64)));
  return pos;
}

/// `index` flattened to i64 with its negatives moved out of range (the scatters reject them, as
/// eager does), through a take from iota(size), which rejects every entry outside [0, size) at
/// run time: the checked index, [numel(index)].
Node *checkedIndex(GraphBuilder &b, Node *index, SymExpr size) {
  Node *idx = b.convert(b.reshape(index, {b.dim(numel(index))}), DType::Int64);
  idx = b.where(b.binary(OpKind::Lt, idx, b.scalar(0, DType::Int64)),
                b.scalar(static_cast<double>(size->value()), DType::Int64), idx);
  return b.take(b.iota(DType::Int64, {size}, 0), 0, idx);
}

/// The row-major strides of a constant shape, in elements.
std::vector<int64_t> rowMajorStrides(const std::vector<SymExpr> &shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;)
    stride[d - 1] = stride[d] * shape[d]->value();
  return stride;
}

/// x * k for an i64 x (x itself when k is 1).
Node *scaled(GraphBuilder &b, Node *x, int64_t k) {
  return k == 1 ? x : b.mul(x, b.scalar(static_cast<double>(k), DType::Int64));
}

/// Eager rounds a half-precision sum, product or mean after each value in source order; the
/// scatter follows it for up to `k` values per element (the builder checked k).
int64_t orderedHits(const Node *n, const std::string &mode, int64_t k) {
  return GraphBuilder::scatterRoundsInOrder(n->dtype(), mode) ? std::max<int64_t>(k, 1) : 0;
}

} // namespace

Node *decomposeScatterDim(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *index = n->operand(1), *src = n->operand(2);
  const attrs::ScatterDim a(*n);
  const std::string &mode = a.mode_text();
  int64_t dim = a.dim(), k = numel(index);
  if (k == 0)
    return self;
  if (self->rank() == 0) {
    Node *target = b.gather(positions(b, {}), 0, b.reshape(index, {b.dim(k)}));
    Node *s = b.slice(b.reshape(src, {b.dim(std::max<int64_t>(numel(src), 1))}), 0, 0, k, 1);
    return b.scatter(self, target, s, mode, a.include_self());
  }
  for (int64_t d = 0; d < index->rank(); ++d)
    if (index->shape()[d]->value() != src->shape()[d]->value())
      src = b.slice(src, d, 0, index->shape()[d]->value(), 1);
  bool oneHot = a.mode() == attrs::ScatterMode::Overwrite;
  for (int64_t d = 0; d < self->rank(); ++d)
    oneHot &= index->shape()[d]->value() == (d == dim ? 1 : self->shape()[d]->value());
  if (oneHot) {
    // One index per line along dim (a loss's one-hot gradient): each element compares its
    // coordinate along dim with its line's index, in one pass at any size and with no
    // positions in memory. The index goes through a take from iota(size) (negatives moved out
    // of range, as eager rejects them), which checks it against the dim's size.
    Node *checked = b.reshape(checkedIndex(b, index, self->shape()[dim]), index->shape());
    Node *hit = b.binary(OpKind::Eq, b.iota(DType::Int64, self->shape(), dim),
                         b.expand(checked, self->shape()));
    return b.where(hit, b.expand(src, self->shape()), self);
  }
  bool includeSelf = a.include_self();
  if (GraphBuilder::scatterAccumulates(self->dtype(), mode, false, numel(self), k)) {
    // Too many pairs for the reductions: an accumulating scatter, its positions computed
    // (the index checked against the dim) rather than gathered from self's positions in
    // memory.
    const std::vector<SymExpr> &is = index->shape();
    std::vector<int64_t> stride = rowMajorStrides(self->shape());
    Node *target = scaled(b, b.reshape(checkedIndex(b, index, self->shape()[dim]), is),
                          stride[dim]);
    for (int64_t d = 0; d < self->rank(); ++d)
      if (d != dim)
        target = b.add(target, scaled(b, b.iota(DType::Int64, is, d), stride[d]));
    return b.scatter(self, target, src, mode, includeSelf);
  }
  Node *target = b.gather(positions(b, self->shape()), dim, index);
  // Eager's scatter kernels accumulate half precision in f32 with self included and round once.
  return b.scatter(self, target, src, mode, includeSelf);
}

Node *decomposeIndexReduce(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *index = n->operand(1), *source = n->operand(2);
  const attrs::IndexReduce a(*n);
  int64_t dim = a.dim(), k = numel(index);
  if (k == 0)
    return self;
  Node *pos = positions(b, self->shape());
  int64_t size = pos->shape()[dim]->value();
  Node *idx = b.convert(b.reshape(index, {b.dim(k)}), DType::Int64);
  // take wraps negative indices; eager's index_reduce rejects them: move them out of range.
  idx = b.where(b.binary(OpKind::Lt, idx, b.scalar(0, DType::Int64)),
                b.scalar(static_cast<double>(size), DType::Int64), idx);
  Node *target = b.take(pos, dim, idx);
  const std::string &mode = a.mode_text();
  return b.scatter(self, target, b.reshape(source, target->shape()), mode, a.include_self(),
                   orderedHits(n, mode, k));
}

Node *decomposePut(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *index = n->operand(1), *source = n->operand(2);
  int64_t k = numel(index);
  if (k == 0)
    return self;
  SymExpr kDim = b.dim(k);
  Node *target = b.take(b.iota(DType::Int64, {b.dim(numel(self))}, 0), 0, b.reshape(index, {kDim}));
  std::string mode = attrs::Put(*n).accumulate() ? "sum" : "overwrite";
  return b.scatter(self, target, b.reshape(source, {kDim}), mode, true, orderedHits(n, mode, k));
}

Node *decomposeDiagonalScatter(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *src = n->operand(1);
  const attrs::DiagonalScatter a(*n);
  if (numel(src) == 0)
    return self;
  Node *target = b.diagonal(positions(b, self->shape()), a.offset(), a.dim1(), a.dim2());
  return b.scatter(self, target, src, "overwrite", true);
}

namespace {
/// The value `mode` leaves unchanged in `t` (f32, f64, i32 or i64).
double identityOf(const std::string &mode, DType t) {
  if (mode == "prod")
    return 1;
  if (mode == "amax")
    return lowestValue(t);
  if (mode == "amin") // an i64 minimum is flipped into a maximum (its highest is no double)
    return t == DType::Int32 ? static_cast<double>(std::numeric_limits<int32_t>::max())
                             : std::numeric_limits<double>::infinity();
  return 0;
}

/// A scatter with more pairs than the reductions take that combines in place
/// (GraphBuilder::scatterCombinesInPlace) but is no accumulating scatter itself, built from
/// accumulating scatters and elementwise ops. An overwrite takes, at each position, the source
/// whose flat index is the largest among those aimed there (the last in order, eager's CPU
/// result), found by an accumulating amax of the indices into -1. The other modes:
///   count   = scatter(0, target, 1, sum)           (where a mean or a left-out self needs it)
///   base    = self, or where(count > 0, the mode's identity, self) with self left out
///   r       = scatter(base, target, src, sum | prod | amax | amin)  in f32 for half precision
///   mean:     r / (count + 1) with self, r / max(count, 1) without (floor division for ints;
///             half precision rounds r and the count to its dtype first, as eager)
/// An i64 amin without self combines -1 - x by amax (an order-reversing map of i64 onto
/// itself), whose identity, the lowest i64, is exact in the builder's constants. A
/// half-precision sum that eager rounds after each value (`inOrder`) stays in its dtype.
Node *combinedInPlace(GraphBuilder &b, Node *self, Node *target, Node *src,
                      const std::string &mode, bool includeSelf, int64_t maxHits) {
  if (mode == "overwrite") {
    // The last source in order aimed at each position: the maximum of their flat indices.
    int64_t m = numel(src);
    Node *order = b.reshape(b.iota(DType::Int64, {b.dim(m)}, 0), src->shape());
    Node *last = b.scatter(b.full(-1, DType::Int64, self->shape()), target, order, "amax", true);
    Node *zero = b.scalar(0, DType::Int64);
    Node *value = b.take(b.reshape(src, {b.dim(m)}), 0, b.binary(OpKind::Maximum, last, zero));
    return b.where(b.binary(OpKind::Ge, last, zero), value, self);
  }
  DType t = self->dtype(), acc = maxHits > 0 && mode == "sum" ? t : computeType(t);
  Node *one = b.scalar(1, DType::Int64), *count = nullptr, *reached = nullptr;
  if (mode == "mean" || !includeSelf) {
    count = b.scatter(b.full(0, DType::Int64, self->shape()), target,
                      b.full(1, DType::Int64, src->shape()), "sum", true);
    reached = b.binary(OpKind::Gt, count, b.scalar(0, DType::Int64));
  }
  std::string combine = mode == "mean" ? "sum" : mode;
  Node *base = b.convert(self, acc), *values = b.convert(src, acc);
  bool flip = !includeSelf && combine == "amin" && acc == DType::Int64;
  if (flip) {
    Node *minusOne = b.scalar(-1, DType::Int64);
    base = b.sub(minusOne, base);
    values = b.sub(minusOne, values);
    combine = "amax";
  }
  if (!includeSelf)
    base = b.where(reached, b.scalar(identityOf(combine, acc), acc), base);
  Node *r = b.scatter(base, target, values, combine, true, acc == t ? maxHits : 0);
  if (flip)
    r = b.sub(b.scalar(-1, DType::Int64), r);
  if (mode == "mean") {
    // Eager divides the sum, rounded to the dtype, by the count, also in the dtype.
    auto rounded = [&](Node *x) { return acc == t ? b.convert(x, acc)
                                                  : b.convert(b.convert(x, t), acc); };
    Node *c = rounded(includeSelf ? b.add(count, one) : b.binary(OpKind::Maximum, count, one));
    r = rounded(r);
    r = isFloating(acc) ? b.div(r, c) : b.binary(OpKind::FloorDiv, r, c);
  }
  return b.convert(r, t);
}
} // namespace

Node *decomposeScatter(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *target = n->operand(1), *src = n->operand(2);
  const attrs::Scatter a(*n);
  attrs::ScatterMode mode = a.mode();
  bool includeSelf = a.include_self();
  DType out = n->dtype();
  int64_t numelOut = numel(self), numelSrc = numel(src);
  if (numelSrc == 0)
    return self;
  int64_t maxHits = a.has_max_hits() ? a.max_hits() : 0;
  if (GraphBuilder::scatterAccumulates(out, a.mode_text(), maxHits > 0, numelOut, numelSrc) ||
      maxHits > GraphBuilder::kMaxScatterHits)
    return combinedInPlace(b, self, target, src, a.mode_text(), includeSelf, maxHits);
  SymExpr nDim = b.dim(numelOut), mDim = b.dim(numelSrc);
  DType t = out == DType::Bool ? DType::Int64 : out;
  Node *selfFlat = b.convert(b.reshape(self, {nDim}), t);
  Node *srcFlat = b.convert(b.reshape(src, {mDim}), t);
  // Bounds check: a negative target becomes N, and take rejects every entry outside [0, N).
  Node *tgt = checkedIndex(b, target, nDim);
  Node *zero64 = b.scalar(0, DType::Int64);

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

  if (mode == attrs::ScatterMode::Overwrite) {
    Node *last = lastSource();
    Node *value = b.take(srcFlat, 0, b.binary(OpKind::Maximum, last, zero64));
    return finish(b.where(reached, value, selfFlat));
  }
  if (mode == attrs::ScatterMode::Amax || mode == attrs::ScatterMode::Amin) {
    Node *base = b.take(srcFlat, 0, b.binary(OpKind::Maximum, lastSource(), zero64));
    Node *baseWide = b.expand(b.reshape(base, {nDim, b.dim(1)}), pairs);
    Node *r = b.reduce(mode == attrs::ScatterMode::Amax ? OpKind::Amax : OpKind::Amin,
                       b.where(hit, srcWide, baseWide), {1}, false, t);
    // Where every source element hits k, base was never reduced: fold self in explicitly.
    if (includeSelf)
      r = b.binary(mode == attrs::ScatterMode::Amax ? OpKind::Maximum : OpKind::Minimum,
                   selfFlat, r);
    return finish(b.where(reached, r, selfFlat));
  }
  bool isProd = mode == attrs::ScatterMode::Prod;
  Node *identity = b.scalar(isProd ? 1.0 : 0.0, t);
  Node *r = nullptr;
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
  if (mode == attrs::ScatterMode::Mean) {
    Node *c = includeSelf ? b.add(count, b.scalar(1, DType::Int64)) : count;
    c = b.convert(c, t);
    r = isFloating(t) ? b.div(r, c) : b.binary(OpKind::FloorDiv, r, c);
  }
  return finish(b.where(reached, r, selfFlat));
}

namespace {
/// take(positions of self, dims.front(), indices) for consecutive dims and indices of one
/// shape, computed without self's positions in memory: each index goes through a take from
/// iota(its dim's size) (negatives wrapped once, every entry checked against the dim, as the
/// take would), times its dim's row-major stride, plus the positions of the other dims.
Node *takenPositions(GraphBuilder &b, Node *self, int64_t first, const std::vector<Node *> &indices) {
  const std::vector<SymExpr> &xs = self->shape();
  std::vector<int64_t> stride = rowMajorStrides(xs);
  std::vector<SymExpr> shape(xs.begin(), xs.begin() + first);
  const std::vector<SymExpr> &is = indices[0]->shape();
  shape.insert(shape.end(), is.begin(), is.end());
  size_t rest = first + indices.size();
  shape.insert(shape.end(), xs.begin() + rest, xs.end());
  Node *pos = b.full(0, DType::Int64, shape);
  for (int64_t d = 0; d < first; ++d)
    pos = b.add(pos, scaled(b, b.iota(DType::Int64, shape, d), stride[d]));
  for (size_t d = rest; d < xs.size(); ++d)
    pos = b.add(pos, scaled(b, b.iota(DType::Int64, shape, d - rest + first + is.size()),
                            stride[d]));
  std::vector<SymExpr> lined(static_cast<size_t>(first), b.dim(1));
  lined.insert(lined.end(), is.begin(), is.end());
  lined.resize(shape.size(), b.dim(1));
  for (size_t m = 0; m < indices.size(); ++m) {
    Node *checked = b.take(b.iota(DType::Int64, {xs[first + m]}, 0), 0,
                           b.convert(indices[m], DType::Int64));
    pos = b.add(pos, scaled(b, b.expand(b.reshape(checked, lined), shape), stride[first + m]));
  }
  return pos;
}
} // namespace

Node *decomposeIndexPut(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *values = n->operands().back();
  std::vector<Node *> indices(n->operands().begin() + 1, n->operands().end() - 1);
  const attrs::IndexPut a(*n);
  IntList dims = a.dims();
  bool accumulate = a.accumulate();
  bool consecutive = GraphBuilder::adjacentDims(dims);
  if (!accumulate && consecutive)
    return b.indexPutLastWrite(self, dims.front(), indices, values);
  bool oneShape = std::all_of(indices.begin(), indices.end(), [&](Node *i) {
    return i->shape() == indices[0]->shape();
  });
  int64_t taken = numel(indices[0]);
  for (int64_t d = 0; d < self->rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end())
      taken *= self->shape()[d]->value();
  if (accumulate && consecutive && oneShape &&
      GraphBuilder::scatterAccumulates(self->dtype(), "sum",
                                       GraphBuilder::scatterRoundsInOrder(self->dtype(), "sum"),
                                       numel(self), taken)) {
    // Too many pairs for the reductions: an accumulating scatter, whose positions are
    // computed rather than taken from self's positions in memory.
    Node *target = takenPositions(b, self, dims.front(), indices);
    return b.scatter(self, target, b.expand(values, target->shape()), "sum", true,
                     orderedHits(n, "sum", numel(indices[0])));
  }
  Node *pos = positions(b, self->shape());
  Node *target;
  if (consecutive) {
    target = b.take(pos, dims.front(), indices);
  } else {
    std::vector<int64_t> order(dims.begin(), dims.end());
    for (int64_t d = 0; d < self->rank(); ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end())
        order.push_back(d);
    target = b.take(b.permute(pos, order), 0, indices);
  }
  if (numel(target) == 0)
    return self;
  // Elements collide only where they share the coordinates of the dims taken whole.
  int64_t fanIn = numel(target);
  for (int64_t d = 0; d < self->rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end())
      fanIn /= std::max<int64_t>(self->shape()[d]->value(), 1);
  std::string mode = a.accumulate() ? "sum" : "overwrite";
  return b.scatter(self, target, b.expand(values, target->shape()), mode, true,
                   orderedHits(n, mode, fanIn));
}

namespace {
/// The count of trues before each element of a flat i64 0/1 tensor, minus one where it is
/// true: the index of the source element a masked element takes (clamped at 0).
Node *sourceIndex(GraphBuilder &b, Node *flat) {
  Node *count = b.scan(OpKind::CumSum, flat, 0, DType::Int64);
  return b.binary(OpKind::Maximum, b.sub(count, b.scalar(1, DType::Int64)),
                  b.scalar(0, DType::Int64));
}
} // namespace

Node *decomposeMaskPut(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *mask = n->operand(1), *values = n->operand(2);
  const std::vector<SymExpr> &xs = self->shape();
  size_t r = mask->rank();
  int64_t masked = numel(mask);
  Node *m = mask->dtype() == DType::Bool ? mask
                                         : b.binary(OpKind::Ne, mask, b.scalar(0, mask->dtype()));
  std::vector<SymExpr> mShape(mask->shape());
  mShape.resize(xs.size(), b.dim(1));
  Node *mFull = b.expand(b.reshape(m, mShape), xs);
  size_t rest = xs.size() - r;
  Node *v = values;
  if (static_cast<size_t>(v->rank()) <= rest || v->shape()[0]->value() == 1) {
    if (static_cast<size_t>(v->rank()) > rest)
      v = b.reshape(v, std::vector<SymExpr>(v->shape().begin() + 1, v->shape().end()));
    v = b.expand(v, xs);
  } else {
    int64_t k = v->shape()[0]->value();
    std::vector<SymExpr> vShape{v->shape()[0]};
    vShape.insert(vShape.end(), xs.begin() + r, xs.end());
    v = b.expand(v, vShape);
    Node *flat = b.convert(b.reshape(m, {b.dim(masked)}), DType::Int64);
    // The number of trues must be k: a take from a one-element tensor at (total - k), with a
    // negative difference moved out of range, is 0 exactly then and a run-time error otherwise.
    Node *total = b.reduce(OpKind::Sum, flat, {}, false, DType::Int64);
    Node *diff = b.sub(total, b.scalar(static_cast<double>(k), DType::Int64));
    diff = b.where(b.binary(OpKind::Lt, diff, b.scalar(0, DType::Int64)),
                   b.scalar(1, DType::Int64), diff);
    Node *zero = b.take(b.full(0, DType::Int64, {b.dim(1)}), 0, diff);
    Node *pos = b.add(sourceIndex(b, flat), zero);
    v = b.take(v, 0, b.reshape(pos, mask->shape()));
  }
  if (attrs::MaskPut(*n).accumulate())
    return b.convert(b.where(mFull, b.add(self, v), self), self->dtype());
  return b.where(mFull, v, self);
}

Node *decomposeMaskedScatter(GraphBuilder &b, Node *n) {
  Node *self = b.expand(n->operand(0), n->shape());
  Node *mask = b.expand(n->operand(1), n->shape());
  Node *source = n->operand(2);
  int64_t total = numel(n);
  if (total == 0)
    return self;
  Node *flat = b.reshape(b.convert(mask, DType::Int64), {b.dim(total)});
  Node *src = b.reshape(source, {b.dim(numel(source))});
  Node *value = b.reshape(b.take(src, 0, sourceIndex(b, flat)), n->shape());
  return b.where(mask, value, self);
}

/// A dense view is the block [offset, offset + k) of self's flat positions, filled by src in
/// its dims' stride order: self's flat values before the block, src permuted and flattened,
/// self's after it. Any other view scatters src at its positions.
Node *decomposeAsStridedScatter(GraphBuilder &b, Node *n) {
  Node *self = n->operand(0), *src = n->operand(1);
  const attrs::AsStridedScatter a(*n);
  const IntList &stride = a.stride();
  if (numel(src) == 0)
    return self;
  IntList order = GraphBuilder::denseViewOrder(a.size(), stride);
  if (!order.empty()) {
    int64_t k = numel(src), total = numel(self), offset = a.offset();
    Node *flatSelf = b.reshape(self, {b.dim(total)});
    std::vector<Node *> parts;
    if (offset > 0)
      parts.push_back(b.slice(flatSelf, 0, 0, offset, 1));
    parts.push_back(b.reshape(b.permute(src, order), {b.dim(k)}));
    if (offset + k < total)
      parts.push_back(b.slice(flatSelf, 0, offset + k, total, 1));
    Node *flat = parts.size() == 1 ? parts[0] : b.concat(parts, 0);
    return b.reshape(flat, n->shape());
  }
  Node *target = stridedPositions(b, src->shape(), stride, a.offset());
  return b.scatter(self, target, src, "overwrite", true);
}

Node *decomposeAsStrided(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  if (numel(n) == 0)
    return b.full(0, n->dtype(), n->shape());
  Node *flat = b.reshape(x, {b.dim(numel(x))});
  const attrs::AsStrided a(*n);
  Node *pos = stridedPositions(b, n->shape(), a.stride(), a.offset());
  if (n->rank() == 0)
    return b.reshape(b.take(flat, 0, b.reshape(pos, {b.dim(1)})), {});
  return b.take(flat, 0, pos);
}

Node *decomposeNonzeroStatic(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  const attrs::NonzeroStatic a(*n);
  int64_t size = a.size(), count = numel(x);
  double fill = static_cast<double>(a.fill());
  if (count == 0 || size == 0 || x->rank() == 0)
    return b.full(fill, DType::Int64, n->shape()); // a 0-d x has no coordinates: [size, 0]
  SymExpr nDim = b.dim(count);
  Node *nz = b.reshape(b.binary(OpKind::Ne, x, b.scalar(0, x->dtype())), {nDim});
  Node *nz64 = b.convert(nz, DType::Int64);
  Node *before = b.sub(b.scan(OpKind::CumSum, nz64, 0, DType::Int64), nz64);
  std::vector<SymExpr> pairs{b.dim(size), nDim};
  Node *hit = b.binary(
      OpKind::LogicalAnd, b.expand(b.reshape(nz, {b.dim(1), nDim}), pairs),
      b.binary(OpKind::Eq, b.expand(b.reshape(before, {b.dim(1), nDim}), pairs),
               b.iota(DType::Int64, pairs, 0)));
  Node *pos = b.where(hit, b.iota(DType::Int64, pairs, 1), b.scalar(-1, DType::Int64));
  pos = b.reduce(OpKind::Amax, pos, {1}, true, DType::Int64); // [size, 1]
  Node *found = b.binary(OpKind::Ge, pos, b.scalar(0, DType::Int64));
  std::vector<Node *> cols;
  int64_t stride = count;
  for (SymExpr d : x->shape()) {
    stride /= d->value();
    Node *c = b.binary(OpKind::Remainder,
                       b.binary(OpKind::FloorDiv, pos,
                                b.scalar(static_cast<double>(stride), DType::Int64)),
                       b.scalar(static_cast<double>(d->value()), DType::Int64));
    cols.push_back(b.where(found, c, b.scalar(fill, DType::Int64)));
  }
  return cols.size() > 1 ? b.concat(cols, 1) : cols[0];
}

} // namespace braze::decomp
