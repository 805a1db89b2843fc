/// mean(x) = sum(x) / n
/// var(x)  = sum((x - mean(x))^2) / max(n - correction, 0)       (two passes; no cancellation)
/// layer_norm(x, w, b) = (x - mean(x)) * rsqrt(var(x) + eps) * w + b   over the trailing dims
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

namespace braze::decomp {

Node *decomposeMean(GraphBuilder &b, Node *n) {
  const attrs::Mean a(*n);
  Node *x = upcast(b, n->operand(0));
  std::vector<int64_t> dims = a.dims();
  Node *s = b.reduce(OpKind::Sum, x, dims, a.keepdim());
  Node *count = b.numel(x, dims, x->dtype());
  return downcastLike(b, b.div(s, count), n->dtype());
}

Node *decomposeVar(GraphBuilder &b, Node *n) {
  const attrs::Var a(*n);
  Node *x = upcast(b, n->operand(0));
  std::vector<int64_t> dims = a.dims();
  Node *mean = b.mean(x, dims, true);
  Node *d = b.sub(x, mean);
  Node *ss = b.reduce(OpKind::Sum, b.mul(d, d), dims, a.keepdim());
  Node *count = b.numel(x, dims, x->dtype());
  Node *denom = b.binary(OpKind::Maximum, b.sub(count, b.scalar(a.correction(), x->dtype())),
                         b.scalar(0.0, x->dtype()));
  return downcastLike(b, b.div(ss, denom), n->dtype());
}

Node *decomposeLayerNorm(GraphBuilder &b, Node *n) {
  const attrs::LayerNorm a(*n);
  Node *x = upcast(b, n->operand(0));
  int64_t axis = a.axis();
  std::vector<int64_t> dims;
  for (int64_t i = axis; i < x->rank(); ++i)
    dims.push_back(i);
  Node *mean = b.mean(x, dims, true);
  Node *var = b.var(x, dims, 0.0, true);
  Node *rstd = b.unary(OpKind::Rsqrt, b.add(var, b.scalar(a.eps(), x->dtype())));
  Node *y = b.mul(b.sub(x, mean), rstd);
  size_t next = 1;
  if (a.weight())
    y = b.mul(y, upcast(b, n->operand(next++)));
  if (a.bias())
    y = b.add(y, upcast(b, n->operand(next++)));
  return downcastLike(b, y, n->dtype());
}

} // namespace braze::decomp
