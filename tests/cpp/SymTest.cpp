/// Symbolic integers: canonical form, soundness of every simplification rule (random
/// expressions evaluated as raw trees and as simplified SymExprs), the provers, printing and
/// the parser.
#include "braze/ir/sym/SymExpr.h"
#include "braze/ir/sym/SymParse.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace braze::sym {
/// The rule table's names (SymRules.cpp).
std::vector<std::string> symRuleNames();
} // namespace braze::sym

using namespace braze::sym;

namespace {

using Values = std::unordered_map<SymExpr, int64_t>;

/// Sizes s0, s1, s2 and indices with constant extents (i0 < 4, i3 < 12), a symbolic one
/// (i1 < s1) and a product (i2 < s0*s2).
class SymTest : public ::testing::Test {
protected:
  SymContext ctx;
  SymExpr s0 = ctx.sizeSymbol("s0");
  SymExpr s1 = ctx.sizeSymbol("s1");
  SymExpr s2 = ctx.sizeSymbol("s2");
  SymExpr i0 = ctx.indexSymbol("i0", ctx.constant(4));
  SymExpr i1 = ctx.indexSymbol("i1", s1);
  SymExpr i2 = ctx.indexSymbol("i2", ctx.mul(s0, s2));
  SymExpr i3 = ctx.indexSymbol("i3", ctx.constant(12));
  std::vector<SymExpr> sizes{s0, s1, s2};
  std::vector<SymExpr> indices{i0, i1, i2, i3};

