// GraphBuilder: scatter (self combined with a source at flat target positions) and the
// scatter-like composites that lowering/decompose/Scatter.cpp lowers: scatter_dim,
// index_reduce, put, diagonal_scatter, index_put and as_strided_scatter (scatters whose targets
// are positions of self indexed as each op indexes self), mask_put, masked_scatter and
// nonzero_static (driven by a mask's running count) and as_strided (a strided read).
#include "braze/ir/graph/Builder.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>

namespace braze {

namespace {
/// The element count of `shape` if every dim is constant (and the count fits in 64 bits).
std::optional<int64_t> constNumel(const std::vector<SymExpr> &shape) {
  int64_t n = 1;
  for (SymExpr d : shape)
    if (!d->isConst() || d->value() < 0 || __builtin_mul_overflow(n, d->value(), &n))
      return std::nullopt;
  return n;
}

int64_t numelOf(const Node *x) { return constNumel(x->shape()).value_or(-1); }

/// The product of `v`, or -1 where it does not fit in 64 bits.
int64_t product(const std::vector<int64_t> &v) {
  int64_t n = 1;
  for (int64_t d : v)
    if (__builtin_mul_overflow(n, d, &n))
      return -1;
  return n;
}

/// Why numel(self) x `sources` element pairs are too many for a scatter ("" if they are not).
std::string pairsError(int64_t self, int64_t sources) {
  if (GraphBuilder::exceedsScatterPairs(self, sources))
    return std::to_string(self) + " x " + std::to_string(sources) +
           " element pairs exceed the scatter limit of " +
           std::to_string(GraphBuilder::kMaxScatterPairs);
  return "";
}

/// pairsError, but none for a scatter that combines in place
/// (GraphBuilder::scatterCombinesInPlace; `inOrder`: eager rounds after each value).
std::string pairsError(int64_t self, int64_t sources, DType t, const std::string &mode,
                       bool inOrder) {
  return GraphBuilder::scatterCombinesInPlace(t, mode, inOrder) ? "" : pairsError(self, sources);
}

/// Why eager's one-value-at-a-time rounding of `k` half-precision values per element cannot be
/// followed ("" if it can or need not be).
std::string orderedHitsError(DType t, const std::string &mode, int64_t k) {
  if (GraphBuilder::scatterRoundsInOrder(t, mode) && mode != "sum" &&
      k > GraphBuilder::kMaxScatterHits)
    return "a half-precision " + mode + " of up to " + std::to_string(k) +
           " values per element (eager rounds after each; braze follows it for up to " +
           std::to_string(GraphBuilder::kMaxScatterHits) + ")";
  return "";
}

/// The shape diagonal(x, offset, d1, d2) has, d1 and d2 normalized and static.
std::vector<int64_t> diagonalShape(const std::vector<int64_t> &x, int64_t offset, int64_t d1,
                                   int64_t d2) {
  int64_t n1 = x[d1], n2 = x[d2];
  offset = std::clamp(offset, -n1, n2); // past either end the diagonal is empty
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
  // eager's scatter kernels accumulate half precision in f32 and round once
  return oneHot ? "" : pairsError(numelOf(self), numelOf(index), self->dtype(), mode, false);
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
  int64_t targets = product(want);
  if (targets < 0)
    return "too many source elements";
  std::string e = orderedHitsError(self->dtype(), mode, k);
  return e.empty() ? pairsError(numelOf(self), targets, self->dtype(), mode,
                                GraphBuilder::scatterRoundsInOrder(self->dtype(), mode))
                   : e;
}

std::string putError(const Node *self, const Node *index, const Node *source, const AttrMap &a) {
  int64_t k = numelOf(index);
  if (numelOf(source) != k)
    return "source must have as many elements as index";
  std::string mode = a.getBool("accumulate") ? "sum" : "overwrite";
  std::string e = orderedHitsError(self->dtype(), mode, k);
  return e.empty() ? pairsError(numelOf(self), k, self->dtype(), mode,
                                GraphBuilder::scatterRoundsInOrder(self->dtype(), mode))
                   : e;
}

std::string diagonalScatterError(const Node *self, const Node *src, const AttrMap &a) {
  int64_t rank = self->rank(), d1 = a.getInt("dim1"), d2 = a.getInt("dim2");
  if (d1 < 0 || d1 >= rank || d2 < 0 || d2 >= rank || d1 == d2)
    return "dim1 and dim2 must be two different dims of self";
  if (diagonalShape(sizes(self), a.getInt("offset"), d1, d2) != sizes(src))
    return "src must have the diagonal's shape";
  return pairsError(numelOf(self), numelOf(src), self->dtype(), "overwrite", false);
}

/// Static broadcast of two shapes, or nullopt.
std::optional<std::vector<int64_t>> broadcastSizes(const std::vector<int64_t> &a,
                                                   const std::vector<int64_t> &b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (x != y && x != 1 && y != 1)
      return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

/// index_put's target shape: the indices' broadcast shape placed as advanced indexing places
/// it, or why there is none ("" error and the shape in `out`).
std::string indexPutShape(const Node *self, const IntList &dims,
                          const std::vector<const Node *> &indices, std::vector<int64_t> &out,
                          int64_t &fanIn) {
  std::vector<int64_t> xs = sizes(self);
  int64_t rank = self->rank();
  if (dims.empty() || dims.size() != indices.size())
    return "needs one index per entry of dims";
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] < 0 || dims[i] >= rank || (i > 0 && dims[i] <= dims[i - 1]))
      return "dims must be increasing dims of self";
  std::vector<int64_t> b;
  for (const Node *ix : indices) {
    std::optional<std::vector<int64_t>> r = broadcastSizes(b, sizes(ix));
    if (!r)
      return "the indices do not broadcast together";
    b = *r;
  }
  fanIn = product(b);
  if (fanIn < 0)
    return "the indices' broadcast shape has too many elements";
  bool adjacent = GraphBuilder::adjacentDims(dims);
  out.clear();
  if (adjacent)
    out.insert(out.end(), xs.begin(), xs.begin() + dims.front());
  out.insert(out.end(), b.begin(), b.end());
  for (int64_t d = adjacent ? dims.back() + 1 : 0; d < rank; ++d)
    if (adjacent || std::find(dims.begin(), dims.end(), d) == dims.end())
      out.push_back(xs[d]);
  return "";
}

std::string indexPutError(const std::vector<const Node *> &ops, const AttrMap &a) {
  const Node *self = ops[0], *values = ops.back();
  std::vector<const Node *> indices(ops.begin() + 1, ops.end() - 1);
  for (const Node *ix : indices)
    if (!isIntegral(ix->dtype()))
      return "indices must be integer tensors (a mask is mask_put)";
  std::vector<int64_t> target;
  int64_t fanIn = 0;
  std::string e = indexPutShape(self, a.getInts("dims"), indices, target, fanIn);
  if (!e.empty())
    return e;
  std::optional<std::vector<int64_t>> b = broadcastSizes(sizes(values), target);
  if (!b || *b != target)
    return "values do not broadcast to the indexed shape";
  std::string mode = a.getBool("accumulate") ? "sum" : "overwrite";
  e = orderedHitsError(self->dtype(), mode, fanIn);
  if (!e.empty())
    return e;
  const IntList &dims = a.getInts("dims");
  if (mode == "overwrite" && GraphBuilder::adjacentDims(dims)) {
    // Each position of the indexed dims is compared with each index entry (no scatter).
    std::vector<int64_t> xs = sizes(self);
    return pairsError(product(std::vector<int64_t>(xs.begin() + dims.front(),
                                                   xs.begin() + dims.back() + 1)),
                      fanIn);
  }
  return product(target) < 0
             ? "too many indexed elements"
             : pairsError(numelOf(self), product(target), self->dtype(), mode,
                          GraphBuilder::scatterRoundsInOrder(self->dtype(), mode));
}

std::string maskPutError(const Node *self, const Node *mask, const Node *values,
                         const AttrMap &a) {
  if (mask->dtype() != DType::Bool && mask->dtype() != DType::UInt8)
    return "the mask must be bool or u8";
  std::vector<int64_t> xs = sizes(self), ms = sizes(mask), vs = sizes(values);
  size_t r = ms.size();
  if (r == 0 || r > xs.size() || !std::equal(ms.begin(), ms.end(), xs.begin()))
    return "the mask must cover self's leading dims";
  std::vector<int64_t> rest(xs.begin() + r, xs.end());
  if (vs.size() <= rest.size() || vs[0] == 1) {
    std::vector<int64_t> v = vs.size() > rest.size() ? std::vector<int64_t>(vs.begin() + 1, vs.end()) : vs;
    std::optional<std::vector<int64_t>> b = broadcastSizes(v, xs);
    if (!b || *b != xs)
      return "values do not broadcast over the masked elements";
  } else {
    if (vs.size() != rest.size() + 1 || product(ms) > GraphBuilder::kMaxScan)
      return "values must be [trues, ..] with the mask at most " +
             std::to_string(GraphBuilder::kMaxScan) + " long";
    std::vector<int64_t> v(vs.begin() + 1, vs.end());
    std::optional<std::vector<int64_t>> b = broadcastSizes(v, rest);
    if (!b || *b != rest)
      return "values do not broadcast over the dims after the mask";
  }
  if (a.getBool("accumulate") && self->dtype() == DType::Bool)
    return "accumulating into a bool tensor";
  return "";
}

std::string maskedScatterError(const Node *self, const Node *mask, const Node *source) {
  if (mask->dtype() != DType::Bool)
    return "the mask must be bool";
  std::optional<std::vector<int64_t>> out = broadcastSizes(sizes(self), sizes(mask));
  if (!out)
    return "self and mask do not broadcast together";
  int64_t n = product(*out);
  if (n < 0 || n > GraphBuilder::kMaxScan)
    return "more than " + std::to_string(GraphBuilder::kMaxScan) + " elements (braze's scan limit)";
  if (n > 0 && numelOf(source) == 0)
    return "an empty source";
  return "";
}

std::string asStridedError(const Node *x, const AttrMap &a) {
  const IntList &size = a.getInts("size"), &stride = a.getInts("stride");
  if (size.size() != stride.size())
    return "size and stride lengths differ";
  if (std::any_of(size.begin(), size.end(), [](int64_t d) { return d < 0; }))
    return "sizes must not be negative";
  if (product(size) < 0)
    return "the view has too many elements";
  if (product(size) == 0)
    return "";
  // The lowest and highest flat positions read, in 128 bits so that no stride overflows.
  __int128 lo = a.getInt("offset"), hi = lo;
  for (size_t d = 0; d < size.size(); ++d) {
    __int128 span = static_cast<__int128>(size[d] - 1) * stride[d];
    (span < 0 ? lo : hi) += span;
  }
  if (lo < 0 || hi >= numelOf(x))
    return "the view reads outside its input's elements";
  return "";
}

std::string asStridedScatterError(const Node *self, const Node *src, const AttrMap &a) {
  if (std::string e = asStridedError(self, a); !e.empty())
    return e;
  const IntList &size = a.getInts("size"), &stride = a.getInts("stride");
  int64_t offset = a.getInt("offset");
  if (offset < 0 || std::any_of(stride.begin(), stride.end(), [](int64_t d) { return d < 0; }))
    return "size, stride and offset must not be negative";
  if (sizes(src) != size)
    return "src must have the view's size";
  int64_t k = product(size);
  if (k == 0 || !GraphBuilder::denseViewOrder(size, stride).empty())
    return ""; // a dense view is one block of positions, each once
  if (k > GraphBuilder::kMaxScan)
    return "a view of more than " + std::to_string(GraphBuilder::kMaxScan) + " elements";
  if (std::string e = pairsError(numelOf(self), k); !e.empty())
    return e;
  // asStridedError kept every position inside self, so none of these overflows.
  std::vector<int64_t> positions{offset};
  for (size_t d = 0; d < size.size(); ++d) {
    std::vector<int64_t> next;
    for (int64_t p : positions)
      for (int64_t i = 0; i < size[d]; ++i)
        next.push_back(p + i * stride[d]);
    positions = std::move(next);
  }
  std::sort(positions.begin(), positions.end());
  if (std::adjacent_find(positions.begin(), positions.end()) != positions.end())
    return "the view overlaps itself";
  return "";
}

std::string nonzeroStaticError(const Node *x, const AttrMap &a) {
  int64_t size = a.getInt("size"), n = numelOf(x);
  if (size < 0)
    return "size must not be negative";
  if (n > GraphBuilder::kMaxScan || (n != 0 && size > GraphBuilder::kMaxScatterPairs / n))
    return "over " + std::to_string(n) + " elements for " + std::to_string(size) +
           " rows (braze scans up to " + std::to_string(GraphBuilder::kMaxScan) + ")";
  return "";
}
} // namespace

