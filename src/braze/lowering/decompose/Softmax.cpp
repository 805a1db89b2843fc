/// softmax(x) = exp(x - max(x)) / sum(exp(x - max(x))), or times 1 / sum
/// (DecomposeOptions::softmaxReciprocal)
/// log_softmax(x) = (x - max(x)) - log(sum(exp(x - max(x))))
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

namespace braze::decomp {

namespace {
/// x - max(x) over `dim`, in the compute type.
Node *shiftByMax(GraphBuilder &b, Node *x, int64_t dim) {
  Node *m = b.reduce(OpKind::Amax, x, {dim}, true);
  // A row that is all -inf would give (-inf) - (-inf) = nan; PyTorch gives nan as well.
  return b.sub(x, m);
}
} // namespace

Node *decomposeSoftmax(GraphBuilder &b, Node *n, const DecomposeOptions &opts) {
  int64_t dim = attrs::Softmax(*n).dim();
  Node *x = upcast(b, n->operand(0));
  Node *e = b.unary(OpKind::Exp, shiftByMax(b, x, dim));
  Node *s = b.reduce(OpKind::Sum, e, {dim}, true);
  Node *p = opts.softmaxReciprocal ? b.mul(e, b.unary(OpKind::Reciprocal, s)) : b.div(e, s);
  return downcastLike(b, p, n->dtype());
}

Node *decomposeLogSoftmax(GraphBuilder &b, Node *n) {
  int64_t dim = attrs::LogSoftmax(*n).dim();
  Node *x = upcast(b, n->operand(0));
  Node *shifted = shiftByMax(b, x, dim);
  Node *s = b.reduce(OpKind::Sum, b.unary(OpKind::Exp, shifted), {dim}, true);
  return downcastLike(b, b.sub(shifted, b.unary(OpKind::Log, s)), n->dtype());
}

} // namespace braze::decomp