  SymExpr c(int64_t v) { return ctx.constant(v); }
  SymExpr parse(std::string_view text) {
    return parseSym(ctx, text, [&](std::string_view name) -> SymExpr {
      for (SymExpr s : ctx.symbols())
        if (s->name() == name)
          return s;
      return nullptr;
    });
  }
};

// ---- canonical form -----------------------------------------------------------------------

TEST_F(SymTest, SumsAndProductsAreCanonical) {
  EXPECT_EQ(ctx.add(s0, s1), ctx.add(s1, s0));
  EXPECT_EQ(ctx.mul(s0, s1), ctx.mul(s1, s0));
  EXPECT_EQ(ctx.add(ctx.add(s0, s1), s2), ctx.add(s0, ctx.add(s1, s2)));
  EXPECT_EQ(ctx.mul(ctx.add(i0, c(1)), s1), ctx.add(ctx.mul(i0, s1), s1));
  EXPECT_EQ(ctx.sub(s0, s0), c(0));
  EXPECT_EQ(ctx.sub(ctx.add(s0, i1), ctx.add(i1, s0)), c(0));
  EXPECT_EQ(ctx.add(c(3), c(4)), c(7));
  EXPECT_EQ(ctx.mul(c(-3), c(4)), c(-12));
  EXPECT_EQ(ctx.mul(c(0), s0), c(0));
  EXPECT_EQ(ctx.mul(s0, c(1)), s0);
  EXPECT_EQ(ctx.add(ctx.add(s0, c(2)), c(-2)), s0);
  EXPECT_EQ(ctx.add(ctx.mul(s0, c(2)), ctx.mul(c(3), s0)), ctx.mul(s0, c(5)));
  EXPECT_EQ(ctx.add(ctx.mul(s0, s1), ctx.mul(s1, s0)), ctx.mul(ctx.mul(s0, s1), c(2)));
  // (s0 + 1)^2 - s0^2 - 2*s0 == 1
  SymExpr p = ctx.add(s0, c(1));
  EXPECT_EQ(ctx.sub(ctx.sub(ctx.mul(p, p), ctx.mul(s0, s0)), ctx.mul(s0, c(2))), c(1));
  EXPECT_EQ(ctx.product({s0, s1, c(2)}), ctx.mul(ctx.mul(c(2), s1), s0));
  EXPECT_EQ(ctx.product({}), c(1));
}

TEST_F(SymTest, SubstituteResimplifies) {
  SymExpr e = ctx.floordiv(ctx.add(ctx.mul(s0, s1), s2), s1);
  EXPECT_EQ(ctx.substitute(e, {{s2, i1}}), s0);
  EXPECT_EQ(ctx.substitute(ctx.add(s0, s1), {{s0, s1}, {s1, s0}}), ctx.add(s0, s1));
}

// ---- soundness: random raw trees against their simplified forms --------------------------

enum class RawOp { Leaf, Add, Sub, Mul, Neg, FloorDiv, Mod, Min, Max };

/// An unsimplified expression tree. A leaf is a constant or a symbol.
struct Raw {
  RawOp op;
  SymExpr leaf = nullptr;
  std::shared_ptr<const Raw> a, b;
};
using RawPtr = std::shared_ptr<const Raw>;

RawPtr rawLeaf(SymExpr e) { return std::make_shared<Raw>(Raw{RawOp::Leaf, e, nullptr, nullptr}); }
RawPtr raw(RawOp op, RawPtr a, RawPtr b = nullptr) {
  return std::make_shared<Raw>(Raw{op, nullptr, std::move(a), std::move(b)});
}

/// Floor division and modulo written independently of the library's: nullopt for b == 0.
std::optional<int64_t> refMod(int64_t a, int64_t b) {
  if (b == 0)
    return std::nullopt;
  int64_t r = a % b;
  return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}
std::optional<int64_t> refFloorDiv(int64_t a, int64_t b) {
  if (b == 0)
    return std::nullopt;
  return (a - *refMod(a, b)) / b;
}

/// Evaluates a raw tree with floor semantics; nullopt where it divides by zero.
std::optional<int64_t> evalRaw(const Raw &r, const Values &vals) {
  if (r.op == RawOp::Leaf)
    return r.leaf->isConst() ? r.leaf->value() : vals.at(r.leaf);
  std::optional<int64_t> a = evalRaw(*r.a, vals);
  std::optional<int64_t> b = r.b ? evalRaw(*r.b, vals) : std::optional<int64_t>(0);
  if (!a || !b)
    return std::nullopt;
  switch (r.op) {
  case RawOp::Leaf:
    break;
  case RawOp::Add:
    return *a + *b;
  case RawOp::Sub:
    return *a - *b;
  case RawOp::Mul:
    return *a * *b;
  case RawOp::Neg:
    return -*a;
  case RawOp::FloorDiv:
    return refFloorDiv(*a, *b);
  case RawOp::Mod:
    return refMod(*a, *b);
  case RawOp::Min:
    return std::min(*a, *b);
  case RawOp::Max:
    return std::max(*a, *b);
  }
  return std::nullopt;
}

/// Fully parenthesized Python-syntax text of a raw tree.
std::string rawText(const Raw &r) {
  if (r.op == RawOp::Leaf)
    return toString(r.leaf);
  auto bin = [&](const char *op) { return "(" + rawText(*r.a) + op + rawText(*r.b) + ")"; };
  switch (r.op) {
  case RawOp::Leaf:
    break;
  case RawOp::Add:
    return bin(" + ");
  case RawOp::Sub:
    return bin(" - ");
  case RawOp::Mul:
    return bin("*");
  case RawOp::Neg:
    return "(-" + rawText(*r.a) + ")";
  case RawOp::FloorDiv:
    return bin(" // ");
  case RawOp::Mod:
    return bin(" % ");
  case RawOp::Min:
    return "min(" + rawText(*r.a) + ", " + rawText(*r.b) + ")";
  case RawOp::Max:
    return "max(" + rawText(*r.a) + ", " + rawText(*r.b) + ")";
  }
  return "";
}

/// Builds a raw tree through the simplifying factories; nullptr if a divisor simplifies to the
/// constant 0 (the raw tree then divides by zero everywhere).
SymExpr build(SymContext &ctx, const Raw &r) {
  if (r.op == RawOp::Leaf)
    return r.leaf;
  SymExpr a = build(ctx, *r.a);
  SymExpr b = r.b ? build(ctx, *r.b) : a;
  if (!a || !b)
    return nullptr;
  switch (r.op) {
  case RawOp::Leaf:
    break;
  case RawOp::Add:
    return ctx.add(a, b);
  case RawOp::Sub:
    return ctx.sub(a, b);
  case RawOp::Mul:
    return ctx.mul(a, b);
  case RawOp::Neg:
    return ctx.neg(a);
  case RawOp::FloorDiv:
    return b->isConst(0) ? nullptr : ctx.floordiv(a, b);
  case RawOp::Mod:
    return b->isConst(0) ? nullptr : ctx.mod(a, b);
  case RawOp::Min:
    return ctx.min(a, b);
  case RawOp::Max:
    return ctx.max(a, b);
  }
  return nullptr;
}

/// Random raw trees over the fixture's symbols, biased toward the shapes the rules match.
class RawGenerator {
public:
  RawGenerator(SymContext &ctx, const std::vector<SymExpr> &sizes,
               const std::vector<SymExpr> &indices)
      : ctx_(ctx), sizes_(sizes), indices_(indices), rng_(20240607) {}

