/// random(seed): element i (row-major) of stream s uses Philox counters from s * 2^40:
///   uniform: u = philox_uniform(seed, base + i)
///   normal:  sqrt(-2 log(1 - u1)) * cos(2 pi u2), u1 and u2 at counters base + 2i, base + 2i + 1
/// random_draw: PyTorch's distributions from those draws (ct: f32 for half precision):
///   uniform:   low + u * (high - low) in ct
///   normal:    mean + std * z in ct
///   integer:   u = u_s + u_{s+1} * 2^-24 (48 bits, f64), low + min(floor(u * span), span - 1)
///   geometric: floor(log1p(-u) / log1p(-p)) + 1 in f64
///   bernoulli: u < p (u in f64 for an f64 result, else f32)
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"
#include "braze/support/Check.h"

#include <cmath>

namespace braze::decomp {

Node *flatPosition(GraphBuilder &b, const std::vector<SymExpr> &shape) {
  Node *pos = b.scalar(0, DType::Int64);
  Node *zeros = b.full(0, DType::Int64, shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    Node *size = b.numel(zeros, {static_cast<int64_t>(d)}, DType::Int64);
    pos = b.add(b.mul(pos, size), b.iota(DType::Int64, shape, static_cast<int64_t>(d)));
  }
  return shape.empty() ? pos : b.expand(pos, shape);
}

Node *decomposeRandom(GraphBuilder &b, Node *n) {
  Node *seed = n->operand(0);
  const std::vector<SymExpr> &shape = n->shape();
  const attrs::Random a(*n);
  Node *base = b.scalar(static_cast<double>(a.stream() << 40), DType::Int64);
  Node *pos = flatPosition(b, shape);
  auto uniform = [&](Node *counter) {
    return b.binary(OpKind::PhiloxUniform, b.expand(seed, shape), b.add(counter, base));
  };
  Node *r;
  if (a.distribution() == attrs::Distribution::Uniform) {
    r = uniform(pos);
  } else {
    Node *two = b.scalar(2, DType::Int64);
    Node *u1 = uniform(b.mul(pos, two));
    Node *u2 = uniform(b.add(b.mul(pos, two), b.scalar(1, DType::Int64)));
    Node *radius = b.unary(OpKind::Sqrt, b.mul(b.scalar(-2.0, DType::Float32),
                                               b.unary(OpKind::Log, b.sub(b.scalar(1.0, DType::Float32), u1))));
    r = b.mul(radius, b.unary(OpKind::Cos, b.mul(b.scalar(6.283185307179586, DType::Float32), u2)));
  }
  return b.convert(r, n->dtype());
}

Node *decomposeRandomDraw(GraphBuilder &b, Node *n) {
  const attrs::RandomDraw a(*n);
  attrs::Distribution dist = a.distribution();
  Node *seed = n->operand(0);
  const std::vector<SymExpr> &shape = n->shape();
  int64_t stream = a.stream();
  DType out = n->dtype();
  auto draw = [&](const char *kind, DType t, int64_t s) {
    return b.random(kind, t, shape, seed, s);
  };
  if (dist == attrs::Distribution::Uniform || dist == attrs::Distribution::Normal) {
    DType ct = computeType(out);
    Node *r;
    if (dist == attrs::Distribution::Uniform) {
      double lo = a.low(), hi = a.high();
      r = b.add(b.scalar(lo, ct), b.mul(draw("uniform", ct, stream), b.scalar(hi - lo, ct)));
    } else {
      r = b.add(n->operand(1), b.mul(n->operand(2), draw("normal", ct, stream)));
    }
    return b.convert(r, out);
  }
  if (dist == attrs::Distribution::Integer) {
    double lo = a.low(), span = a.high() - lo;
    Node *u = b.add(draw("uniform", DType::Float64, stream),
                    b.mul(draw("uniform", DType::Float64, stream + 1),
                          b.scalar(1.0 / (1 << 24), DType::Float64)));
    Node *off = b.convert(b.unary(OpKind::Floor, b.mul(u, b.scalar(span, DType::Float64))),
                          DType::Int64);
    off = b.binary(OpKind::Minimum, off, b.scalar(span - 1, DType::Int64));
    return b.convert(b.add(off, b.scalar(lo, DType::Int64)), out);
  }
  if (dist == attrs::Distribution::Bernoulli) {
    DType ct = out == DType::Float64 ? DType::Float64 : DType::Float32;
    Node *u = draw("uniform", ct, stream);
    Node *p = b.scalar(a.p(), ct);
    return b.convert(b.binary(OpKind::Lt, u, p), out);
  }
  BRAZE_CHECK(dist == attrs::Distribution::Geometric)
      << "unknown distribution " << a.distribution_text();
  Node *u = draw("uniform", DType::Float64, stream);
  Node *k = b.div(b.unary(OpKind::Log1p, b.unary(OpKind::Neg, u)),
                  b.scalar(std::log1p(-a.p()), DType::Float64));
  return b.convert(b.add(b.unary(OpKind::Floor, k), b.scalar(1.0, DType::Float64)), out);
}

} // namespace braze::decomp
