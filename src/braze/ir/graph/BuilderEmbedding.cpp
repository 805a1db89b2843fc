// GraphBuilder: embedding bags, a composite op that lowering/decompose/Embedding.cpp turns into
// a take of the rows and a masked reduction per bag.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

namespace braze {

std::string GraphBuilder::embeddingBagError(const Node *weight, const Node *indices,
                                            const Node *offsets, const Node *weights,
                                            const std::string &mode, int64_t paddingIdx,
                                            bool includeLastOffset, int64_t &bags) {
  if (weight->rank() != 2 || !isFloating(weight->dtype()) || !weight->shape()[0]->isConst())
    return "needs a floating-point weight [R, D] with a static R, got " +
           std::string(dtypeName(weight->dtype())) + shapeText(weight->shape());
  if (mode != "sum" && mode != "mean" && mode != "max")
    return "mode must be \"sum\", \"mean\" or \"max\", got \"" + mode + "\"";
  if (!isIntegral(indices->dtype()) || indices->rank() != (offsets ? 1 : 2))
    return std::string("needs integer indices ") +
           (offsets ? "[L] with offsets" : "[B, P] without offsets") + ", got " +
           std::string(dtypeName(indices->dtype())) + shapeText(indices->shape());
  for (const SymExpr &d : indices->shape())
    if (!d->isConst())
      return "needs static index sizes, got " + shapeText(indices->shape());
  int64_t rows = weight->shape()[0]->value();
  if (paddingIdx < -1 || paddingIdx >= rows)
    return "padding index " + std::to_string(paddingIdx) + " is not a row of " +
           std::to_string(rows) + " (or -1: none)";
  int64_t length = indices->shape()[0]->value();
  if (offsets) {
    if (!isIntegral(offsets->dtype()) || offsets->rank() != 1 || !offsets->shape()[0]->isConst())
      return "needs integer offsets [B] of a static size, got " +
             std::string(dtypeName(offsets->dtype())) + shapeText(offsets->shape());
    bags = offsets->shape()[0]->value() - (includeLastOffset ? 1 : 0);
  } else {
    bags = length;
    length *= indices->shape()[1]->value();
  }
  if (bags < 1)
    return "has no bags";
  if (bags > kMaxComparisons / std::max<int64_t>(length, 1))
    return "matches " + std::to_string(length) + " indices with " + std::to_string(bags) +
           " bags; at most " + std::to_string(kMaxComparisons) + " pairs";
  if (weights && (mode != "sum" || weights->shape() != indices->shape() ||
                  weights->dtype() != weight->dtype()))
    return "per-sample weights need mode \"sum\" and the indices' shape and weight's dtype";
  return {};
}

Node *GraphBuilder::embeddingBag(Node *weight, Node *indices, Node *offsets, Node *weights,
                                 const std::string &mode, int64_t paddingIdx,
                                 bool includeLastOffset) {
  int64_t bags = 0;
  std::string err = embeddingBagError(weight, indices, offsets, weights, mode, paddingIdx,
                                      includeLastOffset, bags);
  if (!err.empty())
    BRAZE_USER_ERROR("embedding_bag", name_) << err;
  AttrMap attrs;
  attrs.set("mode", mode);
  attrs.set("padding_idx", paddingIdx);
  attrs.set("include_last_offset", includeLastOffset);
  attrs.set("offsets", offsets != nullptr);
  attrs.set("weights", weights != nullptr);
  std::vector<Node *> ops{weight, convert(indices, DType::Int64)};
  if (offsets)
    ops.push_back(convert(offsets, DType::Int64));
  if (weights)
    ops.push_back(weights);
  return make(OpKind::EmbeddingBag, ops, std::move(attrs),
              TensorType{weight->dtype(), {dim(bags), weight->shape()[1]}, {}});
}

} // namespace braze
