#include "braze/ir/loop/LoopIR.h"

#include "braze/ir/loop/LoopText.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_set>

namespace braze::loop {

namespace {

/// Ops whose result is bool whatever their operand type (comparisons, predicates, logic).
bool isPredicate(ScalarOpKind k) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (k == ScalarOpKind::E)                                                    \
    return std::string_view(#result) == "bool";
#include "braze/ir/types/ElementwiseOps.def"
  return false;
}

std::string dt(DType t) { return std::string(dtypeName(t)); }

std::string quoted(const std::string &s) { return std::string(1, '\'').append(s).append("'"); }

std::string symsText(const std::vector<SymExpr> &xs) {
  std::string s = "[";
  for (size_t i = 0; i < xs.size(); ++i)
    s += (i ? ", " : "") + sym::toString(xs[i]);
  return s + "]";
}

/// Walks the program in execution order; the first violation is kept in error_.
/// Whether b's layout is a row-major layout of its dims in some order that keeps the last dim
/// innermost (contiguous rows that never overlap; a permuted [B, S, H, D] view of
/// [B, H, S, D]). False for symbolic sizes or strides.
bool stridedRows(const Buffer &b) {
  size_t rank = b.shape.size();
  std::vector<size_t> order; // dims by decreasing stride, unit dims left out
  for (size_t i = 0; i < rank; ++i) {
    if (b.shape[i]->isConst(1))
      continue;
    if (!b.shape[i]->isConst() || !b.strides[i]->isConst())
      return false;
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return b.strides[x]->value() > b.strides[y]->value();
  });
  if (!order.empty() && order.back() != rank - 1 && !b.shape[rank - 1]->isConst(1))
    return false;
  int64_t step = 1;
  for (size_t k = order.size(); k-- > 0;) {
    if (b.strides[order[k]]->value() != step ||
        __builtin_mul_overflow(step, b.shape[order[k]]->value(), &step))
      return false;
  }
  return true;
}

class ProgramVerifier {
public:
  explicit ProgramVerifier(const LoopProgram &p) : p_(p), ctx_(*p.symShared()) {}

  std::string run() {
    if (!checkSizes() || !checkBuffers())
      return error_;
    std::set<const Buffer *> written;
    std::map<const Buffer *, int> outputWrites;
    for (const Buffer *b : p_.inputs())
      written.insert(b);
    for (const auto &c : p_.computations()) {
      comp_ = c.get();
      if (!checkComputation(written))
        return error_;
      written.insert(c->out);
      if (c->out->kind == BufferKind::Output && !c->scatterAt() && ++outputWrites[c->out] > 1)
        return where() + "output %" + c->out->name + " is written more than once";
    }
    for (const Buffer *b : p_.outputs())
      if (!outputWrites.count(b))
        return "output %" + b->name + " is never written";
    return "";
  }

private:
  std::string where() const {
    return "compute " + std::to_string(comp_->id) + " (%" +
           (comp_->out ? comp_->out->name : std::string("<null>")) + "): ";
  }

  bool fail(const std::string &message) {
    error_ = message;
    return false;
  }

  bool failHere(const std::string &message) { return fail(where() + message); }

  bool checkSizes() {
    std::set<std::string> hints;
    for (SymExpr s : p_.sizeSymbols()) {
      if (!s->isSymbol() || s->role() != sym::SymbolRoleKind::Size)
        return fail(quoted(sym::toString(s)) + " in the program's sizes is not a size symbol");
      if (!hints.insert(s->name()).second)
        return fail("two size symbols are named '" + s->name() + "'");
      sizes_.insert(s);
    }
    return true;
  }

  /// Every symbol in e is in `scope` or is a program size symbol.
  bool checkSymbols(SymExpr e, const std::unordered_set<SymExpr> &scope,
                    const std::string &what) {
    std::vector<SymExpr> syms;
    sym::collectSymbols(e, syms);
    for (SymExpr s : syms)
      if (!scope.count(s) && !sizes_.count(s))
        return fail(what + " uses '" + s->name() + "', which is " +
                    (s->role() == sym::SymbolRoleKind::Size
                         ? std::string("not one of the program's sizes")
                         : std::string("not an index of this computation")));
    return true;
  }

