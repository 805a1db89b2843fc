#pragma once
/// A tensor's type, shared by the graph and loop IRs: dtype, shape and strides (SymExprs), and
/// its text form.
#include "braze/ir/sym/SymExpr.h"
#include "braze/ir/types/DType.h"

#include <string>
#include <vector>

namespace braze {

using sym::SymExpr;

struct TensorType {
  DType dtype = DType::Float32;
  std::vector<SymExpr> shape;
  std::vector<SymExpr> strides; ///< in elements

  int rank() const { return static_cast<int>(shape.size()); }
  bool operator==(const TensorType &o) const {
    return dtype == o.dtype && shape == o.shape && strides == o.strides;
  }
};

/// "[s0, 4]".
std::string shapeText(const std::vector<SymExpr> &shape);

/// Row-major strides for a shape.
std::vector<SymExpr> contiguousStrides(sym::SymContext &ctx, const std::vector<SymExpr> &shape);
/// "f32[s0, 4]" (strides printed only when not contiguous: "f32[4, 3]{1, 4}").
std::string typeToString(sym::SymContext &ctx, const TensorType &t);

} // namespace braze