  RawPtr expr(int depth) {
    if (depth == 0 || pick(5) == 0)
      return leaf();
    switch (pick(12)) {
    case 0:
      return raw(RawOp::Add, expr(depth - 1), expr(depth - 1));
    case 1:
      return raw(RawOp::Sub, expr(depth - 1), expr(depth - 1));
    case 2:
      return raw(RawOp::Mul, expr(depth - 1), pick(2) ? constLeaf() : expr(depth - 1));
    case 3:
      return raw(RawOp::Neg, expr(depth - 1));
    case 4:
      return raw(RawOp::FloorDiv, expr(depth - 1), divisor(depth - 1));
    case 5:
      return raw(RawOp::Mod, expr(depth - 1), divisor(depth - 1));
    case 6:
      return raw(pick(2) ? RawOp::Min : RawOp::Max, expr(depth - 1), expr(depth - 1));
    default:
      return pattern(depth - 1);
    }
  }

private:
  /// The shapes the rule table exists for, with random parts.
  RawPtr pattern(int depth) {
    RawPtr x = expr(depth);
    RawPtr d = divisor(depth);
    switch (pick(12)) {
    case 0:
    case 1: { // (i*s + j) // s and (i*s + j) % s, j an index of extent s
      RawPtr s = rawLeaf(indices_[1]->extent());
      RawPtr i = pick(2) ? rawLeaf(indices_[0]) : x;
      RawPtr sum = raw(RawOp::Add, raw(RawOp::Mul, i, s), rawLeaf(indices_[1]));
      if (pick(2))
        sum = raw(RawOp::Add, sum, leaf());
      return raw(pick(2) ? RawOp::FloorDiv : RawOp::Mod, sum, s);
    }
    case 2: { // (x // d)*d + x % d
      RawPtr split = raw(RawOp::Add, raw(RawOp::Mul, raw(RawOp::FloorDiv, x, d), d),
                         raw(RawOp::Mod, x, d));
      return pick(2) ? split : raw(RawOp::Mul, split, constLeaf());
    }
    case 3: // (x // d0) // d1
      return raw(RawOp::FloorDiv, raw(RawOp::FloorDiv, x, d), divisor(depth));
    case 4: { // (x % (d*k)) % d, or with an unrelated outer divisor
      RawPtr outer = pick(2) ? raw(RawOp::Mul, d, constLeaf()) : divisor(depth);
      return raw(RawOp::Mod, raw(RawOp::Mod, x, outer), d);
    }
    case 5: // i2 against its own extent s0*s2
      return raw(pick(2) ? RawOp::FloorDiv : RawOp::Mod, rawLeaf(indices_[2]),
                 raw(RawOp::Mul, rawLeaf(sizes_[0]), rawLeaf(sizes_[2])));
    case 6: // min/max of an index and something
      return raw(pick(2) ? RawOp::Min : RawOp::Max, rawLeaf(indices_[pick(indices_.size())]), x);
    case 7: { // (c*x + j) // (c*m) and % (c*m), j an index of extent c (a reshape's index)
      bool twelve = pick(2);
      int64_t cv = twelve ? 12 : 4;
      RawPtr j = rawLeaf(indices_[twelve ? 3 : 0]);
      RawPtr sum = raw(RawOp::Add, raw(RawOp::Mul, x, rawLeaf(ctx_.constant(cv))), j);
      if (pick(2))
        sum = raw(RawOp::Add, sum, raw(RawOp::Mul, leaf(), rawLeaf(ctx_.constant(cv * 2))));
      RawPtr div = rawLeaf(ctx_.constant(cv * static_cast<int64_t>(1 + pick(3))));
      return raw(pick(2) ? RawOp::FloorDiv : RawOp::Mod, sum, div);
    }
    default: { // a bounded dividend against a nearby bound
      static const RawOp ops[] = {RawOp::FloorDiv, RawOp::Mod, RawOp::Min, RawOp::Max};
      RawPtr bound = pick(3) ? positiveLeaf() : rawLeaf(sizes_[pick(sizes_.size())]);
      return raw(ops[pick(4)], bounded(depth), bound);
    }
    }
  }

