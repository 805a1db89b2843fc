/// Over 800 lines for a reason: the Lowerer below holds every node's lazy value, stores the
/// values the realize step marked, and copies views into the layouts their readers need; its
/// rules (views, reductions, products, convolution, attention and the outputs) read and store
/// each other's values through that one map, so they are one class in one file. Index
/// arithmetic that needs no node lives in IndexMaps.
#include "braze/lowering/to_loops/ToLoops.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/loop/LoopText.h"
#include "braze/ir/loop/Rewrite.h"
#include "braze/lowering/realize/Realize.h"
#include "braze/lowering/to_loops/IndexMaps.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace braze {

using loop::Buffer;
using loop::BufferKind;
using loop::Expr;
using loop::ReduceKind;
using loop::ScalarOpKind;

namespace {

/// A node's value: a function from a full index tuple (one SymExpr per dim; unit dims get 0)
/// to a scalar Expr in the node's compute type, plus the buffer it lives in once realized.
struct Value {
  std::function<const Expr *(const Index &)> load;
  Buffer *buffer = nullptr;
  /// Reads a buffer at an index affine in the loop variables (a buffer, or a permute / expand /
  /// slice / select / flip / unfold / unit-dim reshape of one): no recomputation, and a matrix
  /// product can hand it to BLAS with strides.
  bool affineView = false;
};

/// The shapes are equal once their unit dims are dropped.
bool onlyUnitDimsDiffer(const std::vector<SymExpr> &a, const std::vector<SymExpr> &b) {
  std::vector<SymExpr> x, y;
  for (SymExpr d : a)
    if (!d->isConst(1))
      x.push_back(d);
  for (SymExpr d : b)
    if (!d->isConst(1))
      y.push_back(d);
  return x == y;
}

ScalarOpKind scalarOpFor(OpKind op) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (op == OpKind::E)                                                         \
    return ScalarOpKind::E;
#include "braze/ir/types/ElementwiseOps.def"
  BRAZE_UNREACHABLE("not elementwise: " << opName(op));
}

ReduceKind reduceKindFor(OpKind op) {
  static const std::pair<OpKind, ReduceKind> kKinds[] = {
      {OpKind::Sum, ReduceKind::Sum}, {OpKind::Prod, ReduceKind::Prod},
      {OpKind::Amax, ReduceKind::Max}, {OpKind::Amin, ReduceKind::Min},
      {OpKind::Any, ReduceKind::Any}, {OpKind::All, ReduceKind::All},
      {OpKind::ArgMax, ReduceKind::ArgMax}, {OpKind::ArgMin, ReduceKind::ArgMin}};
  for (const auto &[k, r] : kKinds)
    if (k == op)
      return r;
  BRAZE_UNREACHABLE("not a reduction: " << opName(op));
}

class Lowerer {
public:
  Lowerer(Graph &g, const LoweringOptions &opts)
      : g_(g), opts_(opts), p_(std::make_unique<loop::LoopProgram>(g.symShared())),
        s_(g.sym()), ex_(p_->exprs()) {}

  std::unique_ptr<loop::LoopProgram> run() {
    p_->sizeSymbols() = g_.sizeSymbols();
    // An output is stored right after its node is lowered, so what it reads need not stay
    // alive to the end of the graph (a training forward returns dozens of saved activations):
    // a view of a stored value (a returned K/V cache) is copied out or becomes that buffer, and
    // a computed value is stored once, its later readers loading it.
    std::vector<bool> done(g_.outputs().size(), false);
    for (const auto &n : g_.nodes()) {
      // The realize step's marks: a shared value is stored where it is computed (a row
      // reduction's kernel stores it too), a value a reader needs in memory where it is first
      // read (next to that reader; a view reads nothing until its own reader does), and a
      // marked output right away.
      if (opCategory(n->op()) != OpCategoryKind::View)
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
            values_[n.get()] = bufferValue(b);
            computed = false;
          }
        }
    }
    return std::move(p_);
  }

