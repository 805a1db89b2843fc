/// Lowering a realized graph to loops: the walk over the nodes, and the rules of views,
/// elementwise ops, reductions, gathers and the outputs. The ops kept whole are
/// ToLoopsLibraryOps.cpp's, where stored values live and their layouts Layouts.cpp's; the
/// Lowerer's state is declared in Lowerer.h.
#include "braze/lowering/to_loops/ToLoops.h"
#include "braze/lowering/to_loops/Lowerer.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/ir/loop/LoopText.h"
#include "braze/ir/loop/Rewrite.h"
#include "braze/lowering/realize/Realize.h"
#include "braze/lowering/to_loops/IndexMaps.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

namespace braze {

namespace to_loops {

std::unique_ptr<loop::LoopProgram> Lowerer::run() {
  p_->sizeSymbols() = g_.sizeSymbols();
  // An output is stored right after its node is lowered, so what it reads need not stay
  // alive to the end of the graph (a training forward returns dozens of saved activations):
  // a view of a stored value (a returned K/V cache) is copied out or becomes that buffer, and
  // a computed value is stored once, its later readers loading it.
  std::vector<bool> done(g_.outputs().size(), false);
  for (const auto &n : g_.nodes()) {
    // The realize step's marks: a shared value is stored where it is computed (a row
    // reduction's kernel stores it too), a value a reader needs in memory where it is first
    // read (next to that reader; a view reads nothing until its own reader does, or until
    // it is returned: the output is then that buffer, not a second computation of the
    // value), and a marked output right away.
    if (opCategory(n->op()) != OpCategoryKind::View || isGraphOutput(n.get()))
      for (Node *o : n->operands())
        for (Node *x = o;; x = x->operand(0)) {
          storeMarked(x);
          if (x->stored() || opCategory(x->op()) != OpCategoryKind::View)
            break;
        }
    values_[n.get()] = lower(n.get());
    if (n->storage() == Storage::Stored || isGraphOutput(n.get()))
      storeMarked(n.get());
    if (!isGraphOutput(n.get()))
      continue;
    const Value &v = values_.at(n.get());
    Index full;
    std::vector<SymExpr> vars;
    bool computed = !v.buffer && !plainLoad(n.get(), v, full, vars);
    for (size_t k = 0; k < g_.outputs().size(); ++k)
      if (g_.outputs()[k] == n.get() && !done[k]) {
        Buffer *b = realizeOutput(n.get(), static_cast<int>(k));
        done[k] = true;
        if (computed) {
          auto nhwc = nhwc_.find(n.get());
          values_[n.get()] =
              nhwc != nhwc_.end() && nhwc->second == b ? nhwcValue(b) : bufferValue(b);
          computed = false;
        }
      }
  }
  return std::move(p_);
}

void Lowerer::storeMarked(Node *n) {
  Value &v = values_.at(n);
  if (n->stored() && !v.buffer && !nhwc_.count(n))
    v = storeIntermediate(n, v);
}

std::vector<SymExpr> Lowerer::freshVars(const std::vector<SymExpr> &extents, const char *prefix,
                                        Index &full) {
  ++varsEpoch_;
  std::vector<SymExpr> vars;
  full.clear();
  for (SymExpr e : extents) {
    if (e->isConst(1)) {
      full.push_back(s_.constant(0));
      continue;
    }
    SymExpr v = s_.indexSymbol(prefix + std::to_string(vars.size()), e);
    vars.push_back(v);
    full.push_back(v);
  }
  return vars;
}

Value Lowerer::bufferValue(Buffer *b) {
  DType compute = computeType(b->dtype);
  return Value{[this, b, compute](const Index &idx) {
                 return ex_.cast(ex_.load(b, linearIndex(s_, idx, b->strides)), compute);
               },
               b, true};
}

Value Lowerer::realize(Node *n, const Value &v, BufferKind kind, int ioIndex,
                       const std::string &suffix, std::vector<SymExpr> strides) {
  std::string name =
      kind == BufferKind::Output ? "out" + std::to_string(ioIndex) : n->name() + suffix;
  if (kind == BufferKind::Output)
    strides = g_.outputStrides(ioIndex);
  else if (strides.empty())
    strides = paddedStrides(n->shape(), n->dtype());
  Buffer *b = p_->addBuffer(name, n->dtype(), n->shape(), kind, ioIndex, strides);
  Index full;
  std::vector<SymExpr> vars = freshVars(n->shape(), "i", full);
  p_->addComputation(b, vars, {}, ReduceKind::None, v.load(full));
  return bufferValue(b);
}

std::vector<SymExpr> Lowerer::paddedStrides(const std::vector<SymExpr> &shape, DType t) const {
  return opts_.padRows ? paddedRowStrides(s_, shape, dtypeSize(t)) : std::vector<SymExpr>{};
}

Buffer *Lowerer::realizeOutput(Node *n, int k) {
  Value &v = values_.at(n);
  bool rowMajor = g_.outputStrides(k).empty() ||
                  g_.outputStrides(k) == contiguousStrides(s_, n->shape());
  // A stored value becomes the output as it is laid out: row-major, or with padded rows; so
  // does a buffer that n only views as it is (the reshapes around an attention's result).
  Buffer *b = v.buffer ? v.buffer : viewedAsItIs(n, v);
  bool stored = b && (b->strides == contiguousStrides(s_, n->shape()) ||
                      b->strides == paddedStrides(n->shape(), n->dtype()));
  if (b && b->kind == BufferKind::Intermediate && rowMajor && stored) {
    claimAsOutput(b, k);
    return b;
  }
  // A stored value the output views in another shape over the same elements (a saved
  // activation returned transposed for the backward's weight gradient) is the output too; the
  // caller sees it in the output's shape and strides.
  std::vector<SymExpr> want =
      g_.outputStrides(k).empty() ? contiguousStrides(s_, n->shape()) : g_.outputStrides(k);
  // (Not a scalar viewing a buffer of ones: an empty caller's shape means the buffer's own.)
  Buffer *c = n->rank() > 0 ? viewedInLayout(n, v, want) : nullptr;
  if (c) {
    claimAsOutput(c, k);
    if (c->shape != n->shape() || c->strides != want) {
      c->callerShape = n->shape();
      c->callerStrides = want;
    }
    return c;
  }
  // A channels-last image is computed into an [N, H, W, C] buffer the caller sees in its
  // shape, so that a convolution reading it later reads it in place (not a copy of it).
  if (opts_.channelsLast && n->rank() == 4 && !nhwc_.count(n) &&
      want == channelsLastStrides(n->shape())) {
    Buffer *b = realizeNhwc(n, v);
    claimAsOutput(b, k);
    b->callerShape = n->shape();
    b->callerStrides = want;
    return b;
  }
  // An input, an output already, or a lazy value: compute into a fresh output buffer.
  return realize(n, v, BufferKind::Output, k).buffer;
}

void Lowerer::claimAsOutput(Buffer *b, int k) {
  b->kind = BufferKind::Output;
  b->ioIndex = k;
  b->name = "out" + std::to_string(k);
}

Buffer *Lowerer::viewedInLayout(Node *n, const Value &v, const std::vector<SymExpr> &strides) {
  Index full;
  std::vector<SymExpr> vars;
  const Expr *e = plainLoad(n, v, full, vars);
  if (!e || e->index() != linearIndex(s_, full, strides))
    return nullptr;
  Buffer *b = ownBuffer(e->buffer());
  if (!b || b->kind != BufferKind::Intermediate ||
      s_.product(b->shape) != s_.product(n->shape()) ||
      !loop::denseLayout(s_, b->shape, b->strides) || !loop::denseLayout(s_, n->shape(), strides))
    return nullptr;
  return b;
}

Buffer *Lowerer::ownBuffer(const Buffer *b) {
  for (const auto &own : p_->buffers())
    if (own.get() == b)
      return own.get();
  return nullptr;
}

const Expr *Lowerer::plainLoad(Node *n, const Value &v, Index &full, std::vector<SymExpr> &vars) {
  vars = freshVars(n->shape(), "a", full);
  const Expr *e = v.load(full);
  if (e->kind() == loop::ExprKind::Op && e->op() == ScalarOpKind::Cast)
    e = e->operands()[0];
  return e->kind() == loop::ExprKind::Load && e->indirect().empty() && e->dtype() == n->dtype()
             ? e : nullptr;
}

bool Lowerer::isGraphOutput(const Node *n) const {
  return std::find(g_.outputs().begin(), g_.outputs().end(), n) != g_.outputs().end();
}

Buffer *Lowerer::viewedAsItIs(Node *n, const Value &v) {
  Index full;
  std::vector<SymExpr> vars;
  const Expr *e = plainLoad(n, v, full, vars);
  if (!e)
    return nullptr;
  const Buffer *b = e->buffer();
  if (b->shape != n->shape() || e->index() != linearIndex(s_, full, b->strides))
    return nullptr;
  return ownBuffer(b);
}

Value Lowerer::lower(Node *n) {
  switch (opCategory(n->op())) {
  case OpCategoryKind::Input: {
    int index = static_cast<int>(attrs::Input(*n).index());
    if (channelsLastInput(n)) {
      // Its memory is an [N, H, W, C] buffer as it is: read in place, not copied.
      Buffer *b = p_->addBuffer(n->name(), n->dtype(), toNhwc(n->shape()), BufferKind::Input,
                                index);
      b->callerShape = n->shape();
      b->callerStrides = n->type().strides;
      return nhwcValue(nhwc_[n] = b);
    }
    return bufferValue(p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Input, index,
                                     n->type().strides));
  }
  case OpCategoryKind::Full: {
    // A half-precision tensor holds the value rounded to its dtype.
    double value = attrs::Full(*n).value(); // an integer result's is an int (verified)
    const Expr *c = ex_.cast(ex_.cast(ex_.constant(value, DType::Float32), n->dtype()),
                             computeType(n->dtype()));
    if (n->dtype() == DType::Float64)
      c = ex_.constant(value, DType::Float64);
    if (!isFloating(n->dtype()))
      c = ex_.constant(value, n->dtype());
    return lazy([c](const Index &) { return c; });
  }
  case OpCategoryKind::Iota: {
    size_t dim = static_cast<size_t>(attrs::Iota(*n).dim());
    DType t = computeType(n->dtype());
    return lazy([this, dim, t](const Index &idx) {
      return ex_.cast(ex_.indexValue(idx[dim], DType::Int64), t);
    });
  }
  case OpCategoryKind::Numel: {
    Node *x = n->operand(0);
    SymExpr count = s_.constant(1);
    for (int64_t d : attrs::Numel(*n).dims())
      count = s_.mul(count, x->shape()[d]);
    DType t = computeType(n->dtype());
    const Expr *c = ex_.cast(ex_.indexValue(count, DType::Int64), t);
    return lazy([c](const Index &) { return c; });
  }
  case OpCategoryKind::Elementwise:
    return lowerElementwise(n);
  case OpCategoryKind::Cast: {
    const Value &x = operandValue(n, 0);
    DType to = n->dtype(), compute = computeType(to);
    return lazy([this, &x, to, compute](const Index &idx) {
      return roundTo(x.load(idx), to, compute);
    });
  }
  case OpCategoryKind::Reduce:
    return lowerReduction(n);
  case OpCategoryKind::View:
    return lowerView(n);
  case OpCategoryKind::Gather:
    return n->op() == OpKind::Take ? lowerTake(n) : lowerGather(n);
  case OpCategoryKind::Concat:
    return lowerConcat(n);
  case OpCategoryKind::MatMul:
    return lowerMatMul(n);
  case OpCategoryKind::Composite:
    BRAZE_UNREACHABLE("composite op " << opName(n->op()) << " reached lowering; decompose first");
  case OpCategoryKind::Extern: // kept whole: one extern computation (loop::ExternSpec)
    if (n->op() == OpKind::Convolution)
      return lowerConvolution(n);
    if (n->op() == OpKind::ConvWeightGrad)
      return lowerConvWeightGrad(n);
    if (n->op() == OpKind::ConvInputGrad)
      return lowerConvInputGrad(n);
    if (isAttentionFamily(n->op()))
      return lowerAttention(n);
    if (n->op() == OpKind::Scatter)
      return lowerAccumulatingScatter(n);
    BRAZE_UNREACHABLE("extern op " << opName(n->op()) << " has no extern form");
  }
  BRAZE_UNREACHABLE("bad category");
}

Value Lowerer::lowerElementwise(Node *n) {
  std::vector<const Value *> xs;
  std::vector<std::vector<SymExpr>> shapes;
  for (size_t i = 0; i < n->operands().size(); ++i) {
    xs.push_back(&operandValue(n, i));
    shapes.push_back(n->operand(i)->shape());
  }
  ScalarOpKind op = scalarOpFor(n->op());
  DType storage = n->dtype(), out = computeType(storage);
  std::vector<SymExpr> outShape = n->shape();
  return lazy([this, xs, shapes, op, storage, out, outShape](const Index &idx) {
    std::vector<const Expr *> args;
    for (size_t i = 0; i < xs.size(); ++i)
      args.push_back(xs[i]->load(broadcastIndex(s_, idx, outShape, shapes[i])));
    const Expr *v = ex_.op(op, std::move(args), out);
    // A half-precision op rounds its result, as PyTorch's kernel does for each
    // op (overflow to inf included); composites compute in f32 on purpose.
    return roundTo(v, storage, out);
  });
}

Value Lowerer::lowerReduction(Node *n) {
  Node *xn = n->operand(0);
  const Value &x = values_.at(xn);
  const attrs::Sum a(*n); // any reduction
  const IntList &dims = a.dims();
  bool keepdim = a.keepdim();
  // In channels-last mode a 4-d result (a max pool's) is stored [N, H, W, C], so that its
  // kernel runs along C, as its channels-last operand is laid out.
  bool nhwc = opts_.channelsLast && n->rank() == 4;
  Buffer *b = p_->addBuffer(n->name(), n->dtype(), nhwc ? toNhwc(n->shape()) : n->shape(),
                            BufferKind::Intermediate);
  Index outIdx, redIdx;
  std::vector<SymExpr> vars = freshVars(b->shape, "i", outIdx);
  if (nhwc)
    outIdx = fromNhwc(outIdx);
  std::vector<SymExpr> redExtents;
  for (int64_t d : dims)
    redExtents.push_back(xn->shape()[d]);
  std::vector<SymExpr> rvars = freshVars(redExtents, "r", redIdx);
  Index inIdx;
  size_t o = 0, r = 0;
  for (int64_t j = 0; j < xn->rank(); ++j) {
    bool reduced = std::find(dims.begin(), dims.end(), j) != dims.end();
    if (reduced) {
      inIdx.push_back(redIdx[r++]);
      if (keepdim)
        ++o;
    } else {
      inIdx.push_back(outIdx[o++]);
    }
  }
  ReduceKind kind = reduceKindFor(n->op());
  const Expr *value = x.load(inIdx);
  if (kind == ReduceKind::Any || kind == ReduceKind::All)
    value = value->dtype() == DType::Bool
                ? value
                : ex_.op(ScalarOpKind::Ne, {value, ex_.constant(0, value->dtype())}, DType::Bool);
  // Reducing only unit dims folds a single element: the value itself (position 0 for arg).
  if (rvars.empty() && (kind == ReduceKind::ArgMax || kind == ReduceKind::ArgMin))
    value = ex_.constant(0, DType::Int64);
  p_->addComputation(b, vars, rvars, rvars.empty() ? ReduceKind::None : kind, value);
  if (nhwc)
    return nhwcValue(nhwc_[n] = b);
  return bufferValue(b);
}

Value Lowerer::lowerView(Node *n) {
  const Value &x = operandValue(n, 0);
  Node *xn = n->operand(0);
  Value v = lazy([this, &x, n](const Index &idx) {
    return x.load(viewOperandIndex(s_, *n, idx));
  });
  v.affineView = x.affineView &&
                 (n->op() != OpKind::Reshape || onlyUnitDimsDiffer(n->shape(), xn->shape()));
  return v;
}

Value Lowerer::lowerConcat(Node *n) {
  size_t dim = attrs::Concat(*n).dim();
  std::vector<const Value *> xs;
  std::vector<SymExpr> offsets, sizes;
  SymExpr off = s_.constant(0);
  for (size_t i = 0; i < n->operands().size(); ++i) {
    xs.push_back(&operandValue(n, i));
    offsets.push_back(off);
    sizes.push_back(n->operand(i)->shape()[dim]);
    off = s_.add(off, sizes.back());
  }
  DType t = computeType(n->dtype());
  return lazy([this, xs, offsets, sizes, dim, t](const Index &idx) {
    const Expr *result = nullptr;
    for (size_t k = xs.size(); k-- > 0;) {
      Index in = idx;
      SymExpr local = s_.sub(idx[dim], offsets[k]);
      in[dim] = s_.max(s_.constant(0),
                       s_.min(local, s_.sub(sizes[k], s_.constant(1))));
      const Expr *v = xs[k]->load(in);
      if (!result) {
        result = v;
        continue;
      }
      // idx < offsets[k + 1]  <=>  take operand k
      const Expr *pos = ex_.indexValue(idx[dim], DType::Int64);
      const Expr *end = ex_.indexValue(s_.add(offsets[k], sizes[k]), DType::Int64);
      const Expr *inK = ex_.op(ScalarOpKind::Lt, {pos, end}, DType::Bool);
      result = ex_.op(ScalarOpKind::Where, {inK, v, result}, t);
    }
    return result;
  });
}

Buffer *Lowerer::inMemory(Node *n) {
  Value &v = values_.at(n);
  // A value held channels-last (an input read in place, a convolution's result) is read
  // through an [N, H, W, C] buffer that may have n's name: its copy in n's own layout is
  // another buffer.
  if (!v.buffer)
    v = realize(n, v, BufferKind::Intermediate, -1, nhwc_.count(n) ? "_nchw" : "",
                intermediateStrides(n));
  return v.buffer;
}

std::optional<Value> Lowerer::takeInPlace(Node *n, const Value &xv) {
  const Value *index = &operandValue(n, 1);
  size_t dim = attrs::Take(*n).dim(), indexRank = n->operand(1)->rank();
  SymExpr extent = n->operand(0)->shape()[dim];
  return boundInPlace(n, xv, extent, [this, index, dim, indexRank, extent](const Index &idx,
                                                                            SymExpr t) {
    Index at(idx.begin() + dim, idx.begin() + dim + indexRank);
    const Expr *i = wrapIndex(ex_.cast(index->load(at), DType::Int64), extent);
    Index in(idx.begin(), idx.begin() + dim);
    in.push_back(t);
    in.insert(in.end(), idx.begin() + dim + indexRank, idx.end());
    return std::make_pair(i, in);
  });
}

namespace {

/// Whether v's value is one of `storage`'s (a half dtype's values widened to f32): v widens
/// such a value, or selects between such values (a masked_fill of a half tensor), or negates
/// or takes the absolute value of one. Rounding it to `storage` changes nothing.
bool holdsValueOf(const Expr *v, DType storage) {
  if (v->kind() != loop::ExprKind::Op)
    return false;
  switch (v->op()) {
  case loop::ScalarOpKind::Cast:
    return v->operands()[0]->dtype() == storage;
  case loop::ScalarOpKind::Where:
    return holdsValueOf(v->operands()[1], storage) && holdsValueOf(v->operands()[2], storage);
  case loop::ScalarOpKind::Neg:
  case loop::ScalarOpKind::Abs:
    return holdsValueOf(v->operands()[0], storage);
  default:
    return false;
  }
}

} // namespace

SymExpr Lowerer::boundSymbol(BoundSymbols &b, size_t j, SymExpr extent) {
  if (b.epoch != varsEpoch_) {
    b.epoch = varsEpoch_;
    b.syms.clear();
  }
  if (b.syms.size() <= j)
    b.syms.resize(j + 1, nullptr);
  if (!b.syms[j])
    b.syms[j] = s_.indexSymbol(j == 0 ? "t" : "t" + std::to_string(j), extent);
  return b.syms[j];
}

const Expr *Lowerer::roundTo(const Expr *v, DType storage, DType compute) {
  if (isHalf(storage) && v->dtype() == compute && holdsValueOf(v, storage))
    return v;
  return ex_.cast(ex_.cast(v, storage), compute);
}

const Expr *Lowerer::wrapIndex(const Expr *i, SymExpr extent) {
  const Expr *zero = ex_.constant(0, DType::Int64), *size = ex_.indexValue(extent, DType::Int64);
  return ex_.op(ScalarOpKind::Where,
                {ex_.op(ScalarOpKind::Lt, {i, zero}, DType::Bool),
                 ex_.op(ScalarOpKind::Add, {i, size}, DType::Int64), i},
                DType::Int64);
}

std::optional<Value> Lowerer::boundInPlace(Node *n, const Value &xv, SymExpr extent,
                                           const PositionAt &position) {
  DType compute = computeType(n->dtype());
  Index probe;
  freshVars(n->shape(), "p", probe);
  // The bound index's name differs from every index the source's loads bind already (a load
  // may hold both). The source's lowering names those, so one probe finds them for every point.
  std::string name = "t";
  {
    auto [i, in] = position(probe, s_.indexSymbol(name, extent));
    std::set<std::string> bound;
    for (const Expr *e : {xv.load(in), i})
      loop::forEachLoad(e, [&](const Expr *l) {
        for (const auto &b : l->indirect())
          bound.insert(b.first->name());
      });
    for (int k = 1; bound.count(name); ++k)
      name = "t" + std::to_string(k);
  }
  auto build = [this, xv, extent, position, compute, name](const Index &idx) -> const Expr * {
    SymExpr t = s_.indexSymbol(name, extent);
    auto [i, in] = position(idx, t);
    std::unordered_map<const Expr *, const Expr *> done;
    const Expr *v = bindIndirect(xv.load(in), t, i, done);
    return v && bindsIndex(v, t) ? ex_.cast(v, compute) : nullptr;
  };
  if (!build(probe))
    return std::nullopt;
  return lazy(build);
}

bool Lowerer::bindsIndex(const Expr *e, SymExpr t) {
  bool bound = false;
  loop::forEachLoad(e, [&](const Expr *l) {
    for (const auto &b : l->indirect())
      bound = bound || b.first == t;
  });
  return bound;
}

Value Lowerer::lowerTake(Node *n) {
  Node *xn = n->operand(0);
  // A view of a stored value that realize left unstored (LoweringOptions::takeViewsInPlace:
  // experts' weights read transposed) is read where it lies.
  Index probe;
  std::vector<SymExpr> probeVars;
  const Value *view = &values_.at(xn);
  bool direct = opCategory(xn->op()) == OpCategoryKind::View && !view->buffer &&
                plainLoad(xn, *view, probe, probeVars);
  size_t k = n->operands().size() - 1;
  if (!direct && k == 1 && !view->buffer) // a computed source (realize's computedAtTaken)
    if (auto v = takeInPlace(n, *view))
      return *v;
  Buffer *src = direct ? nullptr : inMemory(xn);
  std::vector<const Value *> indices;
  for (size_t j = 1; j <= k; ++j)
    indices.push_back(&operandValue(n, j));
  size_t dim = attrs::Take(*n).dim();
  size_t indexRank = n->operand(1)->rank();
  std::vector<SymExpr> extents(xn->shape().begin() + dim, xn->shape().begin() + dim + k);
  DType compute = computeType(n->dtype());
  auto bound = std::make_shared<BoundSymbols>();
  return lazy([this, src, view, indices, dim, indexRank, extents, bound, compute](const Index &idx) {
    Index at(idx.begin() + dim, idx.begin() + dim + indexRank);
    Index in(idx.begin(), idx.begin() + dim);
    std::vector<loop::IndirectBinding> bindings;
    for (size_t j = 0; j < indices.size(); ++j) {
      const Expr *i = wrapIndex(ex_.cast(indices[j]->load(at), DType::Int64), extents[j]);
      SymExpr t = boundSymbol(*bound, j, extents[j]);
      in.push_back(t);
      bindings.push_back({t, i});
    }
    in.insert(in.end(), idx.begin() + dim + indexRank, idx.end());
    if (!src) {
      const Expr *e = view->load(in);
      if (e->kind() == loop::ExprKind::Op && e->op() == ScalarOpKind::Cast)
        e = e->operands()[0];
      return ex_.cast(ex_.load(e->buffer(), e->index(), bindings), compute);
    }
    const Expr *v = ex_.load(src, linearIndex(s_, in, src->strides), bindings);
    return ex_.cast(v, compute);
  });
}

bool Lowerer::readsInPlace(Node *n, const Value &v) {
  if (n->rank() < 2)
    return false;
  Index full;
  std::vector<SymExpr> vars;
  const Expr *e = plainLoad(n, v, full, vars);
  if (!e)
    return false;
  std::optional<sym::AffineForm> form = sym::affineIn(s_, e->index(), vars);
  if (!form)
    return false;
  size_t rank = n->shape().size();
  for (size_t d : {rank - 1, rank - 2}) {
    auto at = std::find(vars.begin(), vars.end(), full[d]);
    if (at != vars.end() && form->coef[at - vars.begin()]->isConst(1))
      return true;
  }
  return false;
}

loop::ConvSpec Lowerer::convSpec(Node *n) {
  const attrs::ConvWeightGrad a(*n); // convolution, conv_weight_grad or conv_input_grad
  loop::ConvSpec spec;
  spec.stride = a.stride();
  spec.padding = a.padding();
  spec.dilation = a.dilation();
  spec.groups = a.groups();
  spec.channelsLast = opts_.channelsLast && n->operand(0)->rank() == 4;
  return spec;
}

Buffer *Lowerer::convImage(Node *n, const loop::ConvSpec &spec) {
  if (spec.channelsLast)
    return realizeNhwc(n, values_.at(n));
  Buffer *b = inMemory(n);
  if (opts_.rowMajorConvolution && b->strides != contiguousStrides(s_, b->shape))
    b = realize(n, values_.at(n), BufferKind::Intermediate, -1, "_rows").buffer;
  return b;
}

const Expr *Lowerer::inRange(SymExpr at, SymExpr size) {
  const Expr *p = ex_.indexValue(at, DType::Int64);
  const Expr *lo = ex_.op(ScalarOpKind::Ge, {p, ex_.constant(0, DType::Int64)}, DType::Bool);
  const Expr *hi = ex_.op(ScalarOpKind::Lt, {p, ex_.indexValue(size, DType::Int64)}, DType::Bool);
  return ex_.op(ScalarOpKind::LogicalAnd, {lo, hi}, DType::Bool);
}

const Expr *Lowerer::conjoin(const Expr *a, const Expr *b) {
  return a ? ex_.op(ScalarOpKind::LogicalAnd, {a, b}, DType::Bool) : b;
}

std::vector<SymExpr> Lowerer::withSpatial(SymExpr first, const std::vector<SymExpr> &shape) {
  std::vector<SymExpr> out{first};
  out.insert(out.end(), shape.begin() + 2, shape.end());
  return out;
}

SymExpr Lowerer::groupChannel(const loop::ConvSpec &spec, SymExpr o, SymExpr c,
                              SymExpr outChannels, SymExpr perGroupIn) {
  if (spec.groups == 1)
    return c;
  SymExpr perGroupOut = s_.floordiv(outChannels, s_.constant(spec.groups));
  return s_.add(s_.mul(s_.floordiv(o, perGroupOut), perGroupIn), c);
}

Buffer *Lowerer::convWeight(Node *wn, const loop::ConvSpec &spec) {
  Buffer *w =
      spec.channelsLast && opts_.channelsLastWeights ? channelsLastWeight(wn) : inMemory(wn);
  if (opts_.rowMajorConvolution && !spec.channelsLast &&
      w->strides != contiguousStrides(s_, w->shape))
    w = realize(wn, values_.at(wn), BufferKind::Intermediate, -1, "_rows").buffer;
  return w;
}

bool Lowerer::mergesDims(const std::vector<SymExpr> &from, const std::vector<SymExpr> &to,
                         size_t h) {
  for (size_t d = 0; d < to.size(); ++d) {
    SymExpr want = d < h ? from[d] : d == h ? s_.mul(from[h], from[h + 1]) : from[d + 1];
    if (to[d] != want)
      return false;
  }
  return true;
}

const Expr *Lowerer::bindIndirect(const Expr *e, SymExpr t, const Expr *i,
                                  std::unordered_map<const Expr *, const Expr *> &done) {
  if (auto it = done.find(e); it != done.end())
    return it->second;
  auto uses = [&](SymExpr x) { return sym::mentions(x, t); };
  const Expr *out = e;
  switch (e->kind()) {
  case loop::ExprKind::Const:
    break;
  case loop::ExprKind::IndexValue:
    if (uses(e->index()))
      out = nullptr;
    break;
  case loop::ExprKind::Load: {
    // A load through indices of its own keeps them, each bound inside too (a take of a take).
    std::vector<loop::IndirectBinding> bindings;
    for (const auto &[sy, v] : e->indirect()) {
      const Expr *bound = bindIndirect(v, t, i, done);
      if (!bound)
        return done[e] = nullptr;
      bindings.push_back({sy, bound});
    }
    if (uses(e->index()))
      bindings.push_back({t, i});
    if (!bindings.empty())
      out = ex_.load(e->buffer(), e->index(), std::move(bindings));
    break;
  }
  case loop::ExprKind::Op: {
    std::vector<const Expr *> ops;
    for (const Expr *o : e->operands()) {
      const Expr *no = bindIndirect(o, t, i, done);
      if (!no)
        return done[e] = nullptr;
      ops.push_back(no);
    }
    out = ex_.op(e->op(), ops, e->dtype());
    break;
  }
  }
  return done[e] = out;
}

std::optional<Value> Lowerer::gatherInPlace(Node *n, const Value &xv, const Value &index,
                                            size_t dim, SymExpr extent) {
  if (xv.buffer)
    return std::nullopt;
  return boundInPlace(n, xv, extent, [this, &index, dim](const Index &idx, SymExpr t) {
    Index in = idx;
    in[dim] = t;
    return std::make_pair(ex_.cast(index.load(idx), DType::Int64), in);
  });
}

Value Lowerer::lowerGather(Node *n) {
  Node *xn = n->operand(0);
  const Value &index = operandValue(n, 1);
  size_t dim = attrs::Gather(*n).dim();
  SymExpr extent = xn->shape()[dim];
  DType compute = computeType(n->dtype());
  if (auto v = gatherInPlace(n, values_.at(xn), index, dim, extent))
    return *v;
  Buffer *src = inMemory(xn);
  auto bound = std::make_shared<BoundSymbols>();
  return lazy([this, src, &index, dim, extent, bound, compute](const Index &idx) {
    const Expr *i = ex_.cast(index.load(idx), DType::Int64);
    SymExpr t = boundSymbol(*bound, 0, extent);
    Index in = idx;
    in[dim] = t;
    const Expr *v = ex_.load(src, linearIndex(s_, in, src->strides), {{t, i}});
    return ex_.cast(v, compute);
  });
}

} // namespace to_loops

std::unique_ptr<loop::LoopProgram> lowerToLoops(Graph &g, const LoweringOptions &opts) {
  BRAZE_CHECK(g.realized()) << "lowerToLoops needs the realize step's decisions (realize)";
  return to_loops::Lowerer(g, opts).run();
}

} // namespace braze