  /// Expressions with a known range, whose upper bound the rules compute: indices, x % d,
  /// b // c, and sums of bounded terms with positive coefficients.
  RawPtr bounded(int depth) {
    switch (depth <= 0 ? 0 : pick(4)) {
    case 0:
      return rawLeaf(indices_[pick(indices_.size())]);
    case 1:
      return raw(RawOp::Mod, expr(depth - 1), pick(2) ? positiveLeaf() : divisor(depth - 1));
    case 2:
      return raw(RawOp::FloorDiv, bounded(depth - 1), positiveLeaf());
    default:
      return raw(RawOp::Add, raw(RawOp::Mul, bounded(depth - 1), positiveLeaf()),
                 bounded(depth - 1));
    }
  }

  /// Mostly divisors of the constant extents 4 and 12, so that bounds come out exact.
  RawPtr positiveLeaf() {
    static const int64_t values[] = {1, 2, 3, 4, 6, 12, 2, 3, 4, 5, 11, 13};
    return rawLeaf(ctx_.constant(values[pick(std::size(values))]));
  }

  RawPtr divisor(int depth) {
    switch (pick(4)) {
    case 0:
      return constLeaf();
    case 1:
      return rawLeaf(sizes_[pick(sizes_.size())]);
    case 2:
      return raw(RawOp::Mul, rawLeaf(sizes_[pick(sizes_.size())]), constLeaf());
    default:
      return depth > 0 ? expr(depth - 1) : constLeaf();
    }
  }

  RawPtr leaf() {
    switch (pick(3)) {
    case 0:
      return constLeaf();
    case 1:
      return rawLeaf(sizes_[pick(sizes_.size())]);
    default:
      return rawLeaf(indices_[pick(indices_.size())]);
    }
  }