private:
  /// Stores n's value, once, if the realize step marked it and it has no buffer yet.
  void storeMarked(Node *n) {
    Value &v = values_.at(n);
    if (n->stored() && !v.buffer && !nhwc_.count(n))
      v = storeIntermediate(n, v);
  }

  /// Fresh loop vars for the non-unit entries of `extents`; the full index has 0 elsewhere.
  std::vector<SymExpr> freshVars(const std::vector<SymExpr> &extents, const char *prefix,
                                 Index &full) {
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

  Value bufferValue(Buffer *b) {
    DType compute = computeType(b->dtype);
    return Value{[this, b, compute](const Index &idx) {
                   return ex_.cast(ex_.load(b, linearIndex(s_, idx, b->strides)), compute);
                 },
                 b, true};
  }

  /// Materializes `v` (values of node n) into a new buffer: an output's strides are the graph's,
  /// an intermediate's are `strides` (empty: row-major).
  Value realize(Node *n, const Value &v, BufferKind kind, int ioIndex,
                const std::string &suffix = "", std::vector<SymExpr> strides = {}) {
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

  /// Strides with the rows padded (LoweringOptions::padRows, paddedRowStrides), or empty when a
  /// value of this shape and dtype is stored row-major.
  std::vector<SymExpr> paddedStrides(const std::vector<SymExpr> &shape, DType t) const {
    return opts_.padRows ? paddedRowStrides(s_, shape, dtypeSize(t)) : std::vector<SymExpr>{};
  }

  /// Stores output k, n's value, and returns the buffer that holds it.
  Buffer *realizeOutput(Node *n, int k) {
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
    // An input, an output already, or a lazy value: compute into a fresh output buffer.
    return realize(n, v, BufferKind::Output, k).buffer;
  }

  void claimAsOutput(Buffer *b, int k) {
    b->kind = BufferKind::Output;
    b->ioIndex = k;
    b->name = "out" + std::to_string(k);
  }

  /// The stored intermediate that v, n's value, reads as it is at every index when n is laid
  /// out with `strides`: the same elements, both layouts dense; or nullptr.
  Buffer *viewedInLayout(Node *n, const Value &v, const std::vector<SymExpr> &strides) {
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

  /// The program's own, mutable, buffer b.
  Buffer *ownBuffer(const Buffer *b) {
    for (const auto &own : p_->buffers())
      if (own.get() == b)
        return own.get();
    return nullptr;
  }

  /// v, n's value, at fresh indices `full` (over `vars`, n's non-unit dims) when it only reads
  /// one buffer of n's dtype (a view of it, a half value maybe widened to f32): that load, with
  /// no indirection. nullptr when v computes anything.
  const Expr *plainLoad(Node *n, const Value &v, Index &full, std::vector<SymExpr> &vars) {
    vars = freshVars(n->shape(), "a", full);
    const Expr *e = v.load(full);
    if (e->kind() == loop::ExprKind::Op && e->op() == ScalarOpKind::Cast)
      e = e->operands()[0];
    return e->kind() == loop::ExprKind::Load && e->indirect().empty() && e->dtype() == n->dtype()
               ? e : nullptr;
  }

  bool isGraphOutput(const Node *n) const {
    return std::find(g_.outputs().begin(), g_.outputs().end(), n) != g_.outputs().end();
  }

  /// The buffer of n's shape and dtype that v, n's value, reads at every index as it is (a
  /// chain of views that changes nothing), or nullptr.
  Buffer *viewedAsItIs(Node *n, const Value &v) {
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

  const Value &operandValue(Node *n, size_t i) { return values_.at(n->operand(i)); }

  Value lazy(std::function<const Expr *(const Index &)> f) { return Value{std::move(f), nullptr}; }

  /// n's value v stored once: [N, H, W, C] in channels-last mode, else intermediateStrides.
  /// A 4-d value read only as convolutions' weight (the flipped weight of an input gradient)
  /// is stored as they read it (channelsLastWeight, or row-major), not [N, H, W, C] and then
  /// copied again for them.
  Value storeIntermediate(Node *n, const Value &v) {
    if (opts_.channelsLast && n->rank() == 4 && !onlyConvolutionWeight(n))
      return nhwcValue(realizeNhwc(n, v));
    if (opts_.channelsLast && n->rank() == 4 && opts_.channelsLastWeights)
      return realize(n, v, BufferKind::Intermediate, -1, "", channelsLastStrides(n->shape()));
    return realize(n, v, BufferKind::Intermediate, -1, "", intermediateStrides(n));
  }

  bool onlyConvolutionWeight(const Node *n) const {
    if (std::find(g_.outputs().begin(), g_.outputs().end(), n) != g_.outputs().end())
      return false;
    std::vector<Node *> readers = readersOf(n);
    return !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](const Node *u) {
      return readsAsWeight(u, n) && u->operand(0) != n;
    });
  }

  /// Whether u reads n as a convolution's weight (of a convolution or an input gradient).
  static bool readsAsWeight(const Node *u, const Node *n) {
    return (u->op() == OpKind::Convolution || u->op() == OpKind::ConvInputGrad) &&
           u->operand(1) == n;
  }

  /// A stored intermediate's strides (empty: row-major). In channels-last mode a value of rank
  /// above 4 keeps dim 1 innermost: the channels of a value derived from a channels-last
  /// image, such as a pooling's [N, C, OH, W, kh] windows, so its kernels run along them.
  std::vector<SymExpr> intermediateStrides(Node *n) {
    if (!opts_.channelsLast || n->rank() <= 4)
      return {};
    return channelsLastStrides(n->shape());
  }

  /// Dense strides with dim 1 innermost and the others row-major ({HWC, 1, WC, C} for
  /// [N, C, H, W]).
  std::vector<SymExpr> channelsLastStrides(const std::vector<SymExpr> &shape) {
    std::vector<SymExpr> st(shape.size());
    st[1] = s_.constant(1);
    SymExpr step = shape[1];
    for (size_t i = shape.size(); i-- > 0;) {
      if (i == 1)
        continue;
      st[i] = step;
      step = s_.mul(step, shape[i]);
    }
    return st;
  }

  // ---- Channels-last mode (LoweringOptions::channelsLast) ------------------------------------
  // A 4-d value stored for a convolution, or because several ops read it, lives in a buffer
  // shaped [N, H, W, C], so the kernels that write and read it run along C; a stored value of
  // higher rank keeps dim 1 innermost (intermediateStrides).

  static Index toNhwc(const Index &i) { return {i[0], i[2], i[3], i[1]}; }
  static Index fromNhwc(const Index &f) { return {f[0], f[3], f[1], f[2]}; }

  Value nhwcValue(Buffer *b) {
    DType compute = computeType(b->dtype);
    return Value{[this, b, compute](const Index &idx) {
                   return ex_.cast(ex_.load(b, linearIndex(s_, toNhwc(idx), b->strides)), compute);
                 },
                 nullptr, true};
  }

  /// In channels-last mode: a 4-d input laid out channels-last and dense ({HWC, 1, WC, C}),
  /// other than a convolution's weight (channelsLastWeight reads those).
  bool channelsLastInput(Node *n) {
    if (!opts_.channelsLast || n->rank() != 4 ||
        n->type().strides != channelsLastStrides(n->shape()))
      return false;
    for (Node *u : readersOf(n))
      if (readsAsWeight(u, n))
        return false;
    return true;
  }

  /// n's values in a [N, H, W, C] buffer (made once per node).
  Buffer *realizeNhwc(Node *n, const Value &v) {
    if (auto it = nhwc_.find(n); it != nhwc_.end())
      return it->second;
    Buffer *b = p_->addBuffer(n->name() + "_nhwc", n->dtype(), toNhwc(n->shape()),
                              BufferKind::Intermediate);
    Index f;
    std::vector<SymExpr> vars = freshVars(b->shape, "i", f);
    p_->addComputation(b, vars, {}, ReduceKind::None, v.load(fromNhwc(f)));
    return nhwc_[n] = b;
  }

  /// A convolution weight [O, C, kh, kw] stored with C innermost (cuDNN's NHWC filter layout),
  /// copying it (once, for every convolution that reads it) if it is not.
  Buffer *channelsLastWeight(Node *n) {
    if (auto it = filters_.find(n); it != filters_.end())
      return it->second;
    Buffer *w = inMemory(n);
    std::vector<SymExpr> want = channelsLastStrides(n->shape());
    if (w->strides != want)
      w = realize(n, values_.at(n), BufferKind::Intermediate, -1, "_cl", want).buffer;
    return filters_[n] = w;
  }

  Value lower(Node *n) {
    switch (opCategory(n->op())) {
    case OpCategoryKind::Input: {
      int index = static_cast<int>(n->attrs().getInt("index"));
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
      const Expr *c = ex_.cast(ex_.cast(ex_.constant(n->attrs().getFloat("value"), DType::Float32),
                                        n->dtype()),
                               computeType(n->dtype()));
      if (n->dtype() == DType::Float64)
        c = ex_.constant(n->attrs().getFloat("value"), DType::Float64);
      if (!isFloating(n->dtype()))
        c = ex_.constant(static_cast<double>(n->attrs().getInt("value")), n->dtype());
      return lazy([c](const Index &) { return c; });
    }
    case OpCategoryKind::Iota: {
      size_t dim = static_cast<size_t>(n->attrs().getInt("dim"));
      DType t = computeType(n->dtype());
      return lazy([this, dim, t](const Index &idx) {
        return ex_.cast(ex_.indexValue(idx[dim], DType::Int64), t);
      });
    }
    case OpCategoryKind::Numel: {
      Node *x = n->operand(0);
      SymExpr count = s_.constant(1);
      for (int64_t d : n->attrs().getInts("dims"))
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
        return ex_.cast(ex_.cast(x.load(idx), to), compute);
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
      BRAZE_UNREACHABLE("composite op " << opName(n->op()) << " reached lowering; decompose first");
    }
    BRAZE_UNREACHABLE("bad category");
  }

  Value lowerElementwise(Node *n) {
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
      return ex_.cast(ex_.cast(v, storage), out);
    });
  }

  Value lowerReduction(Node *n) {
    Node *xn = n->operand(0);
    const Value &x = values_.at(xn);
    const IntList &dims = n->attrs().getInts("dims");
    bool keepdim = n->attrs().getBool("keepdim");
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

  Value lowerView(Node *n) {
    const Value &x = operandValue(n, 0);
    Node *xn = n->operand(0);
    Value v = lazy([this, &x, n](const Index &idx) {
      return x.load(viewOperandIndex(s_, *n, idx));
    });
    v.affineView = x.affineView &&
                   (n->op() != OpKind::Reshape || onlyUnitDimsDiffer(n->shape(), xn->shape()));
    return v;
  }

  /// out = operand k at (i - offset_k) where offset_k <= i < offset_k+1. Every operand is read
  /// at a clamped index (always in bounds) and a chain of `where` picks the right one.
  Value lowerConcat(Node *n) {
    size_t dim = n->attrs().getInt("dim");
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

  /// The buffer holding node n's values, realizing them first if they are computed lazily
  /// (an indirect load needs memory to read from).
  Buffer *inMemory(Node *n) {
    Value &v = values_.at(n);
    // A value held channels-last (an input read in place, a convolution's result) is read
    // through an [N, H, W, C] buffer that may have n's name: its copy in n's own layout is
    // another buffer.
    if (!v.buffer)
      v = realize(n, v, BufferKind::Intermediate, -1, nhwc_.count(n) ? "_nchw" : "",
                  intermediateStrides(n));
    return v.buffer;
  }

  /// out[a.., j.., b..] = x[a.., index0[j..], index1[j..], .., b..]; negative indices wrap
  /// once. Each index binds its own indirect symbol, so every component is bounds-checked
  /// against its own dim (a bad component cannot alias another valid flat position).
  Value lowerTake(Node *n) {
    Node *xn = n->operand(0);
    // A view of a stored value that realize left unstored (LoweringOptions::takeViewsInPlace:
    // experts' weights read transposed) is read where it lies.
    Index probe;
    std::vector<SymExpr> probeVars;
    const Value *view = &values_.at(xn);
    bool direct = opCategory(xn->op()) == OpCategoryKind::View && !view->buffer &&
                  plainLoad(xn, *view, probe, probeVars);
    Buffer *src = direct ? nullptr : inMemory(xn);
    size_t k = n->operands().size() - 1;
    std::vector<const Value *> indices;
    for (size_t j = 1; j <= k; ++j)
      indices.push_back(&operandValue(n, j));
    size_t dim = n->attrs().getInt("dim");
    size_t indexRank = n->operand(1)->rank();
    std::vector<SymExpr> extents(xn->shape().begin() + dim, xn->shape().begin() + dim + k);
    DType compute = computeType(n->dtype());
    return lazy([this, src, view, indices, dim, indexRank, extents, compute](const Index &idx) {
      Index at(idx.begin() + dim, idx.begin() + dim + indexRank);
      Index in(idx.begin(), idx.begin() + dim);
      std::vector<loop::IndirectBinding> bindings;
      const Expr *zero = ex_.constant(0, DType::Int64);
      for (size_t j = 0; j < indices.size(); ++j) {
        const Expr *i = ex_.cast(indices[j]->load(at), DType::Int64);
        const Expr *size = ex_.indexValue(extents[j], DType::Int64);
        const Expr *neg = ex_.op(ScalarOpKind::Lt, {i, zero}, DType::Bool);
        i = ex_.op(ScalarOpKind::Where,
                   {neg, ex_.op(ScalarOpKind::Add, {i, size}, DType::Int64), i},
                   DType::Int64);
        std::string hint = j == 0 ? "t" : "t" + std::to_string(j);
        SymExpr t = s_.indexSymbol(hint, extents[j]);
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

  /// Whether v, n's value, is a plain load (plainLoad) at an index affine in n's indices with a
  /// unit step along one of the last two dims (a reshape of a permuted buffer whose layout
  /// makes it row-major): a matrix product can read it in place.
  bool readsInPlace(Node *n, const Value &v) {
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

  /// out[b.., m, n] = sum_k a[b.., m, k] * b[b.., k, n]: a reduction whose operands are always
  /// in memory (a computed operand is realized first, so nothing is recomputed per output),
  /// which the scheduler hands to BLAS when the layouts allow.
  /// With opts_.widenedHalfMatMul, an f32 product of two f16/bf16 tensors converted to f32 reads
  /// the half operands and widens each element as it loads it (the product of two widened halves
  /// is exact in f32).
  Value lowerMatMul(Node *n) {
    std::array<Node *, 2> src = matMulSources(n, opts_.widenedHalfMatMul);
    // The realize step stored the computed operands; a view of a stored value in a layout the
    // product cannot read in place is copied row-major.
    for (Node *o : src) {
      Value &v = values_.at(o);
      if (!v.affineView && !readsInPlace(o, v))
        v = realize(o, v, BufferKind::Intermediate, -1);
    }
    const Value &a = values_.at(src[0]), &b = values_.at(src[1]);
    Buffer *out = p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Intermediate, -1,
                                paddedStrides(n->shape(), n->dtype()));
    Index outIdx, redIdx;
    std::vector<SymExpr> vars = freshVars(n->shape(), "i", outIdx);
    SymExpr k = n->operand(0)->shape().back();
    std::vector<SymExpr> rvars = freshVars({k}, "r", redIdx);
    size_t r = outIdx.size();
    Index ia(outIdx.begin(), outIdx.end() - 1), ib(outIdx.begin(), outIdx.end() - 2);
    ia.push_back(redIdx[0]);
    ib.push_back(redIdx[0]);
    ib.push_back(outIdx[r - 1]);
    DType t = computeType(n->dtype());
    const Expr *value = ex_.op(ScalarOpKind::Mul, {a.load(ia), b.load(ib)}, t);
    p_->addComputation(out, vars, rvars, rvars.empty() ? ReduceKind::None : ReduceKind::Sum, value);
    return bufferValue(out);
  }

  /// A scatter decompose kept whole combines in place (GraphBuilder::scatterIsAccumulating):
  /// self is copied into a row-major buffer, then one computation over src's space combines
  /// each source value at its flat position (loop::Computation::scatterAt), which codegen
  /// checks, by the mode's combine.
  Value lowerAccumulatingScatter(Node *n) {
    Node *target = n->operand(1), *src = n->operand(2);
    const std::string &mode = n->attrs().getString("mode");
    BRAZE_CHECK(GraphBuilder::scatterIsAccumulating(n->dtype(), mode,
                                                    n->attrs().getBool("include_self"),
                                                    n->attrs().has("max_hits")))
        << "scatter " << n->name() << " reached lowering without combining in place";
    Value out = realize(n, values_.at(n->operand(0)), BufferKind::Intermediate, -1, "",
                        contiguousStrides(s_, n->shape()));
    Index full;
    std::vector<SymExpr> vars = freshVars(src->shape(), "i", full);
    const Expr *value = ex_.cast(values_.at(src).load(full), n->dtype());
    loop::Computation *c =
        p_->addComputation(out.buffer, vars, {}, ReduceKind::None, value);
    c->scatterAt = ex_.cast(values_.at(target).load(full), DType::Int64);
    c->scatterCombine = mode == "prod"   ? ReduceKind::Prod
                        : mode == "amax" ? ReduceKind::Max
                        : mode == "amin" ? ReduceKind::Min
                                         : ReduceKind::Sum;
    return out;
  }

  /// A convolution the decomposer kept (a library takes it): one sum reduction in the direct
  /// form ConvSpec describes, over the input and weight in memory, with the spec attached.
  /// Window positions in the padding read the clamped edge and are zeroed by a `where`. The
  /// bias, if any, is a pointwise add after it that fuses into the consumer.
  /// A convolution's (or weight gradient's) attributes, and its layout in this program.
  loop::ConvSpec convSpec(Node *n) {
    const AttrMap &a = n->attrs();
    loop::ConvSpec spec;
    spec.stride = a.getInts("stride");
    spec.padding = a.getInts("padding");
    spec.dilation = a.getInts("dilation");
    spec.groups = a.getInt("groups");
    spec.channelsLast = opts_.channelsLast && n->operand(0)->rank() == 4;
    return spec;
  }

  /// A convolution's image operand (its input, or a weight gradient's output gradient) in
  /// memory: an [N, H, W, C] buffer in channels-last mode, else where it is, copied row-major
  /// when the library needs rows.
  Buffer *convImage(Node *n, const loop::ConvSpec &spec) {
    if (spec.channelsLast)
      return realizeNhwc(n, values_.at(n));
    Buffer *b = inMemory(n);
    if (opts_.rowMajorConvolution && b->strides != contiguousStrides(s_, b->shape))
      b = realize(n, values_.at(n), BufferKind::Intermediate, -1, "_rows").buffer;
    return b;
  }

  /// 0 <= at < size, as a bool Expr.
  const Expr *inRange(SymExpr at, SymExpr size) {
    const Expr *p = ex_.indexValue(at, DType::Int64);
    const Expr *lo = ex_.op(ScalarOpKind::Ge, {p, ex_.constant(0, DType::Int64)}, DType::Bool);
    const Expr *hi = ex_.op(ScalarOpKind::Lt, {p, ex_.indexValue(size, DType::Int64)}, DType::Bool);
    return ex_.op(ScalarOpKind::LogicalAnd, {lo, hi}, DType::Bool);
  }

  /// a && b, where a null `a` is true.
  const Expr *conjoin(const Expr *a, const Expr *b) {
    return a ? ex_.op(ScalarOpKind::LogicalAnd, {a, b}, DType::Bool) : b;
  }

  /// x[batch, channel, pos * stride + tap * dilation - padding] in type t: the input element
  /// under kernel tap `taps` of the window at output position `pos`; zero in the padding
  /// (where the load reads the clamped edge).
  const Expr *windowElement(const loop::ConvSpec &spec, Buffer *x, const std::vector<SymExpr> &xs,
                            SymExpr batch, SymExpr channel, const Index &pos, const Index &taps,
                            DType t) {
    Index xi{batch, channel};
    const Expr *inside = nullptr;
    for (size_t i = 0; i < pos.size(); ++i) {
      SymExpr at = s_.add(s_.add(s_.mul(pos[i], s_.constant(spec.stride[i])),
                                 s_.mul(taps[i], s_.constant(spec.dilation[i]))),
                          s_.constant(-spec.padding[i]));
      SymExpr size = xs[2 + i];
      if (spec.padding[i] == 0) { // the windows stay inside the input
        xi.push_back(at);
        continue;
      }
      xi.push_back(s_.max(s_.constant(0), s_.min(at, s_.sub(size, s_.constant(1)))));
      inside = conjoin(inside, inRange(at, size));
    }
    if (spec.channelsLast)
      xi = toNhwc(xi);
    const Expr *xv = ex_.cast(ex_.load(x, linearIndex(s_, xi, x->strides)), t);
    return inside ? ex_.op(ScalarOpKind::Where, {inside, xv, ex_.constant(0, t)}, t) : xv;
  }

  /// [first, shape's spatial dims..]: a convolution's reduction extents (a channel count, then
  /// the kernel's or the output gradient's positions).
  static std::vector<SymExpr> withSpatial(SymExpr first, const std::vector<SymExpr> &shape) {
    std::vector<SymExpr> out{first};
    out.insert(out.end(), shape.begin() + 2, shape.end());
    return out;
  }

  /// The input channel that output channel `o` reads at its group's channel `c`.
  SymExpr groupChannel(const loop::ConvSpec &spec, SymExpr o, SymExpr c, SymExpr outChannels,
                       SymExpr perGroupIn) {
    if (spec.groups == 1)
      return c;
    SymExpr perGroupOut = s_.floordiv(outChannels, s_.constant(spec.groups));
    return s_.add(s_.mul(s_.floordiv(o, perGroupOut), perGroupIn), c);
  }

  /// A convolution's weight in memory: cuDNN's NHWC filter layout in channels-last mode on
  /// CUDA, else where it is (row-major where the library needs rows).
  Buffer *convWeight(Node *wn, const loop::ConvSpec &spec) {
    Buffer *w =
        spec.channelsLast && opts_.channelsLastWeights ? channelsLastWeight(wn) : inMemory(wn);
    if (opts_.rowMajorConvolution && !spec.channelsLast &&
        w->strides != contiguousStrides(s_, w->shape))
      w = realize(wn, values_.at(wn), BufferKind::Intermediate, -1, "_rows").buffer;
    return w;
  }

  Value lowerConvolution(Node *n) {
    const AttrMap &a = n->attrs();
    loop::ConvSpec spec = convSpec(n);
    Node *xn = n->operand(0), *wn = n->operand(1);
    Buffer *x = convImage(xn, spec);
    Buffer *w = convWeight(wn, spec);
    spec.input = x;
    spec.weight = w;
    bool bias = a.getBool("bias");
    Buffer *out = p_->addBuffer(bias ? n->name() + "_nobias" : n->name(), n->dtype(),
                                spec.channelsLast ? toNhwc(n->shape()) : n->shape(),
                                BufferKind::Intermediate);
    Index o, r;
    std::vector<SymExpr> vars = freshVars(out->shape, "i", o);
    if (spec.channelsLast)
      o = fromNhwc(o);
    std::vector<SymExpr> rvars = freshVars(withSpatial(wn->shape()[1], wn->shape()), "r", r);
    DType t = computeType(n->dtype());
    SymExpr channel = groupChannel(spec, o[1], r[0], wn->shape()[0], wn->shape()[1]);
    Index pos(o.begin() + 2, o.end()), taps(r.begin() + 1, r.end());
    const Expr *xv = windowElement(spec, x, xn->shape(), o[0], channel, pos, taps, t);
    Index wi{o[1], r[0]};
    wi.insert(wi.end(), taps.begin(), taps.end());
    const Expr *wv = ex_.cast(ex_.load(w, linearIndex(s_, wi, w->strides)), t);
    loop::Computation *c = p_->addComputation(out, vars, rvars, ReduceKind::Sum,
                                              ex_.op(ScalarOpKind::Mul, {xv, wv}, t));
    bool channelsLast = spec.channelsLast;
    c->conv = std::move(spec);
    Value conv = channelsLast ? nhwcValue(out) : bufferValue(out);
    if (!bias) {
      if (channelsLast)
        nhwc_[n] = out;
      return conv;
    }
    const Value &b = operandValue(n, 2);
    return lazy([this, conv, &b, t](const Index &idx) {
      return ex_.op(ScalarOpKind::Add, {conv.load(idx), b.load({idx[1]})}, t);
    });
  }
  /// A weight gradient the decomposer kept (cuDNN's backward-filter convolution): one sum
  /// reduction over the batch and the output positions in the direct form ConvSpec describes,
  /// with the spec attached. In channels-last mode the result has the NHWC filter layout of
  /// the forward's weights (channelsLastWeight).
  Value lowerConvWeightGrad(Node *n) {
    loop::ConvSpec spec = convSpec(n);
    spec.direction = loop::ConvDirectionKind::WeightGrad;
    Node *xn = n->operand(0), *dn = n->operand(1);
    Buffer *x = convImage(xn, spec), *dy = convImage(dn, spec);
    spec.input = x;
    spec.gradOut = dy;
    Buffer *out = p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Intermediate, -1,
                                spec.channelsLast && opts_.channelsLastWeights
                                    ? channelsLastStrides(n->shape())
                                    : contiguousStrides(s_, n->shape()));
    Index o, r;
    std::vector<SymExpr> vars = freshVars(out->shape, "i", o);
    std::vector<SymExpr> rvars = freshVars(withSpatial(dn->shape()[0], dn->shape()), "r", r);
    DType t = computeType(n->dtype());
    SymExpr channel = groupChannel(spec, o[0], o[1], dn->shape()[1], n->shape()[1]);
    Index pos(r.begin() + 1, r.end()), taps(o.begin() + 2, o.end());
    const Expr *xv = windowElement(spec, x, xn->shape(), r[0], channel, pos, taps, t);
    Index di{r[0], o[0]};
    di.insert(di.end(), pos.begin(), pos.end());
    if (spec.channelsLast)
      di = toNhwc(di);
    const Expr *dv = ex_.cast(ex_.load(dy, linearIndex(s_, di, dy->strides)), t);
    loop::Computation *c = p_->addComputation(out, vars, rvars, ReduceKind::Sum,
                                              ex_.op(ScalarOpKind::Mul, {dv, xv}, t));
    c->conv = std::move(spec);
    return bufferValue(out);
  }
  /// An input gradient the decomposer kept (cuDNN's or oneDNN's backward-data convolution):
  /// one sum reduction per input element over its group's output channels and the kernel
  /// taps, each term the output gradient at the window position p with p*stride + k*dilation
  /// - padding = s, where there is one (else zero), with the spec attached. In channels-last
  /// mode the result is an [N, H, W, C] buffer, like a convolution's.
  Value lowerConvInputGrad(Node *n) {
    loop::ConvSpec spec = convSpec(n);
    spec.direction = loop::ConvDirectionKind::InputGrad;
    Node *dn = n->operand(0), *wn = n->operand(1);
    Buffer *dy = convImage(dn, spec);
    Buffer *w = convWeight(wn, spec);
    spec.gradOut = dy;
    spec.weight = w;
    Buffer *out = p_->addBuffer(n->name(), n->dtype(),
                                spec.channelsLast ? toNhwc(n->shape()) : n->shape(),
                                BufferKind::Intermediate);
    Index o, r;
    std::vector<SymExpr> vars = freshVars(out->shape, "i", o);
    if (spec.channelsLast)
      o = fromNhwc(o);
    SymExpr perGroupOut = s_.floordiv(wn->shape()[0], s_.constant(spec.groups));
    std::vector<SymExpr> rvars = freshVars(withSpatial(perGroupOut, wn->shape()), "r", r);
    DType t = computeType(n->dtype());
    SymExpr perGroupIn = wn->shape()[1], channel = o[1], outChannel = r[0];
    if (spec.groups > 1) {
      SymExpr group = s_.floordiv(o[1], perGroupIn);
      channel = s_.mod(o[1], perGroupIn);
      outChannel = s_.add(s_.mul(group, perGroupOut), r[0]);
    }
    Index di{o[0], outChannel}, wi{outChannel, channel};
    const Expr *inside = nullptr;
    for (size_t i = 0; i < spec.stride.size(); ++i) {
      // The window position p of input position s under tap k: p * stride = s + padding - k *
      // dilation, when that is a multiple of the stride in [0, P * stride).
      SymExpr tap = r[1 + i], windows = dn->shape()[2 + i];
      SymExpr at = s_.add(s_.add(o[2 + i], s_.constant(spec.padding[i])),
                          s_.mul(tap, s_.constant(-spec.dilation[i])));
      SymExpr stride = s_.constant(spec.stride[i]);
      SymExpr clamped = s_.max(s_.constant(0), s_.min(at, s_.sub(s_.mul(windows, stride),
                                                                  s_.constant(1))));
      di.push_back(s_.floordiv(clamped, stride));
      wi.push_back(tap);
      inside = conjoin(inside, inRange(at, s_.mul(windows, stride)));
      if (spec.stride[i] > 1)
        inside = conjoin(inside, ex_.op(ScalarOpKind::Eq,
                                        {ex_.indexValue(s_.mod(clamped, stride), DType::Int64),
                                         ex_.constant(0, DType::Int64)},
                                        DType::Bool));
    }
    if (spec.channelsLast)
      di = toNhwc(di);
    const Expr *dv = ex_.cast(ex_.load(dy, linearIndex(s_, di, dy->strides)), t);
    dv = ex_.op(ScalarOpKind::Where, {inside, dv, ex_.constant(0, t)}, t);
    const Expr *wv = ex_.cast(ex_.load(w, linearIndex(s_, wi, w->strides)), t);
    loop::Computation *c = p_->addComputation(out, vars, rvars, ReduceKind::Sum,
                                              ex_.op(ScalarOpKind::Mul, {dv, wv}, t));
    c->conv = std::move(spec);
    if (c->conv->channelsLast) {
      nhwc_[n] = out;
      return nhwcValue(out);
    }
    return bufferValue(out);
  }



  /// n's values as a strided view of a buffer (one stride per dim, 0 along unit dims): read in
  /// place when n is a buffer, or a view of one at an index affine in n's indices (a permuted
  /// or sliced projection), with a unit last stride when `unitLast`; otherwise realized
  /// row-major first.
  loop::AttentionOperand stridedOperand(Node *n, bool unitLast) {
    auto withUnitDims = [&](loop::AttentionOperand o) { // a unit dim: 0 (1 when it is last)
      for (size_t i = 0; i < o.strides.size(); ++i)
        if (n->shape()[i]->isConst(1))
          o.strides[i] = s_.constant(i + 1 == o.strides.size() ? 1 : 0);
      return o;
    };
    Value &v = values_.at(n);
    Index full;
    std::vector<SymExpr> vars;
    if (const Expr *e = plainLoad(n, v, full, vars)) {
      if (auto form = sym::affineIn(s_, e->index(), vars)) {
        loop::AttentionOperand o{e->buffer(), form->base, n->shape(), {}};
        size_t next = 0;
        for (SymExpr d : full)
          o.strides.push_back(d->isConst(0) ? s_.constant(0) : form->coef[next++]);
        o = withUnitDims(std::move(o));
        if (!unitLast || o.strides.back()->isConst(1))
          return o;
      }
    }
    Buffer *b = inMemory(n);
    if (b->strides != contiguousStrides(s_, b->shape))
      b = realize(n, v, BufferKind::Intermediate, -1, "_rows").buffer;
    return withUnitDims({b, s_.constant(0), n->shape(), b->strides});
  }

  /// LoweringOptions::permutedAttentionOutput: the strides that make the one permutation all
  /// of n's readers apply to it row-major; for a graph output, the dense strides with a unit
  /// last stride the caller takes it in (memory-efficient attention returns [B, M, H, K]
  /// memory), written in place rather than copied; else empty (row-major).
  std::vector<SymExpr> attentionOutputStrides(Node *n) {
    if (!opts_.permutedAttentionOutput)
      return {};
    // Strided rows need static sizes (loop::stridedRows): symbolic ones stay row-major.
    for (SymExpr d : n->shape())
      if (!d->isConst())
        return {};
    const std::vector<Node *> &outs = g_.outputs();
    if (auto at = std::find(outs.begin(), outs.end(), n); at != outs.end()) {
      const std::vector<SymExpr> &want = g_.outputStrides(static_cast<size_t>(at - outs.begin()));
      if (std::find(at + 1, outs.end(), n) == outs.end() && !want.empty() &&
          want.back()->isConst(1) && loop::denseLayout(s_, n->shape(), want))
        return want;
      return {};
    }
    // A grouped attention's result [.., G, R, S, D] (grouped-attention) is read through one
    // reshape that merges G and R back into the heads: its strides are the merged value's,
    // split.
    Node *m = n;
    std::vector<Node *> readers = readersOf(n);
    size_t h = n->rank() >= 4 ? static_cast<size_t>(n->rank()) - 4 : 0;
    bool grouped = readers.size() == 1 && readers[0]->op() == OpKind::Reshape &&
                   n->rank() >= 4 && readers[0]->rank() + 1 == n->rank() &&
                   !isGraphOutput(readers[0]) && mergesDims(n->shape(), readers[0]->shape(), h);
    if (grouped)
      m = readers[0];
    std::optional<IntList> dims;
    for (Node *u : readersOf(m)) {
      if (u->op() != OpKind::Permute || (dims && *dims != u->attrs().getInts("dims")))
        return {};
      dims = u->attrs().getInts("dims");
    }
    size_t rank = m->shape().size();
    if (!dims || dims->size() != rank || dims->back() != static_cast<int64_t>(rank) - 1)
      return {};
    std::vector<SymExpr> strides(rank);
    SymExpr step = s_.constant(1);
    for (size_t i = rank; i-- > 0;) {
      strides[(*dims)[i]] = step;
      step = s_.mul(step, m->shape()[(*dims)[i]]);
    }
    if (grouped)
      strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(h),
                     s_.mul(strides[h], n->shape()[h + 1]));
    return strides;
  }

  /// The nodes that read n, once each, in graph order.
  std::vector<Node *> readersOf(const Node *n) const {
    std::vector<Node *> out;
    for (const auto &u : g_.nodes())
      if (std::find(u->operands().begin(), u->operands().end(), n) != u->operands().end())
        out.push_back(u.get());
    return out;
  }

  /// Whether `to` is `from` with dims h and h + 1 merged into one.
  bool mergesDims(const std::vector<SymExpr> &from, const std::vector<SymExpr> &to, size_t h) {
    for (size_t d = 0; d < to.size(); ++d) {
      SymExpr want = d < h ? from[d] : d == h ? s_.mul(from[h], from[h + 1]) : from[d + 1];
      if (to[d] != want)
        return false;
    }
    return true;
  }

  /// An attention-family op the target fuses: one Computation with the spec and no value,
  /// writing a row-major buffer; the bias broadcasts by zero strides (dims it lacks or has as 1).
  Value lowerAttention(Node *n) {
    const AttrMap &a = n->attrs();
    loop::AttentionSpec spec;
    bool grad = n->op() == OpKind::AttentionGrad, lse = n->op() == OpKind::AttentionLse;
    Node *q = n->operand(grad), *k = n->operand(grad + 1);
    spec.q = stridedOperand(q, true);
    spec.k = stridedOperand(k, true);
    if (!lse)
      spec.v = stridedOperand(n->operand(grad + 2), true);
    if (grad) {
      const std::string &wrt = a.getString("wrt");
      spec.part = wrt == "q" ? loop::AttentionPart::GradQ
                             : wrt == "k" ? loop::AttentionPart::GradK : loop::AttentionPart::GradV;
      spec.dout = stridedOperand(n->operand(0), true);
      spec.out = stridedOperand(n->operand(4), true);
      spec.lse = stridedOperand(n->operand(5), false);
    }
    spec.part = lse ? loop::AttentionPart::Lse : spec.part;
    spec.safe = grad || lse || a.getBool("safe");
    spec.scale = a.getFloat("scale");
    spec.causal = a.getBool("causal");
    if (a.getBool("bias")) {
      Node *bn = n->operands().back();
      loop::AttentionOperand b = stridedOperand(bn, false);
      size_t rank = static_cast<size_t>(q->rank()), lead = rank - static_cast<size_t>(bn->rank());
      std::vector<SymExpr> strides(lead, s_.constant(0));
      for (size_t i = 0; i < b.strides.size(); ++i)
        strides.push_back(bn->shape()[i]->isConst(1) ? s_.constant(0) : b.strides[i]);
      b.strides = std::move(strides);
      b.shape.assign(q->shape().begin(), q->shape().end() - 1);
      b.shape.push_back(k->shape()[rank - 2]);
      spec.bias = std::move(b);
    }
    std::vector<SymExpr> strides;
    if (spec.part == loop::AttentionPart::Output)
      strides = attentionOutputStrides(n);
    Buffer *out = p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Intermediate, -1,
                                std::move(strides));
    Index o;
    p_->addComputation(out, freshVars(out->shape, "i", o), {}, ReduceKind::None, nullptr)
        ->attention = std::move(spec);
    return bufferValue(out);
  }

  /// e with the indirect binding {t, i} on every load whose index uses t; nullptr when t is
  /// used outside load indices (an index value), where a binding cannot reach it, or e has
  /// indirect loads of its own.
  const Expr *bindIndirect(const Expr *e, SymExpr t, const Expr *i,
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
    case loop::ExprKind::Load:
      if (!e->indirect().empty())
        out = nullptr; // an indirect load already: keep to one level of indirection
      else if (uses(e->index()))
        out = ex_.load(e->buffer(), e->index(), {{t, i}});
      break;
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

  /// A gather from a value the realize step did not store (a cheap value computed nowhere else,
  /// log_softmax feeding nll_loss, or a view of a stored one) reads the value's inputs at the
  /// gathered positions instead of realizing the whole value; nullopt when the value's body
  /// cannot take the gathered index (bindIndirect).
  std::optional<Value> gatherInPlace(Node *n, const Value &xv, const Value &index, size_t dim,
                                     SymExpr extent, DType compute) {
    if (xv.buffer)
      return std::nullopt;
    auto build = [this, xv, &index, dim, extent, compute](const Index &idx) -> const Expr * {
      const Expr *i = ex_.cast(index.load(idx), DType::Int64);
      SymExpr t = s_.indexSymbol("t", extent);
      Index in = idx;
      in[dim] = t;
      std::unordered_map<const Expr *, const Expr *> done;
      const Expr *v = bindIndirect(xv.load(in), t, i, done);
      return v ? ex_.cast(v, compute) : nullptr;
    };
    Index probe;
    freshVars(n->shape(), "p", probe);
    if (!build(probe))
      return std::nullopt;
    return lazy(build);
  }

  Value lowerGather(Node *n) {
    Node *xn = n->operand(0);
    const Value &index = operandValue(n, 1);
    std::vector<SymExpr> indexShape = n->operand(1)->shape();
    size_t dim = n->attrs().getInt("dim");
    SymExpr extent = xn->shape()[dim];
    DType compute = computeType(n->dtype());
    if (auto v = gatherInPlace(n, values_.at(xn), index, dim, extent, compute))
      return *v;
    Buffer *src = inMemory(xn);
    return lazy([this, src, &index, indexShape, dim, extent, compute](const Index &idx) {
      const Expr *i = ex_.cast(index.load(idx), DType::Int64);
      SymExpr t = s_.indexSymbol("t", extent);
      Index in = idx;
      in[dim] = t;
      const Expr *v = ex_.load(src, linearIndex(s_, in, src->strides), {{t, i}});
      return ex_.cast(v, compute);
    });
  }

  Graph &g_;
  LoweringOptions opts_;
  std::unique_ptr<loop::LoopProgram> p_;
  sym::SymContext &s_;
  loop::ExprContext &ex_;
  std::unordered_map<const Node *, Value> values_;
  std::unordered_map<const Node *, Buffer *> nhwc_; ///< channels-last copies, by node
  std::unordered_map<const Node *, Buffer *> filters_; ///< convolution weights, NHWC filters
};

} // namespace

std::unique_ptr<loop::LoopProgram> lowerToLoops(Graph &g, const LoweringOptions &opts) {
  BRAZE_CHECK(g.realized()) << "lowerToLoops needs the realize step's decisions (realize)";
  return Lowerer(g, opts).run();
}

} // namespace braze
