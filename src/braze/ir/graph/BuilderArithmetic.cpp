// GraphBuilder: small arithmetic composites (the cross product, truncating division, the soft
// margin loss, rounding to decimals) that
// lowering/decompose/Arithmetic.cpp turns into elementwise ops in eager's order.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>

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

Node *GraphBuilder::clamp(Node *x, Node *lo, Node *hi) {
  if (lo)
    x = binary(OpKind::Maximum, x, lo);
  if (hi)
    x = binary(OpKind::Minimum, x, hi);
  return x;
}

Node *GraphBuilder::addScaled(Node *x, Node *y, Node *alpha, bool subtract) {
  Node *scaled = alpha ? mul(y, alpha) : y;
  return subtract ? sub(x, scaled) : add(x, scaled);
}

Node *GraphBuilder::copyLike(Node *src, Node *like) {
  return expand(convert(src, like->dtype()), like->shape());
}

std::pair<Node *, Node *> GraphBuilder::frexp(Node *x) {
  if (!isFloating(x->dtype()))
    BRAZE_USER_ERROR("frexp", name_) << "needs a floating-point operand, got "
                                     << dtypeName(x->dtype());
  Node *mantissa = unary(OpKind::FrexpMantissa, x);
  Node *exponent = unary(OpKind::FrexpExponent, x);
  return {mantissa, convert(exponent, DType::Int32)};
}

Node *GraphBuilder::truncDiv(Node *a, Node *b) {
  DType t = promoteTypes(a->dtype(), b->dtype());
  if (t == DType::Bool)
    BRAZE_USER_ERROR("trunc_div", name_) << "needs numbers, not bools";
  std::vector<SymExpr> shape = broadcastShapes("trunc_div", a->shape(), b->shape());
  return make(OpKind::TruncDiv, {expand(convert(a, t), shape), expand(convert(b, t), shape)}, {},
              TensorType{t, shape, {}});
}

Node *GraphBuilder::softMarginLoss(Node *x, Node *y, const std::string &reduction) {
  if (!isFloating(x->dtype()) || y->dtype() != x->dtype())
    BRAZE_USER_ERROR("soft_margin_loss", name_)
        << "needs floating-point operands of one dtype, got " << dtypeName(x->dtype()) << " and "
        << dtypeName(y->dtype());
  if (!isLossReduction(reduction))
    BRAZE_USER_ERROR("soft_margin_loss", name_)
        << "reduction must be \"none\", \"mean\" or \"sum\", got \"" << reduction << "\"";
  std::vector<SymExpr> shape = broadcastShapes("soft_margin_loss", x->shape(), y->shape());
  AttrMap attrs;
  attrs.set("reduction", reduction);
  std::vector<SymExpr> result = reduction == "none" ? shape : std::vector<SymExpr>{};
  return make(OpKind::SoftMarginLoss, {expand(x, shape), expand(y, shape)}, std::move(attrs),
              TensorType{x->dtype(), result, {}});
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

namespace {

std::string addMatMulError(const std::vector<const Node *> &ops, const AttrMap &a,
                           TensorType &type) {
  const Node *bias = ops[0], *x = ops[1], *y = ops[2];
  bool batchSum = a.getBool("batch_sum");
  int64_t r = x->rank();
  if (r < 2 || y->rank() != r || (batchSum && r != 3))
    return batchSum ? "needs 3-d operands" : "needs operands of one rank, at least 2";
  if (x->dtype() != y->dtype() || bias->dtype() != x->dtype() || x->dtype() == DType::Bool)
    return "needs operands of one numeric dtype";
  for (int64_t d = 0; d + 2 < r; ++d)
    if (x->shape()[d] != y->shape()[d])
      return "the operands' batch dims differ";
  if (x->shape()[r - 1] != y->shape()[r - 2])
    return "the operands cannot be multiplied";
  std::vector<SymExpr> shape(x->shape().begin() + (batchSum ? 1 : 0), x->shape().end() - 1);
  shape.push_back(y->shape().back());
  if (bias->shape() != shape)
    return "bias must be expanded to the result's shape";
  if (batchSum && isHalf(x->dtype())) {
    const SymExpr &batches = x->shape()[0];
    if (!batches->isConst() || batches->value() < 1 ||
        batches->value() > GraphBuilder::kMaxUnrolledBatches)
      return "a half-precision addbmm over 1 to " +
             std::to_string(GraphBuilder::kMaxUnrolledBatches) + " batches";
  }
  type = TensorType{x->dtype(), shape, {}};
  return "";
}

std::string trilinearError(const std::vector<const Node *> &ops, const AttrMap &a,
                           sym::SymContext &ctx, TensorType &type) {
  const char *names[] = {"expand1", "expand2", "expand3"};
  int64_t rank = -1;
  std::vector<SymExpr> shape;
  for (int i = 0; i < 3; ++i) {
    const IntList &e = a.getInts(names[i]);
    int64_t r = ops[i]->rank() + static_cast<int64_t>(e.size());
    if (rank >= 0 && r != rank)
      return "the operands unsqueezed at their expand dims must have one rank";
    rank = r;
    std::vector<SymExpr> s;
    size_t next = 0;
    for (int64_t d = 0; d < r; ++d) {
      bool unsqueezed = std::find(e.begin(), e.end(), d) != e.end();
      if (!unsqueezed && next >= static_cast<size_t>(ops[i]->rank()))
        return std::string(names[i]) + " must name distinct dims of the expanded rank";
      s.push_back(unsqueezed ? ctx.constant(1) : ops[i]->shape()[next++]);
    }
    if (next != static_cast<size_t>(ops[i]->rank()))
      return std::string(names[i]) + " must name distinct dims of the expanded rank";
    if (i == 0) {
      shape = s;
      continue;
    }
    for (int64_t d = 0; d < r; ++d) {
      if (s[d]->isConst(1))
        continue;
      if (!shape[d]->isConst(1) && shape[d] != s[d])
        return "the expanded operands do not broadcast together";
      shape[d] = s[d];
    }
  }
  if (ops[0]->dtype() != ops[1]->dtype() || ops[1]->dtype() != ops[2]->dtype())
    return "needs operands of one dtype";
  const IntList &sum = a.getInts("sumdim");
  std::vector<SymExpr> out;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(sum.begin(), sum.end(), d) == sum.end())
      out.push_back(shape[d]);
  for (int64_t d : sum)
    if (d < 0 || d >= rank)
      return "sumdim must name dims of the expanded rank";
  type = TensorType{ops[0]->dtype(), out, {}};
  return "";
}

} // namespace

