/// Verifier checks of the order-statistics, scan, search, distance and scatter composites.
#include "braze/ir/graph/GraphVerifier.h"
#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>
#include <cmath>

namespace braze::detail {

/// The sort family: a sorted dim of an operand of rank 1 or more within the sort limits;
/// argsort (i64) and sort (the operand's dtype) keep the operand's shape; median, median_index
/// and mode's results keep the dim as 1 (non-empty, and for mode an integer or bool operand);
/// sort, median and mode give the operand's dtype, the others i64.
bool GraphVerifier::checkSort() {
  const Node *x = node_->operand(0);
  if (x->rank() == 0)
    return fail("needs an operand of rank 1 or more");
  if (!checkDim("dim", x->rank()))
    return false;
  int64_t dim = attrs::Mode(*node_).dim(); // every sort's
  std::string err = GraphBuilder::sortLimitError(x->shape(), dim);
  if (!err.empty())
    return fail(err);
  OpKind op = node_->op();
  std::vector<SymExpr> want = x->shape();
  if (op != OpKind::Argsort && op != OpKind::Sort) {
    if (want[dim]->value() == 0)
      return fail("needs a non-empty dim");
    want[dim] = ctx_.constant(1);
  }
  if (op == OpKind::Mode && isFloating(x->dtype()))
    return fail("takes integers and bools");
  bool values = op == OpKind::Mode || op == OpKind::Sort || op == OpKind::Median;
  DType type = values ? x->dtype() : DType::Int64;
  if (node_->dtype() != type || node_->shape() != want)
    return fail("result must be " + std::string(dtypeName(type)) + shapeText(want));
  return true;
}

/// Scans: a scanned dim within GraphBuilder::scanLimitError, a result of the operand's shape
/// and dtype (i64 for cum_extreme_index; cum_extreme needs a non-scalar operand).
bool GraphVerifier::checkScan() {
  const Node *x = node_->operand(0);
  bool extreme = node_->op() == OpKind::CumExtreme || node_->op() == OpKind::CumExtremeIndex;
  if (extreme && x->rank() == 0)
    return fail("needs an operand of rank 1 or more");
  if (!checkDim("dim", x->rank()))
    return false;
  std::string err =
      GraphBuilder::scanLimitError(x->shape(), attrs::CumSum(*node_).dim()); // every scan's
  if (!err.empty())
    return fail(err);
  DType want = node_->op() == OpKind::CumExtremeIndex ? DType::Int64 : x->dtype();
  if (node_->op() == OpKind::LogCumSumExp && !isFloating(x->dtype()))
    return fail("needs a floating-point operand");
  if (node_->dtype() != want || node_->shape() != x->shape())
    return fail("result must be " + std::string(dtypeName(want)) + shapeText(x->shape()));
  return true;
}

/// search_sorted: seq and values of one numeric dtype (GraphBuilder::searchShape), an i64
/// sorter of seq's shape when the attribute says so, i32 or i64 indices shaped as values.
/// histogram: GraphBuilder::histogramError, a result [bins] of the operand's dtype.
bool GraphVerifier::checkSearch() {
  const Node *x = node_->operand(0);
  if (node_->op() == OpKind::Histogram) {
    const attrs::Histogram h(*node_);
    std::string err = GraphBuilder::histogramError(x, h.bins(), h.min(), h.max());
    if (!err.empty())
      return fail(err);
    std::vector<SymExpr> want{ctx_.constant(h.bins())};
    return node_->dtype() == x->dtype() && node_->shape() == want
               ? true
               : fail("result must be " + std::string(dtypeName(x->dtype())) + shapeText(want));
  }
  const Node *values = node_->operand(1);
  bool sorter = attrs::SearchSorted(*node_).sorter();
  if (node_->operands().size() != 2u + sorter)
    return fail("operand count does not match the 'sorter' attribute");
  if (x->dtype() != values->dtype() || x->dtype() == DType::Bool)
    return fail("sequence and values must share one numeric dtype");
  std::string err = GraphBuilder::searchShape(x, values);
  if (!err.empty())
    return fail(err);
  if (sorter &&
      (node_->operand(2)->dtype() != DType::Int64 || node_->operand(2)->shape() != x->shape()))
    return fail("the sorter must be i64 of the sequence's shape");
  if ((node_->dtype() != DType::Int64 && node_->dtype() != DType::Int32) ||
      node_->shape() != values->shape())
    return fail("result must be i32 or i64 of the values' shape");
  return true;
}

/// cdist: [.., P, M] and [.., R, M] (batch dims broadcast) -> [.., P, R]; pdist: [N, M] ->
/// [N (N - 1) / 2]; f32 or f64 throughout, p >= 0.
bool GraphVerifier::checkDistances() {
  const Node *x = node_->operand(0);
  double p = attrs::Pdist(*node_).p(); // and cdist's
  if (std::isnan(p) || p < 0)
    return fail("p must be >= 0 (or inf)");
  if ((x->dtype() != DType::Float32 && x->dtype() != DType::Float64) ||
      node_->dtype() != x->dtype())
    return fail("operands and result must be f32 or f64, of one dtype");
  std::vector<SymExpr> want;
  if (node_->op() == OpKind::Pdist) {
    if (x->rank() != 2 || !x->shape()[0]->isConst())
      return fail("needs a [N, M] operand with a static N");
    int64_t n = x->shape()[0]->value();
    want.push_back(ctx_.constant(n * (n - 1) / 2));
  } else {
    const Node *y = node_->operand(1);
    int r = x->rank();
    if (r < 2 || y->rank() != r || y->dtype() != x->dtype() ||
        x->shape()[r - 1] != y->shape()[r - 1])
      return fail("needs operands [.., P, M] and [.., R, M] of one rank and dtype");
    std::vector<SymExpr> a(x->shape().begin(), x->shape().end() - 2),
        c(y->shape().begin(), y->shape().end() - 2);
    size_t bad = 0;
    if (!broadcastShape(a, c, want, bad))
      return fail("batch dims do not broadcast");
    want.push_back(x->shape()[r - 2]);
    want.push_back(y->shape()[r - 2]);
  }
  return node_->shape() == want ? true : fail("result must be " + shapeText(want));
}

/// embedding_bag: GraphBuilder::embeddingBagError on its operands (as the attributes say which
/// are there), i64 indices and offsets, and a result [B, D] of the weight's dtype.
bool GraphVerifier::checkEmbeddingBag() {
  const attrs::EmbeddingBag a(*node_);
  bool offsets = a.offsets(), weights = a.weights();
  if (node_->operands().size() != 2u + offsets + weights)
    return fail("operand count does not match the 'offsets' and 'weights' attributes");
  const Node *w = node_->operand(0), *idx = node_->operand(1);
  const Node *off = offsets ? node_->operand(2) : nullptr;
  const Node *psw = weights ? node_->operand(node_->operands().size() - 1) : nullptr;
  if (idx->dtype() != DType::Int64 || (off && off->dtype() != DType::Int64))
    return fail("indices and offsets must be i64");
  int64_t bags = 0;
  std::string err =
      GraphBuilder::embeddingBagError(w, idx, off, psw, a.mode_text(), a.padding_idx(),
                                      a.include_last_offset(), bags);
  if (!err.empty())
    return fail(err);
  std::vector<SymExpr> want{ctx_.constant(bags), w->shape()[1]};
  return node_->dtype() == w->dtype() && node_->shape() == want
             ? true
             : fail("result must be " + std::string(dtypeName(w->dtype())) + shapeText(want));
}

/// cross, fmax, fmin, trunc_div: operands of the result's dtype and shape; cross's and
/// trunc_div's are numbers, and cross's `dim` is 3 long;
/// round_decimals: a floating-point operand of the result's type, decimals in range;
/// soft_margin_loss: floating-point operands of one dtype and shape, a known reduction.
bool GraphVerifier::checkArithmetic() {
  const Node *x = node_->operand(0);
  OpKind op = node_->op();
  if (op == OpKind::Signbit || op == OpKind::Angle || op == OpKind::Ldexp) {
    DType want = op == OpKind::Signbit ? DType::Bool
                 : op == OpKind::Angle ? x->dtype()
                                       : GraphBuilder::ldexpType(x->dtype(),
                                                                 node_->operand(1)->dtype());
    if (op == OpKind::Angle && !isFloating(x->dtype()))
      return fail("needs a floating-point operand");
    for (const Node *o : node_->operands())
      if (o->shape() != node_->shape())
        return fail("operands must have the result's shape");
    return node_->dtype() == want ? true
                                  : fail("result must be " + std::string(dtypeName(want)));
  }
  if (op == OpKind::SoftMarginLoss) {
    const Node *y = node_->operand(1);
    if (!isFloating(x->dtype()) || y->dtype() != x->dtype() || y->shape() != x->shape())
      return fail("needs floating-point operands of one dtype and shape");
    bool none = attrs::SoftMarginLoss(*node_).reduction() == attrs::LossReduction::None;
    return node_->dtype() == x->dtype() && node_->rank() == (none ? x->rank() : 0) &&
                   (!none || node_->shape() == x->shape())
               ? true
               : fail("result must be the operands' dtype, their shape for reduction \"none\" "
                      "and a scalar otherwise");
  }
  if (node_->op() == OpKind::RoundDecimals) {
    int64_t d = attrs::RoundDecimals(*node_).decimals();
    if (d < -GraphBuilder::kMaxDecimals || d > GraphBuilder::kMaxDecimals)
      return fail("decimals must be within +-" + std::to_string(GraphBuilder::kMaxDecimals));
    return isFloating(x->dtype()) && node_->type().shape == x->shape() &&
                   node_->dtype() == x->dtype()
               ? true
               : fail("needs a floating-point operand of the result's type");
  }
  for (const Node *o : node_->operands())
    if (o->dtype() != node_->dtype() || o->shape() != node_->shape())
      return fail("operands must have the result's dtype and shape");
  if ((op == OpKind::Cross || op == OpKind::TruncDiv) && x->dtype() == DType::Bool)
    return fail("needs numbers, not bools");
  if (op != OpKind::Cross)
    return true;
  if (x->rank() == 0 || !checkDim("dim", x->rank()))
    return x->rank() == 0 ? fail("needs operands of rank 1 or more") : false;
  return x->shape()[attrs::Cross(*node_).dim()]->isConst(3) ? true
                                                           : fail("dim must be 3 long");
}

bool GraphVerifier::checkScatter() {
  const attrs::Scatter a(*node_);
  if (a.has_max_hits() &&
      (a.max_hits() < 1 ||
       (a.max_hits() > GraphBuilder::kMaxScatterHits && a.mode() != attrs::ScatterMode::Sum)))
    return fail("attribute 'max_hits' must be an integer from 1 to " +
                std::to_string(GraphBuilder::kMaxScatterHits) +
                " (at least 1 for a sum, which adds in place beyond that)");
  const Node *self = node_->operand(0), *target = node_->operand(1), *src = node_->operand(2);
  if (!isIntegral(target->dtype()) || target->shape() != src->shape())
    return fail("needs an integer target of the source's shape");
  if (src->dtype() != self->dtype() || node_->type().shape != self->shape())
    return fail("source and result must have self's dtype and shape");
  return true;
}

/// The scatter-like composites (scatter_dim ... nonzero_static): GraphBuilder::scatterLikeError
/// and a result of GraphBuilder::scatterLikeType.
bool GraphVerifier::checkScatterLike() {
  const std::vector<Node *> &ops = node_->operands();
  std::vector<const Node *> view(ops.begin(), ops.end());
  std::string err = GraphBuilder::scatterLikeError(node_->op(), view, node_->attrs());
  if (!err.empty())
    return fail(err);
  TensorType want = GraphBuilder::scatterLikeType(node_->op(), view, node_->attrs(), ctx_);
  return node_->dtype() == want.dtype && node_->shape() == want.shape
             ? true
             : fail("result must be " + std::string(dtypeName(want.dtype)) +
                    shapeText(want.shape));
}

} // namespace braze::detail