  RawPtr constLeaf() {
    static const int64_t values[] = {-3, -2, -1, 1, 2, 3, 4, 6, 8, 12};
    return rawLeaf(ctx_.constant(values[pick(std::size(values))]));
  }

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  SymContext &ctx_;
  const std::vector<SymExpr> &sizes_, &indices_;
  std::mt19937 rng_;
};

/// Random values: sizes in 0..7, each index inside its range; none if some range is empty.
std::optional<Values> randomValues(std::mt19937 &rng, const std::vector<SymExpr> &sizes,
                                   const std::vector<SymExpr> &indices) {
  Values vals;
  for (SymExpr s : sizes)
    vals[s] = std::uniform_int_distribution<int64_t>(0, 7)(rng);
  for (SymExpr i : indices) {
    int64_t extent = evaluate(i->extent(), vals);
    if (extent <= 0)
      return std::nullopt;
    vals[i] = std::uniform_int_distribution<int64_t>(0, extent - 1)(rng);
  }
  return vals;
}

TEST_F(SymTest, EveryRuleIsSoundOnRandomExpressions) {
  RawGenerator gen(ctx, sizes, indices);
  std::mt19937 rng(7);
  int checked = 0, failures = 0;
  for (int n = 0; n < 10000 && failures < 10; ++n) {
    RawPtr r = gen.expr(4);
    SymExpr e = build(ctx, *r);
    if (!e)
      continue;
    for (int k = 0; k < 40 && failures < 10; ++k) {
      std::optional<Values> vals = randomValues(rng, sizes, indices);
      if (!vals)
        continue;
      std::optional<int64_t> want = evalRaw(*r, *vals);
      if (!want)
        continue;
      std::string got;
      try {
        int64_t v = evaluate(e, *vals);
        if (v == *want) {
          ++checked;
          continue;
        }
        got = std::to_string(v);
      } catch (const braze::InternalError &err) {
        got = err.what();
      }
      ++failures;
      std::string at;
      for (SymExpr s : ctx.symbols())
        at += " " + s->name() + "=" + std::to_string(vals->at(s));
      ADD_FAILURE() << rawText(*r) << "\n  simplified: " << toString(e) << "\n  at" << at
                    << "\n  raw = " << *want << ", simplified = " << got;
    }
  }
  EXPECT_GT(checked, 150000);
}

/// Each rule on one expression it rewrites; the names must match the table, so that a new rule
/// cannot go unproven.
TEST_F(SymTest, EveryRuleFires) {
  struct Example {
    const char *rule;
    SymExpr got, want;
  };
  SymExpr f = ctx.add(s0, s2); // not a multiple of s1
  const Example examples[] = {
      {"c0 // c1 -> fold", ctx.floordiv(c(-7), c(2)), c(-4)},
      {"x // 1 -> x", ctx.floordiv(ctx.sub(s0, s1), c(1)), ctx.sub(s0, s1)},
      {"x // x -> 1", ctx.floordiv(ctx.add(s0, c(1)), ctx.add(s0, c(1))), c(1)},
      {"x // y -> 0 (0 <= x < y)", ctx.floordiv(i1, s1), c(0)},
      {"(y*q + r) // y -> q + r // y", ctx.floordiv(ctx.add(ctx.mul(i0, s1), i1), s1), i0},
      {"(x // y) // z -> x // (y*z) (y, z > 0)", ctx.floordiv(ctx.floordiv(f, c(2)), s1),
       ctx.makeRaw(SymKind::FloorDiv, {f, ctx.mul(s1, c(2))})},
      {"0 // y -> 0", ctx.floordiv(c(0), s1), c(0)},
      {"(c*q + r) // (c*m) -> q // m (0 <= r < c)",
       ctx.floordiv(ctx.add(ctx.mul(s0, c(12)), i3), c(24)),
       ctx.makeRaw(SymKind::FloorDiv, {s0, c(2)})},
      {"(c*q + r) % (c*m) -> c*(q % m) + r (0 <= r < c)",
       ctx.mod(ctx.add(ctx.mul(s0, c(12)), i3), c(24)),
       ctx.add(ctx.mul(c(12), ctx.makeRaw(SymKind::Mod, {s0, c(2)})), i3)},
      {"c0 % c1 -> fold", ctx.mod(c(-7), c(3)), c(2)},
      {"x % 1 -> 0", ctx.mod(f, c(-1)), c(0)},
      {"x % y -> x (0 <= x < y)", ctx.mod(i1, s1), i1},
      {"(y*q + r) % y -> r % y", ctx.mod(ctx.add(ctx.mul(i0, s1), i1), s1), i1},
      {"(x % (y*q)) % y -> x % y", ctx.mod(ctx.mod(f, ctx.mul(s1, c(3))), s1),
       ctx.makeRaw(SymKind::Mod, {f, s1})},
      {"0 % y -> 0", ctx.mod(c(0), s1), c(0)},
      {"min(c0, c1) -> fold", ctx.min(c(3), c(-2)), c(-2)},
      {"max(c0, c1) -> fold", ctx.max(c(3), c(-2)), c(3)},
      {"min(x, y) -> x (x <= y)", ctx.min(s0, ctx.add(s0, s1)), s0},
      {"max(x, y) -> y (x <= y)", ctx.max(i0, c(3)), c(3)},
  };
  std::set<std::string> tested;
  for (const Example &ex : examples) {
    EXPECT_EQ(ex.got, ex.want) << ex.rule << ": got " << toString(ex.got) << ", want "
                               << toString(ex.want);
    tested.insert(ex.rule);
  }
  std::vector<std::string> names = symRuleNames();
  EXPECT_EQ(tested, std::set<std::string>(names.begin(), names.end()));
}

TEST_F(SymTest, SplitIndexRecombines) {
  // The rule on sums: k*(x // d)*d + k*(x % d) -> k*x.
  SymExpr f = ctx.add(s0, ctx.mul(s1, s2));
  auto split = [&](SymExpr x, SymExpr d) {
    return ctx.add(ctx.mul(ctx.floordiv(x, d), d), ctx.mod(x, d));
  };
  EXPECT_EQ(split(f, s2), f);
  EXPECT_EQ(split(f, c(4)), f);
  EXPECT_EQ(split(s0, c(4)), s0);
  EXPECT_EQ(ctx.mul(split(f, c(4)), c(3)), ctx.mul(f, c(3)));
  EXPECT_EQ(ctx.add(split(s0, s1), s2), ctx.add(s0, s2));
  // The flat index of a 2-d loop nest, split again by its inner extent.
  SymExpr flat = ctx.add(ctx.mul(i0, s1), i1);
  EXPECT_EQ(ctx.floordiv(flat, s1), i0);
  EXPECT_EQ(ctx.mod(flat, s1), i1);
  EXPECT_EQ(split(flat, s1), flat);
  // Nested splits of one flat index: ((f // 2) // 3) == f // 6, (f % 12) % 4 == f % 4.
  EXPECT_EQ(ctx.floordiv(ctx.floordiv(f, c(2)), c(3)), ctx.floordiv(f, c(6)));
  EXPECT_EQ(ctx.mod(ctx.mod(f, c(12)), c(4)), ctx.mod(f, c(4)));
  // Not rewritten: the partner's coefficient does not match.
  EXPECT_NE(ctx.add(ctx.mul(ctx.floordiv(s0, c(4)), c(3)), ctx.mod(s0, c(4))), s0);
  // A dim split twice and merged back (heads into groups of 4, then 64-wide rows): the
  // partner of (x // 64) % 4 is (x // 64) // 4 in its canonical form x // 256.
  SymExpr x = i1;
  SymExpr twice = ctx.add(ctx.add(ctx.mul(ctx.floordiv(x, c(256)), c(256)),
                                  ctx.mul(ctx.mod(ctx.floordiv(x, c(64)), c(4)), c(64))),
                          ctx.mod(x, c(64)));
  EXPECT_EQ(twice, x);
  EXPECT_EQ(ctx.add(ctx.mul(ctx.floordiv(f, c(12)), c(3)), ctx.mod(ctx.floordiv(f, c(4)), c(3))),
            ctx.floordiv(f, c(4)));
  EXPECT_NE(ctx.add(ctx.mul(ctx.floordiv(f, c(12)), c(2)), ctx.mod(ctx.floordiv(f, c(4)), c(3))),
            ctx.floordiv(f, c(4)));
}

// ---- provers and evaluation ---------------------------------------------------------------

TEST_F(SymTest, ConstantArithmeticReportsOverflow) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  const int64_t small = std::numeric_limits<int64_t>::min();
  auto message = [](const std::function<void()> &f) -> std::string {
    try {
      f();
    } catch (const braze::Diagnostic &d) {
      return d.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { ctx.mul(c(big), c(2)); }),
            "shape: integer overflow: 9223372036854775807 * 2 does not fit in 64 bits");
  EXPECT_EQ(message([&] { ctx.add(c(big), c(1)); }),
            "shape: integer overflow: 9223372036854775807 + 1 does not fit in 64 bits");
  EXPECT_NE(message([&] { ctx.add(ctx.mul(s0, c(big)), s0); }), "no error");
  EXPECT_NE(message([&] { ctx.mul(ctx.mul(s0, c(big)), c(3)); }), "no error");
  EXPECT_NE(message([&] { ctx.neg(c(small)); }), "no error");
  EXPECT_NE(message([&] { ctx.floordiv(c(small), c(-1)); }), "no error");
  EXPECT_EQ(ctx.mod(c(small), c(-1)), c(0));
  EXPECT_EQ(ctx.add(c(big), c(-1)), c(big - 1)); // near the edge, no false alarm
}

