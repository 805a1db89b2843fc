/// embedding_bag: bag b of 1-d indices holds the positions i with offsets[b] <= i <
/// offsets[b + 1] (the last bag runs to the end, or to the last offset with
/// include_last_offset); of [B, P] indices, row b. Its rows are weight[indices[i]] (times the
/// per-sample weights), less those equal to padding_idx, reduced by sum, mean (over the bag's
/// count, at least 1) or max (an empty bag gives zeros):
///   member[b, i] = (bag(i) == b), bag(i) = #{b : offsets[b] <= i} - 1,
///   out[b] = reduce_i (member[b, i] ? row(i) : identity).
/// Half precision is computed in f32 and rounded once.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <cmath>

namespace braze::decomp {

Node *decomposeEmbeddingBag(GraphBuilder &b, Node *n) {
  const attrs::EmbeddingBag a(*n);
  Node *weight = n->operand(0), *indices = n->operand(1);
  bool hasOffsets = a.offsets();
  attrs::EmbeddingBagMode mode = a.mode();
  DType work = computeType(weight->dtype());
  int64_t bags = n->shape()[0]->value(), length = 1;
  for (const SymExpr &d : indices->shape())
    length *= d->value();
  Node *flat = b.reshape(indices, {b.dim(length)});
  Node *pos = b.iota(DType::Int64, {b.dim(length)}, 0), *bag, *member;
  Node *bagIds = b.iota(DType::Int64, {b.dim(bags), b.dim(1)}, 0);
  if (hasOffsets) {
    Node *offsets = n->operand(2);
    Node *starts = b.reshape(b.slice(offsets, 0, 0, bags, 1), {b.dim(1), b.dim(bags)});
    Node *le = b.binary(OpKind::Le, starts, b.reshape(pos, {b.dim(length), b.dim(1)}));
    bag = b.sub(b.reduce(OpKind::Sum, b.convert(le, DType::Int64), {1}, false), i64(b, 1));
  } else {
    int64_t per = std::max<int64_t>(indices->shape()[1]->value(), 1);
    bag = b.binary(OpKind::FloorDiv, pos, i64(b, per));
  }
  member = b.binary(OpKind::Eq, b.reshape(bag, {b.dim(1), b.dim(length)}), bagIds);
  if (hasOffsets && a.include_last_offset())
    member = b.binary(OpKind::LogicalAnd, member,
                      b.binary(OpKind::Lt, pos, b.select(n->operand(2), 0, bags)));
  if (int64_t pad = a.padding_idx(); pad >= 0)
    member = b.binary(OpKind::LogicalAnd, member, b.binary(OpKind::Ne, flat, i64(b, pad)));
  Node *rows = b.convert(b.take(weight, 0, flat), work); // [L, D]
  if (a.weights()) {
    Node *w = b.convert(b.reshape(n->operand(n->operands().size() - 1), {b.dim(length)}), work);
    rows = b.mul(rows, b.unsqueeze(w, 1));
  }
  Node *m3 = b.unsqueeze(member, 2), *rows3 = b.unsqueeze(rows, 0); // [B, L, 1], [1, L, D]
  Node *zero = b.scalar(0.0, work), *out;
  if (mode == attrs::EmbeddingBagMode::Max) {
    out = b.reduce(OpKind::Amax, b.where(m3, rows3, b.scalar(-INFINITY, work)), {1}, false);
    out = b.where(b.reduce(OpKind::Any, member, {1}, true), out, zero);
  } else {
    out = b.reduce(OpKind::Sum, b.where(m3, rows3, zero), {1}, false);
    if (mode == attrs::EmbeddingBagMode::Mean) {
      Node *count = b.reduce(OpKind::Sum, b.convert(member, work), {1}, true);
      out = b.div(out, b.binary(OpKind::Maximum, count, b.scalar(1.0, work)));
    }
  }
  return b.convert(out, n->dtype());
}

} // namespace braze::decomp
