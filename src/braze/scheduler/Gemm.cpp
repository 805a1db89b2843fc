#include "braze/scheduler/Gemm.h"

#include "braze/ir/loop/Rewrite.h"

#include <algorithm>
#include <set>
#include <unordered_map>

namespace braze::sched {

namespace {

using loop::Expr;
using loop::ExprKind;
using sym::SymExpr;

using Affine = sym::AffineForm;
using sym::affineIn;

/// x = cast(load of a `storage` buffer) to f32: the load; otherwise nullptr.
const Expr *widenedLoad(const Expr *x, DType storage) {
  if (x->kind() != ExprKind::Op || x->op() != loop::ScalarOpKind::Cast)
    return nullptr;
  const Expr *l = x->operands()[0];
  return l->kind() == ExprKind::Load && l->dtype() == storage ? l : nullptr;
}

bool isCast(const Expr *e) { return e->kind() == ExprKind::Op && e->op() == loop::ScalarOpKind::Cast; }

/// Whether e is 0 (through casts).
bool isZero(const Expr *e) {
  while (isCast(e))
    e = e->operands()[0];
  return e->kind() == ExprKind::Const && e->floatValue() == 0.0;
}

/// Whether f32 value e is exactly a `half` value: a widened half value, a zero, or a choice
/// between such.
bool halfExact(const Expr *e, DType half) {
  if ((isCast(e) && e->operands()[0]->dtype() == half) || isZero(e))
    return true;
  return e->kind() == ExprKind::Op && e->op() == loop::ScalarOpKind::Where &&
         halfExact(e->operands()[1], half) && halfExact(e->operands()[2], half);
}

/// x without round trips through a half dtype that change nothing: cast(cast(y, half), f32)
/// where y is exactly a half value (the rounding a masked_fill of half rows leaves).
const Expr *peelRoundTrips(const Expr *x) {
  while (isCast(x) && x->dtype() == DType::Float32 && isCast(x->operands()[0]) &&
         isHalf(x->operands()[0]->dtype()) &&
         x->operands()[0]->operands()[0]->dtype() == DType::Float32 &&
         halfExact(x->operands()[0]->operands()[0], x->operands()[0]->dtype()))
    x = x->operands()[0]->operands()[0];
  return x;
}

/// x without its wheres against 0 (rows of an operand filled with zeros where a mask holds,
/// each perhaps inside round trips through a half dtype): appends each mask to `masks` and
/// returns the operand under them.
const Expr *maskedOperand(const Expr *x, std::vector<GemmCall::RowMask> &masks) {
  for (x = peelRoundTrips(x); x->kind() == ExprKind::Op && x->op() == loop::ScalarOpKind::Where;
       x = peelRoundTrips(x)) {
    const Expr *c = x->operands()[0], *a = x->operands()[1], *b = x->operands()[2];
    if (isZero(a) && !isZero(b)) {
      masks.push_back({c, true});
      x = b;
    } else if (isZero(b) && !isZero(a)) {
      masks.push_back({c, false});
      x = a;
    } else {
      break;
    }
  }
  return x;
}

/// Whether e reads at an index (or computes an index value) that mentions one of `vars`.
bool movesWith(const Expr *e, const std::vector<SymExpr> &vars) {
  bool moves = false;
  std::vector<const Expr *> todo{e};
  while (!todo.empty() && !moves) {
    const Expr *x = todo.back();
    todo.pop_back();
    if (x->kind() == ExprKind::Load || x->kind() == ExprKind::IndexValue)
      for (SymExpr v : vars)
        moves = moves || (v && sym::mentions(x->index(), v));
    if (x->kind() == ExprKind::Load)
      for (const auto &binding : x->indirect())
        todo.push_back(binding.second);
    for (const Expr *o : x->operands())
      todo.push_back(o);
  }
  return moves;
}

} // namespace

StridedBatch stridedBatch(sym::SymContext &s, const GemmCall &g) {
  StridedBatch r;
  r.outer = g.batchVars.size();
  r.count = s.constant(1);
  r.strideA = r.strideB = r.strideC = s.constant(0);
  r.offA = g.offA, r.offB = g.offB, r.offC = g.offC;
  if (g.batchVars.empty())
    return r;
  auto aa = affineIn(s, g.offA, g.batchVars), ab = affineIn(s, g.offB, g.batchVars),
       ac = affineIn(s, g.offC, g.batchVars);
  if (!aa || !ab || !ac)
    return r;
  size_t last = g.batchVars.size() - 1;
  r.outer = last;
  r.count = g.batchVars[last]->extent();
  r.strideA = aa->coef[last], r.strideB = ab->coef[last], r.strideC = ac->coef[last];
  while (r.outer > 0) {
    size_t i = r.outer - 1;
    if (aa->coef[i] != s.mul(r.strideA, r.count) || ab->coef[i] != s.mul(r.strideB, r.count) ||
        ac->coef[i] != s.mul(r.strideC, r.count))
      break;
    r.count = s.mul(r.count, g.batchVars[i]->extent());
    r.outer = i;
  }
  std::unordered_map<SymExpr, SymExpr> zero;
  for (size_t i = r.outer; i < g.batchVars.size(); ++i)
    zero[g.batchVars[i]] = s.constant(0);
  r.offA = s.substitute(g.offA, zero);
  r.offB = s.substitute(g.offB, zero);
  r.offC = s.substitute(g.offC, zero);
  return r;
}

std::optional<GemmCall> matchGemm(loop::LoopProgram &p, const loop::Computation &c,
                                  bool grouped) {
  sym::SymContext &s = p.sym();
  if (c.reduce != loop::ReduceKind::Sum || c.rvars.size() != 1)
    return std::nullopt;
  const Expr *v = c.value;
  if (v->kind() != ExprKind::Op || v->op() != loop::ScalarOpKind::Mul)
    return std::nullopt;
  const Expr *x = v->operands()[0], *y = v->operands()[1];
  // A grouped product's A may have rows filled with zeros where masks of m hold.
  std::vector<GemmCall::RowMask> maskX, maskY;
  if (grouped) {
    x = maskedOperand(x, maskX);
    y = maskedOperand(y, maskY);
  }
  DType t = v->dtype();
  // f16/bf16 operands are widened to f32 and the sum rounded once when stored, which is what a
  // half-precision GEMM with f32 accumulation computes.
  // Widened operands stored to an f32 C are that product with an f32 result.
  DType storage = t;
  if (t == DType::Float32 && c.out->dtype != t && isHalf(c.out->dtype)) {
    storage = c.out->dtype;
    x = widenedLoad(x, storage);
    y = widenedLoad(y, storage);
    if (!x || !y)
      return std::nullopt;
  } else if (t == DType::Float32 && c.out->dtype == t) {
    for (DType half : {DType::BFloat16, DType::Float16}) {
      const Expr *wx = widenedLoad(x, half), *wy = widenedLoad(y, half);
      if (wx && wy) {
        storage = half;
        x = wx, y = wy;
      }
    }
  }
  DType outDtype = c.out->dtype;
  // A grouped product's B has one indirect index, and its A may have one too (gathered rows).
  auto indirectCount = [](const Expr *e) { return e->kind() == ExprKind::Load ? e->indirect().size() : 0; };
  if ((t != DType::Float32 && t != DType::Float64) || x->kind() != ExprKind::Load ||
      y->kind() != ExprKind::Load || indirectCount(x) > (grouped ? 1u : 0u) ||
      indirectCount(y) > (grouped ? 1u : 0u) ||
      x->dtype() != storage || y->dtype() != storage ||
      (outDtype != storage && outDtype != DType::Float32))
    return std::nullopt;
  // The output's last two dims are m and n; a unit dim has no variable.
  std::vector<size_t> dims = loop::nonUnitDims(*c.out);
  size_t rank = c.out->shape.size();
  if (rank < 2)
    return std::nullopt;
  SymExpr mVar = nullptr, nVar = nullptr;
  GemmCall g;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == rank - 1)
      nVar = c.vars[i];
    else if (dims[i] == rank - 2)
      mVar = c.vars[i];
    else
      g.batchVars.push_back(c.vars[i]);
  }
  SymExpr kVar = c.rvars[0];
  std::vector<SymExpr> mnk;
  for (SymExpr e : {mVar, nVar, kVar})
    mnk.push_back(e ? e : s.constant(0)); // absent: contributes nothing
  std::vector<SymExpr> vars;
  for (SymExpr e : {mVar, nVar, kVar})
    if (e)
      vars.push_back(e);
  auto coefOf = [&](const Affine &a, SymExpr var) {
    for (size_t i = 0; i < vars.size(); ++i)
      if (vars[i] == var)
        return a.coef[i];
    return s.constant(0);
  };
  // In a grouped product, each indirect index (B's group, A's gathered row) is a symbol of its
  // operand's affine index whose value moves with m alone; there are no batch dims.
  auto operandVars = [&](const Expr *e) {
    std::vector<SymExpr> vs = vars;
    if (!e->indirect().empty())
      vs.push_back(e->indirect()[0].first);
    return vs;
  };
  for (const Expr *e : {x, y})
    if (!e->indirect().empty() &&
        (!mVar || !g.batchVars.empty() || movesWith(e->indirect()[0].second, {nVar, kVar})))
      return std::nullopt;
  auto ax = affineIn(s, x->index(), operandVars(x));
  auto ay = affineIn(s, y->index(), operandVars(y));
  auto ac = affineIn(s, loop::storeIndex(s, c), vars);
  if (!ax || !ay || !ac)
    return std::nullopt;
  // A is the operand that does not move with n; B the one that does not move with m.
  const Expr *A = x, *B = y;
  Affine aa = *ax, ab = *ay;
  if (nVar && !coefOf(aa, nVar)->isConst(0)) {
    std::swap(A, B);
    std::swap(aa, ab);
    std::swap(maskX, maskY);
  }
  if (!maskY.empty())
    return std::nullopt; // only A's rows are masked
  for (const GemmCall::RowMask &mask : maskX)
    if (!mVar || movesWith(mask.cond, {nVar, kVar}))
      return std::nullopt; // by m alone
  if ((nVar && !coefOf(aa, nVar)->isConst(0)) || (mVar && !coefOf(ab, mVar)->isConst(0)))
    return std::nullopt;
  if (!A->indirect().empty() && B->indirect().empty())
    return std::nullopt; // gathered rows only in a grouped product
  if (!B->indirect().empty()) {
    g.group = B->indirect()[0].second;
    g.groupSym = B->indirect()[0].first;
    g.groupStride = ab.coef.back();
    g.mVar = mVar;
  }
  if (!maskX.empty() && !g.group)
    return std::nullopt; // masked rows only in a grouped product
  g.rowZero = std::move(maskX);
  if (!A->indirect().empty()) {
    if (!coefOf(aa, mVar)->isConst(0))
      return std::nullopt;
    g.rowOf = A->indirect()[0].second;
    g.rowSym = A->indirect()[0].first;
    g.rowStride = aa.coef.back();
    g.rowStep = coefOf(aa, kVar);
  }
  g.a = A->buffer();
  g.b = B->buffer();
  g.c = c.out;
  g.dtype = storage;
  g.outDtype = outDtype;
  g.m = mVar ? mVar->extent() : s.constant(1);
  g.n = nVar ? nVar->extent() : s.constant(1);
  g.k = kVar->extent();
  // Row-major C: unit stride along n.
  SymExpr cn = coefOf(*ac, nVar), cm = coefOf(*ac, mVar);
  if (nVar && !cn->isConst(1))
    return std::nullopt;
  g.ldc = mVar ? cm : g.n;
  // A[m, k]: unit stride along k (as is) or along m (transposed); gathered rows are copied
  // dense.
  SymExpr am = coefOf(aa, mVar), ak = coefOf(aa, kVar);
  if (g.rowOf) {
    g.transA = false;
    g.lda = g.k;
  } else if (ak->isConst(1)) {
    g.transA = false;
    g.lda = mVar ? am : g.k;
  } else if (!mVar || am->isConst(1)) {
    g.transA = true;
    g.lda = ak;
  } else {
    return std::nullopt;
  }
  // B[k, n]: unit stride along n (as is) or along k (transposed).
  SymExpr bk = coefOf(ab, kVar), bn = coefOf(ab, nVar);
  if (nVar ? bn->isConst(1) : true) {
    g.transB = false;
    g.ldb = bk;
  } else if (bk->isConst(1)) {
    g.transB = true;
    g.ldb = bn;
  } else {
    return std::nullopt;
  }
  g.offA = aa.base;
  g.offB = ab.base;
  g.offC = ac->base;
  return g;
}

