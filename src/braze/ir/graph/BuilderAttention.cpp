// GraphBuilder: scaled dot-product attention, a composite op. lowering/decompose turns it into
// matmul + softmax + matmul unless the target runs it as one fused kernel.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

#include <cmath>
#include <limits>

namespace braze {

Node *GraphBuilder::attention(Node *q, Node *k, Node *v, Node *bias, double scale, bool causal,
                              bool safe) {
  const char *op = "attention";
  for (Node *x : {q, k, v})
    if (!isFloating(x->dtype()) || x->dtype() != q->dtype())
      BRAZE_USER_ERROR(op, name_) << "query, key and value must share one floating-point dtype, got "
                                  << dtypeName(q->dtype()) << ", " << dtypeName(k->dtype())
                                  << " and " << dtypeName(v->dtype());
  int64_t r = q->rank();
  if (r < 2 || k->rank() != r || v->rank() != r)
    BRAZE_USER_ERROR(op, name_) << "query, key and value must have one rank of at least 2, got "
                                << r << ", " << k->rank() << " and " << v->rank();
  for (int64_t i = 0; i < r - 2; ++i)
    if (k->shape()[i] != q->shape()[i] || v->shape()[i] != q->shape()[i])
      BRAZE_USER_ERROR(op, name_) << "batch dims differ: query " << shapeText(q->shape())
                                  << ", key " << shapeText(k->shape()) << ", value "
                                  << shapeText(v->shape());
  if (k->shape()[r - 1] != q->shape()[r - 1])
    BRAZE_USER_ERROR(op, name_) << "key's last dim " << sym::toString(k->shape()[r - 1])
                                << " must equal query's " << sym::toString(q->shape()[r - 1]);
  if (v->shape()[r - 2] != k->shape()[r - 2])
    BRAZE_USER_ERROR(op, name_) << "value has " << sym::toString(v->shape()[r - 2])
                                << " rows but key has " << sym::toString(k->shape()[r - 2]);
  if (!std::isfinite(scale))
    BRAZE_USER_ERROR(op, name_) << "scale must be finite, got " << scale;
  std::vector<SymExpr> scores(q->shape().begin(), q->shape().end() - 1);
  scores.push_back(k->shape()[r - 2]);
  std::vector<Node *> ops{q, k, v};
  if (bias) {
    if (bias->rank() > r)
      BRAZE_USER_ERROR(op, name_) << "bias has rank " << bias->rank() << " but the scores "
                                  << shapeText(scores) << " have rank " << r;
    int64_t lead = r - bias->rank();
    for (int64_t i = 0; i < bias->rank(); ++i)
      if (!bias->shape()[i]->isConst(1) && bias->shape()[i] != scores[lead + i])
        BRAZE_USER_ERROR(op, name_) << "bias " << shapeText(bias->shape())
                                    << " does not broadcast to the scores " << shapeText(scores);
    if (bias->dtype() == DType::Bool)
      bias = where(bias, scalar(0, q->dtype()),
                   scalar(-std::numeric_limits<double>::infinity(), q->dtype()));
    else if (!isFloating(bias->dtype()))
      BRAZE_USER_ERROR(op, name_) << "bias must be bool or floating-point, got "
                                  << dtypeName(bias->dtype());
    ops.push_back(convert(bias, q->dtype()));
  }
  std::vector<SymExpr> shape(q->shape().begin(), q->shape().end() - 1);
  shape.push_back(v->shape()[r - 1]);
  AttrMap attrs;
  attrs.set("scale", scale);
  attrs.set("causal", causal);
  attrs.set("safe", safe);
  attrs.set("bias", bias != nullptr);
  return make(OpKind::Attention, ops, std::move(attrs), TensorType{q->dtype(), shape, {}});
}

} // namespace braze
