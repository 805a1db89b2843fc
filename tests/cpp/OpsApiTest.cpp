// The C++ API without Python: graphs of ops the FX frontend also uses (a transposed
// convolution, max, average and adaptive pooling, grid sampling, a scatter reduce, a sort, a
// median, grouped-query attention and its gradient, attention's log-sum-exp in PyTorch's
// kernel layouts, a Fourier transform), built with GraphBuilder, compiled and run on the CPU,
// and checked against reference values computed here.
#include "braze/driver/Compile.h"
#include "braze/ir/graph/Builder.h"
#include "braze/support/Diagnostic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <vector>

namespace braze {
namespace {

CompileOptions testOptions() {
  CompileOptions o = CompileOptions::fromEnvironment();
  if (!std::getenv("BRAZE_CACHE_DIR"))
    o.cacheDir = "/tmp/braze-ops-api-test-cache";
  return o;
}

std::vector<float> wave(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = std::sin(0.61f * static_cast<float>(i) + scale) * scale;
  return v;
}

TEST(OpsApiTest, TransposedConvolutionWithGroupsStrideAndBias) {
  // x [N=2, Cin=4, 5, 6], w [Cin=4, Cout/g=3, 3, 2], groups 2, stride (2, 1), padding (1, 0),
  // dilation (1, 2), output padding (1, 0): each input element spreads w over the output.
  const int64_t n = 2, cin = 4, cg = 3, g = 2, h = 5, wd = 6, kh = 3, kw = 2;
  const int64_t sh = 2, sw = 1, ph = 1, pw = 0, dh = 1, dw = 2, oph = 1;
  const int64_t oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1;
  const int64_t ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + 1;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Float32, {b.dim(n), b.dim(cin), b.dim(h), b.dim(wd)});
  Node *w = b.input("w", DType::Float32, {b.dim(cin), b.dim(cg), b.dim(kh), b.dim(kw)});
  Node *bias = b.input("bias", DType::Float32, {b.dim(g * cg)});
  Node *y = b.convTranspose(x, w, bias, {sh, sw}, {ph, pw}, {dh, dw}, {oph, 0}, g);
  ASSERT_EQ(shapeText(y->shape()), "[2, 6, " + std::to_string(oh) + ", " + std::to_string(ow) + "]");
  b.output({y});
  CompileResult r = compile(graph, testOptions());
  std::vector<float> xs = wave(n * cin * h * wd, 1.3f), ws = wave(cin * cg * kh * kw, 0.7f),
                     bs = wave(g * cg, 0.5f), out(n * g * cg * oh * ow);
  r.executable->runRaw({xs.data(), ws.data(), bs.data()},
                       {{n, cin, h, wd}, {cin, cg, kh, kw}, {g * cg}}, {out.data()});
  std::vector<double> want(out.size());
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t o = 0; o < g * cg; ++o)
      for (int64_t i = 0; i < oh * ow; ++i)
        want[(b0 * g * cg + o) * oh * ow + i] = bs[o];
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t c = 0; c < cin; ++c)
      for (int64_t y0 = 0; y0 < h; ++y0)
        for (int64_t x0 = 0; x0 < wd; ++x0)
          for (int64_t oc = 0; oc < cg; ++oc)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                int64_t yy = y0 * sh - ph + ky * dh, xx = x0 * sw - pw + kx * dw;
                if (yy < 0 || yy >= oh || xx < 0 || xx >= ow)
                  continue;
                int64_t o = (c / (cin / g)) * cg + oc;
                want[((b0 * g * cg + o) * oh + yy) * ow + xx] +=
                    double(xs[((b0 * cin + c) * h + y0) * wd + x0]) *
                    ws[((c * cg + oc) * kh + ky) * kw + kx];
              }
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], want[i], 1e-4) << "at " << i;
}