namespace {

/// x, or the load under a widening cast of x.
const Expr *unwiden(const Expr *x) {
  if (x->kind() == ExprKind::Op && x->op() == loop::ScalarOpKind::Cast &&
      x->dtype() == DType::Float32)
    return x->operands()[0];
  return x;
}

/// A pattern around the loads of one buffer C in readers' expressions: whether every load of C
/// is inside an instance of it (covers), and the expressions with each instance replaced
/// (rewrite). A subclass says what an instance becomes.
class PatternReads {
public:
  PatternReads(loop::LoopProgram &p, const loop::Buffer *c) : p_(p), c_(c) {}
  virtual ~PatternReads() = default;

  /// Whether every load of C in e is inside the pattern.
  bool covers(const Expr *e) {
    if (auto it = covered_.find(e); it != covered_.end())
      return it->second;
    bool ok = true;
    if (replacement(e)) {
      ok = true;
    } else if (e->kind() == ExprKind::Load && e->buffer() == c_) {
      ok = false;
    } else {
      for (const Expr *o : e->operands())
        ok = ok && covers(o);
      for (const auto &b : e->indirect())
        ok = ok && covers(b.second);
    }
    return covered_[e] = ok;
  }

  const Expr *rewrite(const Expr *e) {
    if (auto it = rewritten_.find(e); it != rewritten_.end())
      return it->second;
    const Expr *out = e;
    if (const Expr *r = replacement(e)) {
      out = r;
    } else if (e->kind() == ExprKind::Op) {
      std::vector<const Expr *> ops;
      for (const Expr *o : e->operands())
        ops.push_back(rewrite(o));
      out = p_.exprs().op(e->op(), ops, e->dtype());
    } else if (e->kind() == ExprKind::Load && !e->indirect().empty()) {
      out = p_.exprs().load(e->buffer(), e->index(), rebind(e));
    }
    return rewritten_[e] = out;
  }

protected:
  /// What e becomes when it is an instance of the pattern; nullptr otherwise.
  virtual const Expr *replacement(const Expr *e) = 0;