std::string GraphBuilder::productError(OpKind op, const std::vector<const Node *> &operands,
                                       const AttrMap &attrs, sym::SymContext &ctx,
                                       TensorType &type) {
  if (op == OpKind::AddMatMul)
    return addMatMulError(operands, attrs, type);
  BRAZE_CHECK(op == OpKind::Trilinear) << "not a product composite: " << opName(op);
  return trilinearError(operands, attrs, ctx, type);
}

Node *GraphBuilder::addMatMul(Node *bias, Node *a, Node *b, double beta, double alpha,
                              bool batchSum) {
  AttrMap attrs;
  attrs.set("beta", beta);
  attrs.set("alpha", alpha);
  attrs.set("batch_sum", batchSum);
  if (a->rank() >= 2 && b->rank() == a->rank()) {
    std::vector<SymExpr> shape(a->shape().begin() + (batchSum ? 1 : 0), a->shape().end() - 1);
    shape.push_back(b->shape().back());
    bias = expand(convert(bias, a->dtype()), shape);
  }
  std::vector<Node *> ops{bias, a, b};
  TensorType type;
  std::string err = productError(OpKind::AddMatMul, {bias, a, b}, attrs, sym(), type);
  if (!err.empty())
    BRAZE_USER_ERROR(batchSum ? "addbmm" : "addmm", name_) << err;
  return make(OpKind::AddMatMul, std::move(ops), std::move(attrs), std::move(type));
}

Node *GraphBuilder::trilinear(Node *x1, Node *x2, Node *x3, IntList expand1, IntList expand2,
                              IntList expand3, IntList sumdim) {
  AttrMap attrs;
  attrs.set("expand1", std::move(expand1));
  attrs.set("expand2", std::move(expand2));
  attrs.set("expand3", std::move(expand3));
  attrs.set("sumdim", std::move(sumdim));
  TensorType type;
  std::string err = productError(OpKind::Trilinear, {x1, x2, x3}, attrs, sym(), type);
  if (!err.empty())
    BRAZE_USER_ERROR("trilinear", name_) << err;
  return make(OpKind::Trilinear, {x1, x2, x3}, std::move(attrs), std::move(type));
}

} // namespace braze
