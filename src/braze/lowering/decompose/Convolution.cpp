/// convolution(x, w, b), spatial dims S, kernel K, groups g:
///   1. pad every spatial dim with zeros and unfold it into windows (im2col as an index remap):
///      [N, C, O1.., k1..];
///   2. move channels next to the kernel and flatten: [N, P = prod(O), g, C/g * prod(k)];
///   3. batched matmul with the weight as [g, C/g * prod(k), O/g] -> [N, g, P, O/g];
///   4. back to [N, O, O1..] and add the bias.
/// A floating-point depthwise convolution (one input and one output channel per group) skips
/// 2-3: the windows times the weight [1, C, 1.., k..] summed over the kernel dims, one fused
/// reduction that reads x through the window remap (no im2col copy, no per-channel products of
/// width one). Half precision accumulates in f32 and rounds once.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

namespace braze::decomp {

Node *decomposeConvolution(GraphBuilder &b, Node *n) {
  sym::SymContext &s = b.sym();
  const attrs::Convolution a(*n);
  const IntList &stride = a.stride(), &padding = a.padding(), &dilation = a.dilation();
  int64_t groups = a.groups();
  Node *x = n->operand(0), *w = n->operand(1);
  int64_t spatial = x->rank() - 2;
  // 1.
  for (int64_t i = 0; i < spatial; ++i) {
    x = b.pad(x, 2 + i, padding[i], padding[i], 0.0);
    int64_t k;
    s.constValue(w->shape()[2 + i], k);
    x = b.unfold(x, 2 + i, k, stride[i], dilation[i]);
  }
  int64_t perGroupIn = 0, outChannels = 0;
  bool depthwise = groups > 1 && isFloating(x->dtype()) &&
                   s.constValue(w->shape()[1], perGroupIn) && perGroupIn == 1 &&
                   s.constValue(w->shape()[0], outChannels) && outChannels == groups;
  if (depthwise) {
    std::vector<SymExpr> wshape{b.dim(1), w->shape()[0]};
    std::vector<int64_t> kernelDims;
    for (int64_t i = 0; i < spatial; ++i)
      wshape.push_back(b.dim(1));
    for (int64_t i = 0; i < spatial; ++i) {
      wshape.push_back(w->shape()[2 + i]);
      kernelDims.push_back(2 + spatial + i);
    }
    DType dt = x->dtype();
    bool half = dt == DType::Float16 || dt == DType::BFloat16;
    Node *xs = half ? b.convert(x, DType::Float32) : x;
    Node *ws = b.reshape(w, wshape);
    ws = half ? b.convert(ws, DType::Float32) : ws;
    Node *y = b.reduce(OpKind::Sum, b.mul(xs, ws), kernelDims, false);
    if (a.bias()) {
      std::vector<SymExpr> bshape(n->shape().size(), b.dim(1));
      bshape[1] = n->shape()[1];
      Node *bias = b.reshape(n->operand(2), bshape);
      y = b.add(y, half ? b.convert(bias, DType::Float32) : bias);
    }
    return half ? b.convert(y, dt) : y;
  }
  // 2. [N, C, O.., k..] -> [N, O.., C, k..]
  std::vector<int64_t> perm{0};
  for (int64_t i = 0; i < spatial; ++i)
    perm.push_back(2 + i);
  perm.push_back(1);
  for (int64_t i = 0; i < spatial; ++i)
    perm.push_back(2 + spatial + i);
  x = b.permute(x, perm);
  SymExpr positions = s.constant(1), window = s.constant(1);
  for (int64_t i = 0; i < spatial; ++i) {
    positions = s.mul(positions, n->shape()[2 + i]);
    window = s.mul(window, w->shape()[2 + i]);
  }
  SymExpr cg = w->shape()[1], og = s.floordiv(w->shape()[0], b.dim(groups));
  SymExpr batch = x->shape()[0];
  x = b.reshape(x, {batch, positions, b.dim(groups), s.mul(cg, window)});
  x = b.permute(x, {0, 2, 1, 3});
  // 3.
  Node *wm = b.reshape(w, {b.dim(groups), og, s.mul(cg, window)});
  wm = b.permute(wm, {0, 2, 1});
  Node *y = b.matmul(x, wm); // [N, g, P, O/g]
  // 4.
  y = b.permute(y, {0, 1, 3, 2});
  std::vector<SymExpr> shape = n->shape();
  y = b.reshape(y, shape);
  if (a.bias()) {
    std::vector<SymExpr> bshape(shape.size(), b.dim(1));
    bshape[1] = shape[1];
    y = b.add(y, b.reshape(n->operand(2), bshape));
  }
  return y;
}

} // namespace braze::decomp
