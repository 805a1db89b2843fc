/// Small arithmetic composites, in eager's order of operations:
///   cross(a, b)[i] = a[i+1] * b[i+2] - a[i+2] * b[i+1] (indices mod 3 along dim), each product
///                    and difference rounded in the dtype, as eager's kernel does;
///   round_decimals(x) = round(x * 10^d) / 10^d, or for d < 0 round(x / 10^-d) * 10^-d,
///                    half precision in f32 and rounded once;
///   fmax(a, b)     = isnan(a) ? b : isnan(b) ? a : maximum(a, b) (fmin with minimum);
///   trunc_div(a, b) = trunc(a / b) for floating point; for integers floordiv(a, b), plus one
///                    where the quotient is inexact (a nonzero remainder) and negative (the
///                    operands' signs differ);
///   soft_margin_loss(x, y) = log1p(exp(-x * y)), each step in x's dtype as eager's kernel
///                    rounds, then its mean or sum over every dim (reduction "mean", "sum");
///   signbit(x)     = copysign(1, x) < 0 for floats (the sign of -0.0 and of NaNs), x < 0
///                    otherwise;
///   ldexp(x, e)    = x * pow(2, e), 2 and e in e's float dtype (f32 for integers);
///   angle(x)       = isnan(x) ? x : x < 0 ? pi : 0;
///   add_matmul     = beta * bias + alpha * (a @ b) (summed over the batch for addbmm), the
///                    scalars in the result's dtype (truncated for integers), beta == 0
///                    dropping bias; half-precision addbmm adds one f32 product per batch,
///                    rounding after each, as eager's loop of addmm calls;
///   trilinear      = sum(x1' * x2' over the sum dims x3 is expanded in) * x3', summed over
///                    the rest (x' unsqueezed at its expand dims; half precision in f32).
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>
#include <cmath>