bool GraphBuilder::isScatterMode(const std::string &mode) {
  static const char *kModes[] = {"overwrite", "sum", "prod", "mean", "amax", "amin"};
  return std::any_of(std::begin(kModes), std::end(kModes),
                     [&](const char *m) { return mode == m; });
}

namespace {
bool accumulatingType(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Int32 || t == DType::Int64;
}
} // namespace

bool GraphBuilder::scatterCombinesInPlace(DType t, const std::string &mode, bool inOrder) {
  if (mode == "overwrite")
    return true;
  bool minMax = mode == "amax" || mode == "amin";
  if (!minMax && mode != "sum" && mode != "prod" && mode != "mean")
    return false;
  return accumulatingType(t) || (isHalf(t) && (!inOrder || minMax || mode == "sum"));
}

bool GraphBuilder::scatterInPlaceIsExact(DType t, const std::string &mode) {
  return mode == "overwrite" || mode == "amax" || mode == "amin" ||
         ((mode == "sum" || mode == "prod") && (t == DType::Int32 || t == DType::Int64));
}

bool GraphBuilder::scatterIsAccumulating(DType t, const std::string &mode, bool includeSelf,
                                         bool inOrder) {
  if (isHalf(t) && inOrder)
    return includeSelf && mode == "sum";
  return includeSelf && accumulatingType(t) &&
         (mode == "sum" || mode == "prod" || mode == "amax" || mode == "amin");
}