TEST_F(SymTest, ProvablyNonNegative) {
  EXPECT_TRUE(ctx.provablyNonNegative(c(0)));
  EXPECT_FALSE(ctx.provablyNonNegative(c(-1)));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.mul(s0, s1)));
  EXPECT_TRUE(ctx.provablyNonNegative(i1));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.mul(i1, s0)));
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.sub(s0, c(1))));
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.neg(i1)));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.sub(c(3), i0)));
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.sub(c(2), i0)));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.sub(s1, i1)));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.floordiv(s0, s1)));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.mod(ctx.sub(s0, c(9)), s1)));
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.mod(s0, ctx.neg(s1))));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.max(ctx.neg(s0), s1)));
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.min(ctx.neg(s0), s1)));
  EXPECT_TRUE(ctx.provablyNonNegative(ctx.mul(ctx.min(s0, i1), s2)));
  // An index that also occurs non-linearly cannot be replaced by one end of its range:
  // i0 - i0*s0 < 0 at i0 = 1, s0 = 2, and 3*(i0 // 2) - i0 < 0 at i0 = 1.
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.sub(i0, ctx.mul(i0, s0))));
  EXPECT_FALSE(ctx.provablyNonNegative(ctx.sub(ctx.mul(ctx.floordiv(i0, c(2)), c(3)), i0)));
}

