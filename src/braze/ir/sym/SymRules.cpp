/// The rewrite rules for floordiv, mod, min and max, and the one rule on sums that undoes a
/// split index ((x // c) * c + x % c == x). Each entry's name is the rule in math; the entry
/// returns the rewritten expression or nullptr when it does not apply. Operands are already in
/// canonical form. tests/cpp/SymTest.cpp proves every rule by evaluating both sides on many
/// small values.
///
/// Both sides need only agree where the left side is defined: there every divisor is nonzero,
/// so a divisor proven >= 0 is > 0.
#include "braze/ir/sym/SymExpr.h"

#include "braze/support/Check.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>

namespace braze::sym {

namespace {

struct Rule {
  const char *name;
  SymKind kind;
  std::function<SymExpr(SymContext &, SymExpr, SymExpr)> apply;
};

std::vector<SymExpr> termsOf(SymExpr e) {
  return e->kind() == SymKind::Add ? e->operands() : std::vector<SymExpr>{e};
}

SymExpr sumOf(SymContext &ctx, const std::vector<SymExpr> &ts) {
  SymExpr r = ctx.constant(0);
  for (SymExpr t : ts)
    r = ctx.add(r, t);
  return r;
}

/// If t == d * q exactly as a polynomial term, returns q; else nullptr.
SymExpr exactQuotient(SymContext &ctx, SymExpr t, SymExpr d) {
  if (t->isConst(0))
    return ctx.constant(0);
  if (d->isConst()) {
    int64_t dv = d->value();
    if (dv == 0)
      return nullptr;
    if (t->isConst())
      return t->value() % dv == 0 ? ctx.constant(t->value() / dv) : nullptr;
    int64_t coef = 1;
    std::vector<SymExpr> fs;
    if (t->kind() == SymKind::Mul) {
      for (SymExpr f : t->operands())
        f->isConst() ? void(coef *= f->value()) : fs.push_back(f);
    } else {
      fs.push_back(t);
    }
    if (coef % dv != 0)
      return nullptr;
    SymExpr q = ctx.constant(coef / dv);
    for (SymExpr f : fs)
      q = ctx.mul(q, f);
    return q;
  }
  // Symbolic divisor: d must be a monomial whose factors all appear in t.
  if (d->kind() == SymKind::Add)
    return nullptr;
  int64_t dc = 1, tc = 1;
  std::vector<SymExpr> df, tf;
  auto split = [](SymExpr e, int64_t &c, std::vector<SymExpr> &fs) {
    if (e->kind() == SymKind::Mul) {
      for (SymExpr f : e->operands())
        f->isConst() ? void(c *= f->value()) : fs.push_back(f);
    } else if (e->isConst()) {
      c = e->value();
    } else {
      fs.push_back(e);
    }
  };
  split(d, dc, df);
  split(t, tc, tf);
  if (dc == 0 || tc % dc != 0)
    return nullptr;
  for (SymExpr f : df) {
    auto it = std::find(tf.begin(), tf.end(), f);
    if (it == tf.end())
      return nullptr;
    tf.erase(it);
  }
  SymExpr q = ctx.constant(tc / dc);
  for (SymExpr f : tf)
    q = ctx.mul(q, f);
  return q;
}

/// If a == d * q exactly as polynomials (as a whole, or term by term), returns q; else nullptr.
SymExpr exactQuotientOfSum(SymContext &ctx, SymExpr a, SymExpr d) {
  if (SymExpr q = exactQuotient(ctx, a, d))
    return q;
  std::vector<SymExpr> qs;
  for (SymExpr t : termsOf(a)) {
    SymExpr qt = exactQuotient(ctx, t, d);
    if (!qt)
      return nullptr;
    qs.push_back(qt);
  }
  return sumOf(ctx, qs);
}

/// d > 0 wherever an expression dividing by d is defined (see the top of this file).
bool provablyPositiveDivisor(SymContext &ctx, SymExpr d) { return ctx.provablyNonNegative(d); }

/// An inclusive upper bound of e where e is defined, or nullptr if none is known.
SymExpr upperBound(SymContext &ctx, SymExpr e) {
  switch (e->kind()) {
  case SymKind::Const:
    return e;
  case SymKind::Symbol:
    return e->role() == SymbolRoleKind::Index ? ctx.sub(e->extent(), ctx.constant(1)) : e;
  case SymKind::FloorDiv: {
    // ub(x // d) = (ub(x) + 1) / d - 1 when d divides ub(x) + 1 exactly, d > 0.
    SymExpr ub = upperBound(ctx, e->lhs());
    if (!ub || !provablyPositiveDivisor(ctx, e->rhs()))
      return nullptr;
    SymExpr q = exactQuotientOfSum(ctx, ctx.add(ub, ctx.constant(1)), e->rhs());
    return q ? ctx.sub(q, ctx.constant(1)) : nullptr;
  }
  case SymKind::Mod:
    // ub(x % d) = d - 1 for d > 0.
    return provablyPositiveDivisor(ctx, e->rhs()) ? ctx.sub(e->rhs(), ctx.constant(1)) : nullptr;
  case SymKind::Add: {
    SymExpr r = ctx.constant(0);
    for (SymExpr t : e->operands()) {
      int64_t coef = 1;
      SymExpr body = t;
      if (t->kind() == SymKind::Mul && t->operands()[0]->isConst() && t->operands().size() == 2) {
        coef = t->operands()[0]->value();
        body = t->operands()[1];
      }
      if (coef < 0)
        return nullptr;
      SymExpr ub = upperBound(ctx, body);
      if (!ub)
        return nullptr;
      r = ctx.add(r, ctx.mul(ctx.constant(coef), ub));
    }
    return r;
  }
  case SymKind::Mul:
  case SymKind::Min:
  case SymKind::Max:
    return ctx.provablyNonNegative(e) && e->kind() == SymKind::Min
               ? upperBound(ctx, e->lhs())
               : nullptr;
  }
  return nullptr;
}

/// 0 <= e < d, proven.
bool provablyInRange(SymContext &ctx, SymExpr e, SymExpr d) {
  if (!ctx.provablyNonNegative(e))
    return false;
  if (ctx.provablyLess(e, d))
    return true;
  SymExpr ub = upperBound(ctx, e);
  return ub && ctx.provablyLess(ub, d);
}

/// Splits a sum into the terms that are exact multiples of d (returned as their quotients)
/// and the rest.
void splitMultiples(SymContext &ctx, SymExpr a, SymExpr d, std::vector<SymExpr> &quotients,
                    std::vector<SymExpr> &rest) {
  for (SymExpr t : termsOf(a)) {
    if (SymExpr q = exactQuotient(ctx, t, d))
      quotients.push_back(q);
    else
      rest.push_back(t);
  }
}

/// The constant factor of a polynomial term (a constant term is its own factor).
int64_t coefficientOf(SymExpr t) {
  if (t->isConst())
    return t->value();
  int64_t c = 1;
  if (t->kind() == SymKind::Mul)
    for (SymExpr f : t->operands())
      if (f->isConst())
        c *= f->value();
  return c;
}

/// a == c*q + r with 0 <= r < c proven, for a constant divisor D == c*m (c > 1).
struct BelowFactor {
  SymExpr c, q, r, m;
};

/// The split of a sum `a` against a constant divisor D > 1: the terms whose constant factors c
/// divides (their quotients summed in q) and the rest (r). The candidates for c are gcd(D,
/// factor) of each term, largest first; nullopt when none works.
std::optional<BelowFactor> splitBelowFactor(SymContext &ctx, SymExpr a, SymExpr d) {
  if (!d->isConst() || d->value() <= 1 || a->kind() != SymKind::Add)
    return std::nullopt;
  int64_t dv = d->value();
  std::vector<int64_t> candidates;
  for (SymExpr t : termsOf(a)) {
    int64_t g = std::gcd(dv, coefficientOf(t));
    if (g > 1 && std::find(candidates.begin(), candidates.end(), g) == candidates.end())
      candidates.push_back(g);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (int64_t cand : candidates) {
    std::vector<SymExpr> qs, rest;
    splitMultiples(ctx, a, ctx.constant(cand), qs, rest);
    if (qs.empty() || rest.empty())
      continue;
    SymExpr r = sumOf(ctx, rest);
    if (provablyInRange(ctx, r, ctx.constant(cand)))
      return BelowFactor{ctx.constant(cand), sumOf(ctx, qs), r, ctx.constant(dv / cand)};
  }
  return std::nullopt;
}

const std::vector<Rule> &rules() {
  static const std::vector<Rule> table = {
      // ---- floordiv -------------------------------------------------------------------
      {"c0 // c1 -> fold", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         if (a->isConst() && b->isConst() && b->value() != 0)
           return ctx.constant(floorDiv(a->value(), b->value()));
         return nullptr;
       }},
      {"0 // y -> 0", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr) -> SymExpr { return a->isConst(0) ? a : nullptr; }},
      {"x // 1 -> x", SymKind::FloorDiv,
       [](SymContext &, SymExpr a, SymExpr b) -> SymExpr { return b->isConst(1) ? a : nullptr; }},
      {"x // x -> 1", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         return a == b ? ctx.constant(1) : nullptr;
       }},
      {"x // y -> 0 (0 <= x < y)", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         return provablyInRange(ctx, a, b) ? ctx.constant(0) : nullptr;
       }},
      {"(y*q + r) // y -> q + r // y", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         std::vector<SymExpr> qs, rest;
         splitMultiples(ctx, a, b, qs, rest);
         if (qs.empty())
           return nullptr;
         SymExpr r = sumOf(ctx, rest);
         return ctx.add(sumOf(ctx, qs), ctx.floordiv(r, b));
       }},
      {"(c*q + r) // (c*m) -> q // m (0 <= r < c)", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         std::optional<BelowFactor> s = splitBelowFactor(ctx, a, b);
         return s ? ctx.floordiv(s->q, s->m) : nullptr;
       }},
      {"(x // y) // z -> x // (y*z) (y, z > 0)", SymKind::FloorDiv,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         if (a->kind() == SymKind::FloorDiv && provablyPositiveDivisor(ctx, a->rhs()) &&
             provablyPositiveDivisor(ctx, b))
           return ctx.floordiv(a->lhs(), ctx.mul(a->rhs(), b));
         return nullptr;
       }},
      // ---- mod ------------------------------------------------------------------------
      {"c0 % c1 -> fold", SymKind::Mod,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         if (a->isConst() && b->isConst() && b->value() != 0)
           return ctx.constant(floorMod(a->value(), b->value()));
         return nullptr;
       }},
      {"0 % y -> 0", SymKind::Mod,
       [](SymContext &ctx, SymExpr a, SymExpr) -> SymExpr { return a->isConst(0) ? a : nullptr; }},
      {"x % 1 -> 0", SymKind::Mod,
       [](SymContext &ctx, SymExpr, SymExpr b) -> SymExpr {
         return b->isConst(1) || b->isConst(-1) ? ctx.constant(0) : nullptr;
       }},
      {"x % y -> x (0 <= x < y)", SymKind::Mod,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         return provablyInRange(ctx, a, b) ? a : nullptr;
       }},
      {"(y*q + r) % y -> r % y", SymKind::Mod,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         std::vector<SymExpr> qs, rest;
         splitMultiples(ctx, a, b, qs, rest);
         if (qs.empty())
           return nullptr;
         return ctx.mod(sumOf(ctx, rest), b);
       }},
      {"(c*q + r) % (c*m) -> c*(q % m) + r (0 <= r < c)", SymKind::Mod,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         std::optional<BelowFactor> s = splitBelowFactor(ctx, a, b);
         return s ? ctx.add(ctx.mul(s->c, ctx.mod(s->q, s->m)), s->r) : nullptr;
       }},
      {"(x % (y*q)) % y -> x % y", SymKind::Mod,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         if (a->kind() == SymKind::Mod && exactQuotientOfSum(ctx, a->rhs(), b))
           return ctx.mod(a->lhs(), b);
         return nullptr;
       }},
      // ---- min / max ------------------------------------------------------------------
      {"min(c0, c1) -> fold", SymKind::Min,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         return a->isConst() && b->isConst() ? ctx.constant(std::min(a->value(), b->value()))
                                             : nullptr;
       }},
      {"max(c0, c1) -> fold", SymKind::Max,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         return a->isConst() && b->isConst() ? ctx.constant(std::max(a->value(), b->value()))
                                             : nullptr;
       }},
      {"min(x, y) -> x (x <= y)", SymKind::Min,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         if (ctx.provablyNonNegative(ctx.sub(b, a)))
           return a;
         if (ctx.provablyNonNegative(ctx.sub(a, b)))
           return b;
         return nullptr;
       }},
      {"max(x, y) -> y (x <= y)", SymKind::Max,
       [](SymContext &ctx, SymExpr a, SymExpr b) -> SymExpr {
         if (ctx.provablyNonNegative(ctx.sub(b, a)))
           return b;
         if (ctx.provablyNonNegative(ctx.sub(a, b)))
           return a;
         return nullptr;
       }},
  };
  return table;
}

} // namespace

SymExpr applySymRules(SymContext &ctx, SymKind kind, SymExpr a, SymExpr b) {
  for (const Rule &r : rules()) {
    if (r.kind != kind)
      continue;
    if (SymExpr out = r.apply(ctx, a, b))
      return out;
  }
  // No rule applies: the canonical raw node (min/max operands ordered).
  if ((kind == SymKind::Min || kind == SymKind::Max) && compareSym(b, a) < 0)
    std::swap(a, b);
  return ctx.makeRaw(kind, {a, b});
}

std::vector<std::string> symRuleNames() {
  std::vector<std::string> names;
  for (const Rule &r : rules())
    names.push_back(r.name);
  return names;
}

} // namespace braze::sym
