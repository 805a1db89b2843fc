#include "braze/ir/graph/Builder.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <sstream>

namespace braze {

namespace {

bool isBitwise(OpKind op) {
  return op == OpKind::BitwiseAnd || op == OpKind::BitwiseOr || op == OpKind::BitwiseXor ||
         op == OpKind::BitwiseNot;
}
} // namespace

std::vector<SymExpr> GraphBuilder::dims(const std::vector<int64_t> &vs) {
  std::vector<SymExpr> out;
  for (int64_t v : vs)
    out.push_back(g_.sym().constant(v));
  return out;
}

Node *GraphBuilder::make(OpKind op, std::vector<Node *> operands, AttrMap attrs, TensorType type) {
  type.strides.clear(); // every computed tensor is row-major; views are index remaps
  return g_.addNode(op, std::move(operands), std::move(attrs), std::move(type), name_);
}

int64_t GraphBuilder::normalizeDim(std::string_view op, int64_t dim, int64_t rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r)
    BRAZE_USER_ERROR(std::string(op), name_)
        << "dim " << dim << " is out of range for a tensor of rank " << rank;
  return dim < 0 ? dim + r : dim;
}

int64_t GraphBuilder::normalizeSizedDim(std::string_view op, int64_t dim, int64_t rank) {
  if (rank == 0)
    BRAZE_USER_ERROR(std::string(op), name_) << "needs a tensor with at least one dim, got rank 0";
  return normalizeDim(op, dim, rank);
}

std::vector<int64_t> GraphBuilder::normalizeDims(std::string_view op, std::vector<int64_t> ds,
                                                 int64_t rank) {
  for (int64_t &d : ds)
    d = rank == 0 ? (normalizeDim(op, d, rank), 0) : normalizeDim(op, d, rank);
  std::sort(ds.begin(), ds.end());
  if (std::adjacent_find(ds.begin(), ds.end()) != ds.end() && rank > 0)
    BRAZE_USER_ERROR(std::string(op), name_) << "a dim appears twice in the dim list";
  ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
  if (rank == 0)
    ds.clear();
  return ds;
}

std::vector<SymExpr> GraphBuilder::broadcastShapes(std::string_view op,
                                                   const std::vector<SymExpr> &a,
                                                   const std::vector<SymExpr> &b) {
  std::vector<SymExpr> out;
  size_t i = 0;
  if (!broadcastShape(a, b, out, i)) {
    size_t n = out.size();
    SymExpr x = a[i - (n - a.size())], y = b[i - (n - b.size())];
    BRAZE_USER_ERROR(std::string(op), name_)
        << "shapes " << shapeText(a) << " and " << shapeText(b) << " do not broadcast (dim " << i
        << ": " << sym::toString(x) << " vs " << sym::toString(y) << ")";
  }
  return out;
}

Node *GraphBuilder::input(const std::string &name, DType dtype, std::vector<SymExpr> shape,
                          std::vector<SymExpr> strides) {
  if (!strides.empty() && strides.size() != shape.size())
    BRAZE_USER_ERROR("input", name) << "rank " << shape.size() << " but " << strides.size()
                                    << " strides";
  TensorType t{dtype, std::move(shape), std::move(strides)};
  AttrMap attrs;
  attrs.set("index", static_cast<int64_t>(g_.inputs().size()));
  return g_.addNode(OpKind::Input, {}, std::move(attrs), std::move(t), name);
}

Node *GraphBuilder::full(double value, DType dtype, std::vector<SymExpr> shape) {
  AttrMap attrs;
  if (isFloating(dtype))
    attrs.set("value", value);
  else
    attrs.set("value", static_cast<int64_t>(value));
  return make(OpKind::Full, {}, std::move(attrs), TensorType{dtype, std::move(shape), {}});
}

Node *GraphBuilder::iota(DType dtype, std::vector<SymExpr> shape, int64_t dim) {
  AttrMap attrs;
  attrs.set("dim", normalizeSizedDim("iota", dim, static_cast<int64_t>(shape.size())));
  return make(OpKind::Iota, {}, std::move(attrs), TensorType{dtype, std::move(shape), {}});
}