TEST(OpsApiTest, SlicesOfADynamicDimAndAnInputSizedOneLess) {
  // x [n, 3]: its last row (x[-1:], as the first row of x flipped, flipped back), its first
  // n - 1 rows (sliceLength), and y [n - 1, 3], whose one dim binds n as y's dim plus one.
  Graph graph;
  GraphBuilder b(graph);
  SymExpr n = b.sizeSymbol("n");
  SymExpr less = graph.sym().sub(n, b.dim(1));
  Node *x = b.input("x", DType::Float32, {n, b.dim(3)});
  Node *y = b.input("y", DType::Float32, {less, b.dim(3)});
  Node *last = b.slice(x, 0, -1, INT64_MAX, 1);
  ASSERT_EQ(shapeText(last->shape()), "[min(1, n), 3]");
  Node *head = b.sliceLength(x, 0, 0, less, 1);
  b.output({b.reduce(OpKind::Sum, last, {0}, false), b.add(head, y)});
  CompileResult r = compile(graph, testOptions());
  for (int64_t rows : {4, 7}) {
    std::vector<float> xs = wave(rows * 3, 1.1f), ys = wave((rows - 1) * 3, 0.3f);
    std::vector<float> sum(3), out((rows - 1) * 3);
    r.executable->runRaw({xs.data(), ys.data()}, {{rows, 3}, {rows - 1, 3}},
                         {sum.data(), out.data()});
    for (int64_t j = 0; j < 3; ++j)
      ASSERT_FLOAT_EQ(sum[j], xs[(rows - 1) * 3 + j]);
    for (int64_t i = 0; i < (rows - 1) * 3; ++i)
      ASSERT_FLOAT_EQ(out[i], xs[i] + ys[i]);
  }
  EXPECT_THROW(b.sliceLength(b.input("z", DType::Float32, {b.dim(4)}), 0, 2, b.dim(5), 1), Diagnostic);

  // A symbol bound from a dim m + 1 alone: a size 0 there would make m negative.
  Graph g2;
  GraphBuilder b2(g2);
  SymExpr m = b2.sizeSymbol("m");
  Node *z = b2.input("z", DType::Float32, {g2.sym().add(m, b2.dim(1)), b2.dim(2)});
  b2.output({b2.add(z, z)});
  CompileResult r2 = compile(g2, testOptions());
  std::vector<float> zs = wave(6, 0.9f), twice(6);
  r2.executable->runRaw({zs.data()}, {{3, 2}}, {twice.data()});
  for (size_t i = 0; i < zs.size(); ++i)
    ASSERT_FLOAT_EQ(twice[i], 2 * zs[i]);
  EXPECT_THROW(r2.executable->runRaw({zs.data()}, {{0, 2}}, {twice.data()}), runtime::RunError);
}

TEST(OpsApiTest, MaxPoolWithIndices) {
  const int64_t c = 3, h = 7, wd = 6, k = 3, s = 2, p = 1;
  const int64_t oh = (h + 2 * p - k) / s + 1, ow = (wd + 2 * p - k) / s + 1;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Float32, {b.dim(c), b.dim(h), b.dim(wd)});
  auto [values, indices] = b.maxPool(x, 2, {k}, {s}, {p}, {1}, false);
  b.output({values, indices});
  CompileResult r = compile(graph, testOptions());
  std::vector<float> xs = wave(c * h * wd, 2.0f), got(c * oh * ow);
  std::vector<int64_t> at(c * oh * ow);
  r.executable->runRaw({xs.data()}, {{c, h, wd}}, {got.data(), at.data()});
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        float best = -INFINITY;
        int64_t where = -1;
        for (int64_t a = 0; a < k; ++a)
          for (int64_t e = 0; e < k; ++e) {
            int64_t y = i * s - p + a, z = j * s - p + e;
            if (y < 0 || y >= h || z < 0 || z >= wd)
              continue;
            if (xs[(ch * h + y) * wd + z] > best) {
              best = xs[(ch * h + y) * wd + z];
              where = y * wd + z;
            }
          }
        EXPECT_EQ(got[(ch * oh + i) * ow + j], best);
        EXPECT_EQ(at[(ch * oh + i) * ow + j], where);
      }
}

TEST(OpsApiTest, AdaptiveAveragePoolingAndItsMaxIndices1d) {
  // [C=2, n=11] pooled to 4: window j covers [floor(j n / 4), ceil((j + 1) n / 4)).
  const int64_t c = 2, n = 11, o = 4;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Float32, {b.dim(c), b.dim(n)});
  auto [values, indices] = b.adaptiveMaxPool(x, {o});
  b.output({b.adaptiveAvgPool(x, {o}), values, indices});
  CompileResult r = compile(graph, testOptions());
  std::vector<float> xs = wave(c * n, 1.5f), avg(c * o), top(c * o);
  std::vector<int64_t> at(c * o);
  r.executable->runRaw({xs.data()}, {{c, n}}, {avg.data(), top.data(), at.data()});
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t j = 0; j < o; ++j) {
      int64_t start = j * n / o, end = ((j + 1) * n + o - 1) / o, where = start;
      double sum = 0;
      for (int64_t i = start; i < end; ++i) {
        sum += xs[ch * n + i];
        if (xs[ch * n + i] > xs[ch * n + where])
          where = i;
      }
      EXPECT_NEAR(avg[ch * o + j], sum / static_cast<double>(end - start), 1e-5);
      EXPECT_EQ(top[ch * o + j], xs[ch * n + where]);
      EXPECT_EQ(at[ch * o + j], where);
    }
}

