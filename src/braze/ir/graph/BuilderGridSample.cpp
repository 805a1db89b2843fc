// GraphBuilder: grid sampling (PyTorch's grid_sample), a composite op that
// lowering/decompose/GridSample.cpp turns into coordinate arithmetic and gathers.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

namespace braze {

std::string GraphBuilder::gridSampleShape(const Node *x, const Node *grid,
                                          const std::string &mode,
                                          const std::string &paddingMode,
                                          std::vector<SymExpr> &shape) {
  int64_t rank = x->rank(), spatial = rank - 2;
  if (spatial != 2 && spatial != 3)
    return "needs an input [N, C, *S] with 2 or 3 spatial dims, got " + shapeText(x->shape());
  if (grid->rank() != rank || !grid->shape().back()->isConst(spatial))
    return "needs a grid [N, *O, " + std::to_string(spatial) + "] for the input " +
           shapeText(x->shape()) + ", got " + shapeText(grid->shape());
  if (grid->shape()[0] != x->shape()[0])
    return "the grid's batch " + sym::toString(grid->shape()[0]) + " is not the input's " +
           sym::toString(x->shape()[0]);
  if (!isFloating(x->dtype()) || grid->dtype() != x->dtype())
    return "needs a floating-point input and a grid of its dtype, got " +
           std::string(dtypeName(x->dtype())) + " and " + std::string(dtypeName(grid->dtype()));
  if (mode != "bilinear" && mode != "nearest" && mode != "bicubic")
    return "mode must be \"bilinear\", \"nearest\" or \"bicubic\", got \"" + mode + "\"";
  if (mode == "bicubic" && spatial != 2)
    return "bicubic sampling needs 2 spatial dims, got " + std::to_string(spatial);
  if (paddingMode != "zeros" && paddingMode != "border" && paddingMode != "reflection")
    return "padding mode must be \"zeros\", \"border\" or \"reflection\", got \"" +
           paddingMode + "\"";
  // The decomposition flattens both the input's spatial dims and the grid's points into one
  // dim each, so each product must be an int64.
  int64_t inputs = 1, points = 1;
  for (int64_t i = 0; i < spatial; ++i) {
    SymExpr n = x->shape()[2 + i], o = grid->shape()[1 + i];
    if (!n->isConst() || n->value() < 1 || __builtin_mul_overflow(inputs, n->value(), &inputs))
      return "the input's spatial sizes must be static and non-empty, with a product that is "
             "an int64, got " +
             shapeText(x->shape());
    if (!o->isConst() || o->value() < 0 || __builtin_mul_overflow(points, o->value(), &points))
      return "the grid's sizes must be static, with a product that is an int64, got " +
             shapeText(grid->shape());
  }
  shape = {x->shape()[0], x->shape()[1]};
  shape.insert(shape.end(), grid->shape().begin() + 1, grid->shape().end() - 1);
  return {};
}

Node *GraphBuilder::gridSample(Node *x, Node *grid, const std::string &mode,
                               const std::string &paddingMode, bool alignCorners) {
  std::vector<SymExpr> shape;
  std::string err = gridSampleShape(x, grid, mode, paddingMode, shape);
  if (!err.empty())
    BRAZE_USER_ERROR("grid_sample", name_) << err;
  AttrMap attrs;
  attrs.set("mode", mode);
  attrs.set("padding_mode", paddingMode);
  attrs.set("align_corners", alignCorners);
  return make(OpKind::GridSample, {x, grid}, std::move(attrs),
              TensorType{x->dtype(), std::move(shape), {}});
}

} // namespace braze