Node *GraphBuilder::arange(DType dtype, SymExpr length, double start, double step) {
  Node *h = iota(dtype, {length}, 0);
  if (step != 1)
    h = mul(h, scalar(step, dtype));
  if (start != 0)
    h = add(h, scalar(start, dtype));
  return h;
}

Node *GraphBuilder::numel(Node *x, std::vector<int64_t> ds, DType dtype) {
  if (ds.empty())
    for (int64_t i = 0; i < x->rank(); ++i)
      ds.push_back(i);
  ds = normalizeDims("numel", ds, x->rank());
  AttrMap attrs;
  attrs.set("dims", IntList(ds.begin(), ds.end()));
  return make(OpKind::Numel, {x}, std::move(attrs), TensorType{dtype, {}, {}});
}

Node *GraphBuilder::elementwise(OpKind op, std::vector<Node *> xs) {
  std::string_view name = opName(op);
  if (opCategory(op) != OpCategoryKind::Elementwise)
    BRAZE_USER_ERROR(std::string(name), name_) << "is not an elementwise op";
  if (static_cast<int>(xs.size()) != elementwiseArity(op))
    BRAZE_USER_ERROR(std::string(name), name_)
        << "takes " << elementwiseArity(op) << " operands, got " << xs.size();
  std::vector<SymExpr> shape;
  for (Node *x : xs)
    shape = broadcastShapes(name, shape, x->shape());
  // Type promotion: zero-dim operands only raise the category (PyTorch's rule).
  size_t first = op == OpKind::Where ? 1 : 0;
  if (op == OpKind::Where && xs[0]->dtype() != DType::Bool)
    BRAZE_USER_ERROR("where", name_) << "condition must be bool, got " << dtypeName(xs[0]->dtype());
  std::vector<std::pair<DType, bool>> operands;
  for (Node *x : xs)
    operands.push_back({x->dtype(), x->rank() == 0});
  DType promoted = elementwisePromotedType(op, operands);
  if (isBitwise(op) && isFloating(promoted))
    BRAZE_USER_ERROR(std::string(name), name_)
        << "needs integer or bool operands, got " << dtypeName(promoted);
  if (op == OpKind::Sub && promoted == DType::Bool)
    BRAZE_USER_ERROR("sub", name_) << "subtracting bool tensors is not supported";
  DType result = elementwiseResultType(op, promoted);
  // Operands are converted to one type so that every kernel computes in it.
  DType operandType = elementwiseOperandType(op, promoted);
  for (size_t i = first; i < xs.size(); ++i)
    if (xs[i]->dtype() != operandType)
      xs[i] = convert(xs[i], operandType);
  return make(op, std::move(xs), {}, TensorType{result, std::move(shape), {}});
}

Node *GraphBuilder::convert(Node *x, DType dtype) {
  if (x->dtype() == dtype)
    return x;
  return make(OpKind::Convert, {x}, {}, TensorType{dtype, x->shape(), {}});
}

Node *GraphBuilder::reduce(OpKind op, Node *x, std::vector<int64_t> ds, bool keepdim,
                           std::optional<DType> dtype) {
  std::string_view name = opName(op);
  if (opCategory(op) != OpCategoryKind::Reduce)
    BRAZE_USER_ERROR(std::string(name), name_) << "is not a reduction";
  std::vector<SymExpr> shape;
  AttrMap attrs = reductionAttrs(name, x, ds, keepdim, shape);
  for (int64_t d : ds)
    if ((op == OpKind::Amax || op == OpKind::Amin || op == OpKind::ArgMax ||
         op == OpKind::ArgMin) &&
        x->shape()[d]->isConst(0))
      BRAZE_USER_ERROR(std::string(name), name_)
          << "cannot reduce over dim " << d << " of size 0 (no identity)";
  if ((op == OpKind::ArgMax || op == OpKind::ArgMin) && x->dtype() == DType::Bool)
    x = convert(x, DType::UInt8);
  DType out = x->dtype();
  if (op == OpKind::ArgMax || op == OpKind::ArgMin)
    out = DType::Int64;
  else if (dtype)
    out = *dtype;
  else if ((op == OpKind::Sum || op == OpKind::Prod) && !isFloating(out))
    out = DType::Int64;
  else if (op == OpKind::Any || op == OpKind::All)
    out = DType::Bool;
  bool keepsInputType = op == OpKind::Any || op == OpKind::All || op == OpKind::ArgMax ||
                        op == OpKind::ArgMin;
  if (x->dtype() != out && !keepsInputType)
    x = convert(x, out);
  return make(op, {x}, std::move(attrs), TensorType{out, std::move(shape), {}});
}

