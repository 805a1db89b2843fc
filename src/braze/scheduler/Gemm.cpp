#include "braze/scheduler/Gemm.h"

#include <unordered_map>

namespace braze::sched {

namespace {

using loop::Expr;
using loop::ExprKind;
using sym::SymExpr;

/// e = base + sum(coef[v] * v) over `vars`, with base and coefficients free of them.
struct Affine {
  SymExpr base = nullptr;
  std::vector<SymExpr> coef;
};

std::optional<Affine> affineIn(sym::SymContext &s, SymExpr e, const std::vector<SymExpr> &vars) {
  std::unordered_map<SymExpr, SymExpr> zero;
  for (SymExpr v : vars)
    zero[v] = s.constant(0);
  Affine a;
  a.base = s.substitute(e, zero);
  SymExpr rebuilt = a.base;
  for (SymExpr v : vars) {
    std::unordered_map<SymExpr, SymExpr> one = zero;
    one[v] = s.constant(1);
    SymExpr c = s.sub(s.substitute(e, one), a.base);
    std::vector<SymExpr> syms;
    sym::collectSymbols(c, syms);
    for (SymExpr x : syms)
      for (SymExpr v2 : vars)
        if (x == v2)
          return std::nullopt;
    a.coef.push_back(c);
    rebuilt = s.add(rebuilt, s.mul(c, v));
  }
  if (rebuilt != e) // a product of loop variables, a floordiv, ...
    return std::nullopt;
  return a;
}

} // namespace

std::optional<GemmCall> matchGemm(loop::LoopProgram &p, const loop::Computation &c) {
  sym::SymContext &s = p.sym();
  if (c.reduce != loop::ReduceKind::Sum || c.rvars.size() != 1)
    return std::nullopt;
  const Expr *v = c.value;
  if (v->kind() != ExprKind::Op || v->op() != loop::ScalarOpKind::Mul)
    return std::nullopt;
  const Expr *x = v->operands()[0], *y = v->operands()[1];
  DType t = v->dtype();
  if ((t != DType::Float32 && t != DType::Float64) || x->kind() != ExprKind::Load ||
      y->kind() != ExprKind::Load || !x->indirect().empty() || !y->indirect().empty() ||
      x->dtype() != t || y->dtype() != t || c.out->dtype != t)
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
  auto ax = affineIn(s, x->index(), vars), ay = affineIn(s, y->index(), vars);
  auto ac = affineIn(s, loop::storeIndex(s, c), vars);
  if (!ax || !ay || !ac)
    return std::nullopt;
  // A is the operand that does not move with n; B the one that does not move with m.
  const Expr *A = x, *B = y;
  Affine aa = *ax, ab = *ay;
  if (nVar && !coefOf(aa, nVar)->isConst(0)) {
    std::swap(A, B);
    std::swap(aa, ab);
  }
  if ((nVar && !coefOf(aa, nVar)->isConst(0)) || (mVar && !coefOf(ab, mVar)->isConst(0)))
    return std::nullopt;
  g.a = A->buffer();
  g.b = B->buffer();
  g.c = c.out;
  g.dtype = t;
  g.m = mVar ? mVar->extent() : s.constant(1);
  g.n = nVar ? nVar->extent() : s.constant(1);
  g.k = kVar->extent();
  // Row-major C: unit stride along n.
  SymExpr cn = coefOf(*ac, nVar), cm = coefOf(*ac, mVar);
  if (nVar && !cn->isConst(1))
    return std::nullopt;
  g.ldc = mVar ? cm : g.n;
  // A[m, k]: unit stride along k (as is) or along m (transposed).
  SymExpr am = coefOf(aa, mVar), ak = coefOf(aa, kVar);
  if (ak->isConst(1)) {
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

} // namespace braze::sched
