// Text form of the tensor graph: printer, parser and verifier.
#include "braze/ir/graph/GraphText.h"

#include "braze/ir/graph/Builder.h"
#include "braze/support/Diagnostic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace braze {
namespace {

/// printGraph is a fixpoint of parse ∘ print, and the parsed graph verifies.
void expectRoundTrip(const Graph &g) {
  std::string text = printGraph(g);
  std::unique_ptr<Graph> parsed = parseGraph(text);
  EXPECT_EQ(printGraph(*parsed), text);
  EXPECT_EQ(verifyGraph(*parsed), "");
  ASSERT_EQ(parsed->nodes().size(), g.nodes().size());
  ASSERT_EQ(parsed->inputs().size(), g.inputs().size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    EXPECT_EQ(parsed->inputs()[i]->name(), g.inputs()[i]->name());
  ASSERT_EQ(parsed->sizeSymbols().size(), g.sizeSymbols().size());
  for (size_t i = 0; i < g.sizeSymbols().size(); ++i)
    EXPECT_EQ(parsed->sizeSymbols()[i]->name(), g.sizeSymbols()[i]->name());
}

std::string parseError(std::string_view text) {
  try {
    parseGraph(text);
  } catch (const Diagnostic &d) {
    EXPECT_EQ(d.op(), "graph-parser");
    return d.what();
  }
  return "no error";
}

TEST(GraphText, PrintsTheDocumentedForm) {
  Graph g;
  GraphBuilder b(g);
  SymExpr s0 = b.sizeSymbol("s0");
  Node *a = b.input("a", DType::Float32, {s0, b.dim(8)});
  b.input("b", DType::Float32, {s0, b.dim(8)}, {b.dim(1), s0});
  b.setName("ceil");
  Node *c = b.unary(OpKind::Ceil, a);
  b.setName("sum");
  Node *sum = b.reduce(OpKind::Sum, c, {1}, false);
  b.setName("full");
  b.full(0.5, DType::Float32);
  b.output({sum, c});
  EXPECT_EQ(printGraph(g), "graph(%a: f32[s0, 8], %b: f32[s0, 8]{1, s0}) {\n"
                           "  %ceil = ceil(%a) : f32[s0, 8]\n"
                           "  %sum = sum(%ceil) {dims=[1], keepdim=false} : f32[s0]\n"
                           "  %full = full() {value=0.5} : f32[]\n"
                           "  return %sum, %ceil\n"
                           "}\n");
  EXPECT_EQ(verifyGraph(g), "");
  expectRoundTrip(g);
}

TEST(GraphText, RoundTripsEveryOpCategory) {
  Graph g;
  GraphBuilder b(g);
  SymExpr s0 = b.sizeSymbol("s0"), s1 = b.sizeSymbol("s1");
  Node *x = b.input("x", DType::Float32, {s0, s1});
  Node *xt = b.input("xt", DType::Float32, {s0, s1}, {b.dim(1), s0}); // column-major
  Node *h = b.input("h", DType::Float16, {b.dim(4), b.dim(6)});
  Node *idx = b.input("idx", DType::Int64, {s0, b.dim(2)});
  Node *w = b.input("w", DType::Float32, {s1});

  Node *sum = b.add(x, xt);                                  // elementwise, binary
  Node *e = b.unary(OpKind::Exp, b.convert(sum, DType::Float64)); // cast + unary
  Node *cond = b.binary(OpKind::Gt, x, b.scalar(0.5, DType::Float32));
  Node *sel = b.where(cond, x, xt);                           // ternary, bool operand
  Node *io = b.iota(DType::Int32, {s0, s1}, 1);
  Node *red = b.reduce(OpKind::Amax, sel, {1}, true);
  Node *any = b.reduce(OpKind::Any, cond, {0, 1}, false);
  Node *flat = b.reshape(x, {b.sym().mul(s0, s1)});          // symbolic reshape
  Node *hr = b.reshape(h, b.dims({2, 2, 6}));
  Node *perm = b.permute(hr, {2, 0, 1});
  Node *exp = b.expand(b.unsqueeze(w, 0), {b.dim(3), s1});
  Node *sl = b.slice(h, 1, 1, 5, 2);
  Node *dynSl = b.slice(x, 0, 1, INT64_MAX, 1);
  Node *se = b.select(h, 0, 2);
  Node *ga = b.gather(x, 1, idx);
  Node *sm = b.softmax(x, 1);
  Node *lsm = b.logSoftmax(x, -1);
  Node *mean = b.mean(x, {1}, true);
  Node *var = b.var(x, {0}, 1.0, false);
  Node *ln = b.layerNorm(x, 1, w, w, 1e-5);
  Node *ln1 = b.layerNorm(x, 1, nullptr, nullptr, 1e-12);
  Node *ge = b.gelu(x, "tanh");
  Node *si = b.silu(x);
  Node *ne = b.numel(x, {1}, DType::Int64);
  Node *fi = b.full(7, DType::Int32, {s1});
  b.output({e, io, red, any, flat, perm, exp, sl, dynSl, se, ga, sm, lsm, mean, var, ln, ln1, ge,
            si, ne, fi});
  ASSERT_EQ(verifyGraph(g), "");
  expectRoundTrip(g);
}

TEST(GraphText, RoundTripsEveryAttributeKind) {
  Graph g;
  GraphBuilder b(g);
  b.input("x", DType::Float32, {b.dim(2)});
  AttrMap attrs;
  attrs.set("value", 0.1);
  attrs.set("big", 1e300);
  attrs.set("tiny", -2.5e-300);
  attrs.set("whole", 3.0);
  attrs.set("negzero", -0.0);
  attrs.set("pinf", std::numeric_limits<double>::infinity());
  attrs.set("ninf", -std::numeric_limits<double>::infinity());
  attrs.set("nan", std::nan(""));
  attrs.set("count", int64_t{-42});
  attrs.set("flag", true);
  attrs.set("mode", std::string("tanh approx"));
  attrs.set("list", IntList{3, -1, 0});
  attrs.set("empty", IntList{});
  Node *f = g.addNode(OpKind::Full, {}, attrs, TensorType{DType::Float32, {}, {}}, "f");
  g.setOutputs({f});
  std::string text = printGraph(g);
  EXPECT_NE(text.find("{big=1e+300, count=-42, empty=[], flag=true, list=[3, -1, 0], "
                      "mode=\"tanh approx\", nan=nan, negzero=-0.0, ninf=-inf, pinf=inf, "
                      "tiny=-2.5e-300, value=0.1, whole=3.0}"),
            std::string::npos)
      << text;
  std::unique_ptr<Graph> parsed = parseGraph(text);
  EXPECT_EQ(printGraph(*parsed), text);
  const AttrMap &back = parsed->nodes().back()->attrs();
  for (const auto &[name, value] : attrs.all()) {
    if (name != "nan") {
      EXPECT_EQ(back.get(name), value) << name;
    }
  }
  EXPECT_TRUE(std::isnan(back.getFloat("nan")));
  EXPECT_TRUE(std::signbit(back.getFloat("negzero")));
}

TEST(GraphText, SizesLineKeepsBindingOrder) {
  Graph g;
  GraphBuilder b(g);
  SymExpr n = b.sizeSymbol("n"), m = b.sizeSymbol("m");
  Node *x = b.input("x", DType::Float32, {m, n});
  b.output({b.reshape(x, {b.sym().mul(m, n)})});
  std::string text = printGraph(g);
  EXPECT_EQ(text, "sizes n, m\n"
                  "graph(%x: f32[m, n]) {\n"
                  "  %reshape = reshape(%x) : f32[n*m]\n"
                  "  return %reshape\n"
                  "}\n");
  expectRoundTrip(g);
}

TEST(GraphText, ExplicitInputAttributesAndComments) {
  std::unique_ptr<Graph> g = parseGraph("# two inputs\n"
                                        "graph(%a: f32[4, 3]{1, 4} {index=1, pinned=true},\n"
                                        "      %b: i64[]) {\n"
                                        "  %c = convert(%b) : f32[]  # scalar\n"
                                        "  return %c, %a\n"
                                        "}\n");
  EXPECT_EQ(g->inputs()[0]->attrs().getInt("index"), 1);
  EXPECT_TRUE(g->inputs()[0]->attrs().getBool("pinned"));
  EXPECT_EQ(g->inputs()[1]->attrs().getInt("index"), 1);
  EXPECT_EQ(printGraph(*g), "graph(%a: f32[4, 3]{1, 4} {index=1, pinned=true}, %b: i64[]) {\n"
                            "  %c = convert(%b) : f32[]\n"
                            "  return %c, %a\n"
                            "}\n");
  EXPECT_EQ(verifyGraph(*g), "input %a is input 0 but its \"index\" attribute is 1");
}

TEST(GraphText, ParseErrorsNameWhatWasExpected) {
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  %b = exp(%a) f32[4]\n  return %b\n}\n"),
            "graph-parser: line 2, column 16: expected ':', found 'f32'");
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  %b = exp(%c) : f32[4]\n  return %b\n}\n"),
            "graph-parser: line 2, column 12: use of undefined value %c");
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  %b = frob(%a) : f32[4]\n  return %b\n}\n"),
            "graph-parser: line 2, column 8: expected an op name, found 'frob'");
  EXPECT_EQ(parseError("graph(%a: f33[4]) {\n  return %a\n}\n"),
            "graph-parser: line 1, column 11: expected a dtype, found 'f33'");
  EXPECT_EQ(parseError("graph(%a: f32[s0 +]) {\n  return %a\n}\n"),
            "graph-parser: line 1, column 19: expected an expression but found end of input "
            "in 's0 +'");
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  %a = neg(%a) : f32[4]\n  return %a\n}\n"),
            "graph-parser: line 2, column 3: value %a is defined twice");
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  %b = full() {value=} : f32[]\n  return %b\n}\n"),
            "graph-parser: line 2, column 22: expected an attribute value, found '}'");
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  return %a\n"),
            "graph-parser: line 3, column 1: expected '}', found end of input");
  EXPECT_EQ(parseError("graph(%a: f32[4]) {\n  return %a\n}\nextra"),
            "graph-parser: line 4, column 1: expected end of input, found 'extra'");
}