TEST(OpsApiTest, IntegerAveragePoolingRoundsTowardZero3d) {
  // i64 [1, 3, 4, 5], kernel 2, stride 2, padding 1, ceil mode, padding not counted.
  const int64_t d = 3, h = 4, w = 5;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Int64, {b.dim(1), b.dim(d), b.dim(h), b.dim(w)});
  Node *avg = b.avgPool(x, 3, {2}, {2}, {1}, true, false, 0);
  b.output({avg});
  CompileResult r = compile(graph, testOptions());
  std::vector<int64_t> sizes{d, h, w}, outs;
  for (int64_t size : sizes)
    outs.push_back(GraphBuilder::pooledSize(size, 2, 2, 1, 1, true));
  std::vector<int64_t> xs(d * h * w), got(outs[0] * outs[1] * outs[2]);
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = static_cast<int64_t>((i * 37) % 23) - 11;
  r.executable->runRaw({xs.data()}, {{1, d, h, w}}, {got.data()});
  for (int64_t a = 0; a < outs[0]; ++a)
    for (int64_t e = 0; e < outs[1]; ++e)
      for (int64_t f = 0; f < outs[2]; ++f) {
        int64_t sum = 0, count = 0;
        for (int64_t i = 2 * a - 1; i < 2 * a + 1; ++i)
          for (int64_t j = 2 * e - 1; j < 2 * e + 1; ++j)
            for (int64_t k = 2 * f - 1; k < 2 * f + 1; ++k)
              if (i >= 0 && i < d && j >= 0 && j < h && k >= 0 && k < w) {
                sum += xs[(i * h + j) * w + k];
                ++count;
              }
        EXPECT_EQ(got[(a * outs[1] + e) * outs[2] + f], sum / count) << a << " " << e << " " << f;
      }
}

TEST(OpsApiTest, BilinearGridSampleReadsZerosOutsideTheInput) {
  // x [N=2, C=3, 4, 5] sampled at grid [2, 3, 6, 2] entries in [-1.2, 1.2] without
  // align_corners: -1 and 1 are the outer edges of the corner elements, so the points near
  // them weigh taps outside the input, which read 0.
  const int64_t n = 2, c = 3, h = 4, w = 5, oh = 3, ow = 6;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Float32, {b.dim(n), b.dim(c), b.dim(h), b.dim(w)});
  Node *grid = b.input("grid", DType::Float32, {b.dim(n), b.dim(oh), b.dim(ow), b.dim(2)});
  Node *y = b.gridSample(x, grid, "bilinear", "zeros", false);
  ASSERT_EQ(shapeText(y->shape()), "[2, 3, 3, 6]");
  b.output({y});
  CompileResult r = compile(graph, testOptions());
  std::vector<float> xs = wave(n * c * h * w, 1.1f), gs = wave(n * oh * ow * 2, 1.2f),
                     out(n * c * oh * ow);
  r.executable->runRaw({xs.data(), gs.data()}, {{n, c, h, w}, {n, oh, ow, 2}}, {out.data()});
  int64_t outside = 0;
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t i = 0; i < oh * ow; ++i) {
      // Entry 0 addresses the width, entry 1 the height.
      double px = ((gs[(b0 * oh * ow + i) * 2] + 1.0) * w - 1) / 2;
      double py = ((gs[(b0 * oh * ow + i) * 2 + 1] + 1.0) * h - 1) / 2;
      double x0 = std::floor(px), y0 = std::floor(py);
      for (int64_t ch = 0; ch < c; ++ch) {
        double want = 0;
        for (int64_t dy = 0; dy < 2; ++dy)
          for (int64_t dx = 0; dx < 2; ++dx) {
            int64_t xi = static_cast<int64_t>(x0) + dx, yi = static_cast<int64_t>(y0) + dy;
            if (xi < 0 || xi >= w || yi < 0 || yi >= h) {
              outside += ch == 0;
              continue;
            }
            double weight = (dx ? px - x0 : x0 + 1 - px) * (dy ? py - y0 : y0 + 1 - py);
            want += weight * xs[((b0 * c + ch) * h + yi) * w + xi];
          }
        EXPECT_NEAR(out[(b0 * c + ch) * oh * ow + i], want, 1e-5) << b0 << " " << ch << " " << i;
      }
    }
  EXPECT_GT(outside, 0) << "no tap fell outside the input";
}

