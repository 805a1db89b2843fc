/// Small arithmetic composites, in eager's order of operations:
///   cross(a, b)[i] = a[i+1] * b[i+2] - a[i+2] * b[i+1] (indices mod 3 along dim), each product
///                    and difference rounded in the dtype, as eager's kernel does;
///   round_decimals(x) = round(x * 10^d) / 10^d, or for d < 0 round(x / 10^-d) * 10^-d,
///                    half precision in f32 and rounded once;
///   fmax(a, b)     = isnan(a) ? b : isnan(b) ? a : maximum(a, b) (fmin with minimum);
///   signbit(x)     = copysign(1, x) < 0 for floats (the sign of -0.0 and of NaNs), x < 0
///                    otherwise;
///   ldexp(x, e)    = x * pow(2, e), 2 and e in e's float dtype (f32 for integers);
///   angle(x)       = isnan(x) ? x : x < 0 ? pi : 0.
#include "braze/lowering/decompose/Decompose.h"

#include <cmath>

namespace braze::decomp {

Node *decomposeCross(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0), *y = n->operand(1);
  int64_t d = n->attrs().getInt("dim");
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

Node *decomposeRoundDecimals(GraphBuilder &b, Node *n) {
  Node *x = upcast(b, n->operand(0));
  int64_t d = n->attrs().getInt("decimals");
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

} // namespace braze::decomp
