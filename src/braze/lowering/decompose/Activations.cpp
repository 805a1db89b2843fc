/// gelu(x)        = 0.5 * x * (1 + erf(x / sqrt(2)))
/// gelu_tanh(x)   = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
/// silu(x)        = x * sigmoid(x)
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

namespace braze::decomp {

Node *decomposeGelu(GraphBuilder &b, Node *n) {
  Node *x = upcast(b, n->operand(0));
  DType t = x->dtype();
  Node *inner;
  if (attrs::Gelu(*n).approximate() == attrs::GeluApproximate::Tanh) {
    Node *cube = b.mul(b.mul(x, x), x);
    Node *poly = b.add(x, b.mul(b.scalar(0.044715, t), cube));
    inner = b.unary(OpKind::Tanh, b.mul(b.scalar(0.7978845608028654, t), poly));
  } else {
    inner = b.unary(OpKind::Erf, b.mul(x, b.scalar(0.7071067811865476, t)));
  }
  Node *y = b.mul(b.mul(b.scalar(0.5, t), x), b.add(b.scalar(1.0, t), inner));
  return downcastLike(b, y, n->dtype());
}

Node *decomposeSilu(GraphBuilder &b, Node *n) {
  Node *x = upcast(b, n->operand(0));
  return downcastLike(b, b.mul(x, b.unary(OpKind::Sigmoid, x)), n->dtype());
}

} // namespace braze::decomp