TEST(OpsApiTest, ScatterSumIncludingSelf) {
  const int64_t n = 10, m = 25;
  Graph graph;
  GraphBuilder b(graph);
  Node *self = b.input("self", DType::Float32, {b.dim(n)});
  Node *target = b.input("target", DType::Int64, {b.dim(m)});
  Node *src = b.input("src", DType::Float32, {b.dim(m)});
  b.output({b.scatter(self, target, src, "sum", true)});
  CompileResult r = compile(graph, testOptions());
  std::vector<float> base = wave(n, 1.0f), values = wave(m, 0.9f), got(n);
  std::vector<int64_t> to(m);
  for (int64_t i = 0; i < m; ++i)
    to[i] = (i * 7 + 3) % n;
  r.executable->runRaw({base.data(), to.data(), values.data()}, {{n}, {m}, {m}}, {got.data()});
  std::vector<double> want(base.begin(), base.end());
  for (int64_t i = 0; i < m; ++i)
    want[to[i]] += values[i];
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5) << "at " << i;
}

TEST(OpsApiTest, SortIsStableWithNaNLast) {
  // Rows of 9 with repeated values and a NaN: values and indices along dim 1, descending too.
  const int64_t rows = 3, n = 9;
  for (bool descending : {false, true}) {
    Graph graph;
    GraphBuilder b(graph);
    Node *x = b.input("x", DType::Float32, {b.dim(rows), b.dim(n)});
    auto [sorted, order] = b.sort(x, 1, descending);
    b.output({sorted, order});
    CompileResult r = compile(graph, testOptions());
    std::vector<float> xs(rows * n), values(rows * n);
    for (int64_t i = 0; i < rows * n; ++i)
      xs[i] = static_cast<float>((i * 5 + 2) % 4) - 1.5f;
    xs[4] = NAN;
    std::vector<int64_t> at(rows * n);
    r.executable->runRaw({xs.data()}, {{rows, n}}, {values.data(), at.data()});
    for (int64_t row = 0; row < rows; ++row) {
      std::vector<int64_t> want(n);
      std::iota(want.begin(), want.end(), 0);
      const float *v = xs.data() + row * n;
      std::stable_sort(want.begin(), want.end(), [&](int64_t a, int64_t c) {
        if (std::isnan(v[a]) || std::isnan(v[c]))
          return descending ? std::isnan(v[a]) && !std::isnan(v[c])
                            : !std::isnan(v[a]) && std::isnan(v[c]);
        return descending ? v[a] > v[c] : v[a] < v[c];
      });
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(at[row * n + k], want[k]) << "row " << row << " position " << k;
        float got = values[row * n + k], expect = v[want[k]];
        EXPECT_TRUE(got == expect || (std::isnan(got) && std::isnan(expect)));
      }
    }
  }
}

TEST(OpsApiTest, MedianAlongADimAndOverAll) {
  // The lower median of rows of 8 ints (keepdim off) with its index, and of all 24 elements.
  const int64_t rows = 3, n = 8;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Int32, {b.dim(rows), b.dim(n)});
  auto [values, at] = b.median(x, 1, false, false);
  b.output({values, at, b.median(x, std::nullopt, false, false).first});
  CompileResult r = compile(graph, testOptions());
  std::vector<int32_t> xs(rows * n), got(rows), all(1);
  for (int64_t i = 0; i < rows * n; ++i)
    xs[i] = static_cast<int32_t>((i * 11 + 5) % 13) - 6;
  std::vector<int64_t> index(rows);
  r.executable->runRaw({xs.data()}, {{rows, n}}, {got.data(), index.data(), all.data()});
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<int32_t> v(xs.begin() + row * n, xs.begin() + (row + 1) * n);
    std::vector<int32_t> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(got[row], sorted[(n - 1) / 2]) << "row " << row;
    EXPECT_EQ(v[index[row]], got[row]) << "row " << row;
  }
  std::vector<int32_t> sorted = xs;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(all[0], sorted[(rows * n - 1) / 2]);
}

