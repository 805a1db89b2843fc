// GraphBuilder: scans (cumsum, cumprod, logcumsumexp, the running max and min), binary search
// (searchsorted, bucketize) and histograms, composite ops that lowering/decompose/Scans.cpp
// and Search.cpp turn into masked reductions. Their work is quadratic in the scanned length
// or the product of the two lengths, so sizes are static and bounded.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

#include <cmath>

namespace braze {

std::string GraphBuilder::scanLimitError(const std::vector<SymExpr> &shape, int64_t dim) {
  if (shape.empty())
    return {};
  if (!shape[dim]->isConst())
    return "needs a static scanned dim, got " + shapeText(shape);
  if (shape[dim]->value() > kMaxScan)
    return "scans a dim of " + std::to_string(shape[dim]->value()) + " elements; at most " +
           std::to_string(kMaxScan);
  return {};
}

Node *GraphBuilder::scan(OpKind op, Node *x, int64_t d, std::optional<DType> dtype) {
  std::string name(opName(op));
  if (op != OpKind::CumSum && op != OpKind::CumProd && op != OpKind::LogCumSumExp)
    BRAZE_USER_ERROR(name, name_) << "is not a scan (cumsum, cumprod or logcumsumexp)";
  d = normalizeDim(name, d, x->rank());
  DType out = dtype ? *dtype : (isFloating(x->dtype()) ? x->dtype() : DType::Int64);
  if (op == OpKind::LogCumSumExp && !isFloating(out))
    BRAZE_USER_ERROR(name, name_) << "needs a floating-point input, got " << dtypeName(x->dtype());
  std::string err = scanLimitError(x->shape(), d);
  if (!err.empty())
    BRAZE_USER_ERROR(name, name_) << err;
  x = convert(x, out);
  AttrMap attrs;
  attrs.set("dim", x->rank() == 0 ? int64_t{0} : d);
  return make(op, {x}, std::move(attrs), x->type());
}

std::pair<Node *, Node *> GraphBuilder::cumExtreme(Node *x, int64_t d, bool max) {
  const char *op = max ? "cummax" : "cummin";
  if (x->rank() == 0 && (d == 0 || d == -1))
    return {x, full(0, DType::Int64, {})};
  d = normalizeSizedDim(op, d, x->rank());
  std::string err = scanLimitError(x->shape(), d);
  if (!err.empty())
    BRAZE_USER_ERROR(op, name_) << err;
  AttrMap attrs;
  attrs.set("dim", d);
  attrs.set("max", max);
  Node *values = make(OpKind::CumExtreme, {x}, attrs, x->type());
  Node *indices =
      make(OpKind::CumExtremeIndex, {x}, attrs, TensorType{DType::Int64, x->shape(), {}});
  return {values, indices};
}

std::string GraphBuilder::searchShape(const Node *seq, const Node *values) {
  if (seq->rank() == 0)
    return "needs a sequence of rank 1 or more";
  if (seq->rank() > 1) {
    if (values->rank() != seq->rank())
      return "needs values of the sequence's rank " + std::to_string(seq->rank()) + " for an "
             "N-d sequence, got " + shapeText(values->shape());
    for (int64_t i = 0; i + 1 < seq->rank(); ++i)
      if (seq->shape()[i] != values->shape()[i])
        return "needs values whose leading dims are the sequence's, got " +
               shapeText(seq->shape()) + " and " + shapeText(values->shape());
  }
  int64_t comparisons = 1;
  for (const SymExpr &d : values->shape()) {
    if (!d->isConst())
      return "needs static sizes, got values " + shapeText(values->shape());
    comparisons *= d->value();
  }
  SymExpr m = seq->shape().back();
  if (!m->isConst())
    return "needs static sizes, got a sequence " + shapeText(seq->shape());
  if (m->value() > 0 && comparisons > kMaxComparisons / m->value())
    return "compares " + std::to_string(comparisons) + " values with " +
           std::to_string(m->value()) + " boundaries each; at most " +
           std::to_string(kMaxComparisons) + " comparisons";
  return {};
}

Node *GraphBuilder::searchSorted(Node *seq, Node *values, Node *sorter, bool right, DType out) {
  const char *op = "searchsorted";
  if (out != DType::Int64 && out != DType::Int32)
    BRAZE_USER_ERROR(op, name_) << "gives i64 or i32 indices, not " << dtypeName(out);
  if (seq->dtype() == DType::Bool || values->dtype() == DType::Bool)
    BRAZE_USER_ERROR(op, name_) << "compares numbers, not bools";
  std::string err = searchShape(seq, values);
  if (!err.empty())
    BRAZE_USER_ERROR(op, name_) << err;
  if (sorter && (sorter->shape() != seq->shape() || !isIntegral(sorter->dtype())))
    BRAZE_USER_ERROR(op, name_) << "needs an integer sorter of the sequence's shape "
                                << shapeText(seq->shape()) << ", got "
                                << dtypeName(sorter->dtype()) << shapeText(sorter->shape());
  DType t = promoteTypes(seq->dtype(), values->dtype());
  AttrMap attrs;
  attrs.set("right", right);
  attrs.set("sorter", sorter != nullptr);
  std::vector<Node *> ops{convert(seq, t), convert(values, t)};
  if (sorter)
    ops.push_back(convert(sorter, DType::Int64));
  return make(OpKind::SearchSorted, ops, std::move(attrs), TensorType{out, values->shape(), {}});
}

std::string GraphBuilder::histogramError(const Node *x, int64_t bins, double lo, double hi) {
  DType t = x->dtype();
  if (!isFloating(t) && !isIntegral(t))
    return "needs a floating-point or integer input, got " + std::string(dtypeName(t));
  if (isIntegral(t) && std::isfinite(lo) && std::isfinite(hi)) {
    // eager's kernel takes the range in the input's integers
    lo = std::trunc(lo), hi = std::trunc(hi);
    double end = std::ldexp(1.0, 8 * dtypeSize(t) - (isSigned(t) ? 1 : 0));
    if (lo < lowestValue(t) || hi >= end)
      return "needs a range within " + std::string(dtypeName(t)) + ", got [" +
             std::to_string(lo) + ", " + std::to_string(hi) + "]";
  }
  if (bins < 1 || !std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi))
    return "needs bins >= 1 and a finite range min < max (of integers for an integer input), "
           "got " + std::to_string(bins) + " bins over [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]";
  int64_t n = 1;
  for (const SymExpr &d : x->shape()) {
    if (!d->isConst())
      return "needs static sizes, got " + shapeText(x->shape());
    n *= d->value();
  }
  if (n > 0 && bins > kMaxComparisons / n)
    return "compares " + std::to_string(n) + " elements with " + std::to_string(bins) +
           " bins; at most " + std::to_string(kMaxComparisons) + " comparisons";
  return {};
}

Node *GraphBuilder::histogram(Node *x, int64_t bins, double lo, double hi) {
  std::string err = histogramError(x, bins, lo, hi);
  if (!err.empty())
    BRAZE_USER_ERROR("histc", name_) << err;
  AttrMap attrs;
  attrs.set("bins", bins);
  attrs.set("min", lo);
  attrs.set("max", hi);
  return make(OpKind::Histogram, {x}, std::move(attrs), TensorType{x->dtype(), {dim(bins)}, {}});
}

} // namespace braze