TEST_F(SymTest, ProvablyLess) {
  EXPECT_TRUE(ctx.provablyLess(i0, c(4)));
  EXPECT_FALSE(ctx.provablyLess(i0, c(3)));
  EXPECT_TRUE(ctx.provablyLess(i1, s1));
  EXPECT_FALSE(ctx.provablyLess(s1, s1));
  EXPECT_TRUE(ctx.provablyLess(s0, ctx.add(s0, c(1))));
  EXPECT_TRUE(ctx.provablyLess(i2, ctx.mul(s0, s2)));
  // j < i when j's extent is i.
  SymExpr j = ctx.indexSymbol("j", i1);
  EXPECT_TRUE(ctx.provablyLess(j, i1));
  EXPECT_FALSE(ctx.provablyLess(i1, j));
}

TEST_F(SymTest, Evaluate) {
  Values vals{{s0, 5}, {s1, 3}, {i0, 2}};
  EXPECT_EQ(evaluate(ctx.add(ctx.mul(s0, s1), i0), vals), 17);
  EXPECT_EQ(evaluate(ctx.floordiv(ctx.neg(s0), s1), vals), -2);
  EXPECT_EQ(evaluate(ctx.mod(ctx.neg(s0), s1), vals), 1);
  EXPECT_EQ(evaluate(ctx.mod(s0, ctx.neg(s1)), vals), -1);
  EXPECT_EQ(evaluate(ctx.min(s0, ctx.mul(i0, s1)), vals), 5);
  EXPECT_EQ(evaluate(ctx.max(s0, ctx.mul(i0, s1)), vals), 6);
  EXPECT_THROW(evaluate(s2, vals), braze::InternalError);
}

// ---- printing and parsing -----------------------------------------------------------------

TEST_F(SymTest, ToString) {
  EXPECT_EQ(toString(ctx.add(ctx.mul(s0, s1), ctx.floordiv(s2, c(4)))), "s0*s1 + s2 // 4");
  EXPECT_EQ(toString(ctx.sub(s0, ctx.mul(s1, c(3)))), "s0 - 3*s1");
  EXPECT_EQ(toString(ctx.sub(ctx.sub(s0, s1), c(2))), "s0 - s1 - 2");
  EXPECT_EQ(toString(ctx.neg(ctx.mul(s0, s1))), "-s0*s1");
  EXPECT_EQ(toString(c(-5)), "-5");
  EXPECT_EQ(toString(ctx.floordiv(ctx.add(s0, s1), c(2))), "(s0 + s1) // 2");
  EXPECT_EQ(toString(ctx.mod(s0, ctx.mul(s1, s2))), "s0 % (s1*s2)");
  EXPECT_EQ(toString(ctx.mul(ctx.floordiv(s0, s1), s2)), "s2*(s0 // s1)");
  EXPECT_EQ(toString(ctx.min(ctx.add(s0, c(1)), s1)), "min(s1, s0 + 1)");
  EXPECT_EQ(toString(ctx.floordiv(ctx.floordiv(s0, s1), s2)), "s0 // (s1*s2)");
}

