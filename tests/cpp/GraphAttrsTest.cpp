// The typed attribute views generated from Ops.def (OpAttrs.h): accessors of each kind, enums
// read from and written as graph text, optional attributes, views shared by ops of the same
// attributes, and the internal error of a view over a node of other attributes.
#include "braze/ir/graph/GraphText.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/support/Check.h"

#include <gtest/gtest.h>

#include <string>

namespace braze {
namespace {

const Node *named(const Graph &g, const std::string &name) {
  for (const auto &n : g.nodes())
    if (n->name() == name)
      return n.get();
  ADD_FAILURE() << "no node " << name;
  return nullptr;
}

TEST(GraphAttrsTest, TypedAccessorsReadEachKind) {
  std::unique_ptr<Graph> g = parseGraph(R"(graph(%x: f32[2, 3, 4], %i: i64[2, 3, 4]) {
  %s = sum(%x) {dims=[1, 2], keepdim=true} : f32[2, 1, 1]
  %a = amax(%x) {dims=[0], keepdim=false} : f32[3, 4]
  %g = gelu(%x) {approximate="tanh"} : f32[2, 3, 4]
  %c = scatter_dim(%x, %i, %x) {dim=2, include_self=false, mode="amin"} : f32[2, 3, 4]
  %sl = slice(%x) {dim=2, start=1, step=2} : f32[2, 3, 2]
  return %s, %a, %g, %c, %sl
})");
  const attrs::Sum s(*named(*g, "s"));
  EXPECT_EQ(s.dims(), (IntList{1, 2}));
  EXPECT_TRUE(s.keepdim());
  // Every reduction has sum's attributes: one view reads them all.
  const attrs::Sum a(*named(*g, "a"));
  EXPECT_EQ(a.dims(), IntList{0});
  EXPECT_FALSE(a.keepdim());
  EXPECT_EQ(attrs::Gelu(*named(*g, "g")).approximate(), attrs::GeluApproximate::Tanh);
  const attrs::ScatterDim c(*named(*g, "c"));
  EXPECT_EQ(c.mode(), attrs::ScatterMode::Amin);
  EXPECT_EQ(c.dim(), 2);
  EXPECT_FALSE(c.include_self());
  EXPECT_EQ(attrs::Slice(*named(*g, "sl")).step(), 2);
}

TEST(GraphAttrsTest, OptionalAttributesSayWhetherTheyArePresent) {
  std::unique_ptr<Graph> g = parseGraph(R"(graph(%s: i64[]) {
  %u = random_draw(%s) {distribution="uniform", high=2.5, low=-1, stream=0} : f32[4]
  %b = random_draw(%s) {distribution="bernoulli", p=0.25, stream=1} : f32[4]
  return %u, %b
})");
  const attrs::RandomDraw u(*named(*g, "u")), b(*named(*g, "b"));
  EXPECT_EQ(u.distribution(), attrs::Distribution::Uniform);
  ASSERT_TRUE(u.has_low() && u.has_high());
  EXPECT_EQ(u.low(), -1.0); // an int attribute read as a number
  EXPECT_EQ(u.high(), 2.5);
  EXPECT_FALSE(u.has_p());
  EXPECT_EQ(b.distribution(), attrs::Distribution::Bernoulli);
  EXPECT_TRUE(b.has_p());
  EXPECT_FALSE(b.has_low());
  EXPECT_EQ(b.stream(), 1);
}

TEST(GraphAttrsTest, EnumsRoundTripTheirText) {
  EXPECT_EQ(attrs::enumText(attrs::ScatterMode::Overwrite), "overwrite");
  EXPECT_EQ(attrs::enumValue<attrs::FftMode>("c2r"), attrs::FftMode::C2R);
  for (std::string_view t : attrs::enumTexts<attrs::GridSamplePadding>())
    EXPECT_EQ(attrs::enumText(attrs::enumValue<attrs::GridSamplePadding>(t)), t);
  EXPECT_THROW(attrs::enumValue<attrs::LossReduction>("median", "reduction"), InternalError);
}

TEST(GraphAttrsTest, AViewOfOtherAttributesIsAnInternalError) {
  EXPECT_TRUE(attrs::viewable(OpKind::ArgMin, OpKind::Sum));
  EXPECT_TRUE(attrs::viewable(OpKind::Mean, OpKind::Sum));
  // var has sum's attributes and a correction besides; sum lacks the correction.
  EXPECT_TRUE(attrs::viewable(OpKind::Var, OpKind::Sum));
  EXPECT_FALSE(attrs::viewable(OpKind::Sum, OpKind::Var));
  // Same names, other kinds: cum_extreme's max is a bool, histogram's a number.
  EXPECT_FALSE(attrs::viewable(OpKind::CumExtreme, OpKind::Histogram));
  // An optional attribute the node's op lacks reads as absent: scatter_dim through scatter.
  EXPECT_TRUE(attrs::viewable(OpKind::ScatterDim, OpKind::Scatter));
  // Same name and kind, other enums: a scatter's mode is not an embedding bag's.
  EXPECT_FALSE(attrs::viewable(OpKind::Scatter, OpKind::EmbeddingBag));
  std::unique_ptr<Graph> g = parseGraph(R"(graph(%x: f32[2, 3]) {
  %s = sum(%x) {dims=[1], keepdim=false} : f32[2]
  return %s
})");
  EXPECT_THROW(attrs::Slice{*named(*g, "s")}, InternalError);
}

TEST(GraphAttrsTest, TheExternFamilyIsItsOwnCategory) {
  // The ops a target may keep whole as one call (Ops.def's BRAZE_EXTERN); every other op that
  // decompose lowers stays a composite.
  for (OpKind k : {OpKind::Convolution, OpKind::ConvWeightGrad, OpKind::ConvInputGrad,
                   OpKind::Attention, OpKind::AttentionLse, OpKind::AttentionGrad,
                   OpKind::Scatter})
    EXPECT_EQ(opCategory(k), OpCategoryKind::Extern) << opName(k);
  for (OpKind k : {OpKind::ConvTranspose, OpKind::ScatterDim, OpKind::IndexPut, OpKind::Silu,
                   OpKind::LayerNorm})
    EXPECT_EQ(opCategory(k), OpCategoryKind::Composite) << opName(k);
  // An extern op's attributes are checked from its schema, and what they mean as a composite's.
  auto verified = [](const std::string &attrs) {
    return verifyGraph(*parseGraph("graph(%x: f32[1, 1, 4, 4], %w: f32[1, 1, 3, 3]) {\n"
                                   "  %y = convolution(%x, %w) {" + attrs +
                                   "} : f32[1, 1, 2, 2]\n  return %y\n}\n"));
  };
  EXPECT_EQ(verified("stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1, bias=false"), "");
  EXPECT_NE(verified("stride=[1, 1]").find("padding"), std::string::npos);
  EXPECT_NE(verified("stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=0, bias=false"), "");
}

} // namespace
} // namespace braze
