#include "braze/ir/types/TensorType.h"

namespace braze {

std::string shapeText(const std::vector<SymExpr> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + sym::toString(shape[i]);
  return s + "]";
}

std::vector<SymExpr> contiguousStrides(sym::SymContext &ctx, const std::vector<SymExpr> &shape) {
  std::vector<SymExpr> strides(shape.size());
  SymExpr s = ctx.constant(1);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s = ctx.mul(s, shape[i]);
  }
  return strides;
}

std::string typeToString(sym::SymContext &ctx, const TensorType &t) {
  std::string s(dtypeName(t.dtype));
  s += '[';
  for (size_t i = 0; i < t.shape.size(); ++i)
    s += (i ? ", " : "") + sym::toString(t.shape[i]);
  s += ']';
  if (!t.strides.empty() && t.strides != contiguousStrides(ctx, t.shape)) {
    s += '{';
    for (size_t i = 0; i < t.strides.size(); ++i)
      s += (i ? ", " : "") + sym::toString(t.strides[i]);
    s += '}';
  }
  return s;
}

} // namespace braze
