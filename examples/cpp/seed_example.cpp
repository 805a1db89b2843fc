// Builds the seed example as a braze graph from C++, compiles it, runs it on its own buffers
// and checks the result against a direct computation. No Python anywhere.
//
//   x = ceil(a) + floor(b);  y = x.sum(-1);  z = softmax(y, -1);  w = (z * 10) ** 3
#include "braze/driver/Compile.h"
#include "braze/ir/graph/Builder.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main(int argc, char **argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 300, cols = argc > 2 ? std::atoll(argv[2]) : 77;
  braze::Graph g;
  braze::GraphBuilder b(g);
  braze::SymExpr n = b.sizeSymbol("n"); // dynamic: one artifact serves every row count
  braze::Node *a = b.input("a", braze::DType::Float32, {n, b.dim(cols)});
  braze::Node *bb = b.input("b", braze::DType::Float32, {n, b.dim(cols)});
  braze::Node *x = b.add(b.unary(braze::OpKind::Ceil, a), b.unary(braze::OpKind::Floor, bb));
  braze::Node *y = b.reduce(braze::OpKind::Sum, x, {-1}, false);
  braze::Node *z = b.softmax(y, -1);
  braze::Node *w = b.binary(braze::OpKind::Pow, b.mul(z, b.scalar(10, braze::DType::Float32)),
                            b.scalar(3, braze::DType::Float32));
  b.output({w});

  braze::CompileOptions opts = braze::CompileOptions::fromEnvironment();
  braze::CompileResult r = braze::compile(g, opts);

  std::mt19937 rng(0);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> av(rows * cols), bv(rows * cols), out(rows);
  for (auto &v : av)
    v = dist(rng);
  for (auto &v : bv)
    v = dist(rng);
  r.executable->runRaw({av.data(), bv.data()}, {{rows, cols}, {rows, cols}}, {out.data()});

  // Reference in double.
  std::vector<double> ys(rows);
  double mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j)
      s += std::ceil(av[i * cols + j]) + std::floor(bv[i * cols + j]);
    ys[i] = s;
    mx = std::max(mx, s);
  }
  for (double v : ys)
    sum += std::exp(v - mx);
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double ref = std::pow(std::exp(ys[i] - mx) / sum * 10, 3);
    worst = std::max(worst, std::fabs(ref - out[i]) / std::max(1.0, std::fabs(ref)));
  }
  std::printf("kernels: %d, cache %s, max relative error %.3g\n", r.numKernels,
              r.cacheHit ? "hit" : "miss", worst);
  return worst < 1e-4 ? 0 : 1;
}