  bool checkBuffers() {
    std::set<std::string> names;
    std::set<std::pair<BufferKind, int>> slots;
    for (const auto &b : p_.buffers()) {
      buffers_.insert(b.get());
      std::string what = "buffer %" + b->name;
      if (!names.insert(b->name).second)
        return fail("two buffers are named %" + b->name);
      if (b->strides.size() != b->shape.size())
        return fail(what + " has rank " + std::to_string(b->shape.size()) + " but " +
                    std::to_string(b->strides.size()) + " strides");
      if (b->kind != BufferKind::Intermediate && b->ioIndex < 0)
        return fail(what + " is an " + std::string(bufferKindName(b->kind)) +
                    " without an io index");
      if (b->kind != BufferKind::Intermediate && !slots.insert({b->kind, b->ioIndex}).second)
        return fail(what + ": another " + std::string(bufferKindName(b->kind)) +
                    " has io index " + std::to_string(b->ioIndex));
      for (const auto *xs : {&b->shape, &b->strides, &b->callerShape, &b->callerStrides})
        for (SymExpr e : *xs)
          if (!checkSymbols(e, {}, what))
            return false;
      if (!b->callerShape.empty() && !checkCallerLayout(*b, what))
        return false;
    }
    return true;
  }

  /// An input or output seen by its caller in another shape: the same elements, both layouts
  /// dense.
  bool checkCallerLayout(const Buffer &b, const std::string &what) {
    if (b.kind == BufferKind::Intermediate)
      return fail(what + " is an intermediate with a caller's shape; only an input or an output "
                         "has one");
    if (b.callerStrides.size() != b.callerShape.size())
      return fail(what + " has a caller's shape of rank " + std::to_string(b.callerShape.size()) +
                  " but " + std::to_string(b.callerStrides.size()) + " strides");
    if (ctx_.product(b.callerShape) != ctx_.product(b.shape))
      return fail(what + " has " + sym::toString(ctx_.product(b.shape)) +
                  " elements but its caller's shape " + symsText(b.callerShape) + " has " +
                  sym::toString(ctx_.product(b.callerShape)));
    if (!denseLayout(ctx_, b.shape, b.strides) ||
        !denseLayout(ctx_, b.callerShape, b.callerStrides))
      return fail(what + " is seen by its caller as " + symsText(b.callerShape) + " strides " +
                  symsText(b.callerStrides) + " over " + symsText(b.shape) + " strides " +
                  symsText(b.strides) + "; both must cover their elements once, without gaps");
    return true;
  }

  bool checkComputation(const std::set<const Buffer *> &written) {
    const Computation &c = *comp_;
    if (!c.out || !buffers_.count(c.out))
      return failHere("writes a buffer that is not in the program");
    if (c.out->kind == BufferKind::Input)
      return failHere("writes input %" + c.out->name);
    if (c.isReduction() && c.rvars.empty())
      return failHere("is a " + std::string(reduceKindName(c.reduce)) +
                      " reduction without reduction indices");
    if (!c.isReduction() && !c.rvars.empty())
      return failHere("is pointwise but has reduction indices");
    if (c.attention() && (c.value || c.isReduction() || c.conv()))
      return failHere("is an attention and has a value, a reduction or a convolution");
    if (!c.value && !c.attention())
      return failHere("has no value");
    // Index symbols: fresh, distinct, with extents over sizes and earlier indices.
    std::unordered_set<SymExpr> scope;
    std::set<std::string> &hints = hints_;
    hints.clear();
    for (SymExpr s : p_.sizeSymbols())
      hints.insert(s->name());
    for (const auto *list : {&c.vars, &c.rvars})
      for (SymExpr v : *list) {
        if (!v->isSymbol() || v->role() != sym::SymbolRoleKind::Index || !v->extent())
          return failHere(quoted(sym::toString(v)) + " is not an index symbol");
        if (!hints.insert(v->name()).second)
          return failHere("index '" + v->name() + "' has the name of another symbol in scope");
        if (!checkSymbols(v->extent(), scope, where() + "extent of " + v->name()))
          return false;
        scope.insert(v);
      }
    SymExpr space = ctx_.product(c.extents());
    if (!c.scatterAt() && space != ctx_.product(c.out->shape))
      return failHere("iteration space " + symsText(c.extents()) +
                      " does not cover buffer shape " + symsText(c.out->shape));

    std::vector<const Expr *> order = exprPostOrder({c.value, c.scatterAt()});
    for (size_t i = 0; i < order.size(); ++i)
      if (!checkExpr(order[i], std::string("%").append(std::to_string(i)), scope, written))
        return false;
    if (c.scatterAt())
      return checkScatter(c, written);
    if (c.attention())
      return checkAttention(*c.attention(), written);
    return !c.conv() || checkConv(*c.conv(), order);
  }

