/// conv_weight_grad where no library takes it whole: the weight gradient of a convolution of
/// x [N, C, *s] giving gradOut [N, O, *o], kernel sizes `kernel` -> [O, C / groups, *kernel],
/// in one of three forms (weightGradForms). With a library the f32 op (and on CUDA the f16 and
/// bf16 one) stays whole and runs as cuDNN's backward-filter or oneDNN's backward-weights
/// convolution (loop::ConvSpec, ConvDirectionKind::WeightGrad).
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>

namespace braze::decomp {

namespace {

/// x [N, C, *s] padded and cut into a convolution's windows (a view), the first `counts` of
/// them along each spatial dim: [N, C, *counts, *kernel]. (A transposed convolution's output
/// padding leaves windows past those its input gradient has.)
Node *convWindows(GraphBuilder &b, Node *x, const std::vector<SymExpr> &counts,
                  const IntList &kernel, const IntList &stride, const IntList &padding,
                  const IntList &dilation) {
  for (size_t i = 0; i < kernel.size(); ++i)
    if (padding[i])
      x = b.pad(x, static_cast<int64_t>(2 + i), padding[i], padding[i], 0.0);
  for (size_t i = 0; i < kernel.size(); ++i) {
    auto d = static_cast<int64_t>(2 + i);
    x = b.unfold(x, d, kernel[i], stride[i], dilation[i]);
    int64_t have = 0, want = 0;
    if (b.sym().constValue(x->shape()[d], have) && b.sym().constValue(counts[i], want) &&
        have > want)
      x = b.slice(x, d, 0, want, 1);
  }
  return x;
}

/// The weight gradient of a convolution of x [N, C, *s] giving gradOut [N, O, *o], kernel
/// sizes `kernel` -> [O, C / groups, *kernel]. Three forms, each where it is fast:
///   - one group and a kernel of one tap: the product go[O, N·o] · x[N·o, C] (a GEMM);
///   - one group and a wider kernel: the convolution of x with channels as the batch
///     ([C, N, *s]) by gradOut with batch points as channels ([O, N, *o]), stride and dilation
///     swapped, its spatial dims cut to the kernel (oneDNN or cuDNN runs it as a convolution;
///     as an im2col product it is the same GEMM);
///   - several groups (depthwise): per kernel tap, a sum over the batch and the output
///     positions of gradOut times x's windows at that tap, read in place; the taps' sums share
///     one kernel and its loads of gradOut (per-group products are too small for a library,
///     and a convolution of that form falls on oneDNN's reference kernels).
Node *weightGradForms(GraphBuilder &b, Node *x, Node *gradOut, const IntList &kernel,
                      const IntList &stride, const IntList &padding, const IntList &dilation,
                      int64_t groups) {
  const std::vector<SymExpr> &xs = x->shape(), &gs = gradOut->shape();
  const std::vector<SymExpr> counts(gs.begin() + 2, gs.end()); // the windows gradOut has
  size_t spatial = kernel.size();
  int64_t c = 0, o = 0;
  b.sym().constValue(xs[1], c);
  b.sym().constValue(gs[1], o);
  SymExpr g = b.dim(groups), cg = b.dim(c / groups), og = b.dim(o / groups);
  std::vector<SymExpr> weight{b.dim(o), cg};
  SymExpr positions = b.dim(1); // output positions per batch point
  for (size_t i = 0; i < spatial; ++i) {
    weight.push_back(b.dim(kernel[i]));
    positions = b.sym().mul(positions, gs[2 + i]);
  }
  bool oneTap = std::all_of(kernel.begin(), kernel.end(), [](int64_t k) { return k == 1; });
  if (groups == 1 && oneTap) {
    Node *cols = b.reshape(convWindows(b, x, counts, kernel, stride, padding, dilation),
                           {xs[0], xs[1], positions});
    Node *a = b.reshape(b.permute(b.reshape(gradOut, {gs[0], gs[1], positions}), {1, 0, 2}),
                        {gs[1], b.sym().mul(gs[0], positions)});
    Node *bt = b.reshape(b.permute(cols, {0, 2, 1}), {b.sym().mul(xs[0], positions), xs[1]});
    return b.reshape(b.matmul(a, bt), weight);
  }
  if (groups > 1) {
    // Per kernel tap: windows [N, G, 1, Cg, *o] times gradOut [N, G, Og, 1, *o], summed over N
    // and o into [G, Og, Cg]; the taps' sums (one kernel: the same space) then stacked last.
    Node *win = convWindows(b, x, counts, kernel, stride, padding, dilation);
    std::vector<SymExpr> ws{xs[0], g, b.dim(1), cg}, go{gs[0], g, og, b.dim(1)};
    std::vector<int64_t> dims{0};
    for (size_t i = 0; i < spatial; ++i) {
      ws.push_back(gs[2 + i]);
      go.push_back(gs[2 + i]);
      dims.push_back(static_cast<int64_t>(4 + i));
    }
    Node *grad = b.reshape(gradOut, go);
    int64_t taps = 1;
    for (int64_t k : kernel)
      taps *= k;
    std::vector<Node *> sums;
    for (int64_t tap = 0; tap < taps; ++tap) {
      Node *w = win;
      int64_t rest = tap;
      for (size_t i = spatial; i-- > 0;) { // the last window dims, innermost first
        w = b.select(w, static_cast<int64_t>(2 + spatial + i), rest % kernel[i]);
        rest /= kernel[i];
      }
      Node *prod = b.mul(b.reshape(w, ws), grad);
      sums.push_back(b.unsqueeze(b.reduce(OpKind::Sum, prod, dims, false), 3));
    }
    return b.reshape(b.concat(sums, 3), weight); // [G, Og, Cg, taps]
  }
  std::vector<int64_t> swap{1, 0};
  for (size_t i = 0; i < spatial; ++i)
    swap.push_back(static_cast<int64_t>(2 + i));
  Node *r = b.convolution(b.permute(x, swap), b.permute(gradOut, swap), nullptr, dilation,
                          padding, stride, 1); // [C, O, *k']
  for (size_t i = 0; i < spatial; ++i)
    r = b.slice(r, static_cast<int64_t>(2 + i), 0, kernel[i], 1);
  return b.permute(r, swap);
}

} // namespace

Node *decomposeConvWeightGrad(GraphBuilder &b, Node *n) {
  const attrs::ConvWeightGrad a(*n);
  IntList kernel;
  for (size_t i = 2; i < n->shape().size(); ++i)
    kernel.push_back(n->shape()[i]->value());
  return weightGradForms(b, n->operand(0), n->operand(1), kernel, a.stride(), a.padding(),
                         a.dilation(), a.groups());
}

/// conv_input_grad where no library takes it whole: the transposed convolution of the output
/// gradient by the weight, with the output padding that gives the input's sizes back (the
/// input positions past the last window's reach).
Node *decomposeConvInputGrad(GraphBuilder &b, Node *n) {
  const attrs::ConvInputGrad a(*n);
  const IntList &stride = a.stride(), &padding = a.padding(), &dilation = a.dilation();
  Node *dy = n->operand(0), *w = n->operand(1);
  IntList extra;
  for (size_t i = 0; i < stride.size(); ++i)
    extra.push_back(n->shape()[2 + i]->value() -
                    GraphBuilder::convTransposeSize(dy->shape()[2 + i]->value(), stride[i],
                                                    padding[i], dilation[i],
                                                    w->shape()[2 + i]->value(), 0));
  return b.convTranspose(dy, w, nullptr, stride, padding, dilation, extra, a.groups());
}

} // namespace braze::decomp
