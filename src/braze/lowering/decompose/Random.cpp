/// random(seed): element i (row-major) of stream s uses Philox counters from s * 2^40:
///   uniform: u = philox_uniform(seed, base + i)
///   normal:  sqrt(-2 log(1 - u1)) * cos(2 pi u2), u1 and u2 at counters base + 2i, base + 2i + 1
#include "braze/lowering/decompose/Decompose.h"

namespace braze::decomp {

namespace {
/// Row-major position of every element of a tensor of `shape`, as i64.
Node *flatPosition(GraphBuilder &b, const std::vector<SymExpr> &shape) {
  Node *pos = b.scalar(0, DType::Int64);
  Node *zeros = b.full(0, DType::Int64, shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    Node *size = b.numel(zeros, {static_cast<int64_t>(d)}, DType::Int64);
    pos = b.add(b.mul(pos, size), b.iota(DType::Int64, shape, static_cast<int64_t>(d)));
  }
  return shape.empty() ? pos : b.expand(pos, shape);
}
} // namespace

Node *decomposeRandom(GraphBuilder &b, Node *n) {
  Node *seed = n->operand(0);
  const std::vector<SymExpr> &shape = n->shape();
  Node *base = b.scalar(static_cast<double>(n->attrs().getInt("stream") << 40), DType::Int64);
  Node *pos = flatPosition(b, shape);
  auto uniform = [&](Node *counter) {
    return b.binary(OpKind::PhiloxUniform, b.expand(seed, shape), b.add(counter, base));
  };
  Node *r;
  if (n->attrs().getString("distribution") == "uniform") {
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

} // namespace braze::decomp