/// A graph f32[4, 3] input %x, built node by node so that each test can break one invariant.
struct BadGraph {
  Graph g;
  Node *x;
  BadGraph() {
    AttrMap index;
    index.set("index", int64_t{0});
    x = g.addNode(OpKind::Input, {}, index, type({4, 3}), "x");
  }
  TensorType type(std::vector<int64_t> shape, DType dtype = DType::Float32) {
    std::vector<SymExpr> dims;
    for (int64_t d : shape)
      dims.push_back(g.sym().constant(d));
    return TensorType{dtype, dims, {}};
  }
  Node *add(OpKind op, std::vector<Node *> operands, std::vector<int64_t> shape,
            AttrMap attrs = {}, DType dtype = DType::Float32) {
    Node *n = g.addNode(op, std::move(operands), std::move(attrs), type(shape, dtype),
                        std::string(opName(op)));
    g.setOutputs({n});
    return n;
  }
};

AttrMap reduceAttrs(IntList dims, bool keepdim) {
  AttrMap a;
  a.set("dims", dims);
  a.set("keepdim", keepdim);
  return a;
}

TEST(GraphVerifier, CatchesBrokenGraphs) {
  {
    BadGraph b;
    b.add(OpKind::Add, {b.x, b.x}, {4, 3});
    EXPECT_EQ(verifyGraph(b.g), "");
  }
  {
    BadGraph b;
    b.add(OpKind::Add, {b.x}, {4, 3});
    EXPECT_EQ(verifyGraph(b.g), "node %add (add): takes 2 operands, got 1");
  }
  {
    BadGraph b;
    Node *y = b.add(OpKind::Neg, {b.x}, {3});
    EXPECT_EQ(verifyGraph(b.g), "node %neg (neg): operands broadcast to [4, 3] but the result "
                                "shape is [3]");
    (void)y;
  }
  {
    BadGraph b;
    Node *y = b.add(OpKind::Full, {}, {4}, [] {
      AttrMap a;
      a.set("value", 1.0);
      return a;
    }());
    b.add(OpKind::Mul, {b.x, y}, {4, 3});
    EXPECT_EQ(verifyGraph(b.g), "node %mul (mul): operand shapes do not broadcast: [4, 3] and [4]");
  }
  {
    BadGraph b;
    b.add(OpKind::Sum, {b.x}, {4}, reduceAttrs({2}, false));
    EXPECT_EQ(verifyGraph(b.g), "node %sum (sum): dim 2 is out of range for rank 2");
  }
  {
    BadGraph b;
    b.add(OpKind::Amax, {b.x}, {4}, reduceAttrs({1}, true));
    EXPECT_EQ(verifyGraph(b.g), "node %amax (amax): result rank 1 is not 2 (operand rank 2, "
                                "keepdim=true)");
  }
  {
    BadGraph b;
    b.add(OpKind::Reshape, {b.x}, {5, 2});
    EXPECT_EQ(verifyGraph(b.g), "node %reshape (reshape): 12 elements cannot become [5, 2]");
  }
  {
    BadGraph b;
    AttrMap dims;
    dims.set("dims", IntList{0, 0});
    b.add(OpKind::Permute, {b.x}, {4, 4}, dims);
    EXPECT_EQ(verifyGraph(b.g),
              "node %permute (permute): dims [0, 0] are not a permutation of 2 dims");
  }
  {
    BadGraph b;
    b.add(OpKind::LayerNorm, {b.x, b.x, b.x, b.x}, {4, 3});
    EXPECT_EQ(verifyGraph(b.g), "node %layer_norm (layer_norm): takes 1 to 3 operands, got 4");
  }
  {
    BadGraph b;
    AttrMap dim;
    dim.set("dim", int64_t{0});
    b.add(OpKind::Gather, {b.x, b.x}, {4, 3}, dim);
    EXPECT_EQ(verifyGraph(b.g), "node %gather (gather): index must be an integer tensor, got f32");
  }
  {
    BadGraph b;
    Node *neg = b.add(OpKind::Neg, {b.x}, {4, 3});
    Node *exp = b.add(OpKind::Exp, {neg}, {4, 3});
    b.g.reorder({b.x, exp, neg});
    EXPECT_EQ(verifyGraph(b.g), "node %exp (exp): operand 0 %neg is used before it is defined");
  }
  {
    BadGraph b;
    b.add(OpKind::Neg, {b.x}, {4, 3});
    b.g.setOutputs({});
    EXPECT_EQ(verifyGraph(b.g), "the graph has no outputs");
  }
  {
    BadGraph b;
    AttrMap index;
    index.set("index", int64_t{5});
    b.g.addNode(OpKind::Input, {}, index, b.type({2}), "y");
    b.g.setOutputs({b.x});
    EXPECT_EQ(verifyGraph(b.g), "input %y is input 1 but its \"index\" attribute is 5");
  }
  {
    BadGraph b;
    SymExpr stray = b.g.sym().sizeSymbol("stray"); // not a size symbol of the graph
    b.g.addNode(OpKind::Neg, {b.x}, {}, TensorType{DType::Float32, {stray}, {}}, "neg");
    b.g.setOutputs({b.x});
    EXPECT_EQ(verifyGraph(b.g),
              "node %neg (neg): type uses 'stray', which is not a size symbol of the graph");
  }
}

} // namespace
} // namespace braze