namespace braze::decomp {

Node *decomposeCross(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *y = n->operand(1);
  int64_t d = attrs::Cross(*n).dim();
  std::vector<Node *> parts;
  for (int64_t i = 0; i < 3; ++i) {
    int64_t j = (i + 1) % 3, k = (i + 2) % 3;
    Node *ab = b.mul(b.select(x, d, j), b.select(y, d, k));
    Node *ba = b.mul(b.select(x, d, k), b.select(y, d, j));
    parts.push_back(b.unsqueeze(b.sub(ab, ba), d));
  }
  return b.concat(parts, d);
}

Node *decomposeFMax(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *y = n->operand(1);
  Node *m = b.binary(n->op() == OpKind::FMax ? OpKind::Maximum : OpKind::Minimum, x, y);
  if (!isFloating(n->dtype()))
    return m;
  m = b.where(b.unary(OpKind::IsNan, y), x, m);
  return b.where(b.unary(OpKind::IsNan, x), y, m);
}

Node *decomposeTruncDiv(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *y = n->operand(1);
  DType t = n->dtype();
  if (isFloating(t))
    return b.unary(OpKind::Trunc, b.binary(OpKind::Div, x, y));
  // One node per statement: the order of a call's arguments is the compiler's, and the graph
  // printed must not depend on it.
  Node *q = b.binary(OpKind::FloorDiv, x, y);
  Node *zero = b.scalar(0, t);
  Node *inexact = b.binary(OpKind::Ne, b.binary(OpKind::Remainder, x, y), zero);
  Node *xNegative = b.binary(OpKind::Lt, x, zero);
  Node *yNegative = b.binary(OpKind::Lt, y, zero);
  Node *fix = b.binary(OpKind::LogicalAnd, inexact, b.binary(OpKind::Ne, xNegative, yNegative));
  Node *up = b.add(q, b.scalar(1, t));
  return b.where(fix, up, q);
}

Node *decomposeSoftMarginLoss(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *y = n->operand(1);
  Node *product = b.mul(b.unary(OpKind::Neg, x), y);
  Node *loss = b.unary(OpKind::Log1p, b.unary(OpKind::Exp, product));
  attrs::LossReduction reduction = attrs::SoftMarginLoss(*n).reduction();
  if (reduction == attrs::LossReduction::None)
    return loss;
  // No dims: every dim.
  return reduction == attrs::LossReduction::Mean ? b.mean(loss, {}, false)
                                                  : b.reduce(OpKind::Sum, loss, {}, false);
}

Node *decomposeRoundDecimals(GraphBuilder &b, Node *n) {
  Node *x = upcast(b, n->operand(0));
  int64_t d = attrs::RoundDecimals(*n).decimals();
  if (d == 0)
    return downcastLike(b, b.unary(OpKind::Round, x), n->dtype());
  Node *ten = b.scalar(std::pow(10.0, static_cast<double>(std::abs(d))), x->dtype());
  Node *r = d > 0 ? b.div(b.unary(OpKind::Round, b.mul(x, ten)), ten)
                  : b.mul(b.unary(OpKind::Round, b.div(x, ten)), ten);
  return downcastLike(b, r, n->dtype());
}

Node *decomposeSignbit(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  DType t = x->dtype();
  if (isFloating(t))
    return b.binary(OpKind::Lt, b.binary(OpKind::CopySign, b.scalar(1.0, t), x), b.scalar(0, t));
  if (t == DType::Bool)
    return b.full(0, DType::Bool, x->shape());
  return b.binary(OpKind::Lt, x, b.scalar(0, t));
}

Node *decomposeLdexp(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *e = n->operand(1);
  DType p = isFloating(e->dtype()) ? e->dtype() : DType::Float32;
  Node *scale = b.binary(OpKind::Pow, b.scalar(2.0, p), b.convert(e, p));
  return b.convert(b.mul(x, scale), n->dtype());
}

Node *decomposeAngle(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  DType t = x->dtype();
  Node *zero = b.scalar(0, t);
  Node *r = b.where(b.binary(OpKind::Lt, x, zero), b.scalar(M_PI, t), zero);
  return b.where(b.elementwise(OpKind::IsNan, {x}), x, r);
}

Node *decomposeAddMatMul(GraphBuilder &b, Node *n) {
  Node *bias = n->operand(0), *x = n->operand(1), *y = n->operand(2);
  const attrs::AddMatMul a(*n);
  double beta = a.beta(), alpha = a.alpha();
  DType t = n->dtype();
  bool batchSum = a.batch_sum();
  if (batchSum && (t == DType::Float16 || t == DType::BFloat16)) {
    Node *prods = b.matmul(b.convert(x, DType::Float32), b.convert(y, DType::Float32));
    Node *acc = nullptr;
    for (int64_t k = 0; k < x->shape()[0]->value(); ++k) {
      Node *term = b.select(prods, 0, k);
      if (alpha != 1)
        term = b.mul(term, b.scalar(alpha, DType::Float32));
      if (acc != nullptr) {
        term = b.add(b.convert(acc, DType::Float32), term);
      } else if (beta != 0) {
        Node *bh = b.convert(bias, DType::Float32);
        if (beta != 1)
          bh = b.mul(bh, b.scalar(beta, DType::Float32));
        term = b.add(bh, term);
      }
      acc = b.convert(term, t);
    }
    return acc;
  }
  if (!isFloating(t)) {
    alpha = std::trunc(alpha);
    beta = std::trunc(beta);
  }
  Node *h = b.matmul(x, y);
  if (batchSum)
    h = b.reduce(OpKind::Sum, h, {0}, false, t);
  if (alpha != 1)
    h = b.mul(h, b.scalar(alpha, t));
  if (beta == 0)
    return h;
  if (beta != 1)
    bias = b.mul(bias, b.scalar(beta, t));
  return b.add(bias, h);
}

Node *decomposeTrilinear(GraphBuilder &b, Node *n) {
  const attrs::Trilinear a(*n);
  DType t = n->dtype(), ct = computeType(t);
  auto expanded = [&](Node *x, const IntList &dims) {
    Node *h = b.convert(x, ct);
    IntList sorted = dims;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t d : sorted)
      h = b.unsqueeze(h, d);
    return h;
  };
  const IntList &expand3 = a.expand3();
  std::vector<int64_t> first, rest;
  IntList sum = a.sumdim();
  std::sort(sum.begin(), sum.end());
  for (int64_t d : sum)
    (std::find(expand3.begin(), expand3.end(), d) != expand3.end() ? first : rest).push_back(d);
  Node *h = b.mul(expanded(n->operand(0), a.expand1()), expanded(n->operand(1), a.expand2()));
  if (!first.empty())
    h = b.convert(b.convert(b.reduce(OpKind::Sum, h, first, true, ct), t), ct);
  h = b.mul(h, expanded(n->operand(2), expand3));
  if (!rest.empty())
    h = b.reduce(OpKind::Sum, h, rest, true, ct);
  return b.reshape(b.convert(h, t), n->shape());
}

} // namespace braze::decomp
