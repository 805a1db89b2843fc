/// attention(q, k, v, bias) = softmax(scale * q·kᵀ + bias, causally masked) · v, with the
/// rows whose every key is masked 0 when `safe` (nan otherwise, as a plain softmax gives).
/// The scores (a product of the operands widened to the compute type, so f16/bf16 scores are
/// never rounded) and their softmax are computed in f32, and the probabilities rounded to the
/// operands' dtype for the second product, as the fused kernels do.
#include "braze/lowering/decompose/Decompose.h"

#include <limits>
#include <numeric>

namespace braze::decomp {

Node *decomposeAttention(GraphBuilder &b, Node *n) {
  Node *q = n->operand(0), *k = n->operand(1), *v = n->operand(2);
  int64_t r = q->rank();
  std::vector<int64_t> swap(static_cast<size_t>(r));
  std::iota(swap.begin(), swap.end(), 0);
  std::swap(swap[r - 1], swap[r - 2]);
  DType compute = computeType(q->dtype());
  Node *s = b.matmul(b.convert(q, compute), b.convert(b.permute(k, swap), compute));
  s = b.mul(s, b.scalar(n->attrs().getFloat("scale"), compute));
  if (n->attrs().getBool("bias"))
    s = b.add(s, upcast(b, n->operand(3)));
  if (n->attrs().getBool("causal")) {
    std::vector<SymExpr> square{q->shape()[r - 2], k->shape()[r - 2]};
    Node *keep = b.binary(OpKind::Le, b.iota(DType::Int64, square, 1),
                          b.iota(DType::Int64, square, 0));
    s = b.where(keep, s, b.scalar(-std::numeric_limits<double>::infinity(), compute));
  }
  Node *p = b.softmax(s, r - 1);
  if (n->attrs().getBool("safe")) {
    // A row whose every key is masked attends to nothing (0), as PyTorch's attention kernels
    // and its safe softmax give, not to nan.
    Node *empty = b.binary(OpKind::Eq, b.reduce(OpKind::Amax, s, {r - 1}, true),
                           b.scalar(-std::numeric_limits<double>::infinity(), compute));
    p = b.where(empty, b.scalar(0, compute), p);
  }
  return b.matmul(downcastLike(b, p, q->dtype()), v);
}

} // namespace braze::decomp