  /// A load's indirect bindings, rewritten.
  std::vector<loop::IndirectBinding> rebind(const Expr *load) {
    std::vector<loop::IndirectBinding> bs;
    for (const auto &[sy, v] : load->indirect())
      bs.push_back({sy, rewrite(v)});
    return bs;
  }

  loop::LoopProgram &p_;
  const loop::Buffer *c_;

private:
  std::unordered_map<const Expr *, bool> covered_;
  std::unordered_map<const Expr *, const Expr *> rewritten_;
};

/// Recognizes round(C[idx] + bias[n]) and rewrites it to a load of C (which then includes the
/// bias).
class BiasMatcher : public PatternReads {
public:
  BiasMatcher(loop::LoopProgram &p, const loop::Buffer *c, SymExpr n)
      : PatternReads(p, c), n_(n) {}

  /// The load of C that `e` becomes, when e is the pattern.
  const Expr *match(const Expr *e) {
    const Expr *sum = e;
    if (isHalf(c_->dtype)) {
      if (e->kind() != ExprKind::Op || e->op() != loop::ScalarOpKind::Cast || e->dtype() != c_->dtype)
        return nullptr;
      sum = e->operands()[0];
    } else if (e->dtype() != c_->dtype) {
      return nullptr;
    }
    if (sum->kind() != ExprKind::Op || sum->op() != loop::ScalarOpKind::Add)
      return nullptr;
    for (int first = 0; first < 2; ++first) {
      const Expr *cl = unwiden(sum->operands()[first]), *bl = unwiden(sum->operands()[1 - first]);
      if (cl->kind() != ExprKind::Load || bl->kind() != ExprKind::Load || cl->buffer() != c_ ||
          !cl->indirect().empty() || !bl->indirect().empty() || bl->buffer() == c_ ||
          bl->buffer()->dtype != c_->dtype || bl->buffer()->shape.size() != 1 ||
          bl->buffer()->shape[0] != n_ || !bl->index()->isSymbol() ||
          bl->index()->extent() != n_)
        continue;
      // The bias index is C's column: one step of it is one step along C's row.
      sym::SymContext &s = p_.sym();
      std::unordered_map<SymExpr, SymExpr> next{{bl->index(), s.add(bl->index(), 1)}};
      if (!s.sub(s.substitute(cl->index(), next), cl->index())->isConst(1))
        continue;
      if (bias_ && bias_ != bl->buffer())
        return nullptr;
      bias_ = bl->buffer();
      return cl;
    }
    return nullptr;
  }