bool GraphBuilder::scatterRoundsInOrder(DType t, const std::string &mode) {
  return isHalf(t) && (mode == "sum" || mode == "prod" || mode == "mean");
}

std::string GraphBuilder::scatterLikeError(OpKind op, const std::vector<const Node *> &operands,
                                           const AttrMap &attrs) {
  for (const Node *x : operands)
    if (!constNumel(x->shape()))
      return "needs constant shapes of at most 2^63 elements";
  const Node *self = operands[0];
  if (op == OpKind::NonzeroStatic)
    return nonzeroStaticError(self, attrs);
  if (op == OpKind::AsStrided)
    return asStridedError(self, attrs);
  if (operands.back()->dtype() != self->dtype())
    return "the source must have self's dtype";
  if (op == OpKind::IndexPut)
    return indexPutError(operands, attrs);
  if (op == OpKind::MaskPut)
    return maskPutError(self, operands[1], operands[2], attrs);
  if (op == OpKind::MaskedScatter)
    return maskedScatterError(self, operands[1], operands[2]);
  if (op == OpKind::AsStridedScatter)
    return asStridedScatterError(self, operands[1], attrs);
  if (op != OpKind::DiagonalScatter && !isIntegral(operands[1]->dtype()))
    return "index must be an integer tensor, got " + std::string(dtypeName(operands[1]->dtype()));
  if (op == OpKind::ScatterDim || op == OpKind::IndexReduce) {
    const std::string &mode = attrs.getString("mode");
    if (!isScatterMode(mode))
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
  if (maxHits < 0 || (maxHits > kMaxScatterHits && mode != "sum"))
    BRAZE_USER_ERROR("scatter", name_) << "max_hits must be from 0 to " << kMaxScatterHits
                                       << " (any for a sum), got " << maxHits;
  if (!isScatterMode(mode))
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
  if (std::string err = pairsError(*n, *m, self->dtype(), mode, maxHits > 0); !err.empty())
    BRAZE_USER_ERROR("scatter", name_) << err;
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

TensorType GraphBuilder::scatterLikeType(OpKind op, const std::vector<const Node *> &operands,
                                         const AttrMap &attrs, sym::SymContext &ctx) {
  const Node *self = operands[0];
  if (op == OpKind::NonzeroStatic)
    return TensorType{DType::Int64, {ctx.constant(attrs.getInt("size")),
                                     ctx.constant(self->rank())}, {}};
  auto constant = [&](const std::vector<int64_t> &dims) {
    std::vector<SymExpr> shape;
    for (int64_t d : dims)
      shape.push_back(ctx.constant(d));
    return TensorType{self->dtype(), shape, {}};
  };
  if (op == OpKind::AsStrided)
    return constant(attrs.getInts("size"));
  if (op == OpKind::MaskedScatter)
    return constant(*broadcastSizes(sizes(self), sizes(operands[1])));
  return TensorType{self->dtype(), self->shape(), {}};
}

Node *GraphBuilder::scatterLike(OpKind op, const char *text, std::vector<Node *> operands,
                                AttrMap attrs) {
  Node *self = operands[0];
  if (op != OpKind::NonzeroStatic && op != OpKind::AsStrided &&
      operands.back()->dtype() != self->dtype())
    operands.back() = convert(operands.back(), self->dtype());
  std::vector<const Node *> view(operands.begin(), operands.end());
  std::string err = scatterLikeError(op, view, attrs);
  if (!err.empty())
    BRAZE_USER_ERROR(text, name_) << err;
  TensorType type = scatterLikeType(op, view, attrs, sym());
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

namespace {
bool constantShapes(const std::vector<Node *> &xs) {
  return std::all_of(xs.begin(), xs.end(),
                     [](const Node *x) { return constNumel(x->shape()).has_value(); });
}
} // namespace

Node *GraphBuilder::sizeScalar(SymExpr n) {
  if (n->isConst())
    return scalar(static_cast<double>(n->value()), DType::Int64);
  // The first element of iota(n + 1) flipped: n - 0, computed from the symbol where read.
  return select(flip(iota(DType::Int64, {sym().add(n, 1)}, 0), {0}), 0, 0);
}

Node *GraphBuilder::indexPutLastWrite(Node *self, int64_t first,
                                      const std::vector<Node *> &indices, Node *values) {
  const std::vector<SymExpr> &xs = self->shape();
  size_t m = indices.size(), last = first + m;
  std::vector<SymExpr> shape = indices[0]->shape(); // the indices' broadcast shape
  for (const Node *ix : indices)
    shape = broadcastShapes("index_put", shape, ix->shape());
  sym::SymContext &ctx = sym();
  SymExpr entries = ctx.product(shape);
  if (entries->isConst(0))
    return self;
  SymExpr pre = ctx.product({xs.begin(), xs.begin() + first});
  SymExpr cells = ctx.product({xs.begin() + first, xs.begin() + last});
  SymExpr post = ctx.product({xs.begin() + last, xs.end()});
  // The position each entry names among the indexed dims, each index bounds-checked (and its
  // negatives wrapped) by a take of an iota, as eager's index_put checks it.
  Node *cell = nullptr;
  SymExpr stride = dim(1);
  for (size_t j = m; j-- > 0;) {
    SymExpr size = xs[first + j];
    Node *ix = reshape(expand(convert(indices[j], DType::Int64), shape), {entries});
    Node *term = take(iota(DType::Int64, {size}, 0), 0, ix);
    if (!stride->isConst(1))
      term = mul(term, sizeScalar(stride));
    cell = cell == nullptr ? term : add(cell, term);
    stride = ctx.mul(stride, size);
  }
  // The last entry naming each cell (-1: none), from every cell compared with every entry, or
  // beyond kMaxExactScatterPairs from an accumulating maximum of the entries' numbers.
  Node *lastEntry = nullptr;
  if (cells->isConst() && entries->isConst() &&
      exceedsScatterPairs(cells->value(), entries->value(), kMaxExactScatterPairs)) {
    lastEntry = scatter(expand(scalar(-1, DType::Int64), {cells}), cell,
                        iota(DType::Int64, {entries}, 0), "amax", true);
  } else {
    std::vector<SymExpr> pairs{cells, entries};
    Node *hit = binary(OpKind::Eq, expand(reshape(cell, {dim(1), entries}), pairs),
                       iota(DType::Int64, pairs, 0));
    lastEntry = reduce(OpKind::Amax,
                       where(hit, iota(DType::Int64, pairs, 1), scalar(-1, DType::Int64)), {1},
                       false, DType::Int64);
  }
  std::vector<SymExpr> target(xs.begin(), xs.begin() + first);
  target.insert(target.end(), shape.begin(), shape.end());
  target.insert(target.end(), xs.begin() + last, xs.end());
  std::vector<SymExpr> lines{pre, cells, post};
  Node *v = reshape(expand(convert(values, self->dtype()), target), {pre, entries, post});
  Node *zero = scalar(0, DType::Int64);
  Node *picked = take(v, 1, binary(OpKind::Maximum, lastEntry, zero));
  Node *written = expand(reshape(binary(OpKind::Ge, lastEntry, zero), {dim(1), cells, dim(1)}),
                         lines);
  return reshape(where(written, picked, reshape(self, lines)), xs);
}

Node *GraphBuilder::indexPut(Node *self, std::vector<int64_t> dims, std::vector<Node *> indices,
                             Node *values, bool accumulate) {
  for (int64_t &d : dims)
    d = normalizeDim("index_put", d, self->rank());
  std::vector<Node *> all{self, values};
  all.insert(all.end(), indices.begin(), indices.end());
  if (!accumulate && dims.size() == indices.size() && adjacentDims(dims) &&
      std::all_of(indices.begin(), indices.end(),
                  [](const Node *ix) { return isIntegral(ix->dtype()); }) &&
      !constantShapes(all)) {
    // Symbolic sizes (a KV cache's rows written at a decode or prefill step).
    return indexPutLastWrite(self, dims.front(), indices, values);
  }
  AttrMap attrs;
  attrs.set("dims", IntList(dims.begin(), dims.end()));
  attrs.set("accumulate", accumulate);
  std::vector<Node *> operands{self};
  operands.insert(operands.end(), indices.begin(), indices.end());
  operands.push_back(values);
  return scatterLike(OpKind::IndexPut, "index_put", std::move(operands), std::move(attrs));
}

Node *GraphBuilder::maskPut(Node *self, Node *mask, Node *values, bool accumulate) {
  AttrMap attrs;
  attrs.set("accumulate", accumulate);
  return scatterLike(OpKind::MaskPut, "mask_put", {self, mask, values}, std::move(attrs));
}

Node *GraphBuilder::maskedScatter(Node *self, Node *mask, Node *source) {
  return scatterLike(OpKind::MaskedScatter, "masked_scatter", {self, mask, source}, {});
}

IntList GraphBuilder::denseViewOrder(const IntList &size, const IntList &stride) {
  IntList order;
  for (size_t d = 0; d < size.size(); ++d)
    order.push_back(static_cast<int64_t>(d));
  // Largest stride first; a unit dim's stride says nothing, so unit dims go last.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    bool ua = size[a] == 1, ub = size[b] == 1;
    return ua != ub ? ub : stride[a] > stride[b];
  });
  int64_t step = 1;
  for (size_t i = order.size(); i-- > 0;) {
    int64_t d = order[i];
    if (size[d] == 1)
      continue;
    if (stride[d] != step)
      return {};
    step *= size[d];
  }
  return order;
}

Node *GraphBuilder::asStridedScatter(Node *self, Node *src, IntList size, IntList stride,
                                     int64_t offset) {
  AttrMap attrs;
  attrs.set("size", std::move(size));
  attrs.set("stride", std::move(stride));
  attrs.set("offset", offset);
  return scatterLike(OpKind::AsStridedScatter, "as_strided_scatter", {self, src},
                     std::move(attrs));
}

Node *GraphBuilder::nonzeroStatic(Node *x, int64_t size, int64_t fill) {
  AttrMap attrs;
  attrs.set("size", size);
  attrs.set("fill", fill);
  return scatterLike(OpKind::NonzeroStatic, "nonzero_static", {x}, std::move(attrs));
}

Node *GraphBuilder::asStrided(Node *x, IntList size, IntList stride, int64_t offset) {
  AttrMap attrs;
  attrs.set("size", std::move(size));
  attrs.set("stride", std::move(stride));
  attrs.set("offset", offset);
  return scatterLike(OpKind::AsStrided, "as_strided", {x}, std::move(attrs));
}

} // namespace braze
