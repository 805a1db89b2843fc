// GraphBuilder: small arithmetic composites (the cross product, rounding to decimals) that
// lowering/decompose/Arithmetic.cpp turns into elementwise ops in eager's order.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

namespace braze {

Node *GraphBuilder::cross(Node *a, Node *b, int64_t d) {
  DType t = promoteTypes(a->dtype(), b->dtype());
  if (t == DType::Bool)
    BRAZE_USER_ERROR("cross", name_) << "needs numbers, not bools";
  std::vector<SymExpr> shape = broadcastShapes("cross", a->shape(), b->shape());
  d = normalizeSizedDim("cross", d, static_cast<int64_t>(shape.size()));
  if (!shape[d]->isConst(3))
    BRAZE_USER_ERROR("cross", name_) << "needs dim " << d << " of size 3, got "
                                     << shapeText(shape);
  AttrMap attrs;
  attrs.set("dim", d);
  return make(OpKind::Cross, {expand(convert(a, t), shape), expand(convert(b, t), shape)},
              std::move(attrs), TensorType{t, shape, {}});
}

Node *GraphBuilder::fmax(Node *a, Node *b, bool max) {
  const char *op = max ? "fmax" : "fmin";
  DType t = promoteTypes(a->dtype(), b->dtype());
  std::vector<SymExpr> shape = broadcastShapes(op, a->shape(), b->shape());
  return make(max ? OpKind::FMax : OpKind::FMin,
              {expand(convert(a, t), shape), expand(convert(b, t), shape)}, {},
              TensorType{t, shape, {}});
}

Node *GraphBuilder::roundDecimals(Node *x, int64_t decimals) {
  if (!isFloating(x->dtype()))
    BRAZE_USER_ERROR("round", name_) << "with decimals needs a floating-point input, got "
                                     << dtypeName(x->dtype());
  if (decimals < -kMaxDecimals || decimals > kMaxDecimals)
    BRAZE_USER_ERROR("round", name_) << "decimals must be within +-" << kMaxDecimals << ", got "
                                     << decimals;
  AttrMap attrs;
  attrs.set("decimals", decimals);
  return make(OpKind::RoundDecimals, {x}, std::move(attrs), x->type());
}

Node *GraphBuilder::signbit(Node *x) {
  std::vector<SymExpr> shape = x->shape();
  return make(OpKind::Signbit, {x}, {}, TensorType{DType::Bool, std::move(shape), {}});
}

DType GraphBuilder::ldexpType(DType x, DType e) {
  return promoteTypes(x, isFloating(e) ? e : DType::Float32);
}

Node *GraphBuilder::ldexp(Node *x, Node *e) {
  std::vector<SymExpr> shape = broadcastShapes("ldexp", x->shape(), e->shape());
  return make(OpKind::Ldexp, {expand(x, shape), expand(e, shape)}, {},
              TensorType{ldexpType(x->dtype(), e->dtype()), shape, {}});
}

Node *GraphBuilder::angle(Node *x) {
  if (!isFloating(x->dtype()))
    BRAZE_USER_ERROR("angle", name_) << "needs a floating-point input, got "
                                     << dtypeName(x->dtype());
  return make(OpKind::Angle, {x}, {}, x->type());
}

} // namespace braze
