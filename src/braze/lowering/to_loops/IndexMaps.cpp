#include "braze/lowering/to_loops/IndexMaps.h"

#include "braze/ir/graph/Graph.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/support/Check.h"

namespace braze {

using sym::SymExpr;

SymExpr linearIndex(sym::SymContext &s, const Index &idx, const std::vector<SymExpr> &strides) {
  BRAZE_CHECK(idx.size() == strides.size()) << "index rank " << idx.size() << " vs "
                                            << strides.size() << " strides";
  SymExpr r = s.constant(0);
  for (size_t k = 0; k < idx.size(); ++k)
    r = s.add(r, s.mul(idx[k], strides[k]));
  return r;
}

Index broadcastIndex(sym::SymContext &s, const Index &idx, const std::vector<SymExpr> &to,
                     const std::vector<SymExpr> &from) {
  BRAZE_CHECK(idx.size() == to.size() && from.size() <= to.size()) << "bad broadcast";
  size_t off = to.size() - from.size();
  Index in(from.size());
  for (size_t j = 0; j < from.size(); ++j)
    in[j] = (from[j]->isConst(1) && !to[off + j]->isConst(1)) ? s.constant(0) : idx[off + j];
  return in;
}

Index reshapeIndex(sym::SymContext &s, const Index &idx, const std::vector<SymExpr> &from,
                   const std::vector<SymExpr> &to) {
  // 1. Common case: the shapes differ only by unit dims; map the other dims in order.
  std::vector<size_t> a, b;
  for (size_t i = 0; i < from.size(); ++i)
    if (!from[i]->isConst(1))
      a.push_back(i);
  for (size_t i = 0; i < to.size(); ++i)
    if (!to[i]->isConst(1))
      b.push_back(i);
  bool sameDims = a.size() == b.size();
  for (size_t k = 0; sameDims && k < a.size(); ++k)
    sameDims = from[a[k]] == to[b[k]];
  Index in(to.size(), s.constant(0));
  if (sameDims) {
    for (size_t k = 0; k < a.size(); ++k)
      in[b[k]] = idx[a[k]];
    return in;
  }
  // An empty tensor has no element to map (its loops run no iteration), and splitting a flat
  // index over a dim of 0 would divide by it: every position maps to 0.
  for (const std::vector<SymExpr> *shape : {&from, &to})
    for (SymExpr d : *shape)
      if (d->isConst(0))
        return in;
  // 2. General case: flatten the result index row-major and split it over `to`.
  SymExpr flat = s.constant(0), stride = s.constant(1);
  for (size_t i = from.size(); i-- > 0;) {
    flat = s.add(flat, s.mul(idx[i], stride));
    stride = s.mul(stride, from[i]);
  }
  stride = s.constant(1);
  for (size_t j = to.size(); j-- > 0;) {
    if (!to[j]->isConst(1)) {
      SymExpr q = s.floordiv(flat, stride);
      in[j] = j == 0 ? q : s.mod(q, to[j]);
    }
    stride = s.mul(stride, to[j]);
  }
  return in;
}

std::vector<SymExpr> paddedRowStrides(sym::SymContext &s, const std::vector<SymExpr> &shape,
                                      int64_t elementBytes) {
  if (shape.size() < 2 || elementBytes > 16)
    return {};
  int64_t numel = 1;
  for (SymExpr d : shape) {
    if (!d->isConst())
      return {};
    numel *= d->value();
  }
  int64_t row = shape.back()->value(), perWord = 16 / elementBytes;
  if (row < 64 || row % perWord == 0 || numel * elementBytes < (int64_t(8) << 20))
    return {};
  // The strides of a row-major layout whose rows are the padded length (the last stays 1).
  std::vector<SymExpr> pitched = shape;
  pitched.back() = s.constant((row + perWord - 1) / perWord * perWord);
  return contiguousStrides(s, pitched);
}

Index viewOperandIndex(sym::SymContext &s, const Node &view, const Index &idx) {
  const std::vector<SymExpr> &in = view.operand(0)->shape();
  OpKind op = view.op();
  if (op == OpKind::Reshape)
    return reshapeIndex(s, idx, view.shape(), in);
  if (op == OpKind::Expand)
    return broadcastIndex(s, idx, view.shape(), in);
  Index out = idx;
  if (op == OpKind::Permute) {
    const IntList &dims = attrs::Permute(view).dims();
    for (size_t k = 0; k < dims.size(); ++k)
      out[dims[k]] = idx[k];
  } else if (op == OpKind::Slice) {
    const attrs::Slice a(view);
    size_t dim = a.dim();
    out[dim] = s.add(s.mul(idx[dim], a.step()), a.start());
  } else if (op == OpKind::Diagonal) {
    const attrs::Diagonal a(view);
    int64_t offset = a.offset();
    size_t d1 = a.dim1(), d2 = a.dim2(), rank = in.size();
    out.assign(rank, nullptr);
    size_t k = 0;
    for (size_t i = 0; i < rank; ++i)
      if (i != d1 && i != d2)
        out[i] = idx[k++];
    SymExpr t = idx.back();
    out[d1] = offset >= 0 ? t : s.add(t, -offset);
    out[d2] = offset >= 0 ? s.add(t, offset) : t;
  } else if (op == OpKind::Unfold) {
    const attrs::Unfold a(view);
    size_t dim = a.dim();
    out.pop_back();
    out[dim] = s.add(s.mul(idx[dim], a.step()), s.mul(idx.back(), a.dilation()));
  } else if (op == OpKind::Flip) {
    for (int64_t d : attrs::Flip(view).dims())
      out[d] = s.sub(s.sub(view.shape()[d], s.constant(1)), idx[d]);
  } else if (op == OpKind::Select) {
    const attrs::Select a(view);
    out.insert(out.begin() + a.dim(), s.constant(a.index()));
  } else {
    BRAZE_UNREACHABLE("not a view: " << opName(op));
  }
  return out;
}

} // namespace braze
