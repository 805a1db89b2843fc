/// max_pool(x): pad H and W with the lowest value (enough on the right for ceil mode), unfold
/// both into windows, flatten each window and take amax; max_pool_indices takes the argmax a
/// instead and maps it back to the input: h = oh*sh - ph + (a // kw)*dh,
/// w = ow*sw - pw + (a % kw)*dw, index = h * W + w.
#include "braze/lowering/decompose/Decompose.h"

#include <cmath>
#include <limits>

namespace braze::decomp {

namespace {
Node *windows(GraphBuilder &b, Node *n) {
  const AttrMap &a = n->attrs();
  const IntList &k = a.getInts("kernel"), &st = a.getInts("stride"), &p = a.getInts("padding"),
                &d = a.getInts("dilation");
  Node *x = n->operand(0);
  double lowest = isFloating(x->dtype()) ? -INFINITY
                                         : static_cast<double>(std::numeric_limits<int64_t>::min());
  int64_t r = x->rank();
  for (int i = 0; i < 2; ++i) {
    int64_t size, out;
    b.sym().constValue(x->shape()[r - 2 + i], size);
    b.sym().constValue(n->shape()[r - 2 + i], out);
    int64_t span = d[i] * (k[i] - 1) + 1;
    int64_t right = std::max<int64_t>(0, (out - 1) * st[i] + span - (size + p[i]));
    x = b.pad(x, r - 2 + i, p[i], right, lowest);
    x = b.unfold(x, r - 2 + i, k[i], st[i], d[i]);
    // unfold appends the window dim; keep the spatial dims where they were
  }
  std::vector<SymExpr> shape = n->shape();
  shape.push_back(b.dim(k[0] * k[1]));
  return b.reshape(x, shape);
}
} // namespace

Node *decomposeMaxPool(GraphBuilder &b, Node *n) {
  return b.reduce(OpKind::Amax, windows(b, n), {-1}, false);
}

Node *decomposeMaxPoolIndices(GraphBuilder &b, Node *n) {
  const AttrMap &a = n->attrs();
  const IntList &k = a.getInts("kernel"), &st = a.getInts("stride"), &p = a.getInts("padding"),
                &d = a.getInts("dilation");
  Node *pos = b.reduce(OpKind::ArgMax, windows(b, n), {-1}, false);
  std::vector<SymExpr> shape = n->shape();
  int64_t r = static_cast<int64_t>(shape.size());
  auto scalar = [&](int64_t v) { return b.scalar(static_cast<double>(v), DType::Int64); };
  Node *oh = b.iota(DType::Int64, shape, r - 2), *ow = b.iota(DType::Int64, shape, r - 1);
  Node *h = b.add(b.sub(b.mul(oh, scalar(st[0])), scalar(p[0])),
                  b.mul(b.binary(OpKind::FloorDiv, pos, scalar(k[1])), scalar(d[0])));
  Node *w = b.add(b.sub(b.mul(ow, scalar(st[1])), scalar(p[1])),
                  b.mul(b.binary(OpKind::Remainder, pos, scalar(k[1])), scalar(d[1])));
  int64_t width;
  b.sym().constValue(n->operand(0)->shape()[r - 1], width);
  return b.add(b.mul(h, scalar(width)), w);
}

} // namespace braze::decomp