  /// An accumulating scatter combines (add, prod, max or min) into values an earlier
  /// computation wrote, at an integer position, one value per point (no reduction,
  /// convolution or attention of its own), in a buffer of f32, f64, i32 or i64; an add also
  /// into f16 or bf16 (rounded after each value).
  bool checkScatter(const Computation &c, const std::set<const Buffer *> &written) {
    if (c.isReduction() || c.conv() || c.attention())
      return failHere("is a scatter and a reduction, a convolution or an attention");
    ReduceKind k = c.scatterCombine();
    if (k != ReduceKind::Sum && k != ReduceKind::Prod && k != ReduceKind::Max &&
        k != ReduceKind::Min)
      return failHere("scatters by " + std::string(reduceKindName(k)) +
                      "; a scatter combines by add, prod, max or min");
    DType t = c.out->dtype;
    bool half = t == DType::Float16 || t == DType::BFloat16;
    if (t != DType::Float32 && t != DType::Float64 && t != DType::Int32 && t != DType::Int64 &&
        !(half && k == ReduceKind::Sum))
      return failHere("scatters into %" + c.out->name + " of " + dt(t) +
                      "; a scatter's buffer is f32, f64, i32 or i64 (f16 or bf16 for add)");
    if (!written.count(c.out))
      return failHere("scatters into %" + c.out->name + " before anything writes it");
    if (!isIntegral(c.scatterAt()->dtype()))
      return failHere("scatters at a position of type " + dt(c.scatterAt()->dtype()) +
                      "; positions are integers");
    return true;
  }

  /// An attention's operands: written buffers of q's floating dtype (the bias and the
  /// log-sum-exp may be any floating dtype), one stride per logical dim and unit last strides
  /// for q, k, v, dout and out; the logical shapes q [B.., Sq, D], k [B.., Sk, D],
  /// v [B.., Sk, Dv], dout and out [B.., Sq, Dv], lse [B.., Sq] agree with the part's row-major
  /// output (the buffers' own shapes may differ: an operand may be a strided view of its
  /// buffer); a dropout's seed is an i64 scalar.
  bool checkAttention(const AttentionSpec &a, const std::set<const Buffer *> &written) {
    const Computation &c = *comp_;
    // The operands' rank, from the output's: the log-sum-exp drops the last dim.
    size_t rank = c.out->shape.size() + (a.part == AttentionPart::Lse ? 1 : 0);
    if (rank < 2)
      return failHere("attention operands must have rank 2 or more");
    SymExpr step = ctx_.constant(1);
    bool rowMajor = true;
    for (size_t i = c.out->shape.size(); i-- > 0;) {
      rowMajor &= c.out->shape[i]->isConst(1) || c.out->strides[i] == step;
      step = ctx_.mul(step, c.out->shape[i]);
    }
    // The output part writes rows with a stride (a permuted layout); its other parts and the
    // gradients write row-major.
    if (!rowMajor && (a.part != AttentionPart::Output || !stridedRows(*c.out)))
      return failHere("attention output %" + c.out->name +
                      (a.part == AttentionPart::Output
                           ? " must have a contiguous last dim and non-overlapping rows"
                           : " must be row-major"));
    bool grad = a.part != AttentionPart::Output && a.part != AttentionPart::Lse;
    if ((a.part != AttentionPart::Lse) != (a.v.buffer != nullptr) || grad != a.dout.has_value() ||
        grad != a.out.has_value() || grad != a.lse.has_value())
      return failHere(std::string(attentionPartName(a.part)) + " has the wrong operands");
    DType t = a.q.buffer ? a.q.buffer->dtype : c.out->dtype;
    if (a.part != AttentionPart::Lse && c.out->dtype != t)
      return failHere("attention output %" + c.out->name + " must have q's dtype");
    for (const AttentionOperand *o : a.operands()) {
      const Buffer *b = o->buffer;
      if (!b || !buffers_.count(b) || !written.count(b))
        return failHere("attention operand is not a buffer written before it");
      std::string what = "attention operand %" + b->name;
      if (a.seed && o == &*a.seed) {
        if (b->dtype != DType::Int64 || !o->shape.empty() || !o->offset ||
            a.part == AttentionPart::Lse || !(a.dropout > 0 && a.dropout < 1))
          return failHere("attention seed %" + b->name + " must be an i64 scalar of an output "
                          "or a gradient with a dropout in (0, 1)");
        continue;
      }
      bool free = (a.bias && o == &*a.bias) || (a.lse && o == &*a.lse);
      if (!isFloating(b->dtype) || (!free && b->dtype != t))
        return failHere(what + " is " + dt(b->dtype) + "; q, k, v, dout and out share one "
                        "floating dtype");
      size_t want = a.lse && o == &*a.lse ? rank - 1 : rank;
      if (o->shape.size() != want || o->strides.size() != want || !o->offset)
        return failHere(what + " needs an offset, " + std::to_string(want) + " sizes and " +
                        std::to_string(want) + " strides");
      if (!free && !o->strides.back()->isConst(1))
        return failHere(what + " must have unit stride along its last dim");
      for (SymExpr e : o->strides)
        if (!checkSymbols(e, {}, where() + "stride of " + what))
          return false;
      if (!checkSymbols(o->offset, {}, where() + "offset of " + what))
        return false;
    }
    const std::vector<SymExpr> &q = a.q.shape, &k = a.k.shape;
    std::vector<SymExpr> rows(q.begin(), q.end() - 1), y = rows, scores = rows;
    scores.push_back(k[rank - 2]);
    bool ok = k[rank - 1] == q[rank - 1];
    for (size_t i = 0; ok && i + 2 < rank; ++i)
      ok = k[i] == q[i];
    if (a.v.buffer) {
      const std::vector<SymExpr> &v = a.v.shape;
      ok = ok && v[rank - 2] == k[rank - 2];
      for (size_t i = 0; ok && i + 2 < rank; ++i)
        ok = v[i] == q[i];
      y.push_back(v[rank - 1]);
    }
    if (ok && grad)
      ok = a.dout->shape == y && a.out->shape == y && a.lse->shape == rows;
    if (ok && a.bias)
      ok = a.bias->shape == scores;
    std::vector<SymExpr> want = a.part == AttentionPart::Output ? y
                                : a.part == AttentionPart::Lse  ? rows
                                : a.part == AttentionPart::GradQ ? q
                                : a.part == AttentionPart::GradK ? k
                                                                 : a.v.shape;
    if (!ok || c.out->shape != want)
      return failHere(std::string(attentionPartName(a.part)) + " shapes do not agree: q " +
                      symsText(q) + ", k " + symsText(k) +
                      (a.v.buffer ? ", v " + symsText(a.v.shape) : "") + ", output " +
                      symsText(c.out->shape));
    if (!std::isfinite(a.scale))
      return failHere("attention scale must be finite");
    return true;
  }