TEST(OpsApiTest, GroupedQueryAttentionAndItsKeyGradient) {
  // 4 query heads over 2 key/value heads (query head h reads key head h / 2), S = 3, D = 2, in
  // f64: the output and dL/dk for L = sum(out * dout), a key head summing the gradients of the
  // two query heads that read it.
  const int64_t h = 4, hk = 2, s = 3, d = 2;
  const double scale = 0.7;
  Graph graph;
  GraphBuilder b(graph);
  Node *q = b.input("q", DType::Float64, {b.dim(1), b.dim(h), b.dim(s), b.dim(d)});
  Node *k = b.input("k", DType::Float64, {b.dim(1), b.dim(hk), b.dim(s), b.dim(d)});
  Node *v = b.input("v", DType::Float64, {b.dim(1), b.dim(hk), b.dim(s), b.dim(d)});
  Node *dout = b.input("dout", DType::Float64, {b.dim(1), b.dim(h), b.dim(s), b.dim(d)});
  Node *out = b.attention(q, k, v, nullptr, scale, false);
  Node *lse = b.attentionLse(q, k, nullptr, scale, false);
  Node *dk = b.attentionGrad("k", dout, q, k, v, out, lse, nullptr, scale, false);
  b.output({out, dk});
  CompileResult r = compile(graph, testOptions());
  std::vector<double> qs(h * s * d), ks(hk * s * d), vs(hk * s * d), ds(h * s * d);
  for (size_t i = 0; i < qs.size(); ++i) {
    qs[i] = std::sin(0.37 * static_cast<double>(i) + 0.2);
    ds[i] = std::cos(0.53 * static_cast<double>(i));
  }
  for (size_t i = 0; i < ks.size(); ++i) {
    ks[i] = std::cos(0.71 * static_cast<double>(i) + 0.4);
    vs[i] = std::sin(0.29 * static_cast<double>(i) - 0.3);
  }
  std::vector<double> got(h * s * d), gotDk(hk * s * d);
  r.executable->runRaw({qs.data(), ks.data(), vs.data(), ds.data()},
                       {{1, h, s, d}, {1, hk, s, d}, {1, hk, s, d}, {1, h, s, d}},
                       {got.data(), gotDk.data()});
  std::vector<double> wantDk(hk * s * d, 0.0);
  for (int64_t head = 0; head < h; ++head) {
    int64_t kh = head / (h / hk);
    auto at = [&](const std::vector<double> &x, int64_t hh, int64_t i, int64_t j) {
      return x[(hh * s + i) * d + j];
    };
    for (int64_t i = 0; i < s; ++i) {
      std::vector<double> p(s);
      double norm = 0;
      for (int64_t j = 0; j < s; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += at(qs, head, i, c) * at(ks, kh, j, c);
        p[j] = std::exp(scale * dot);
        norm += p[j];
      }
      std::vector<double> o(d, 0.0);
      for (int64_t j = 0; j < s; ++j) {
        p[j] /= norm;
        for (int64_t c = 0; c < d; ++c)
          o[c] += p[j] * at(vs, kh, j, c);
      }
      for (int64_t c = 0; c < d; ++c)
        EXPECT_NEAR(got[(head * s + i) * d + c], o[c], 1e-12) << "head " << head << " row " << i;
      // dL/dscores_j = p_j (dout·v_j - dout·o); dL/dk_j += scale * that * q_i.
      double doutO = 0;
      for (int64_t c = 0; c < d; ++c)
        doutO += at(ds, head, i, c) * o[c];
      for (int64_t j = 0; j < s; ++j) {
        double doutV = 0;
        for (int64_t c = 0; c < d; ++c)
          doutV += at(ds, head, i, c) * at(vs, kh, j, c);
        for (int64_t c = 0; c < d; ++c)
          wantDk[(kh * s + j) * d + c] += scale * p[j] * (doutV - doutO) * at(qs, head, i, c);
      }
    }
  }
  for (size_t i = 0; i < wantDk.size(); ++i)
    EXPECT_NEAR(gotDk[i], wantDk[i], 1e-12) << "at " << i;
}

