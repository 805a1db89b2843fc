/// max_pool(x): pad H and W with the lowest value (enough on the right for ceil mode), unfold
/// both into windows and take amax over the two window dims; max_pool_indices flattens each
/// window, takes the argmax a instead and maps it back to the input:
/// h = oh*sh - ph + (a // kw)*dh,
/// w = ow*sw - pw + (a % kw)*dw, index = h * W + w.
#include "braze/lowering/decompose/Decompose.h"

#include <cmath>
#include <limits>

namespace braze::decomp {

namespace {
/// The pooling windows of x (whose last two dims are pooled) as [.., OH, OW, kh, kw], or
/// [.., OH, OW, kh * kw] when `flatten`: the declared padding is filled with `padValue`, the
/// extra right padding ceil mode needs with `extraValue`. A reduction over the two window dims
/// folds in the same (row-major) order as over the flattened one, without dividing its index.
Node *windows(GraphBuilder &b, Node *n, Node *x, double padValue, double extraValue,
              bool flatten) {
  const AttrMap &a = n->attrs();
  const IntList &k = a.getInts("kernel"), &st = a.getInts("stride"), &p = a.getInts("padding"),
                &d = a.getInts("dilation");
  int64_t r = x->rank(), nr = n->rank();
  for (int i = 0; i < 2; ++i) {
    int64_t size, out;
    b.sym().constValue(x->shape()[r - 2 + i], size);
    b.sym().constValue(n->shape()[nr - 2 + i], out);
    int64_t span = d[i] * (k[i] - 1) + 1;
    int64_t right = std::max<int64_t>(0, (out - 1) * st[i] + span - (size + p[i]));
    x = b.pad(x, r - 2 + i, p[i], p[i], padValue);
    x = b.pad(x, r - 2 + i, 0, right - std::min(right, p[i]) , extraValue);
    if (right < p[i]) // the declared right padding is more than the windows reach
      x = b.slice(x, r - 2 + i, 0, size + p[i] + right, 1);
    x = b.unfold(x, r - 2 + i, k[i], st[i], d[i]);
  }
  if (!flatten)
    return x;
  std::vector<SymExpr> shape(x->shape().begin(), x->shape().end() - 2);
  shape.push_back(b.dim(k[0] * k[1]));
  return b.reshape(x, shape);
}

double lowestOf(DType t) {
  return isFloating(t) ? -INFINITY : static_cast<double>(std::numeric_limits<int64_t>::min());
}
} // namespace

Node *decomposeMaxPool(GraphBuilder &b, Node *n) {
  double lowest = lowestOf(n->dtype());
  return b.reduce(OpKind::Amax, windows(b, n, n->operand(0), lowest, lowest, false), {-2, -1},
                  false);
}

/// avg_pool(x) = sum(window) / divisor, where the divisor is divisor_override, or the count of
/// window positions inside the input (plus the declared padding with count_include_pad).
Node *decomposeAvgPool(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  Node *sum = b.reduce(OpKind::Sum, windows(b, n, x, 0.0, 0.0, false), {-2, -1}, false);
  int64_t divisor = n->attrs().getInt("divisor");
  if (divisor != 0)
    return b.div(sum, b.scalar(static_cast<double>(divisor), n->dtype()));
  // A window covers a rectangle, so its count is the product of per-dim counts: with
  // start = o * stride - padding, [start, min(start + k, size + padding)) with the declared
  // padding counted, else that range clipped to [0, size).
  const AttrMap &a = n->attrs();
  const IntList &k = a.getInts("kernel"), &st = a.getInts("stride"), &p = a.getInts("padding");
  bool includePad = a.getBool("count_include_pad");
  int64_t r = n->rank();
  auto scalar = [&](int64_t v) { return b.scalar(static_cast<double>(v), DType::Int64); };
  Node *count = nullptr;
  for (int i = 0; i < 2; ++i) {
    int64_t size, out;
    b.sym().constValue(x->shape()[r - 2 + i], size);
    b.sym().constValue(n->shape()[r - 2 + i], out);
    std::vector<SymExpr> shape(2, b.dim(1));
    shape[i] = b.dim(out);
    Node *start = b.sub(b.mul(b.iota(DType::Int64, shape, i), scalar(st[i])), scalar(p[i]));
    Node *end = b.binary(OpKind::Minimum, b.add(start, scalar(k[i])), scalar(size + p[i]));
    if (!includePad) {
      start = b.binary(OpKind::Maximum, start, scalar(0));
      end = b.binary(OpKind::Minimum, end, scalar(size));
    }
    Node *c = b.convert(b.sub(end, start), n->dtype());
    count = count ? b.mul(count, c) : c;
  }
  return b.div(sum, count);
}

Node *decomposeMaxPoolIndices(GraphBuilder &b, Node *n) {
  const AttrMap &a = n->attrs();
  const IntList &k = a.getInts("kernel"), &st = a.getInts("stride"), &p = a.getInts("padding"),
                &d = a.getInts("dilation");
  double lowest = lowestOf(n->operand(0)->dtype());
  Node *pos =
      b.reduce(OpKind::ArgMax, windows(b, n, n->operand(0), lowest, lowest, true), {-1}, false);
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
