// GraphBuilder: order statistics (sort, argsort, the median and its index, mode), composite
// ops that lowering/decompose/Sort.cpp turns into rank-counting reductions. Their work is
// quadratic in the sorted length, so sizes are static and bounded (sortLimitError).
#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

#include "braze/support/Diagnostic.h"

#include <algorithm>

namespace braze {

std::string GraphBuilder::sortLimitError(const std::vector<SymExpr> &shape, int64_t dim) {
  int64_t numel = 1;
  for (const SymExpr &d : shape) {
    if (!d->isConst())
      return "needs static sizes, got " + shapeText(shape);
    numel *= d->value();
  }
  int64_t n = shape.empty() ? 1 : shape[dim]->value();
  if (n > kMaxSortDim || (n > 0 && numel > kMaxSortWork / n))
    return "sorts " + std::to_string(numel) + " elements along a dim of " + std::to_string(n) +
           "; at most " + std::to_string(kMaxSortDim) + " long and " +
           std::to_string(kMaxSortWork) + " comparisons";
  return {};
}

int64_t GraphBuilder::sortedDim(const char *op, Node *x, int64_t dim) {
  dim = normalizeSizedDim(op, dim, x->rank());
  std::string err = sortLimitError(x->shape(), dim);
  if (!err.empty())
    BRAZE_USER_ERROR(op, name_) << err;
  return dim;
}

Node *GraphBuilder::argsort(Node *x, int64_t dim, bool descending) {
  dim = sortedDim("argsort", x, dim);
  AttrMap attrs;
  attrs.set("dim", dim);
  attrs.set("descending", descending);
  return make(OpKind::Argsort, {x}, std::move(attrs), TensorType{DType::Int64, x->shape(), {}});
}

Node *GraphBuilder::medianIndex(Node *x, int64_t dim, bool ignoreNan) {
  dim = sortedDim("median", x, dim);
  std::vector<SymExpr> shape = x->shape();
  if (shape[dim]->isConst(0))
    BRAZE_USER_ERROR("median", name_) << "of an empty dim";
  shape[dim] = this->dim(1);
  AttrMap attrs;
  attrs.set("dim", dim);
  attrs.set("ignore_nan", ignoreNan);
  return make(OpKind::MedianIndex, {x}, std::move(attrs), TensorType{DType::Int64, shape, {}});
}

std::pair<Node *, Node *> GraphBuilder::mode(Node *x, int64_t dim, bool keepdim) {
  if (x->rank() == 0)
    return {x, full(0, DType::Int64, {})};
  dim = sortedDim("mode", x, dim);
  if (isFloating(x->dtype()))
    BRAZE_USER_ERROR("mode", name_) << "takes integers and bools, got " << dtypeName(x->dtype());
  std::vector<SymExpr> shape = x->shape();
  if (shape[dim]->isConst(0))
    BRAZE_USER_ERROR("mode", name_) << "of an empty dim";
  shape[dim] = this->dim(1);
  AttrMap attrs;
  attrs.set("dim", dim);
  Node *values = make(OpKind::Mode, {x}, attrs, TensorType{x->dtype(), shape, {}});
  Node *indices = make(OpKind::ModeIndex, {x}, attrs, TensorType{DType::Int64, shape, {}});
  if (!keepdim)
    return {squeeze(values, {dim}), squeeze(indices, {dim})};
  return {values, indices};
}

std::pair<Node *, Node *> GraphBuilder::sort(Node *x, int64_t dim, bool descending) {
  if (x->rank() == 0)
    return {x, full(0, DType::Int64, {})};
  dim = normalizeSizedDim("sort", dim, x->rank());
  bool empty = std::any_of(x->shape().begin(), x->shape().end(),
                           [](SymExpr d) { return d->isConst(0); });
  SymExpr n = x->shape()[dim];
  if (empty || (n->isConst() && n->value() <= 1))
    return {x, full(0, DType::Int64, x->shape())};
  Node *indices = argsort(x, dim, descending);
  AttrMap attrs;
  attrs.set("dim", dim);
  attrs.set("descending", descending);
  return {make(OpKind::Sort, {x}, std::move(attrs), TensorType{x->dtype(), x->shape(), {}}),
          indices};
}

std::pair<Node *, Node *> GraphBuilder::median(Node *x, std::optional<int64_t> dim,
                                               bool keepdim, bool ignoreNan) {
  if (x->rank() == 0)
    return {x, full(0, DType::Int64, {})};
  if (!dim) {
    return median(reshape(x, {sym().product(x->shape())}), 0, false, ignoreNan);
  }
  Node *index = medianIndex(x, *dim, ignoreNan);
  int64_t d = attrs::MedianIndex(*index).dim();
  AttrMap attrs;
  attrs.set("dim", d);
  attrs.set("ignore_nan", ignoreNan);
  Node *values = make(OpKind::Median, {x}, std::move(attrs),
                      TensorType{x->dtype(), index->shape(), {}});
  if (!keepdim)
    return {squeeze(values, {d}), squeeze(index, {d})};
  return {values, index};
}

} // namespace braze