  /// A convolution's buffers, ranks, attribute lengths and ranges, and the output shape its
  /// windows give (see ConvSpec).
  bool checkConv(const ConvSpec &cv, const std::vector<const Expr *> &order) {
    const Computation &c = *comp_;
    if (c.reduce != ReduceKind::Sum)
      return failHere("is a convolution but not a sum reduction");
    const Buffer *unused = cv.direction == ConvDirectionKind::Forward      ? cv.gradOut
                           : cv.direction == ConvDirectionKind::WeightGrad ? cv.weight
                                                                           : cv.input;
    if (unused)
      return failHere(std::string("is a ") + cv.name() + " with a third operand %" +
                      unused->name);
    for (const Buffer *b : cv.operands()) {
      if (!b || !buffers_.count(b))
        return failHere("convolution operand is not a buffer of the program");
      bool read = std::any_of(order.begin(), order.end(), [&](const Expr *e) {
        return e->kind() == ExprKind::Load && e->buffer() == b;
      });
      if (!read)
        return failHere("convolution operand %" + b->name + " is not read by the value");
      if (b->dtype != c.out->dtype || !isFloating(b->dtype))
        return failHere("convolution operand %" + b->name + " is " + dt(b->dtype) +
                        "; input, weight and result must share one floating dtype");
    }
    size_t rank = c.out->shape.size();
    if (rank < 3 || cv.operands()[0]->shape.size() != rank ||
        cv.operands()[1]->shape.size() != rank)
      return failHere("convolution input, weight and result must have one rank of at least 3");
    if (cv.channelsLast && rank != 4)
      return failHere("a channels-last convolution must be 2-d");
    size_t spatial = rank - 2;
    for (const auto *list : {&cv.stride, &cv.padding, &cv.dilation})
      if (list->size() != spatial)
        return failHere("convolution stride, padding and dilation need " +
                        std::to_string(spatial) + " entries each");
    for (size_t i = 0; i < spatial; ++i)
      if (cv.stride[i] < 1 || cv.dilation[i] < 1 || cv.padding[i] < 0)
        return failHere("convolution stride and dilation must be >= 1 and padding >= 0");
    if (cv.groups < 1)
      return failHere("convolution groups must be >= 1");
    // In logical order [N, C, spatial..] (a channels-last buffer is stored [N, H, W, C]).
    const std::vector<SymExpr> x = cv.logical(cv.x(c.out)->shape),
                               y = cv.logical(cv.y(c.out)->shape);
    const std::vector<SymExpr> &w = cv.w(c.out)->shape;
    SymExpr g = ctx_.constant(cv.groups);
    bool ok = y[0] == x[0] && y[1] == w[0] && ctx_.mul(w[1], g) == x[1] &&
              ctx_.mul(ctx_.floordiv(w[0], g), g) == w[0];
    for (size_t i = 0; ok && i < spatial; ++i) {
      // floor((x + 2p - d(k - 1) - 1) / s) + 1
      SymExpr reach = ctx_.add(ctx_.mul(ctx_.constant(cv.dilation[i]), w[2 + i]),
                               ctx_.constant(1 - cv.dilation[i]));
      SymExpr span = ctx_.sub(ctx_.add(x[2 + i], ctx_.mul(ctx_.constant(cv.padding[i]), 2)), reach);
      SymExpr windows = ctx_.add(ctx_.floordiv(span, ctx_.constant(cv.stride[i])), ctx_.constant(1));
      // A weight gradient may sum over the first windows only (ConvSpec).
      ok = y[2 + i] == windows || (cv.direction == ConvDirectionKind::WeightGrad &&
                                   ctx_.provablyNonNegative(ctx_.sub(windows, y[2 + i])));
    }
    if (!ok)
      return failHere("convolution shapes do not agree: input " + symsText(x) + ", weight " +
                      symsText(w) + ", result " + symsText(y));
    return true;
  }

