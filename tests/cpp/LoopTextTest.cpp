// Text form of the loop IR: printer, parser and verifier.
#include "braze/ir/loop/LoopText.h"

#include "braze/support/Diagnostic.h"

#include <gtest/gtest.h>

#include <limits>

namespace braze::loop {
namespace {

/// printProgram is a fixpoint of parse ∘ print, and the parsed program verifies.
void expectRoundTrip(const LoopProgram &p) {
  std::string text = printProgram(p);
  std::unique_ptr<LoopProgram> parsed = parseProgram(text);
  EXPECT_EQ(printProgram(*parsed), text);
  EXPECT_EQ(verifyProgram(*parsed), "");
  EXPECT_EQ(parsed->buffers().size(), p.buffers().size());
  EXPECT_EQ(parsed->computations().size(), p.computations().size());
}

std::string parseError(std::string_view text) {
  try {
    parseProgram(text);
  } catch (const Diagnostic &d) {
    EXPECT_EQ(d.op(), "loop-parser");
    return d.what();
  }
  return "no error";
}

const double kInf = std::numeric_limits<double>::infinity();

TEST(LoopText, PrintsAndRoundTripsAProgram) {
  LoopProgram p(std::make_shared<sym::SymContext>());
  sym::SymContext &s = p.sym();
  ExprContext &x = p.exprs();
  SymExpr s0 = s.sizeSymbol("s0"), s1 = s.sizeSymbol("s1");
  p.sizeSymbols() = {s0, s1};
  Buffer *arg0 = p.addBuffer("arg0", DType::Float32, {s0, s1}, BufferKind::Input, 0);
  Buffer *arg1 =
      p.addBuffer("arg1", DType::Float32, {s0, s1}, BufferKind::Input, 1, {s.constant(1), s0});
  Buffer *idx = p.addBuffer("idx", DType::Int64, {s0}, BufferKind::Input, 2);
  Buffer *buf = p.addBuffer("buf0", DType::Float32, {s0}, BufferKind::Intermediate);
  Buffer *out0 = p.addBuffer("out0", DType::Float32, {s0}, BufferKind::Output, 0);
  Buffer *out1 = p.addBuffer("out1", DType::Float16, {s0, s1}, BufferKind::Output, 1);
  Buffer *out2 = p.addBuffer("out2", DType::Bool, {}, BufferKind::Output, 2);

  { // Row sums of ceil(arg0) + arg1 (arg1 is column-major).
    SymExpr i0 = s.indexSymbol("i0", s0), r0 = s.indexSymbol("r0", s1);
    const Expr *a = x.op(ScalarOpKind::Ceil, {x.load(arg0, s.add(s.mul(i0, s1), r0))},
                         DType::Float32);
    const Expr *b = x.load(arg1, s.add(i0, s.mul(r0, s0)));
    p.addComputation(buf, {i0}, {r0}, ReduceKind::Sum,
                     x.op(ScalarOpKind::Add, {a, b}, DType::Float32));
  }
  { // A gather through idx, a where, and the index as a value.
    SymExpr i0 = s.indexSymbol("i0", s0), t0 = s.indexSymbol("t0", s1);
    const Expr *g = x.load(arg0, s.add(s.mul(i0, s1), t0), {{t0, x.load(idx, i0)}});
    const Expr *r = x.load(buf, i0);
    const Expr *w = x.op(ScalarOpKind::Where,
                         {x.op(ScalarOpKind::Gt, {g, r}, DType::Bool), g,
                          x.constant(0.5, DType::Float32)},
                         DType::Float32);
    const Expr *iv = x.cast(x.indexValue(i0, DType::Int64), DType::Float32);
    p.addComputation(out0, {i0}, {}, ReduceKind::None,
                     x.op(ScalarOpKind::Mul, {w, iv}, DType::Float32));
  }
  { // A shared subexpression prints once; a cast to f16.
    SymExpr i0 = s.indexSymbol("i0", s0), i1 = s.indexSymbol("i1", s1);
    const Expr *v = x.load(arg0, s.add(s.mul(i0, s1), i1));
    p.addComputation(out1, {i0, i1}, {}, ReduceKind::None,
                     x.cast(x.op(ScalarOpKind::Mul, {v, v}, DType::Float32), DType::Float16));
  }
  { // any() over everything, with bool, int and infinite constants.
    SymExpr r0 = s.indexSymbol("r0", s0), r1 = s.indexSymbol("r1", s1);
    const Expr *v = x.load(arg0, s.add(s.mul(r0, s1), r1));
    const Expr *isNegInf = x.op(ScalarOpKind::Eq, {v, x.constant(-kInf, DType::Float32)},
                                DType::Bool);
    const Expr *big = x.op(ScalarOpKind::Ge, {x.load(idx, r0), x.constant(-3, DType::Int64)},
                           DType::Bool);
    const Expr *both = x.op(ScalarOpKind::LogicalAnd, {isNegInf, big}, DType::Bool);
    p.addComputation(out2, {}, {r0, r1}, ReduceKind::Any,
                     x.op(ScalarOpKind::LogicalOr, {both, x.constant(0, DType::Bool)},
                          DType::Bool));
  }
  ASSERT_EQ(verifyProgram(p), "");
  EXPECT_EQ(printProgram(p), "sizes s0, s1\n"
                             "buffer %arg0: f32[s0, s1] input 0\n"
                             "buffer %arg1: f32[s0, s1]{1, s0} input 1\n"
                             "buffer %idx: i64[s0] input 2\n"
                             "buffer %buf0: f32[s0] intermediate\n"
                             "buffer %out0: f32[s0] output 0\n"
                             "buffer %out1: f16[s0, s1] output 1\n"
                             "buffer %out2: bool[] output 2\n"
                             "compute %buf0[i0 < s0] reduce sum over [r0 < s1] {\n"
                             "  %0 = load %arg0[r0 + s1*i0] : f32\n"
                             "  %1 = ceil(%0) : f32\n"
                             "  %2 = load %arg1[i0 + s0*r0] : f32\n"
                             "  %3 = add(%1, %2) : f32\n"
                             "  yield %3\n"
                             "}\n"
                             "compute %out0[i0 < s0] {\n"
                             "  %0 = load %idx[i0] : i64\n"
                             "  %1 = load %arg0[t0 + s1*i0] where t0 < s1 = %0 : f32\n"
                             "  %2 = load %buf0[i0] : f32\n"
                             "  %3 = gt(%1, %2) : bool\n"
                             "  %4 = const 0.5 : f32\n"
                             "  %5 = where(%3, %1, %4) : f32\n"
                             "  %6 = index(i0) : i64\n"
                             "  %7 = cast(%6) : f32\n"
                             "  %8 = mul(%5, %7) : f32\n"
                             "  yield %8\n"
                             "}\n"
                             "compute %out1[i0 < s0, i1 < s1] {\n"
                             "  %0 = load %arg0[i1 + s1*i0] : f32\n"
                             "  %1 = mul(%0, %0) : f32\n"
                             "  %2 = cast(%1) : f16\n"
                             "  yield %2\n"
                             "}\n"
                             "compute %out2[] reduce any over [r0 < s0, r1 < s1] {\n"
                             "  %0 = load %arg0[r1 + s1*r0] : f32\n"
                             "  %1 = const -inf : f32\n"
                             "  %2 = eq(%0, %1) : bool\n"
                             "  %3 = load %idx[r0] : i64\n"
                             "  %4 = const -3 : i64\n"
                             "  %5 = ge(%3, %4) : bool\n"
                             "  %6 = logical_and(%2, %5) : bool\n"
                             "  %7 = const false : bool\n"
                             "  %8 = logical_or(%6, %7) : bool\n"
                             "  yield %8\n"
                             "}\n");
  expectRoundTrip(p);
}

TEST(LoopText, RoundTripsSizeIndirectSymbolsAndComments) {
  const char *text = "# a gather whose index is only known to be >= 0\n"
                     "sizes n\n"
                     "buffer %x: f64[n] input 0\n"
                     "buffer %i: i32[4] input 1\n"
                     "buffer %y: f64[4] output 0\n"
                     "compute %y[j < 4] {\n"
                     "  %a = load %i[j] : i32\n"
                     "  %b = load %x[t] where t = %a : f64   # t is a size symbol\n"
                     "  %c = const 1e-300 : f64\n"
                     "  %d = maximum(%b, %c) : f64\n"
                     "  yield %d\n"
                     "}\n";
  std::unique_ptr<LoopProgram> p = parseProgram(text);
  ASSERT_EQ(verifyProgram(*p), "");
  EXPECT_EQ(printProgram(*p), "sizes n\n"
                              "buffer %x: f64[n] input 0\n"
                              "buffer %i: i32[4] input 1\n"
                              "buffer %y: f64[4] output 0\n"
                              "compute %y[j < 4] {\n"
                              "  %0 = load %i[j] : i32\n"
                              "  %1 = load %x[t] where t = %0 : f64\n"
                              "  %2 = const 1e-300 : f64\n"
                              "  %3 = maximum(%1, %2) : f64\n"
                              "  yield %3\n"
                              "}\n");
  const Expr *load = p->computations()[0]->value->operands()[0];
  ASSERT_EQ(load->indirect().size(), 1u);
  EXPECT_EQ(load->indirect()[0].first->role(), sym::SymbolRoleKind::Size);
  expectRoundTrip(*p);
}

/// A 1-d grouped convolution (stride 2, padding 1) in the direct form to_loops gives it.
std::string convProgram(const std::string &spec) {
  return "buffer %x: f32[2, 4, 9] input 0\n"
         "buffer %w: f32[6, 2, 3] input 1\n"
         "buffer %y: f32[2, 6, 5] output 0\n"
         "compute %y[i0 < 2, i1 < 6, i2 < 5] reduce sum over [r0 < 2, r1 < 3] " + spec + " {\n"
         "  %0 = index(2*i2 + r1 - 1) : i64\n"
         "  %1 = const 0 : i64\n"
         "  %2 = ge(%0, %1) : bool\n"
         "  %3 = index(9) : i64\n"
         "  %4 = lt(%0, %3) : bool\n"
         "  %5 = logical_and(%2, %4) : bool\n"
         "  %6 = load %x[36*i0 + 9*r0 + 18*(i1 // 3) + max(0, min(8, 2*i2 + r1 - 1))] : f32\n"
         "  %7 = const 0.0 : f32\n"
         "  %8 = where(%5, %6, %7) : f32\n"
         "  %9 = load %w[6*i1 + 3*r0 + r1] : f32\n"
         "  %10 = mul(%8, %9) : f32\n"
         "  yield %10\n"
         "}\n";
}

std::string callerLayoutProgram(const std::string &out) {
  return "sizes s0\n"
         "buffer %x: f32[s0, 6] input 0\n"
         "buffer %" + out + "\n"
         "compute %y[i0 < s0, i1 < 6] {\n"
         "  %0 = load %x[6*i0 + i1] : f32\n"
         "  %1 = exp(%0) : f32\n"
         "  yield %1\n"
         "}\n";
}

TEST(LoopText, RoundTripsAnOutputSeenInAnotherShape) {
  // The caller sees the [s0, 6] row-major result as its transpose, [6, s0] strides {1, 6}.
  std::string text = callerLayoutProgram("y: f32[s0, 6] output 0 as [6, s0]{1, 6}");
  std::unique_ptr<LoopProgram> p = parseProgram(text);
  ASSERT_EQ(verifyProgram(*p), "");
  EXPECT_EQ(printProgram(*p), text);
  const Buffer &y = *p->outputs()[0];
  EXPECT_EQ(sym::toString(y.seenShape()[0]), "6");
  EXPECT_EQ(sym::toString(y.seenStrides()[1]), "6");
  EXPECT_EQ(sym::toString(y.shape[0]), "s0");
  expectRoundTrip(*p);
  auto error = [](const std::string &out) {
    return verifyProgram(*parseProgram(callerLayoutProgram(out)));
  };
  EXPECT_EQ(error("y: f32[s0, 6] output 0 as [6, s0]{1, 6}"), "");
  EXPECT_EQ(error("y: f32[s0, 6] output 0 as [3, 2, s0]{2, 1, 6}"), "");
  EXPECT_EQ(error("y: f32[s0, 6] output 0 as [6, s0]{1, 7}"),
            "buffer %y is seen by its caller as [6, s0] strides [1, 7] over [s0, 6] strides "
            "[6, 1]; both must cover their elements once, without gaps");
  EXPECT_EQ(error("y: f32[s0, 6] output 0 as [6, s0, 2]{1, 6, 0}"),
            "buffer %y has 6*s0 elements but its caller's shape [6, s0, 2] has 12*s0");
  EXPECT_EQ(error("y: f32[s0, 6] intermediate as [6, s0]{1, 6}"),
            "buffer %y is an intermediate with a caller's shape; only an input or an output has "
            "one");
  EXPECT_NE(parseError(callerLayoutProgram("y: f32[s0, 6] output 0 as [6, s0]"))
                .find("expected '{'"),
            std::string::npos);
}

TEST(LoopText, RoundTripsAnInputSeenInAnotherShape) {
  // A channels-last image the caller passes as [2, 3, 4, 5] strides {60, 1, 15, 3}, read as
  // the [2, 4, 5, 3] buffer its memory is.
  std::string text = "buffer %x: f32[2, 4, 5, 3] input 0 as [2, 3, 4, 5]{60, 1, 15, 3}\n"
                     "buffer %y: f32[2, 4, 5, 3] output 0\n"
                     "compute %y[i0 < 2, i1 < 4, i2 < 5, i3 < 3] {\n"
                     "  %0 = load %x[60*i0 + 15*i1 + 3*i2 + i3] : f32\n"
                     "  %1 = exp(%0) : f32\n"
                     "  yield %1\n"
                     "}\n";
  std::unique_ptr<LoopProgram> p = parseProgram(text);
  ASSERT_EQ(verifyProgram(*p), "");
  EXPECT_EQ(printProgram(*p), text);
  const Buffer &x = *p->inputs()[0];
  EXPECT_EQ(sym::toString(x.seenShape()[1]), "3");
  EXPECT_EQ(sym::toString(x.seenStrides()[1]), "1");
  expectRoundTrip(*p);
}

std::string scatterProgram(const std::string &init, const std::string &head,
                           const std::string &at) {
  return "buffer %src: f32[3, 2] input 0\n"
         "buffer %idx: i64[3] input 1\n"
         "buffer %out0: f32[5, 2] output 0\n" + init +
         "compute %out0[i0 < 3, i1 < 2]" + head + " {\n"
         "  %0 = load %src[2*i0 + i1] : f32\n"
         "  %1 = load %idx[i0] : i64\n"
         "  %2 = const 2 : i64\n"
         "  %3 = mul(%1, %2) : i64\n"
         "  %4 = index(i1) : i64\n"
         "  %5 = add(%3, %4) : i64\n"
         "  %6 = const 1.5 : f32\n"
         "  yield %0" + at + "\n"
         "}\n";
}

TEST(LoopText, RoundTripsAnAccumulatingScatter) {
  const std::string init = "compute %out0[i0 < 5, i1 < 2] {\n"
                           "  %0 = const 0.0 : f32\n"
                           "  yield %0\n"
                           "}\n";
  // The position is printed after the value it adds, in the same body.
  std::string text = scatterProgram(init, " scatter add", " at %5");
  const std::string unused = "  %6 = const 1.5 : f32\n";
  text.erase(text.find(unused), unused.size());
  std::unique_ptr<LoopProgram> p = parseProgram(text);
  ASSERT_EQ(verifyProgram(*p), "");
  EXPECT_EQ(printProgram(*p), text);
  const Computation &c = *p->computations()[1];
  ASSERT_NE(c.scatterAt(), nullptr);
  EXPECT_EQ(c.scatterAt()->dtype(), DType::Int64);
  expectRoundTrip(*p);
  // Nothing wrote the buffer before the scatter adds into it.
  EXPECT_EQ(verifyProgram(*parseProgram(scatterProgram("", " scatter add", " at %5"))),
            "compute 0 (%out0): scatters into %out0 before anything writes it");
  // A position must be an integer.
  EXPECT_EQ(verifyProgram(*parseProgram(scatterProgram(init, " scatter add", " at %6"))),
            "compute 1 (%out0): scatters at a position of type f32; positions are integers");
  // Without `scatter add` the computation must cover its buffer.
  EXPECT_NE(verifyProgram(*parseProgram(scatterProgram(init, "", ""))).find("does not cover"),
            std::string::npos);
  EXPECT_NE(parseError(scatterProgram(init, " scatter add", "")).find("expected 'at'"),
            std::string::npos);
}

TEST(LoopText, RoundTripsEachScatterCombine) {
  const std::string init = "compute %out0[i0 < 5, i1 < 2] {\n"
                           "  %0 = const 1.0 : f32\n"
                           "  yield %0\n"
                           "}\n";
  const std::pair<const char *, ReduceKind> combines[] = {
      {"add", ReduceKind::Sum}, {"prod", ReduceKind::Prod},
      {"max", ReduceKind::Max}, {"min", ReduceKind::Min}};
  for (const auto &[word, kind] : combines) {
    std::unique_ptr<LoopProgram> p =
        parseProgram(scatterProgram(init, std::string(" scatter ") + word, " at %5"));
    EXPECT_EQ(verifyProgram(*p), "") << word;
    EXPECT_EQ(p->computations()[1]->scatterCombine(), kind) << word;
    expectRoundTrip(*p);
  }
  EXPECT_NE(parseError(scatterProgram(init, " scatter mean", " at %5"))
                .find("expected a scatter's combine (add, prod, max or min), found 'mean'"),
            std::string::npos);
  // Only f32, f64, i32 and i64 buffers are combined into.
  std::string half = scatterProgram(init, " scatter max", " at %5");
  half.replace(half.find("%out0: f32"), 10, "%out0: f16");
  EXPECT_NE(verifyProgram(*parseProgram(half)).find("a scatter's buffer is f32, f64, i32 or i64"),
            std::string::npos);
}

TEST(LoopText, RoundTripsAConvolutionSpec) {
  std::string text =
      convProgram("conv(%x, %w, stride=[2], padding=[1], dilation=[1], groups=2)");
  std::unique_ptr<LoopProgram> p = parseProgram(text);
  ASSERT_EQ(verifyProgram(*p), "");
  EXPECT_EQ(printProgram(*p), text);
  const Computation &c = *p->computations()[0];
  ASSERT_TRUE(c.conv() != nullptr);
  EXPECT_EQ(c.conv()->input->name, "x");
  EXPECT_EQ(c.conv()->weight->name, "w");
  EXPECT_EQ(c.conv()->groups, 2);
  expectRoundTrip(*p);
  // A channels-last convolution is 2-d.
  EXPECT_EQ(verifyProgram(*parseProgram(convProgram(
                "conv(%x, %w, stride=[2], padding=[1], dilation=[1], groups=2, layout=nhwc)"))),
            "compute 0 (%y): a channels-last convolution must be 2-d");
  EXPECT_NE(parseError(convProgram(
                "conv(%x, %w, stride=[2], padding=[1], dilation=[1], groups=2, layout=nchw)"))
                .find("expected layout 'nhwc', found 'nchw'"),
            std::string::npos);
  EXPECT_NE(parseError(convProgram("conv(%x, %w, stride=[2], padding=[1], groups=2)")).find(
                "expected 'dilation'"),
            std::string::npos);
}

TEST(LoopVerifier, ChecksConvolutionSpecs) {
  auto error = [](const std::string &spec) {
    return verifyProgram(*parseProgram(convProgram(spec)));
  };
  EXPECT_EQ(error("conv(%x, %w, stride=[2, 1], padding=[1], dilation=[1], groups=2)"),
            "compute 0 (%y): convolution stride, padding and dilation need 1 entries each");
  EXPECT_EQ(error("conv(%x, %w, stride=[0], padding=[1], dilation=[1], groups=2)"),
            "compute 0 (%y): convolution stride and dilation must be >= 1 and padding >= 0");
  EXPECT_EQ(error("conv(%x, %w, stride=[2], padding=[-1], dilation=[1], groups=2)"),
            "compute 0 (%y): convolution stride and dilation must be >= 1 and padding >= 0");
  EXPECT_EQ(error("conv(%x, %w, stride=[2], padding=[1], dilation=[1], groups=0)"),
            "compute 0 (%y): convolution groups must be >= 1");
  EXPECT_EQ(error("conv(%x, %w, stride=[2], padding=[1], dilation=[1], groups=1)"),
            "compute 0 (%y): convolution shapes do not agree: input [2, 4, 9], weight [6, 2, 3], "
            "result [2, 6, 5]");
  EXPECT_EQ(error("conv(%x, %w, stride=[1], padding=[1], dilation=[1], groups=2)"),
            "compute 0 (%y): convolution shapes do not agree: input [2, 4, 9], weight [6, 2, 3], "
            "result [2, 6, 5]");
  EXPECT_EQ(error("conv(%w, %x, stride=[2], padding=[1], dilation=[1], groups=2)"),
            "compute 0 (%y): convolution shapes do not agree: input [6, 2, 3], weight [2, 4, 9], "
            "result [2, 6, 5]");
  EXPECT_EQ(error("conv(%y, %w, stride=[2], padding=[1], dilation=[1], groups=2)"),
            "compute 0 (%y): convolution operand %y is not read by the value");
}

/// q is a permuted view of %x ([2, 5, 3, 8] read as [2, 3, 5, 8]), the bias broadcasts over the
/// heads, and the output is row-major.
std::string attentionProgram(const std::string &spec) {
  return "sizes s0\n"
         "buffer %x: f32[2, 5, 3, 8] input 0\n"
         "buffer %k: f32[2, 3, s0, 8] input 1\n"
         "buffer %v: f32[2, 3, s0, 4] input 2\n"
         "buffer %m: f32[2, 1, 5, s0] input 3\n"
         "buffer %y: f32[2, 3, 5, 4] output 0\n"
         "compute %y[i0 < 2, i1 < 3, i2 < 5, i3 < 4] " + spec + " {\n"
         "  yield\n"
         "}\n";
}

const char *kQ = "q=(%x, 0, [2, 3, 5, 8], [120, 8, 24, 1])";
const char *kK = "k=(%k, 0, [2, 3, s0, 8], [24*s0, 8*s0, 8, 1])";
const char *kV = "v=(%v, 0, [2, 3, s0, 4], [12*s0, 4*s0, 4, 1])";
const char *kBias = "bias=(%m, 0, [2, 3, 5, s0], [5*s0, 0, s0, 1])";

std::string attentionSpec(const std::string &q, const std::string &tail) {
  return "attention(" + q + ", " + kK + ", " + kV + ", " + tail + ")";
}

TEST(LoopText, RoundTripsAnAttentionSpec) {
  for (const std::string tail : {std::string(kBias) + ", scale=0.35, causal=true",
                                 std::string("scale=-1.5e-05, causal=false, safe=false")}) {
    std::string text = attentionProgram(attentionSpec(kQ, tail));
    std::unique_ptr<LoopProgram> p = parseProgram(text);
    ASSERT_EQ(verifyProgram(*p), "") << text;
    EXPECT_EQ(printProgram(*p), text);
    expectRoundTrip(*p);
  }
  std::unique_ptr<LoopProgram> p = parseProgram(
      attentionProgram(attentionSpec(kQ, std::string(kBias) + ", scale=0.35, causal=true")));
  const Computation &c = *p->computations()[0];
  ASSERT_TRUE(c.attention() != nullptr);
  EXPECT_EQ(c.value, nullptr);
  EXPECT_EQ(c.attention()->q.buffer->name, "x");
  EXPECT_TRUE(c.attention()->bias.has_value());
  EXPECT_TRUE(c.attention()->causal);
  EXPECT_TRUE(c.attention()->safe);
  EXPECT_DOUBLE_EQ(c.attention()->scale, 0.35);
  EXPECT_NE(parseError(attentionProgram(attentionSpec(kQ, "scale=0.5, causal=maybe")))
                .find("expected true or false, found 'maybe'"),
            std::string::npos);
  EXPECT_NE(parseError(attentionProgram(attentionSpec(kQ, "scale=x, causal=true")))
                .find("expected a number, found 'x'"),
            std::string::npos);
}

TEST(LoopVerifier, ChecksAttentionSpecs) {
  auto error = [](const std::string &q, const std::string &tail) {
    return verifyProgram(*parseProgram(attentionProgram(attentionSpec(q, tail))));
  };
  EXPECT_EQ(error("q=(%x, 0, [2, 3, 5, 8], [120, 8, 24, 2])", "scale=1.0, causal=false"),
            "compute 0 (%y): attention operand %x must have unit stride along its last dim");
  EXPECT_EQ(error("q=(%x, 0, [2, 3, 5, 6], [120, 8, 24, 1])", "scale=1.0, causal=false"),
            "compute 0 (%y): attention shapes do not agree: q [2, 3, 5, 6], k [2, 3, s0, 8], "
            "v [2, 3, s0, 4], output [2, 3, 5, 4]");
  EXPECT_EQ(error("q=(%x, 0, [2, 3, 5], [120, 8, 1])", "scale=1.0, causal=false"),
            "compute 0 (%y): attention operand %x needs an offset, 4 sizes and 4 strides");
  EXPECT_EQ(error(kQ, "bias=(%m, 0, [2, 3, 5, 5], [5*s0, 0, s0, 1]), scale=1.0, causal=false"),
            "compute 0 (%y): attention shapes do not agree: q [2, 3, 5, 8], k [2, 3, s0, 8], "
            "v [2, 3, s0, 4], output [2, 3, 5, 4]");
  EXPECT_EQ(error("q=(%y, 0, [2, 3, 5, 8], [120, 8, 24, 1])", "scale=1.0, causal=false"),
            "compute 0 (%y): attention operand is not a buffer written before it");
  EXPECT_EQ(error(kQ, "scale=inf, causal=false"), "compute 0 (%y): attention scale must be finite");
}

/// The backward's parts: the log-sum-exp [2, 3, 5] (f32, read through strides [15, 1, 3] as
/// PyTorch's CPU flash attention stores it) and the gradient with respect to k.
std::string attentionBackwardProgram(const std::string &part, const std::string &tail) {
  bool lse = part == "attention_lse";
  std::string operands =
      lse ? std::string(kQ) + ", " + kK
          : "dout=(%g, 0, [2, 3, 5, 4], [60, 20, 4, 1]), " + std::string(kQ) + ", " + kK + ", " +
                kV + ", out=(%o, 0, [2, 3, 5, 4], [60, 20, 4, 1]), lse=(%l, 0, [2, 3, 5], [15, 1, 3])";
  return "sizes s0\n"
         "buffer %x: f32[2, 5, 3, 8] input 0\n"
         "buffer %k: f32[2, 3, s0, 8] input 1\n"
         "buffer %v: f32[2, 3, s0, 4] input 2\n"
         "buffer %m: f32[2, 1, 5, s0] input 3\n"
         "buffer %g: f32[2, 3, 5, 4] input 4\n"
         "buffer %o: f32[2, 3, 5, 4] input 5\n"
         "buffer %l: f32[2, 5, 3] input 6\n" +
         std::string(lse ? "buffer %y: f32[2, 3, 5] output 0\n"
                         : "buffer %y: f32[2, 3, s0, 8] output 0\n") +
         (lse ? "compute %y[i0 < 2, i1 < 3, i2 < 5] " : "compute %y[i0 < 2, i1 < 3, i2 < s0, i3 < 8] ") +
         part + "(" + operands + ", " + tail + ") {\n"
         "  yield\n"
         "}\n";
}

TEST(LoopText, RoundTripsAttentionBackwardParts) {
  for (const std::string part : {"attention_lse", "attention_grad_k"})
    for (const std::string tail : {std::string(kBias) + ", scale=0.35, causal=true",
                                   std::string("scale=0.5, causal=false")}) {
      std::string text = attentionBackwardProgram(part, tail);
      std::unique_ptr<LoopProgram> p = parseProgram(text);
      ASSERT_EQ(verifyProgram(*p), "") << text;
      EXPECT_EQ(printProgram(*p), text);
      expectRoundTrip(*p);
      const AttentionSpec &a = *p->computations()[0]->attention();
      EXPECT_EQ(a.part, part == "attention_lse" ? AttentionPart::Lse : AttentionPart::GradK);
      EXPECT_EQ(a.lse.has_value(), part != "attention_lse");
      EXPECT_EQ(a.v.buffer != nullptr, part != "attention_lse");
    }
  // The output must be shaped as the operand the gradient is taken of (k here, not q).
  std::string text = attentionBackwardProgram("attention_grad_q", "scale=0.5, causal=false");
  EXPECT_EQ(verifyProgram(*parseProgram(text)),
            "compute 0 (%y): attention_grad_q shapes do not agree: q [2, 3, 5, 8], "
            "k [2, 3, s0, 8], v [2, 3, s0, 4], output [2, 3, s0, 8]");
  EXPECT_NE(parseError(attentionBackwardProgram("attention_grad_w", "scale=0.5, causal=false"))
                .find("expected attention, attention_lse or attention_grad_q|k|v, found "
                      "'attention_grad_w'"),
            std::string::npos);
}

TEST(LoopText, PrintExprIsOneLine) {
  LoopProgram p(std::make_shared<sym::SymContext>());
  SymExpr i = p.sym().indexSymbol("i", p.sym().constant(8));
  Buffer *b = p.addBuffer("b", DType::Float32, {p.sym().constant(8)}, BufferKind::Input, 0);
  ExprContext &x = p.exprs();
  const Expr *e = x.cast(
      x.op(ScalarOpKind::Add, {x.load(b, i), x.constant(2.0, DType::Float32)}, DType::Float32),
      DType::Float16);
  EXPECT_EQ(printExpr(e), "cast(add(load %b[i], 2.0:f32)):f16");
}

TEST(LoopText, ParseErrorsNameWhatWasExpected) {
  const std::string head = "buffer %a: f32[4] input 0\nbuffer %o: f32[4] output 0\n";
  EXPECT_EQ(parseError(head + "compute %z[i < 4] {\n  yield\n}\n"),
            "loop-parser: line 3, column 9: unknown buffer %z");
  EXPECT_EQ(parseError(head + "compute %o[i < 4] {\n  %0 = load %a[i] : i32\n  yield %0\n}\n"),
            "loop-parser: line 4, column 21: load of %a has type f32, not i32");
  EXPECT_EQ(parseError(head + "compute %o[i < 4] {\n  %0 = load %a[i + q] : f32\n  yield %0\n}\n"),
            "loop-parser: line 4, column 20: unknown symbol 'q' in 'i + q'");
  EXPECT_EQ(parseError(head + "compute %o[i < 4] {\n  %0 = load %a[i] : f32\n"
                              "  %1 = add(%0) : f32\n  yield %1\n}\n"),
            "loop-parser: line 5, column 8: add takes 2 operands, got 1");
  EXPECT_EQ(parseError(head + "compute %o[i < 4] {\n  yield %3\n}\n"),
            "loop-parser: line 4, column 9: use of undefined value %3");
  EXPECT_EQ(parseError(head + "compute %o[i < 4] reduce mean over [r < 2] {\n  yield\n}\n"),
            "loop-parser: line 3, column 26: expected a reduction kind, found 'mean'");
  EXPECT_EQ(parseError(head + "compute %o[i < 4] {\n  %0 = const 1.5 : i64\n  yield %0\n}\n"),
            "loop-parser: line 4, column 14: expected an integer constant, found '1.5'");
  EXPECT_EQ(parseError(head + "compute %o[i 4] {\n  yield\n}\n"),
            "loop-parser: line 3, column 14: expected '<', found '4'");
  EXPECT_EQ(parseError("sizes n\nbufer %a: f32[n] input 0\n"),
            "loop-parser: line 2, column 1: expected 'buffer' or 'compute', found 'bufer'");
}

/// `in: f32[n] input 0`, `out: f32[n] output 0`; the caller adds computations.
struct SmallProgram {
  LoopProgram p{std::make_shared<sym::SymContext>()};
  SymExpr n = p.sym().sizeSymbol("n");
  Buffer *in, *out;
  SmallProgram() {
    p.sizeSymbols() = {n};
    in = p.addBuffer("in", DType::Float32, {n}, BufferKind::Input, 0);
    out = p.addBuffer("out", DType::Float32, {n}, BufferKind::Output, 0);
  }
  SymExpr index(const char *name) { return p.sym().indexSymbol(name, n); }
  const Expr *load(Buffer *b, SymExpr i) { return p.exprs().load(b, i); }
  const Expr *op(ScalarOpKind k, std::vector<const Expr *> xs, DType t = DType::Float32) {
    return p.exprs().op(k, std::move(xs), t);
  }
};

TEST(LoopVerifier, CatchesBrokenPrograms) {
  {
    SmallProgram s;
    SymExpr i = s.index("i");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.load(s.in, i));
    EXPECT_EQ(verifyProgram(s.p), "");
  }
  {
    SmallProgram s, other;
    SymExpr i = s.index("i");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.load(other.in, i));
    EXPECT_EQ(verifyProgram(s.p),
              "compute 0 (%out): %0 (load) reads a buffer that is not in the program");
  }
  {
    SmallProgram s;
    Buffer *tmp = s.p.addBuffer("tmp", DType::Float32, {s.n}, BufferKind::Intermediate);
    SymExpr i = s.index("i"), j = s.index("j");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.load(tmp, i));
    s.p.addComputation(tmp, {j}, {}, ReduceKind::None, s.load(s.in, j));
    EXPECT_EQ(verifyProgram(s.p), "compute 0 (%out): %0 (load) reads %tmp before it is written");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i"), j = s.index("j");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.load(s.in, j));
    EXPECT_EQ(verifyProgram(s.p),
              "compute 0 (%out): %0 (load) uses 'j', which is not an index of this computation");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i"), j = s.index("j");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.load(s.in, i));
    s.p.addComputation(s.out, {j}, {}, ReduceKind::None, s.load(s.in, j));
    EXPECT_EQ(verifyProgram(s.p), "compute 1 (%out): output %out is written more than once");
  }
  {
    SmallProgram s;
    EXPECT_EQ(verifyProgram(s.p), "output %out is never written");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::Sum, s.load(s.in, i));
    EXPECT_EQ(verifyProgram(s.p),
              "compute 0 (%out): is a sum reduction without reduction indices");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i"), r = s.index("r");
    s.p.addComputation(s.out, {i}, {r}, ReduceKind::None, s.load(s.in, i));
    EXPECT_EQ(verifyProgram(s.p), "compute 0 (%out): is pointwise but has reduction indices");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i");
    const Expr *v = s.load(s.in, i);
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None,
                       s.op(ScalarOpKind::Add, {v, s.p.exprs().constant(1, DType::Int64)}));
    EXPECT_EQ(verifyProgram(s.p), "compute 0 (%out): %2 (add): operand dtypes f32 and i64 differ");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i");
    const Expr *v = s.load(s.in, i);
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.op(ScalarOpKind::Lt, {v, v}));
    EXPECT_EQ(verifyProgram(s.p), "compute 0 (%out): %1 (lt): result is f32 but should be bool");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i");
    const Expr *v = s.load(s.in, i);
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None, s.op(ScalarOpKind::Where, {v, v, v}));
    EXPECT_EQ(verifyProgram(s.p), "compute 0 (%out): %1 (where): condition is f32, not bool");
  }
  {
    SmallProgram s;
    SymExpr m = s.p.sym().sizeSymbol("m"); // not in the program's sizes
    s.p.addBuffer("extra", DType::Float32, {m}, BufferKind::Intermediate);
    EXPECT_EQ(verifyProgram(s.p),
              "buffer %extra uses 'm', which is not one of the program's sizes");
  }
  {
    SmallProgram s;
    SymExpr i = s.index("i"), t = s.index("t");
    s.p.addComputation(s.out, {i}, {}, ReduceKind::None,
                       s.p.exprs().load(s.in, t, {{t, s.load(s.in, i)}}));
    EXPECT_EQ(verifyProgram(s.p),
              "compute 0 (%out): %1 (load): indirect index 't' is bound to a f32 value");
  }
}

} // namespace
} // namespace braze::loop