TEST_F(SymTest, ParseFollowsPythonPrecedence) {
  EXPECT_EQ(parse("s0 + s1*s2"), ctx.add(s0, ctx.mul(s1, s2)));
  EXPECT_EQ(parse("s0 - s1 - s2"), ctx.sub(ctx.sub(s0, s1), s2));
  EXPECT_EQ(parse("s0 // s1 * s2"), ctx.mul(ctx.floordiv(s0, s1), s2));
  EXPECT_EQ(parse("s0 * s1 // s2"), ctx.floordiv(ctx.mul(s0, s1), s2));
  EXPECT_EQ(parse("s0 // 4 % 3"), ctx.mod(ctx.floordiv(s0, c(4)), c(3)));
  EXPECT_EQ(parse("-s0 // 4"), ctx.floordiv(ctx.neg(s0), c(4)));
  EXPECT_EQ(parse("-(s0 // 4)"), ctx.neg(ctx.floordiv(s0, c(4))));
  EXPECT_EQ(parse("s0 - -3"), ctx.add(s0, c(3)));
  EXPECT_EQ(parse("(-3)*s0"), ctx.mul(s0, c(-3)));
  EXPECT_EQ(parse("  max( s0 , min(s1, 2) ) "), ctx.max(s0, ctx.min(s1, c(2))));
  EXPECT_EQ(parse("-9223372036854775808"), c(INT64_MIN));
  EXPECT_EQ(parse("(i0*s1 + i1) // s1"), i0);
}

TEST_F(SymTest, ParseErrorsNameTheColumnAndText) {
  auto message = [&](std::string_view text) -> std::string {
    try {
      parse(text);
    } catch (const braze::Diagnostic &d) {
      EXPECT_EQ(d.op(), "sym");
      return d.message();
    }
    return "no error";
  };
  EXPECT_EQ(message("s0 + "), "column 6: expected an expression but found end of input in 's0 + '");
  EXPECT_EQ(message("s0 $ 1"), "column 4: expected an operator but found '$' in 's0 $ 1'");
  EXPECT_EQ(message("s0 / 2"), "column 4: expected an operator but found '/' in 's0 / 2'");
  EXPECT_EQ(message("(s0 + 1"), "column 8: expected ')' but found end of input in '(s0 + 1'");
  EXPECT_EQ(message("min(s0 s1)"), "column 8: expected ',' but found 's1' in 'min(s0 s1)'");
  EXPECT_EQ(message("s0 + q7"), "column 6: unknown symbol 'q7' in 's0 + q7'");
  EXPECT_EQ(message("abs(s0)"), "column 1: unknown function 'abs' in 'abs(s0)'");
  EXPECT_EQ(message("s0 // (1 - 1)"), "column 7: '//' by zero in 's0 // (1 - 1)'");
  EXPECT_EQ(message("99999999999999999999"),
            "column 1: integer literal '99999999999999999999' out of range in "
            "'99999999999999999999'");
}

TEST_F(SymTest, DeepNestingIsAnErrorNotAStackOverflow) {
  auto message = [&](const std::string &text) -> std::string {
    try {
      parse(text);
    } catch (const braze::Diagnostic &d) {
      return d.message();
    }
    return "no error";
  };
  auto says = [&](const std::string &text, std::string_view what) {
    return message(text).find(what) != std::string::npos;
  };
  constexpr int kDeep = 100000;
  std::string parens = std::string(kDeep, '(') + "s0" + std::string(kDeep, ')');
  EXPECT_TRUE(says(parens, "column 257: expression nested deeper than 256 levels"));
  EXPECT_TRUE(says(std::string(kDeep, '-') + "s0", "expression nested deeper than 256 levels"));
  std::string calls;
  for (int i = 0; i < kDeep; ++i)
    calls += "min(s0, ";
  calls += "s1" + std::string(kDeep, ')');
  EXPECT_TRUE(says(calls, "expression nested deeper than 256 levels"));
  // A long text is shown by its ends.
  EXPECT_TRUE(says(parens, " ... "));
  EXPECT_LT(message(parens).size(), 200u);
  // 256 levels still parse.
  EXPECT_EQ(parse(std::string(256, '(') + "s0 + 1" + std::string(256, ')')), ctx.add(s0, c(1)));
}

TEST_F(SymTest, ParseInvertsToString) {
  RawGenerator gen(ctx, sizes, indices);
  int checked = 0;
  for (int n = 0; n < 3000; ++n) {
    RawPtr r = gen.expr(4);
    SymExpr e = build(ctx, *r);
    if (!e)
      continue;
    EXPECT_EQ(parse(toString(e)), e) << toString(e);
    // The raw tree's own text goes through the same factories in the same order.
    EXPECT_EQ(parse(rawText(*r)), e) << rawText(*r);
    ++checked;
  }
  EXPECT_GT(checked, 2500);
}

} // namespace
