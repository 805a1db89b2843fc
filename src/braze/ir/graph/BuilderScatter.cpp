// GraphBuilder: scatter (self combined with a source at flat target positions) and the
// composites that lowering/decompose/Scatter.cpp turns into it: scatter_dim, index_reduce, put
// and diagonal_scatter, whose targets are positions of self indexed as each op indexes self.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>

namespace braze {

namespace {
/// The element count of `shape` if every dim is constant.
std::optional<int64_t> constNumel(const std::vector<SymExpr> &shape) {
  int64_t n = 1;
  for (SymExpr d : shape) {
    if (!d->isConst())
      return std::nullopt;
    n *= d->value();
  }
  return n;
}

int64_t numelOf(const Node *x) { return constNumel(x->shape()).value_or(-1); }

bool isHalf(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

/// Why numel(self) x `sources` element pairs are too many for a scatter ("" if they are not).
std::string pairsError(int64_t self, int64_t sources) {
  if (sources != 0 && self > GraphBuilder::kMaxScatterPairs / sources)
    return std::to_string(self) + " x " + std::to_string(sources) +
           " element pairs exceed the scatter limit of " +
           std::to_string(GraphBuilder::kMaxScatterPairs);
  return "";
}

/// Why eager's one-value-at-a-time rounding of `k` half-precision values per element cannot be
/// followed ("" if it can or need not be).
std::string orderedHitsError(DType t, const std::string &mode, int64_t k) {
  bool ordered = isHalf(t) && (mode == "sum" || mode == "prod" || mode == "mean");
  if (ordered && k > GraphBuilder::kMaxScatterHits)
    return "a half-precision " + mode + " of up to " + std::to_string(k) +
           " values per element (eager rounds after each; braze follows it for up to " +
           std::to_string(GraphBuilder::kMaxScatterHits) + ")";
  return "";
}

/// The shape diagonal(x, offset, d1, d2) has, d1 and d2 normalized and static.
std::vector<int64_t> diagonalShape(const std::vector<int64_t> &x, int64_t offset, int64_t d1,
                                   int64_t d2) {
  int64_t n1 = x[d1], n2 = x[d2];
  int64_t len = offset >= 0 ? std::min(n1, n2 - offset) : std::min(n1 + offset, n2);
  std::vector<int64_t> shape;
  for (size_t i = 0; i < x.size(); ++i)
    if (static_cast<int64_t>(i) != d1 && static_cast<int64_t>(i) != d2)
      shape.push_back(x[i]);
  shape.push_back(std::max<int64_t>(len, 0));
  return shape;
}

std::vector<int64_t> sizes(const Node *x) {
  std::vector<int64_t> out;
  for (SymExpr d : x->shape())
    out.push_back(d->value());
  return out;
}

std::string scatterDimError(const Node *self, const Node *index, const Node *src,
                            const AttrMap &a) {
  const std::string &mode = a.getString("mode");
  int64_t dim = a.getInt("dim"), rank = self->rank();
  std::vector<int64_t> xs = sizes(self), is = sizes(index), ss = sizes(src);
  if (numelOf(index) == 0)
    return "";
  if (rank == 0) {
    if (index->rank() > 1 || src->rank() > 1 ||
        numelOf(index) > (src->rank() == 0 ? 1 : numelOf(src)))
      return "a 0-d self takes an index and a source of at most one dim";
    return pairsError(1, numelOf(index));
  }
  if (dim < 0 || dim >= rank)
    return "dim " + std::to_string(dim) + " is outside self's " + std::to_string(rank) + " dims";
  if (index->rank() != rank || src->rank() != rank)
    return "index and src must have self's rank";
  bool oneHot = mode == "overwrite";
  for (int64_t d = 0; d < rank; ++d) {
    if ((d != dim && is[d] > xs[d]) || is[d] > ss[d])
      return "index is larger than self (but at dim) or than src";
    oneHot &= d == dim ? is[d] == 1 : is[d] == xs[d];
  }
  return oneHot ? "" : pairsError(numelOf(self), numelOf(index));
}

std::string indexReduceError(const Node *self, const Node *index, const Node *source,
                             const AttrMap &a) {
  const std::string &mode = a.getString("mode");
  if (mode != "prod" && mode != "mean" && mode != "amax" && mode != "amin")
    return "mode must be prod, mean, amax or amin, got '" + mode + "'";
  int64_t dim = a.getInt("dim"), k = numelOf(index);
  std::vector<int64_t> xs = sizes(self);
  if (xs.empty())
    xs.push_back(1);
  if (dim < 0 || dim >= static_cast<int64_t>(xs.size()))
    return "dim " + std::to_string(dim) + " is outside self's dims";
  if (index->rank() > 1)
    return "index must have at most one dim";
  std::vector<int64_t> want = xs;
  want[dim] = k;
  std::vector<int64_t> got = sizes(source);
  if (self->rank() == 0 ? source->rank() > 1 || numelOf(source) != k : got != want)
    return "source must have self's shape with index's length at dim";
  int64_t targets = 1;
  for (int64_t d : want)
    targets *= d;
  std::string e = orderedHitsError(self->dtype(), mode, k);
  return e.empty() ? pairsError(numelOf(self), targets) : e;
}

std::string putError(const Node *self, const Node *index, const Node *source, const AttrMap &a) {
  int64_t k = numelOf(index);
  if (numelOf(source) != k)
    return "source must have as many elements as index";
  std::string e = orderedHitsError(self->dtype(), a.getBool("accumulate") ? "sum" : "", k);
  return e.empty() ? pairsError(numelOf(self), k) : e;
}

std::string diagonalScatterError(const Node *self, const Node *src, const AttrMap &a) {
  int64_t rank = self->rank(), d1 = a.getInt("dim1"), d2 = a.getInt("dim2");
  if (d1 < 0 || d1 >= rank || d2 < 0 || d2 >= rank || d1 == d2)
    return "dim1 and dim2 must be two different dims of self";
  if (diagonalShape(sizes(self), a.getInt("offset"), d1, d2) != sizes(src))
    return "src must have the diagonal's shape";
  return pairsError(numelOf(self), numelOf(src));
}
} // namespace

std::string GraphBuilder::scatterLikeError(OpKind op, const std::vector<const Node *> &operands,
                                           const AttrMap &attrs) {
  for (const Node *x : operands)
    if (!constNumel(x->shape()))
      return "needs constant shapes";
  const Node *self = operands[0];
  if (operands.back()->dtype() != self->dtype())
    return "the source must have self's dtype";
  if (op != OpKind::DiagonalScatter && !isIntegral(operands[1]->dtype()))
    return "index must be an integer tensor, got " + std::string(dtypeName(operands[1]->dtype()));
  if (op == OpKind::ScatterDim || op == OpKind::IndexReduce) {
    static const char *kModes[] = {"overwrite", "sum", "prod", "mean", "amax", "amin"};
    const std::string &mode = attrs.getString("mode");
    if (std::none_of(std::begin(kModes), std::end(kModes), [&](const char *m) { return mode == m; }))
      return "mode must be overwrite, sum, prod, mean, amax or amin, got '" + mode + "'";
    if (mode == "mean" && self->dtype() == DType::Bool)
      return "mean of a bool tensor";
  }
  if (op == OpKind::ScatterDim)
    return scatterDimError(self, operands[1], operands[2], attrs);
  if (op == OpKind::IndexReduce)
    return indexReduceError(self, operands[1], operands[2], attrs);
  if (op == OpKind::Put)
    return putError(self, operands[1], operands[2], attrs);
  BRAZE_CHECK(op == OpKind::DiagonalScatter) << "not a scatter-like op: " << opName(op);
  return diagonalScatterError(self, operands[1], attrs);
}

Node *GraphBuilder::scatter(Node *self, Node *target, Node *src, const std::string &mode,
                            bool includeSelf, int64_t maxHits) {
  if (maxHits < 0 || maxHits > kMaxScatterHits)
    BRAZE_USER_ERROR("scatter", name_) << "max_hits must be from 0 to " << kMaxScatterHits
                                       << ", got " << maxHits;
  if (mode != "overwrite" && mode != "sum" && mode != "prod" && mode != "mean" &&
      mode != "amax" && mode != "amin")
    BRAZE_USER_ERROR("scatter", name_) << "mode must be overwrite, sum, prod, mean, amax or amin, "
                                       << "got '" << mode << "'";
  if (!isIntegral(target->dtype()))
    BRAZE_USER_ERROR("scatter", name_) << "target must be an integer tensor, got "
                                       << dtypeName(target->dtype());
  if (target->shape() != src->shape())
    BRAZE_USER_ERROR("scatter", name_) << "target and source shapes differ";
  if (mode == "mean" && self->dtype() == DType::Bool)
    BRAZE_USER_ERROR("scatter", name_) << "mean of a bool tensor";
  std::optional<int64_t> n = constNumel(self->shape()), m = constNumel(src->shape());
  if (!n || !m)
    BRAZE_USER_ERROR("scatter", name_) << "needs constant shapes";
  if (*m != 0 && *n > kMaxScatterPairs / *m)
    BRAZE_USER_ERROR("scatter", name_) << *n << " x " << *m << " element pairs exceed the limit of "
                                       << kMaxScatterPairs;
  if (src->dtype() != self->dtype())
    src = convert(src, self->dtype());
  AttrMap attrs;
  attrs.set("mode", mode);
  attrs.set("include_self", includeSelf);
  if (maxHits > 0)
    attrs.set("max_hits", maxHits);
  return make(OpKind::Scatter, {self, target, src}, std::move(attrs),
              TensorType{self->dtype(), self->shape(), {}});
}

Node *GraphBuilder::scatterLike(OpKind op, const char *text, std::vector<Node *> operands,
                                AttrMap attrs) {
  Node *self = operands[0];
  if (operands.back()->dtype() != self->dtype())
    operands.back() = convert(operands.back(), self->dtype());
  std::string err = scatterLikeError(
      op, std::vector<const Node *>(operands.begin(), operands.end()), attrs);
  if (!err.empty())
    BRAZE_USER_ERROR(text, name_) << err;
  TensorType type{self->dtype(), self->shape(), {}};
  return make(op, std::move(operands), std::move(attrs), std::move(type));
}

Node *GraphBuilder::scatterDim(Node *self, int64_t dim, Node *index, Node *src,
                               const std::string &mode, bool includeSelf) {
  AttrMap attrs;
  attrs.set("dim", self->rank() == 0 ? 0 : normalizeDim("scatter_dim", dim, self->rank()));
  attrs.set("mode", mode);
  attrs.set("include_self", includeSelf);
  return scatterLike(OpKind::ScatterDim, "scatter_dim", {self, index, src}, std::move(attrs));
}

Node *GraphBuilder::indexReduce(Node *self, int64_t dim, Node *index, Node *source,
                                const std::string &mode, bool includeSelf) {
  AttrMap attrs;
  attrs.set("dim", normalizeDim("index_reduce", dim, std::max<int64_t>(self->rank(), 1)));
  attrs.set("mode", mode);
  attrs.set("include_self", includeSelf);
  return scatterLike(OpKind::IndexReduce, "index_reduce", {self, index, source},
                     std::move(attrs));
}

Node *GraphBuilder::put(Node *self, Node *index, Node *source, bool accumulate) {
  AttrMap attrs;
  attrs.set("accumulate", accumulate);
  return scatterLike(OpKind::Put, "put", {self, index, source}, std::move(attrs));
}

Node *GraphBuilder::diagonalScatter(Node *self, Node *src, int64_t offset, int64_t dim1,
                                    int64_t dim2) {
  AttrMap attrs;
  attrs.set("offset", offset);
  attrs.set("dim1", normalizeDim("diagonal_scatter", dim1, self->rank()));
  attrs.set("dim2", normalizeDim("diagonal_scatter", dim2, self->rank()));
  return scatterLike(OpKind::DiagonalScatter, "diagonal_scatter", {self, src},
                     std::move(attrs));
}

} // namespace braze
