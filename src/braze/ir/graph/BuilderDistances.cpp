// GraphBuilder: pairwise distances (cdist, pdist), composite ops that lowering/decompose turns
// into broadcast differences and reductions, or cdist's matrix-product form.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

#include <cmath>

namespace braze {

Node *GraphBuilder::cdist(Node *a, Node *b, double p, bool matmulForm) {
  const char *op = "cdist";
  if (a->rank() < 2 || b->rank() != a->rank())
    BRAZE_USER_ERROR(op, name_) << "needs operands [.., P, M] and [.., R, M] of one rank >= 2, "
                                   "got ranks "
                                << a->rank() << " and " << b->rank();
  if ((a->dtype() != DType::Float32 && a->dtype() != DType::Float64) || b->dtype() != a->dtype())
    BRAZE_USER_ERROR(op, name_) << "needs two f32 or two f64 operands, got "
                                << dtypeName(a->dtype()) << " and " << dtypeName(b->dtype());
  int64_t r = a->rank();
  if (a->shape()[r - 1] != b->shape()[r - 1])
    BRAZE_USER_ERROR(op, name_) << "feature dims differ: " << shapeText(a->shape()) << " and "
                                << shapeText(b->shape());
  if (std::isnan(p) || p < 0)
    BRAZE_USER_ERROR(op, name_) << "p must be >= 0 (or inf), got " << p;
  std::vector<SymExpr> batchA(a->shape().begin(), a->shape().end() - 2),
      batchB(b->shape().begin(), b->shape().end() - 2);
  std::vector<SymExpr> shape = broadcastShapes(op, batchA, batchB);
  shape.push_back(a->shape()[r - 2]);
  shape.push_back(b->shape()[r - 2]);
  AttrMap attrs;
  attrs.set("p", p);
  attrs.set("matmul_form", matmulForm);
  return make(OpKind::Cdist, {a, b}, std::move(attrs), TensorType{a->dtype(), shape, {}});
}

Node *GraphBuilder::pdist(Node *x, double p) {
  const char *op = "pdist";
  int64_t n;
  if (x->rank() != 2 || !sym().constValue(x->shape()[0], n))
    BRAZE_USER_ERROR(op, name_) << "needs a [N, M] operand with a static N, got "
                                << shapeText(x->shape());
  if (x->dtype() != DType::Float32 && x->dtype() != DType::Float64)
    BRAZE_USER_ERROR(op, name_) << "needs an f32 or f64 operand, got " << dtypeName(x->dtype());
  if (n > kMaxPdistRows)
    BRAZE_USER_ERROR(op, name_) << "takes at most " << kMaxPdistRows << " rows, got " << n;
  if (std::isnan(p) || p < 0)
    BRAZE_USER_ERROR(op, name_) << "p must be >= 0 (or inf), got " << p;
  AttrMap attrs;
  attrs.set("p", p);
  return make(OpKind::Pdist, {x}, std::move(attrs),
              TensorType{x->dtype(), {dim(n * (n - 1) / 2)}, {}});
}

} // namespace braze
