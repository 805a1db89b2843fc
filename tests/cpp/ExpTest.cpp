// The CPU target's float exp (braze_exp in the generated module's prelude) through the whole
// pipeline: exp and sigmoid graphs compiled from C++ and run on every 61st float bit pattern
// plus every float whose exp is subnormal, checked against the exact exp (in double) to
// within 1.01 ulp, with overflow, underflow, infinities and NaN exact.
#include "braze/driver/Compile.h"
#include "braze/ir/graph/Builder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace braze {
namespace {

CompileOptions testOptions() {
  CompileOptions o = CompileOptions::fromEnvironment();
  if (!std::getenv("BRAZE_CACHE_DIR"))
    o.cacheDir = "/tmp/braze-exp-test-cache";
  return o;
}

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// |got - exact| in units of the last place of the float nearest to exact (the smallest
/// subnormal's spacing below the normal range).
double ulpError(float got, double exact) {
  double mag = std::fabs(exact);
  double spacing = mag < 1.1754943508222875e-38 ? std::ldexp(1.0, -149)
                                                 : std::ldexp(1.0, std::ilogb(mag) - 23);
  return std::fabs(got - exact) / spacing;
}

/// The inputs: every 61st bit pattern, every float in [-104, -87] (subnormal results), and
/// the edges of the range.
std::vector<float> sampleInputs() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < 0x100000000ull; b += 61)
    xs.push_back(fromBits(static_cast<uint32_t>(b)));
  for (float x = -104.0f; x <= -87.0f; x = std::nextafter(x, 0.0f))
    xs.push_back(x);
  for (float edge : {88.7228394f, -103.972084f, 0.0f, -0.0f})
    for (float x : {std::nextafter(edge, -INFINITY), edge, std::nextafter(edge, INFINITY)})
      xs.push_back(x);
  xs.push_back(INFINITY);
  xs.push_back(-INFINITY);
  xs.push_back(NAN);
  return xs;
}

/// Runs the one-op graph on xs in chunks and returns the results.
std::vector<float> runUnary(OpKind op, const std::vector<float> &xs) {
  Graph g;
  GraphBuilder b(g);
  SymExpr n = b.sizeSymbol("n");
  Node *x = b.input("x", DType::Float32, {n});
  b.output({b.unary(op, x)});
  CompileResult r = compile(g, testOptions());
  std::vector<float> out(xs.size());
  const size_t chunk = size_t(1) << 22;
  for (size_t at = 0; at < xs.size(); at += chunk) {
    int64_t len = static_cast<int64_t>(std::min(chunk, xs.size() - at));
    r.executable->runRaw({const_cast<float *>(xs.data() + at)}, {{len}}, {out.data() + at});
  }
  return out;
}

TEST(ExpTest, WithinOneUlpOverAllFloats) {
  std::vector<float> xs = sampleInputs();
  std::vector<float> ys = runUnary(OpKind::Exp, xs);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    float x = xs[i], y = ys[i];
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(y)) << "exp(nan)";
      continue;
    }
    double exact = std::exp(static_cast<double>(x));
    float nearest = static_cast<float>(exact);
    if (std::isinf(nearest) || nearest == 0) {
      ASSERT_EQ(y, nearest) << "exp(" << std::hexfloat << x << ")";
      continue;
    }
    double e = ulpError(y, exact);
    ASSERT_LE(e, 1.01) << "exp(" << std::hexfloat << x << ") = " << y << ", exact " << exact;
    worst = std::max(worst, e);
  }
  EXPECT_GT(worst, 0.5); // the check saw rounding, not only exact values
}

TEST(ExpTest, SigmoidMatchesItsDefinition) {
  // 1 / (1 + exp(-x)), as eager computes it: 0 once exp(-x) overflows (x < -88.72).
  std::vector<float> xs;
  for (float x = -88.0f; x <= 120.0f; x += 0.013f)
    xs.push_back(x);
  xs.push_back(-89.0f);
  xs.push_back(INFINITY);
  xs.push_back(-INFINITY);
  std::vector<float> ys = runUnary(OpKind::Sigmoid, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    double x = xs[i];
    double exact = x < -88.7228394 ? 0.0 : 1 / (1 + std::exp(-x));
    EXPECT_NEAR(ys[i], exact, 4e-7 * exact) << "sigmoid(" << xs[i] << ")";
  }
}

} // namespace
} // namespace braze