  bool checkExpr(const Expr *e, const std::string &stmt, const std::unordered_set<SymExpr> &scope,
                 const std::set<const Buffer *> &written) {
    switch (e->kind()) {
    case ExprKind::Const:
      return true;
    case ExprKind::IndexValue:
      return checkSymbols(e->index(), scope, where() + stmt + " (index)");
    case ExprKind::Load: {
      std::string what = where() + stmt + " (load)";
      const Buffer *b = e->buffer();
      if (!b || !buffers_.count(b))
        return fail(what + " reads a buffer that is not in the program");
      if (!written.count(b))
        return fail(what + " reads %" + b->name + " before it is written");
      std::unordered_set<SymExpr> inner = scope;
      std::set<std::string> hints = hints_;
      for (const IndirectBinding &bind : e->indirect()) {
        if (!bind.first->isSymbol() || !bind.second)
          return fail(what + " has a malformed indirect binding");
        if (!isIntegral(bind.second->dtype()))
          return fail(what + ": indirect index '" + bind.first->name() + "' is bound to a " +
                      dt(bind.second->dtype()) + " value");
        if (scope.count(bind.first) || sizes_.count(bind.first) ||
            !inner.insert(bind.first).second)
          return fail(what + ": indirect index '" + bind.first->name() + "' is bound twice");
        if (!hints.insert(bind.first->name()).second)
          return fail(what + ": indirect index '" + bind.first->name() +
                      "' has the name of another symbol in scope");
      }
      return checkSymbols(e->index(), inner, what);
    }
    case ExprKind::Op:
      return checkOp(e, where() + stmt + " (" + std::string(scalarOpName(e->op())) + ")");
    }
    return fail(where() + stmt + " has an unknown kind");
  }

  bool checkOp(const Expr *e, const std::string &what) {
    const auto &ops = e->operands();
    if (static_cast<int>(ops.size()) != scalarOpArity(e->op()))
      return fail(what + " has " + std::to_string(ops.size()) + " operands");
    if (e->op() == ScalarOpKind::Cast)
      return true;
    size_t first = 0;
    if (e->op() == ScalarOpKind::Where) {
      if (ops[0]->dtype() != DType::Bool)
        return fail(what + ": condition is " + dt(ops[0]->dtype()) + ", not bool");
      first = 1;
    }
    DType t = ops[first]->dtype();
    for (size_t i = first + 1; i < ops.size(); ++i)
      if (ops[i]->dtype() != t)
        return fail(what + ": operand dtypes " + dt(t) + " and " + dt(ops[i]->dtype()) +
                    " differ");
    DType result = isPredicate(e->op()) ? DType::Bool : t;
    if (e->op() == ScalarOpKind::PhiloxUniform)
      result = DType::Float32; // from integer seed and counter
    if (e->dtype() != result)
      return fail(what + ": result is " + dt(e->dtype()) + " but should be " + dt(result));
    return true;
  }

  const LoopProgram &p_;
  sym::SymContext &ctx_;
  const Computation *comp_ = nullptr;
  std::unordered_set<const Buffer *> buffers_;
  std::unordered_set<SymExpr> sizes_;
  std::set<std::string> hints_; ///< names of the sizes and the current computation's indices
  std::string error_;
};

} // namespace

std::string verifyProgram(const LoopProgram &p) { return ProgramVerifier(p).run(); }

} // namespace braze::loop
