/// fft: discrete Fourier transforms on complex values held as pairs ([.., 2]: real, imaginary).
/// Each transformed dim is a matrix product with a twiddle matrix built in the graph, in f64,
/// with the angle reduced as (j*k mod n) / n so that it stays exact for large j*k: an O(n^2)
/// DFT per dim, computed in double and rounded once.
///   - c2c: each dim (last first) as [re | im] · [[C, ±S], [∓S, C]];
///   - r2c: the last dim from the real signal (one-sided: n/2 + 1 outputs), the others c2c;
///   - c2r: the others c2c (inverse), then the last dim from its one-sided (Hermitian) spectrum,
///     weighting the terms that stand for two (all but k = 0 and k = n/2) by 2.
/// normalization 1 scales by 1/sqrt(n), 2 by 1/n (n: the product of the transformed sizes).
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <cmath>
#include <tuple>

namespace braze::decomp {

namespace {

constexpr double kPi = 3.14159265358979323846;

struct Dft {
  GraphBuilder &b;

  Node *i64(double v) { return b.scalar(v, DType::Int64); }
  Node *f64(double v) { return b.scalar(v, DType::Float64); }

  /// (2 pi ((j mod rowMod) (k mod colMod) mod n) / n over a [rows, cols] grid, j mod rowMod).
  std::pair<Node *, Node *> angles(int64_t rows, int64_t cols, int64_t n, int64_t rowMod,
                                   int64_t colMod) {
    std::vector<SymExpr> shape{b.dim(rows), b.dim(cols)};
    Node *j = b.binary(OpKind::Remainder, b.iota(DType::Int64, shape, 0), i64(double(rowMod)));
    Node *k = b.binary(OpKind::Remainder, b.iota(DType::Int64, shape, 1), i64(double(colMod)));
    Node *jk = b.binary(OpKind::Remainder, b.mul(j, k), i64(double(n)));
    return {b.mul(b.convert(jk, DType::Float64), f64(2 * kPi / double(n))), j};
  }

  Node *lt(Node *x, double v) { return b.binary(OpKind::Lt, x, i64(v)); }
  Node *rowIndex(Node *like) { return b.iota(DType::Int64, like->shape(), 0); }
  Node *colIndex(Node *like) { return b.iota(DType::Int64, like->shape(), 1); }

  /// x (f64) with dim `dim` (w's rows long) replaced by x · w along it (m long).
  Node *along(Node *x, int64_t dim, Node *w, int64_t m) {
    int64_t rank = x->rank();
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < rank; ++d)
      if (d != dim)
        perm.push_back(d);
    perm.push_back(dim);
    Node *moved = b.permute(x, perm);
    SymExpr rows = b.dim(1);
    std::vector<SymExpr> kept;
    for (size_t i = 0; i + 1 < perm.size(); ++i) {
      rows = b.sym().mul(rows, x->shape()[perm[i]]);
      kept.push_back(x->shape()[perm[i]]);
    }
    Node *out = b.matmul(b.reshape(moved, {rows, x->shape()[dim]}), w);
    kept.push_back(b.dim(m));
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i)
      inverse[perm[i]] = static_cast<int64_t>(i);
    return b.permute(b.reshape(out, kept), inverse);
  }

  std::pair<Node *, Node *> halves(Node *out, int64_t dim, int64_t n) {
    return {b.slice(out, dim, 0, n, 1), b.slice(out, dim, n, 2 * n, 1)};
  }

  std::pair<Node *, Node *> c2c(Node *re, Node *im, int64_t dim, bool forward) {
    int64_t n = re->shape()[dim]->value();
    Node *theta = angles(2 * n, 2 * n, n, n, n).first;
    Node *c = b.unary(OpKind::Cos, theta), *s = b.unary(OpKind::Sin, theta);
    if (!forward)
      s = b.unary(OpKind::Neg, s);
    // [re | im] · [[C, -S], [S, C]]: rows j < n take re, columns k < n give the real part.
    Node *top = lt(rowIndex(theta), double(n)), *left = lt(colIndex(theta), double(n));
    Node *w = b.where(b.binary(OpKind::Eq, top, left), c,
                      b.where(top, b.unary(OpKind::Neg, s), s));
    return halves(along(b.concat({re, im}, dim), dim, w, 2 * n), dim, n);
  }

