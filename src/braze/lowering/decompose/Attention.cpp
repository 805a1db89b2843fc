/// attention(q, k, v, bias) = softmax(scale * q·kᵀ + bias, causally masked) · v, with the
/// rows whose every key is masked 0 when `safe` (nan otherwise, as a plain softmax gives).
/// The scores (a product of the operands widened to the compute type, so f16/bf16 scores are
/// never rounded) and their softmax are computed in f32, and the probabilities rounded to the
/// operands' dtype for the second product, as the fused kernels do.
///
/// attention_lse and attention_grad, the forward's saved log-sum-exp and the backward, are the
/// same scores written out: with p = exp(s - lse) (0 where lse is -inf), dP = dout·vᵀ and
/// Δ = rowsum(dout ∘ out), dS = p ∘ (dP - Δ), so that dv = pᵀ·dout, dq = scale·dS·k and
/// dk = scale·dSᵀ·q, all in the compute type.
///
/// With dropout p, the probabilities that reach v are p ∘ keep / (1 - p), keep being
/// philox_uniform(seed, n) >= p at the scores' row-major position n (the fused kernels'
/// draw); the backward drops the same ones: dv = (p ∘ keep')ᵀ·dout, dS = p ∘ (dP ∘ keep' - Δ),
/// keep' = keep / (1 - p).
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <limits>
#include <numeric>

namespace braze::decomp {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// x with its last two dims swapped.
Node *transposed(GraphBuilder &b, Node *x) {
  std::vector<int64_t> swap(static_cast<size_t>(x->rank()));
  std::iota(swap.begin(), swap.end(), 0);
  std::swap(swap[swap.size() - 1], swap[swap.size() - 2]);
  return b.permute(x, swap);
}

/// scale * q·kᵀ + bias in the compute type, with the keys a causal mask drops at -inf.
Node *scores(GraphBuilder &b, Node *q, Node *k, Node *bias, double scale, bool causal) {
  int64_t r = q->rank();
  DType compute = computeType(q->dtype());
  Node *s = b.matmul(b.convert(q, compute), b.convert(transposed(b, k), compute));
  s = b.mul(s, b.scalar(scale, compute));
  if (bias)
    s = b.add(s, upcast(b, bias));
  if (causal) {
    std::vector<SymExpr> square{q->shape()[r - 2], k->shape()[r - 2]};
    Node *keep = b.binary(OpKind::Le, b.iota(DType::Int64, square, 1),
                          b.iota(DType::Int64, square, 0));
    s = b.where(keep, s, b.scalar(kNegInf, compute));
  }
  return s;
}

/// The bias operand of attention-family node n (its last operand), or nullptr. Read through
/// attention_lse's view, whose attributes attention and attention_grad have too.
Node *biasOf(Node *n) {
  return attrs::AttentionLse(*n).bias() ? n->operands().back() : nullptr;
}

/// An attention's kept probabilities' factor over the scores `s`: 1 / (1 - p) where the
/// draw at a score's position is at least the dropout p, 0 where it drops; nullptr without
/// dropout. The seed is operand `at`.
Node *dropoutFactor(GraphBuilder &b, Node *n, Node *s, size_t at) {
  double p = GraphBuilder::attentionDropout(n);
  if (p == 0)
    return nullptr;
  const std::vector<SymExpr> &shape = s->shape();
  Node *u = b.binary(OpKind::PhiloxUniform, b.expand(n->operand(at), shape),
                     flatPosition(b, shape));
  Node *keep = b.binary(OpKind::Ge, u, b.scalar(p, DType::Float32));
  return b.where(keep, b.scalar(1 / (1 - p), s->dtype()), b.scalar(0, s->dtype()));
}

} // namespace

Node *decomposeAttention(GraphBuilder &b, Node *n) {
  Node *q = n->operand(0), *v = n->operand(2);
  int64_t r = q->rank();
  DType compute = computeType(q->dtype());
  const attrs::Attention a(*n);
  Node *s = scores(b, q, n->operand(1), biasOf(n), a.scale(), a.causal());
  Node *p = b.softmax(s, r - 1);
  if (a.safe()) {
    // A row whose every key is masked attends to nothing (0), as PyTorch's attention kernels
    // and its safe softmax give, not to nan.
    Node *empty = b.binary(OpKind::Eq, b.reduce(OpKind::Amax, s, {r - 1}, true),
                           b.scalar(kNegInf, compute));
    p = b.where(empty, b.scalar(0, compute), p);
  }
  if (Node *keep = dropoutFactor(b, n, s, 3))
    p = b.mul(p, keep);
  return b.matmul(downcastLike(b, p, q->dtype()), v);
}

Node *decomposeAttentionLse(GraphBuilder &b, Node *n) {
  Node *q = n->operand(0);
  int64_t last = q->rank() - 1;
  DType compute = computeType(q->dtype());
  const attrs::AttentionLse a(*n);
  Node *s = scores(b, q, n->operand(1), biasOf(n), a.scale(), a.causal());
  // The row maximum, 0 for an all-masked row, so that such a row gives log(0) = -inf.
  Node *m = b.reduce(OpKind::Amax, s, {last}, true);
  m = b.where(b.binary(OpKind::Eq, m, b.scalar(kNegInf, compute)), b.scalar(0, compute), m);
  Node *sum = b.reduce(OpKind::Sum, b.unary(OpKind::Exp, b.sub(s, m)), {last}, true);
  Node *lse = b.add(b.unary(OpKind::Log, sum), m);
  std::vector<SymExpr> rows(q->shape().begin(), q->shape().end() - 1);
  return b.reshape(lse, rows);
}

Node *decomposeAttentionGrad(GraphBuilder &b, Node *n) {
  Node *dout = n->operand(0), *q = n->operand(1), *k = n->operand(2), *v = n->operand(3);
  Node *out = n->operand(4), *lse = n->operand(5);
  int64_t last = q->rank() - 1;
  DType compute = computeType(q->dtype());
  const attrs::AttentionGrad a(*n);
  double scale = a.scale();
  Node *s = scores(b, q, k, biasOf(n), scale, a.causal());
  Node *l = b.unsqueeze(lse, last);
  Node *p = b.where(b.binary(OpKind::Eq, l, b.scalar(kNegInf, compute)), b.scalar(0, compute),
                    b.unary(OpKind::Exp, b.sub(s, l)));
  Node *g = upcast(b, dout);
  Node *keep = dropoutFactor(b, n, s, 6);
  attrs::AttentionWrt wrt = a.wrt();
  if (wrt == attrs::AttentionWrt::V)
    return downcastLike(b, b.matmul(transposed(b, keep ? b.mul(p, keep) : p), g), q->dtype());
  Node *dp = b.matmul(g, transposed(b, upcast(b, v)));
  if (keep)
    dp = b.mul(dp, keep);
  Node *delta = b.reduce(OpKind::Sum, b.mul(g, upcast(b, out)), {last}, true);
  Node *ds = b.mul(p, b.sub(dp, delta));
  Node *d = wrt == attrs::AttentionWrt::Q ? b.matmul(ds, upcast(b, k))
                                          : b.matmul(transposed(b, ds), upcast(b, q));
  return downcastLike(b, b.mul(d, b.scalar(scale, compute)), q->dtype());
}

} // namespace braze::decomp