Node *GraphBuilder::reshape(Node *x, std::vector<SymExpr> shape) {
  sym::SymContext &s = sym();
  SymExpr a = s.product(x->shape()), b = s.product(shape);
  if (a != b)
    BRAZE_USER_ERROR("reshape", name_) << sym::toString(a) << " elements cannot become "
                                       << shapeText(shape);
  if (shape == x->shape())
    return x;
  return make(OpKind::Reshape, {x}, {}, TensorType{x->dtype(), std::move(shape), {}});
}

Node *GraphBuilder::permute(Node *x, std::vector<int64_t> ds) {
  if (static_cast<int>(ds.size()) != x->rank())
    BRAZE_USER_ERROR("permute", name_) << "needs " << x->rank() << " dims, got " << ds.size();
  std::vector<int64_t> sorted;
  for (int64_t &d : ds)
    d = normalizeDim("permute", d, x->rank());
  sorted = ds;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    BRAZE_USER_ERROR("permute", name_) << "dims are not a permutation";
  bool identity = true;
  std::vector<SymExpr> shape;
  for (size_t i = 0; i < ds.size(); ++i) {
    shape.push_back(x->shape()[ds[i]]);
    identity &= ds[i] == static_cast<int64_t>(i);
  }
  if (identity)
    return x;
  AttrMap attrs;
  attrs.set("dims", IntList(ds.begin(), ds.end()));
  return make(OpKind::Permute, {x}, std::move(attrs), TensorType{x->dtype(), std::move(shape), {}});
}

Node *GraphBuilder::expand(Node *x, std::vector<SymExpr> shape) {
  if (shape.size() < x->shape().size())
    BRAZE_USER_ERROR("expand", name_) << "cannot expand " << shapeText(x->shape()) << " to "
                                      << shapeText(shape) << " (fewer dims)";
  size_t off = shape.size() - x->shape().size();
  for (size_t i = 0; i < x->shape().size(); ++i) {
    SymExpr from = x->shape()[i];
    if (from != shape[off + i] && !from->isConst(1))
      BRAZE_USER_ERROR("expand", name_)
          << "cannot expand " << shapeText(x->shape()) << " to " << shapeText(shape) << " (dim "
          << i << " is " << sym::toString(from) << ", not 1)";
  }
  if (shape == x->shape())
    return x;
  return make(OpKind::Expand, {x}, {}, TensorType{x->dtype(), std::move(shape), {}});
}

Node *GraphBuilder::sliceLength(Node *x, int64_t d, int64_t start, SymExpr length,
                                int64_t step) {
  d = normalizeSizedDim("slice", d, x->rank());
  if (step <= 0 || start < 0)
    BRAZE_USER_ERROR("slice", name_) << "start must be non-negative and step positive, got "
                                     << start << " and " << step;
  int64_t n, len;
  if (sym().constValue(x->shape()[d], n) && sym().constValue(length, len) &&
      (len < 0 || (len > 0 && start + (len - 1) * step >= n)))
    BRAZE_USER_ERROR("slice", name_) << len << " elements from " << start << " every " << step
                                     << " do not lie in a dim of " << n;
  if (start == 0 && step == 1 && length == x->shape()[d])
    return x;
  return sliceNode(x, d, start, length, step);
}