TEST(OpsApiTest, LogSumExpInTheLayoutsOfPyTorchsAttentionKernels) {
  // attentionLse's [B, Sq] as cuDNN returns it ([B, Sq, 1]) and as memory-efficient attention
  // does (rows padded to 32), and each read back as [B, Sq]; q [2, 3, 4], k [2, 5, 4], in f64.
  const int64_t bt = 2, sq = 3, sk = 5, d = 4, padded = 32;
  const double scale = 0.5;
  Graph graph;
  GraphBuilder b(graph);
  Node *q = b.input("q", DType::Float64, {b.dim(bt), b.dim(sq), b.dim(d)});
  Node *k = b.input("k", DType::Float64, {b.dim(bt), b.dim(sk), b.dim(d)});
  Node *lse = b.attentionLse(q, k, nullptr, scale, false);
  EXPECT_EQ(b.lseInLayout(lse, {b.dim(bt), b.dim(sq)}), lse);
  Node *unit = b.lseInLayout(lse, {b.dim(bt), b.dim(sq), b.dim(1)});
  Node *rows = b.lseInLayout(lse, {b.dim(bt), b.dim(padded)});
  EXPECT_THROW(b.lseInLayout(lse, {b.dim(bt), b.dim(2)}), Diagnostic);
  EXPECT_THROW(b.lseFromLayout(b.lseInLayout(lse, {b.dim(bt), b.dim(sq), b.dim(1)}), k),
               Diagnostic);
  b.output({lse, unit, rows, b.lseFromLayout(unit, q), b.lseFromLayout(rows, q)});
  CompileResult r = compile(graph, testOptions());
  std::vector<double> qs(bt * sq * d), ks(bt * sk * d);
  for (size_t i = 0; i < qs.size(); ++i)
    qs[i] = std::sin(0.43 * static_cast<double>(i) + 0.1);
  for (size_t i = 0; i < ks.size(); ++i)
    ks[i] = std::cos(0.31 * static_cast<double>(i) - 0.2);
  std::vector<double> got(bt * sq), gotUnit(bt * sq), gotRows(bt * padded, -1.0),
      back(bt * sq), backRows(bt * sq);
  r.executable->runRaw({qs.data(), ks.data()}, {{bt, sq, d}, {bt, sk, d}},
                       {got.data(), gotUnit.data(), gotRows.data(), back.data(), backRows.data()});
  for (int64_t n = 0; n < bt; ++n)
    for (int64_t i = 0; i < sq; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < sk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += qs[(n * sq + i) * d + c] * ks[(n * sk + j) * d + c];
        sum += std::exp(scale * dot);
      }
      double want = std::log(sum);
      int64_t at = n * sq + i;
      EXPECT_NEAR(got[at], want, 1e-12) << "row " << at;
      EXPECT_EQ(gotUnit[at], got[at]) << "row " << at;
      EXPECT_EQ(gotRows[n * padded + i], got[at]) << "row " << at;
      EXPECT_EQ(back[at], got[at]) << "row " << at;
      EXPECT_EQ(backRows[at], got[at]) << "row " << at;
    }
  for (int64_t n = 0; n < bt; ++n)
    for (int64_t i = sq; i < padded; ++i)
      EXPECT_EQ(gotRows[n * padded + i], 0.0) << "padding row " << i;
}

TEST(OpsApiTest, OneSidedRealFourierTransformAndItsInverse) {
  // rfft of rows of 10 (6 outputs each, held as [re, im] pairs, "ortho"), and irfft of that
  // spectrum back to the rows.
  const int64_t rows = 3, n = 10, half = n / 2 + 1;
  Graph graph;
  GraphBuilder b(graph);
  Node *x = b.input("x", DType::Float64, {b.dim(rows), b.dim(n)});
  Node *spectrum = b.fft(x, "r2c", {1}, 1, true, 0);
  Node *back = b.fft(spectrum, "c2r", {1}, 1, false, n);
  b.output({spectrum, back});
  CompileResult r = compile(graph, testOptions());
  std::vector<double> xs(rows * n), got(rows * half * 2), again(rows * n);
  for (int64_t i = 0; i < rows * n; ++i)
    xs[i] = std::cos(0.3 * double(i * i % 17)) + 0.1 * double(i % 3);
  r.executable->runRaw({xs.data()}, {{rows, n}}, {got.data(), again.data()});
  const double pi = std::acos(-1.0), scale = 1 / std::sqrt(double(n));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t k = 0; k < half; ++k) {
      double re = 0, im = 0;
      for (int64_t j = 0; j < n; ++j) {
        re += xs[row * n + j] * std::cos(2 * pi * double(j * k) / double(n));
        im -= xs[row * n + j] * std::sin(2 * pi * double(j * k) / double(n));
      }
      EXPECT_NEAR(got[(row * half + k) * 2], re * scale, 1e-12);
      EXPECT_NEAR(got[(row * half + k) * 2 + 1], im * scale, 1e-12);
    }
    for (int64_t j = 0; j < n; ++j)
      EXPECT_NEAR(again[row * n + j], xs[row * n + j], 1e-12);
  }
}

} // namespace
} // namespace braze