  std::pair<Node *, Node *> r2c(Node *re, int64_t dim, bool onesided) {
    int64_t n = re->shape()[dim]->value(), m = onesided ? n / 2 + 1 : n;
    Node *theta = angles(n, 2 * m, n, n, m).first;
    Node *w = b.where(lt(colIndex(theta), double(m)), b.unary(OpKind::Cos, theta),
                      b.unary(OpKind::Neg, b.unary(OpKind::Sin, theta)));
    return halves(along(re, dim, w, 2 * m), dim, m);
  }

  Node *c2r(Node *re, Node *im, int64_t dim, int64_t n) {
    int64_t length = re->shape()[dim]->value(), half = n / 2 + 1;
    auto [theta, k] = angles(2 * length, n, n, length, n);
    Node *single = b.binary(OpKind::LogicalOr, b.binary(OpKind::Eq, k, i64(0)),
                            b.binary(OpKind::Eq, b.mul(k, i64(2)), i64(double(n))));
    Node *weight = b.where(single, f64(1), f64(2));
    weight = b.where(lt(k, double(half)), weight, f64(0));
    Node *top = lt(rowIndex(theta), double(length));
    Node *w = b.mul(weight, b.where(top, b.unary(OpKind::Cos, theta),
                                    b.unary(OpKind::Neg, b.unary(OpKind::Sin, theta))));
    return along(b.concat({re, im}, dim), dim, w, n);
  }
};

} // namespace

Node *decomposeFft(GraphBuilder &b, Node *n) {
  const attrs::Fft a(*n);
  attrs::FftMode mode = a.mode();
  IntList dims = a.dims();
  Node *x = n->operand(0);
  Dft f{b};
  Node *re = nullptr, *im = nullptr;
  if (mode == attrs::FftMode::R2C) {
    re = b.convert(x, DType::Float64);
  } else {
    int64_t last = x->rank() - 1;
    re = b.convert(b.select(x, last, 0), DType::Float64);
    im = b.convert(b.select(x, last, 1), DType::Float64);
  }
  // n: the product of the transformed sizes (c2r: the output's along the last dim).
  double count = 1;
  for (int64_t d : dims)
    count *= double(re->shape()[d]->value());
  Node *out = nullptr;
  if (mode == attrs::FftMode::C2R) {
    for (size_t i = dims.size() - 1; i-- > 0;)
      std::tie(re, im) = f.c2c(re, im, dims[i], false);
    int64_t size = a.last_size();
    count = count / double(re->shape()[dims.back()]->value()) * double(size);
    out = f.c2r(re, im, dims.back(), size);
  } else {
    size_t rest = dims.size();
    if (mode == attrs::FftMode::R2C)
      std::tie(re, im) = f.r2c(re, dims[--rest], a.flag());
    for (size_t i = rest; i-- > 0;)
      std::tie(re, im) = f.c2c(re, im, dims[i], mode == attrs::FftMode::R2C || a.flag());
  }
  int64_t norm = a.normalization();
  double scale = norm == 0 ? 1.0 : norm == 1 ? 1.0 / std::sqrt(count) : 1.0 / count;
  DType t = n->dtype();
  auto finish = [&](Node *h) { return b.convert(norm ? b.mul(h, f.f64(scale)) : h, t); };
  if (out)
    return finish(out);
  re = finish(re);
  im = finish(im);
  int64_t r = re->rank();
  return b.concat({b.unsqueeze(re, r), b.unsqueeze(im, r)}, r);
}

} // namespace braze::decomp