  const loop::Buffer *bias() const { return bias_; }

protected:
  const Expr *replacement(const Expr *e) override { return match(e); }

private:
  SymExpr n_;
  const loop::Buffer *bias_ = nullptr;
};

/// The GEMM library always computes g: every size and leading dimension is a constant that
/// passes the layout checks of the generated call.
bool layoutFixed(const GemmCall &g) {
  for (SymExpr e : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
    if (!e->isConst())
      return false;
  int64_t m = g.m->value(), n = g.n->value(), k = g.k->value();
  int64_t lda = g.lda->value(), ldb = g.ldb->value(), ldc = g.ldc->value();
  return k > 0 && m > 0 && n > 0 && lda >= std::max<int64_t>(1, g.transA ? m : k) &&
         ldb >= std::max<int64_t>(1, g.transB ? k : n) && ldc >= std::max<int64_t>(1, n) &&
         g.batchVars.empty() && g.offC->isConst(0);
}

/// Each buffer's readers and writers: positions in the program's computations, in order, each
/// reader once however often it reads.
struct BufferUses {
  std::unordered_map<const loop::Buffer *, std::vector<size_t>> readers, writers;
};
BufferUses bufferUses(const loop::LoopProgram &p) {
  BufferUses u;
  const auto &comps = p.computations();
  for (size_t i = 0; i < comps.size(); ++i) {
    u.writers[comps[i]->out].push_back(i);
    loop::forEachBufferRead(*comps[i], comps[i]->value, [&](const loop::Buffer *b) {
      std::vector<size_t> &r = u.readers[b];
      if (r.empty() || r.back() != i)
        r.push_back(i);
    });
  }
  return u;
}

/// The buffer `c` copies unchanged (its value is a load of that buffer at c's own position,
/// read as its dtype or widened to f32 from a half dtype), or nullptr.
const loop::Buffer *copiedBuffer(loop::LoopProgram &p, const loop::Computation &c) {
  if (!c.value || c.isReduction() || c.conv() || c.attention() || c.scatterAt())
    return nullptr;
  const Expr *ld = unwiden(c.value);
  if (ld != c.value && !isHalf(c.out->dtype))
    return nullptr;
  if (ld->kind() != ExprKind::Load || !ld->indirect().empty() ||
      ld->buffer()->dtype != c.out->dtype || ld->buffer()->shape != c.out->shape)
    return nullptr;
  loop::Computation at; // c's iteration over the copied buffer's layout
  at.out = const_cast<loop::Buffer *>(ld->buffer());
  at.vars = c.vars;
  return ld->index() == loop::storeIndex(p.sym(), at) ? ld->buffer() : nullptr;
}

} // namespace

std::set<int> forwardGemmCopies(loop::LoopProgram &p) {
  std::set<int> copies;
  const auto &comps = p.computations();
  auto [readers, writers] = bufferUses(p);
  for (size_t gi = 0; gi < comps.size(); ++gi) {
    loop::Computation &g = *comps[gi];
    std::optional<GemmCall> call = matchGemm(p, g, /*grouped=*/true);
    const std::vector<size_t> &rs = readers[g.out];
    if (!call || !layoutFixed(*call) || g.out->kind != loop::BufferKind::Intermediate ||
        writers[g.out].size() != 1 || rs.empty() ||
        std::any_of(rs.begin(), rs.end(), [&](size_t r) { return r != rs.front(); }))
      continue;
    loop::Computation &d = *comps[rs.front()];
    // d must be its buffer's only writer but for accumulating scatters after it, which add
    // into whatever d (now the product) wrote.
    const std::vector<size_t> &ws = writers[d.out];
    if (copiedBuffer(p, d) != g.out ||
        std::any_of(ws.begin(), ws.end(), [&](size_t w) {
          return w != rs.front() && (!comps[w]->scatterAt() || w < rs.front());
        }))
      continue;
    loop::Buffer *c = g.out;
    g.out = d.out;
    std::optional<GemmCall> moved = matchGemm(p, g, /*grouped=*/true);
    if (!moved || !layoutFixed(*moved)) {
      g.out = c;
      continue;
    }
    copies.insert(d.id);
  }
  return copies;
}

std::map<int, const loop::Buffer *> absorbGemmBias(loop::LoopProgram &p) {
  std::map<int, const loop::Buffer *> out;
  const auto &comps = p.computations();
  for (size_t ci = 0; ci < comps.size(); ++ci) {
    loop::Computation &c = *comps[ci];
    std::optional<GemmCall> g = matchGemm(p, c);
    if (!g || !layoutFixed(*g) || g->outDtype != g->dtype ||
        c.out->kind != loop::BufferKind::Intermediate)
      continue;
    BiasMatcher m(p, c.out, g->n);
    bool readers = false, ok = true;
    for (size_t di = ci + 1; di < comps.size() && ok; ++di) {
      bool reads = false;
      loop::forEachBufferRead(*comps[di], comps[di]->value,
                              [&](const loop::Buffer *b) { reads |= b == c.out; });
      if (!reads)
        continue;
      readers = true;
      ok = comps[di]->value && m.covers(comps[di]->value);
    }
    if (!readers || !ok || !m.bias())
      continue;
    for (size_t di = ci + 1; di < comps.size(); ++di)
      if (comps[di]->value) // every reader has one (an attention reader is not covered)
        comps[di]->value = m.rewrite(comps[di]->value);
    out[c.id] = m.bias();
  }
  return out;
}

namespace {

/// The loads of one buffer, each directly under a cast to `half` (a rounding), in readers'
/// expressions: whether every load of it is (covers), and the rewrite to a plain load of the
/// buffer once it holds `half` values.
class RoundedReads : public PatternReads {
public:
  RoundedReads(loop::LoopProgram &p, const loop::Buffer *c, DType half)
      : PatternReads(p, c), half_(half) {}

protected:
  /// cast(load of C, half) whose indices do not read C: the load, as C's dtype now has it.
  const Expr *replacement(const Expr *e) override {
    if (!isCast(e) || e->dtype() != half_)
      return nullptr;
    const Expr *l = e->operands()[0];
    if (l->kind() != ExprKind::Load || l->buffer() != c_)
      return nullptr;
    bool readsC = false;
    for (const auto &b : l->indirect())
      loop::forEachLoad(b.second, [&](const Expr *x) { readsC |= x->buffer() == c_; });
    return readsC ? nullptr : p_.exprs().load(c_, l->index(), l->indirect());
  }

private:
  DType half_;
};

} // namespace

void absorbGemmRounding(loop::LoopProgram &p) {
  const auto &comps = p.computations();
  // The computations that read or write each buffer, found once: a rewrite below replaces
  // loads of a product's buffer by loads of the same buffer, so the lists stay true.
  std::unordered_map<const loop::Buffer *, std::vector<loop::Computation *>> touching;
  for (const auto &d : comps) {
    std::vector<loop::Computation *> &w = touching[d->out];
    if (w.empty() || w.back() != d.get())
      w.push_back(d.get());
    loop::forEachBufferRead(*d, d->value, [&](const loop::Buffer *b) {
      std::vector<loop::Computation *> &r = touching[b];
      if (r.empty() || r.back() != d.get())
        r.push_back(d.get());
    });
  }
  for (const auto &cp : comps) {
    loop::Computation &c = *cp;
    std::optional<GemmCall> g = matchGemm(p, c, /*grouped=*/true);
    if (!g || !isHalf(g->dtype) || g->outDtype != DType::Float32 ||
        c.out->kind != loop::BufferKind::Intermediate)
      continue;
    RoundedReads reads(p, c.out, g->dtype);
    std::vector<loop::Computation *> readers;
    bool ok = true;
    for (loop::Computation *d : touching[c.out]) {
      if (d == &c)
        continue;
      ok = ok && d->out != c.out && !d->conv() && !d->attention() && d->value &&
           reads.covers(d->value) && (!d->scatterAt() || reads.covers(d->scatterAt()));
      readers.push_back(d);
    }
    if (!ok || readers.empty())
      continue;
    c.out->dtype = g->dtype;
    for (loop::Computation *d : readers) {
      d->value = reads.rewrite(d->value);
      if (loop::ScatterSpec *scatter = d->scatter())
        scatter->at = reads.rewrite(scatter->at);
    }
  }
}

bool wgmmaGrouped(const GemmCall &g, int computeCapability) {
  return g.group && computeCapability == 90 && g.transB && isHalf(g.dtype) &&
         (g.outDtype == g.dtype || g.outDtype == DType::Float32);
}

std::map<int, const loop::Computation *> pairGemmEpilogues(loop::LoopProgram &p,
                                                           int computeCapability) {
  std::map<int, const loop::Computation *> out;
  sym::SymContext &s = p.sym();
  const auto &comps = p.computations();
  auto [readers, writers] = bufferUses(p);
  for (size_t gi = 0; gi < comps.size(); ++gi) {
    const loop::Computation &g = *comps[gi];
    const loop::Buffer *c = g.out;
    std::optional<GemmCall> call = matchGemm(p, g, /*grouped=*/true);
    if (!call || !wgmmaGrouped(*call, computeCapability) || call->outDtype != call->dtype ||
        !layoutFixed(*call) || call->n->value() % 2 != 0 ||
        c->kind != loop::BufferKind::Intermediate || writers[c].size() != 1 ||
        readers[c].size() != 1 || readers[c].front() <= gi)
      continue;
    const size_t di = readers[c].front();
    const loop::Computation &d = *comps[di];
    const int64_t half = call->n->value() / 2;
    if (!d.value || d.isReduction() || d.conv() || d.attention() || d.scatterAt() ||
        d.vars.size() != 2 || d.vars[0]->extent() != call->m ||
        !d.vars[1]->extent()->isConst(half) || d.out == c || writers[d.out].size() != 1)
      continue;
    // D loads C directly at (m, n) or (m, n + half) of its point, and other buffers at
    // positions that C's values do not choose: the kernel computes D at every point of a tile
    // (rows of other experts too, at an in-range point) and guards only the store.
    const SymExpr at = s.add(s.mul(d.vars[0], call->ldc), d.vars[1]);
    bool ok = true;
    std::set<const loop::Buffer *> reads;
    loop::forEachLoad(d.value, [&](const Expr *e) {
      SymExpr off = s.sub(e->index(), at);
      ok = ok && e->buffer() != d.out &&
           (e->buffer() != c || (e->indirect().empty() && (off->isConst(0) || off->isConst(half))));
      for (const auto &b : e->indirect())
        loop::forEachLoad(b.second, [&](const Expr *x) { ok = ok && x->buffer() != c; });
      reads.insert(e->buffer());
    });
    // D runs in the product's place: nothing between them writes what D reads, or touches D.
    for (size_t i = gi + 1; i < di && ok; ++i) {
      ok = !reads.count(comps[i]->out) && comps[i]->out != d.out;
      loop::forEachBufferRead(*comps[i], comps[i]->value,
                              [&](const loop::Buffer *b) { ok = ok && b != d.out; });
    }
    if (ok)
      out[g.id] = &d;
  }
  return out;
}

} // namespace braze::sched
