/// The ranges CUDA's code generation proves of index expressions before it computes them in
/// int (codegen::indexRange, fitsNarrowIndex): every value an expression takes over its
/// indices' ranges lies in its range, for random expressions of sums, products, quotients,
/// remainders, minima and maxima; sizes, and ranges past +-2^30, are not narrowed.
#include "braze/codegen/CFamily.h"
#include "braze/ir/sym/SymExpr.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

using namespace braze;
using braze::codegen::IndexRange;

namespace {

std::optional<IndexRange> rangeOf(sym::SymExpr s) {
  if (s->role() != sym::SymbolRoleKind::Index || !s->extent()->isConst())
    return std::nullopt;
  return IndexRange{0, s->extent()->value() - 1};
}

sym::SymExpr randomExpr(sym::SymContext &c, const std::vector<sym::SymExpr> &leaves,
                        std::mt19937 &rng, int depth) {
  std::uniform_int_distribution<int> pick(0, depth <= 0 ? 1 : 7);
  std::uniform_int_distribution<int64_t> constant(-9, 40);
  switch (pick(rng)) {
  case 0:
    return c.constant(constant(rng));
  case 1:
    return leaves[std::uniform_int_distribution<size_t>(0, leaves.size() - 1)(rng)];
  case 2:
    return c.add(randomExpr(c, leaves, rng, depth - 1), randomExpr(c, leaves, rng, depth - 1));
  case 3:
    return c.mul(randomExpr(c, leaves, rng, depth - 1), randomExpr(c, leaves, rng, depth - 1));
  case 4:
    return c.floordiv(randomExpr(c, leaves, rng, depth - 1),
                      c.constant(std::uniform_int_distribution<int64_t>(1, 7)(rng)));
  case 5:
    return c.mod(randomExpr(c, leaves, rng, depth - 1),
                 c.constant(std::uniform_int_distribution<int64_t>(1, 7)(rng)));
  case 6:
    return c.min(randomExpr(c, leaves, rng, depth - 1), randomExpr(c, leaves, rng, depth - 1));
  default:
    return c.max(randomExpr(c, leaves, rng, depth - 1), randomExpr(c, leaves, rng, depth - 1));
  }
}

TEST(IndexRangeTest, EveryValueLiesInTheRange) {
  sym::SymContext c;
  std::vector<sym::SymExpr> idx = {c.indexSymbol("i0", c.constant(5)),
                                   c.indexSymbol("i1", c.constant(3)),
                                   c.indexSymbol("i2", c.constant(17))};
  std::mt19937 rng(7);
  int checked = 0;
  for (int n = 0; n < 3000; ++n) {
    sym::SymExpr e = randomExpr(c, idx, rng, 4);
    std::optional<IndexRange> r = codegen::indexRange(e, rangeOf);
    ASSERT_TRUE(r.has_value());  // constant extents and constant divisors: always bounded
    for (int64_t a = 0; a < 5; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t d = 0; d < 17; ++d) {
          int64_t v = sym::evaluate(e, {{idx[0], a}, {idx[1], b}, {idx[2], d}});
          ASSERT_LE(r->lo, v);
          ASSERT_GE(r->hi, v);
        }
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

TEST(IndexRangeTest, SizesAndWideRangesStayInt64) {
  sym::SymContext c;
  sym::SymExpr s = c.sizeSymbol("s0");
  sym::SymExpr i = c.indexSymbol("i", c.constant(4));
  sym::SymExpr j = c.indexSymbol("j", c.constant(int64_t(1) << 28));
  sym::SymExpr k = c.indexSymbol("k", s);
  EXPECT_FALSE(codegen::indexRange(c.add(i, s), rangeOf).has_value());
  EXPECT_FALSE(codegen::fitsNarrowIndex(c.add(i, k), rangeOf));
  // i + 2j < 2^30: narrow; 8j reaches past 2^30: not, though it fits int.
  EXPECT_TRUE(codegen::fitsNarrowIndex(c.add(i, c.mul(j, 2)), rangeOf));
  EXPECT_FALSE(codegen::fitsNarrowIndex(c.add(i, c.mul(j, 8)), rangeOf));
  // A part past the room fails the whole, though the whole is small: (8j + 1) mod 3.
  EXPECT_FALSE(codegen::fitsNarrowIndex(c.mod(c.add(c.mul(j, 8), 1), c.constant(3)), rangeOf));
  // Products of huge bounds are refused, not overflowed.
  sym::SymExpr big = c.indexSymbol("b", c.constant(int64_t(1) << 40));
  EXPECT_FALSE(codegen::indexRange(c.mul(big, big), rangeOf).has_value());
}

TEST(IndexRangeTest, NarrowTextIsIntArithmetic) {
  sym::SymContext c;
  sym::SymExpr x = c.indexSymbol("x", c.constant(112));
  sym::SymExpr e = c.max(c.constant(0), c.min(c.constant(111), c.add(c.mul(x, 2), -1)));
  auto name = [](sym::SymExpr s) { return s->name(); };
  EXPECT_EQ(codegen::indexExpr(e, name),
            "braze_imax(INT64_C(0), braze_imin(INT64_C(111), ((INT64_C(2) * x) + (INT64_C(-1)))))");
  EXPECT_EQ(codegen::indexExpr(e, name, true),
            "braze_imax32(0, braze_imin32(111, ((2 * (int)x) + (-1))))");
}

} // namespace