Node *GraphBuilder::sliceNode(Node *x, int64_t d, int64_t start, SymExpr length, int64_t step) {
  std::vector<SymExpr> shape = x->shape();
  shape[d] = length;
  return make(OpKind::Slice, {x}, {{"dim", d}, {"start", start}, {"step", step}},
              TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::slice(Node *x, int64_t d, int64_t start, int64_t end, int64_t step) {
  d = normalizeSizedDim("slice", d, x->rank());
  if (step <= 0)
    BRAZE_USER_ERROR("slice", name_) << "step must be positive, got " << step;
  SymExpr size = x->shape()[d];
  int64_t n;
  if (!sym().constValue(size, n)) {
    // Symbolic dim: the last k elements (x[-k:]) are the first k of x flipped, flipped back;
    // otherwise bounds that need no normalizing against the unknown size (end clamps to it).
    if (start < 0 && end == INT64_MAX && step == 1)
      return flip(slice(flip(x, {d}), d, 0, -start, 1), {d});
    if (start < 0 || end < 0)
      BRAZE_USER_ERROR("slice", name_) << "bounds [" << start << ", " << end
                                       << ") on a dynamic dim are not supported";
    SymExpr stop = end == INT64_MAX ? size : sym().min(size, dim(end));
    SymExpr len = sym().floordiv(sym().add(sym().sub(stop, dim(start)), dim(step - 1)), dim(step));
    return sliceNode(x, d, start, sym().max(len, dim(0)), step);
  }
  auto clamp = [&](int64_t v) {
    if (v < 0)
      v += n;
    return std::min(std::max<int64_t>(v, 0), n);
  };
  start = clamp(start);
  end = std::max(clamp(end), start);
  int64_t len = (end - start + step - 1) / step;
  if (start == 0 && len == n && step == 1)
    return x;
  return sliceNode(x, d, start, dim(len), step);
}

Node *GraphBuilder::select(Node *x, int64_t d, int64_t index) {
  d = normalizeSizedDim("select", d, x->rank());
  int64_t n;
  if (sym().constValue(x->shape()[d], n)) {
    if (index < -n || index >= n)
      BRAZE_USER_ERROR("select", name_) << "index " << index << " is out of range for dim " << d
                                        << " of size " << n;
    if (index < 0)
      index += n;
  } else if (index < 0) {
    BRAZE_USER_ERROR("select", name_) << "negative index on a dynamic dim is not supported";
  }
  std::vector<SymExpr> shape = x->shape();
  shape.erase(shape.begin() + d);
  AttrMap attrs;
  attrs.set("dim", d);
  attrs.set("index", index);
  return make(OpKind::Select, {x}, std::move(attrs), TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::unsqueeze(Node *x, int64_t d) {
  d = normalizeDim("unsqueeze", d, x->rank() + 1);
  std::vector<SymExpr> shape = x->shape();
  shape.insert(shape.begin() + d, dim(1));
  return reshape(x, shape);
}

Node *GraphBuilder::squeeze(Node *x, std::vector<int64_t> ds) {
  if (ds.empty())
    for (int64_t i = 0; i < x->rank(); ++i)
      ds.push_back(i);
  ds = normalizeDims("squeeze", ds, x->rank());
  std::vector<SymExpr> shape;
  for (int64_t i = 0; i < x->rank(); ++i) {
    bool listed = std::find(ds.begin(), ds.end(), i) != ds.end();
    if (!(listed && x->shape()[i]->isConst(1)))
      shape.push_back(x->shape()[i]);
  }
  return reshape(x, shape);
}

Node *GraphBuilder::take(Node *x, int64_t d, Node *index) {
  return take(x, d, std::vector<Node *>{index});
}

Node *GraphBuilder::take(Node *x, int64_t d, std::vector<Node *> indices) {
  if (x->rank() == 0)
    BRAZE_USER_ERROR("take", name_) << "cannot index a rank-0 tensor";
  d = normalizeDim("take", d, x->rank());
  int64_t k = static_cast<int64_t>(indices.size());
  if (k == 0 || d + k > x->rank())
    BRAZE_USER_ERROR("take", name_) << k << " index tensors from dim " << d
                                    << " do not fit a tensor of rank " << x->rank();
  std::vector<SymExpr> ishape = indices[0]->shape();
  for (Node *index : indices) {
    if (!isIntegral(index->dtype()))
      BRAZE_USER_ERROR("take", name_) << "index must be an integer tensor, got "
                                      << dtypeName(index->dtype());
    ishape = broadcastShapes("take", ishape, index->shape());
  }
  for (Node *&index : indices)
    if (index->shape() != ishape)
      index = expand(index, ishape);
  std::vector<SymExpr> shape(x->shape().begin(), x->shape().begin() + d);
  shape.insert(shape.end(), ishape.begin(), ishape.end());
  shape.insert(shape.end(), x->shape().begin() + d + k, x->shape().end());
  AttrMap attrs;
  attrs.set("dim", d);
  std::vector<Node *> operands{x};
  operands.insert(operands.end(), indices.begin(), indices.end());
  return make(OpKind::Take, std::move(operands), std::move(attrs),
              TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::advancedIndex(Node *x, std::vector<int64_t> dims,
                                  std::vector<Node *> indices) {
  if (dims.empty() || dims.size() != indices.size())
    BRAZE_USER_ERROR("index", name_) << "needs one index tensor per indexed dim, got "
                                     << indices.size() << " for " << dims.size() << " dims";
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] < 0 || dims[i] >= x->rank() || (i > 0 && dims[i] <= dims[i - 1]))
      BRAZE_USER_ERROR("index", name_) << "indexed dims must ascend within rank " << x->rank();
  bool adjacent = dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  if (adjacent)
    return take(x, dims.front(), std::move(indices));
  std::vector<int64_t> order = dims;
  for (int64_t d = 0; d < x->rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end())
      order.push_back(d);
  return take(permute(x, order), 0, std::move(indices));
}

Node *GraphBuilder::matmul(Node *a, Node *b) {
  if (a->rank() == 0 || b->rank() == 0)
    BRAZE_USER_ERROR("matmul", name_) << "both operands need at least one dim, got ranks "
                                      << a->rank() << " and " << b->rank();
  bool vecA = a->rank() == 1, vecB = b->rank() == 1;
  if (vecA)
    a = unsqueeze(a, 0);
  if (vecB)
    b = unsqueeze(b, 1);
  SymExpr k = a->shape().back(), kb = b->shape()[b->rank() - 2];
  if (k != kb)
    BRAZE_USER_ERROR("matmul", name_) << "shapes " << shapeText(a->shape()) << " and "
                                      << shapeText(b->shape()) << " cannot be multiplied ("
                                      << sym::toString(k) << " vs " << sym::toString(kb) << ")";
  DType t = promoteTypes(a->dtype(), b->dtype());
  if (t == DType::Bool)
    BRAZE_USER_ERROR("matmul", name_) << "bool operands are not supported";
  a = convert(a, t);
  b = convert(b, t);
  std::vector<SymExpr> batchA(a->shape().begin(), a->shape().end() - 2);
  std::vector<SymExpr> batchB(b->shape().begin(), b->shape().end() - 2);
  std::vector<SymExpr> batch = broadcastShapes("matmul", batchA, batchB);
  auto withBatch = [&](Node *x, SymExpr r, SymExpr c) {
    std::vector<SymExpr> shape = batch;
    shape.push_back(r);
    shape.push_back(c);
    return expand(x, shape);
  };
  SymExpr m = a->shape()[a->rank() - 2], n = b->shape().back();
  a = withBatch(a, m, k);
  b = withBatch(b, k, n);
  std::vector<SymExpr> shape = batch;
  shape.push_back(m);
  shape.push_back(n);
  Node *out = make(OpKind::MatMul, {a, b}, {}, TensorType{t, shape, {}});
  if (vecA)
    out = squeeze(out, {static_cast<int64_t>(shape.size()) - 2});
  if (vecB)
    out = squeeze(out, {-1});
  return out;
}

Node *GraphBuilder::flip(Node *x, std::vector<int64_t> ds) {
  ds = normalizeDims("flip", ds, x->rank());
  if (ds.empty())
    return x;
  AttrMap attrs;
  attrs.set("dims", IntList(ds.begin(), ds.end()));
  return make(OpKind::Flip, {x}, std::move(attrs), TensorType{x->dtype(), x->shape(), {}});
}

Node *GraphBuilder::concat(std::vector<Node *> xs, int64_t d) {
  if (xs.empty())
    BRAZE_USER_ERROR("concat", name_) << "needs at least one tensor";
  // Legacy rule: 1-d empty tensors are skipped whatever their rank.
  std::vector<Node *> kept;
  for (Node *x : xs)
    if (!(x->rank() == 1 && x->shape()[0]->isConst(0)))
      kept.push_back(x);
  if (kept.empty())
    return xs[0];
  int64_t rank = kept[0]->rank();
  d = normalizeSizedDim("concat", d, rank);
  DType dtype = kept[0]->dtype();
  SymExpr total = sym().constant(0);
  for (size_t i = 0; i < kept.size(); ++i) {
    Node *x = kept[i];
    if (x->rank() != rank)
      BRAZE_USER_ERROR("concat", name_) << "tensor " << i << " has rank " << x->rank()
                                        << " but tensor 0 has rank " << rank;
    for (int64_t k = 0; k < rank; ++k)
      if (k != d && x->shape()[k] != kept[0]->shape()[k])
        BRAZE_USER_ERROR("concat", name_)
            << "tensor " << i << " has shape " << shapeText(x->shape()) << " but tensor 0 has "
            << shapeText(kept[0]->shape()) << " (they may differ only in dim " << d << ")";
    dtype = promoteTypes(dtype, x->dtype());
    total = sym().add(total, x->shape()[d]);
  }
  // An operand with no elements along `dim` contributes nothing (and must not be read).
  std::vector<Node *> nonEmpty;
  for (Node *x : kept)
    if (!x->shape()[d]->isConst(0))
      nonEmpty.push_back(x);
  if (!nonEmpty.empty())
    kept = nonEmpty;
  if (kept.size() == 1)
    return convert(kept[0], dtype);
  for (Node *&x : kept)
    x = convert(x, dtype);
  std::vector<SymExpr> shape = kept[0]->shape();
  shape[d] = total;
  AttrMap attrs;
  attrs.set("dim", d);
  return make(OpKind::Concat, kept, std::move(attrs), TensorType{dtype, shape, {}});
}

Node *GraphBuilder::gather(Node *x, int64_t d, Node *index) {
  d = normalizeSizedDim("gather", d, x->rank());
  if (index->dtype() != DType::Int64 && index->dtype() != DType::Int32)
    BRAZE_USER_ERROR("gather", name_) << "index must be i64 or i32, got "
                                      << dtypeName(index->dtype());
  if (index->rank() != x->rank())
    BRAZE_USER_ERROR("gather", name_) << "index has rank " << index->rank()
                                      << " but the input has rank " << x->rank();
  // Off the gathered dim the index's positions address the input directly: each of those dims
  // must be provably no longer than the input's (equal symbols, or constants in order).
  for (int64_t e = 0; e < x->rank(); ++e) {
    if (e == d)
      continue;
    SymExpr have = x->shape()[e], want = index->shape()[e];
    bool fits = have == want || (want->kind() == sym::SymKind::Const &&
                                 (want->value() == 0 || (have->kind() == sym::SymKind::Const &&
                                                         want->value() <= have->value())));
    if (!fits)
      BRAZE_USER_ERROR("gather", name_) << "index dim " << e << " is " << sym::toString(want)
                                        << " but the input's is " << sym::toString(have);
  }
  AttrMap attrs;
  attrs.set("dim", d);
  return make(OpKind::Gather, {x, index}, std::move(attrs),
              TensorType{x->dtype(), index->shape(), {}});
}

namespace {
void requireFloat(std::string_view op, const std::string &node, Node *x) {
  if (!isFloating(x->dtype()))
    BRAZE_USER_ERROR(std::string(op), node) << "needs a floating-point input, got "
                                            << dtypeName(x->dtype());
}
} // namespace

Node *GraphBuilder::softmax(Node *x, int64_t d) {
  requireFloat("softmax", name_, x);
  AttrMap attrs;
  attrs.set("dim", normalizeDim("softmax", d, x->rank()));
  return make(OpKind::Softmax, {x}, std::move(attrs), x->type());
}

Node *GraphBuilder::logSoftmax(Node *x, int64_t d) {
  requireFloat("log_softmax", name_, x);
  AttrMap attrs;
  attrs.set("dim", normalizeDim("log_softmax", d, x->rank()));
  return make(OpKind::LogSoftmax, {x}, std::move(attrs), x->type());
}

AttrMap GraphBuilder::reductionAttrs(std::string_view op, Node *x, std::vector<int64_t> &ds,
                                     bool keepdim, std::vector<SymExpr> &shape) {
  if (ds.empty())
    for (int64_t i = 0; i < x->rank(); ++i)
      ds.push_back(i);
  ds = normalizeDims(op, ds, x->rank());
  shape.clear();
  for (int64_t i = 0; i < x->rank(); ++i) {
    bool reduced = std::find(ds.begin(), ds.end(), i) != ds.end();
    if (!reduced)
      shape.push_back(x->shape()[i]);
    else if (keepdim)
      shape.push_back(dim(1));
  }
  AttrMap attrs;
  attrs.set("dims", IntList(ds.begin(), ds.end()));
  attrs.set("keepdim", keepdim);
  return attrs;
}

Node *GraphBuilder::mean(Node *x, std::vector<int64_t> ds, bool keepdim) {
  requireFloat("mean", name_, x);
  std::vector<SymExpr> shape;
  AttrMap attrs = reductionAttrs("mean", x, ds, keepdim, shape);
  return make(OpKind::Mean, {x}, std::move(attrs), TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::var(Node *x, std::vector<int64_t> ds, double correction, bool keepdim) {
  requireFloat("var", name_, x);
  std::vector<SymExpr> shape;
  AttrMap attrs = reductionAttrs("var", x, ds, keepdim, shape);
  attrs.set("correction", correction);
  return make(OpKind::Var, {x}, std::move(attrs), TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::layerNorm(Node *x, int64_t axis, Node *weight, Node *bias, double eps) {
  requireFloat("layer_norm", name_, x);
  axis = normalizeDim("layer_norm", axis, x->rank());
  std::vector<SymExpr> normShape(x->shape().begin() + axis, x->shape().end());
  for (Node *p : {weight, bias})
    if (p && p->shape() != normShape)
      BRAZE_USER_ERROR("layer_norm", name_)
          << (p == weight ? "weight" : "bias") << " has shape " << shapeText(p->shape())
          << " but the normalized shape is " << shapeText(normShape);
  std::vector<Node *> ops{x};
  if (weight)
    ops.push_back(weight);
  if (bias)
    ops.push_back(bias);
  AttrMap attrs;
  attrs.set("axis", axis);
  attrs.set("eps", eps);
  attrs.set("weight", weight != nullptr);
  attrs.set("bias", bias != nullptr);
  return make(OpKind::LayerNorm, ops, std::move(attrs), x->type());
}

std::pair<Node *, Node *> GraphBuilder::layerNormStats(Node *x, int64_t axis, double eps) {
  requireFloat("layer_norm", name_, x);
  axis = normalizeDim("layer_norm", axis, x->rank());
  std::vector<int64_t> ds;
  for (int64_t i = axis; i < x->rank(); ++i)
    ds.push_back(i);
  Node *m = mean(x, ds, true);
  Node *v = var(x, ds, 0.0, true);
  Node *rstd = unary(OpKind::Rsqrt, add(v, scalar(eps, v->dtype())));
  return {m, rstd};
}

Node *GraphBuilder::gelu(Node *x, const std::string &approximate) {
  requireFloat("gelu", name_, x);
  if (approximate != "none" && approximate != "tanh")
    BRAZE_USER_ERROR("gelu", name_) << "approximate must be 'none' or 'tanh', got '"
                                    << approximate << "'";
  AttrMap attrs;
  attrs.set("approximate", approximate);
  return make(OpKind::Gelu, {x}, std::move(attrs), x->type());
}

Node *GraphBuilder::silu(Node *x) {
  requireFloat("silu", name_, x);
  return make(OpKind::Silu, {x}, {}, x->type());
}

} // namespace braze
