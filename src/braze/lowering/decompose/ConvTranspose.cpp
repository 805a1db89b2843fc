/// conv_transpose: a transposed convolution is the plain convolution of the input dilated by
/// the stride (stride - 1 zeros between elements) and padded by dilation * (k - 1) - padding on
/// the left (plus output_padding on the right), with the weight's in and out channels swapped
/// per group and its kernel flipped; stride 1, the same dilation and groups.
/// Half-precision operands are computed in f32 and rounded once, or, where eager on the CPU
/// target uses its gemm + col2im kernel (DecomposeOptions::cpuHalfRounding), as that kernel
/// rounds (up to GraphBuilder::kMaxRoundedTaps kernel taps; braze::supports refuses more):
///   1. cols[n, o, k.., s..] = sum_c w[c, o, k..] * x[n, c, s..] (one rounding, per group);
///   2. out = sum over the kernel taps k (row-major) of cols[:, :, k] placed at
///      s * stride - padding + k * dilation, each addition rounded;
///   3. out + bias.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <numeric>

namespace braze::decomp {

namespace {

/// x with stride - 1 zeros between neighbours along dim d (of static size n):
/// [.., n, 1] ++ zeros [.., n, stride - 1] -> [.., n * stride], less the trailing zeros.
Node *dilate(GraphBuilder &b, Node *x, int64_t d, int64_t stride, int64_t n) {
  if (stride == 1)
    return x;
  Node *h = b.unsqueeze(x, d + 1);
  std::vector<SymExpr> zeros = h->shape();
  zeros[d + 1] = b.dim(stride - 1);
  h = b.concat({h, b.full(0, x->dtype(), zeros)}, d + 1);
  std::vector<SymExpr> shape = x->shape();
  shape[d] = b.dim(n * stride);
  return b.slice(b.reshape(h, shape), d, 0, (n - 1) * stride + 1, 1);
}

struct Params {
  IntList stride, padding, dilation, extra, sizes, kernel, outs;
  int64_t groups, cin, coutGroup, spatial;
};

Params paramsOf(Node *n) {
  const attrs::ConvTranspose a(*n);
  Node *x = n->operand(0), *w = n->operand(1);
  Params p{a.stride(), a.padding(), a.dilation(), a.output_padding(), {}, {}, {}, a.groups(),
           w->shape()[0]->value(), w->shape()[1]->value(), x->rank() - 2};
  for (int64_t i = 0; i < p.spatial; ++i) {
    p.sizes.push_back(x->shape()[2 + i]->value());
    p.kernel.push_back(w->shape()[2 + i]->value());
    p.outs.push_back(n->shape()[2 + i]->value());
  }
  return p;
}

/// The convolution form, in x's dtype.
Node *asConvolution(GraphBuilder &b, Node *x, Node *w, Node *bias, const Params &p) {
  for (int64_t i = 0; i < p.spatial; ++i) {
    int64_t d = 2 + i, reach = p.dilation[i] * (p.kernel[i] - 1) - p.padding[i];
    x = b.pad(dilate(b, x, d, p.stride[i], p.sizes[i]), d, reach, reach + p.extra[i], 0);
  }
  // [Cin, Cout/g, k..] -> [g, Cin/g, Cout/g, k..] -> [g, Cout/g, Cin/g, k..] -> [Cout, Cin/g, k..]
  std::vector<SymExpr> k;
  for (int64_t n : p.kernel)
    k.push_back(b.dim(n));
  std::vector<SymExpr> grouped{b.dim(p.groups), b.dim(p.cin / p.groups), b.dim(p.coutGroup)};
  grouped.insert(grouped.end(), k.begin(), k.end());
  std::vector<int64_t> swap{0, 2, 1};
  std::vector<int64_t> spatialDims;
  for (int64_t i = 0; i < p.spatial; ++i) {
    swap.push_back(3 + i);
    spatialDims.push_back(2 + i);
  }
  std::vector<SymExpr> flat{b.dim(p.groups * p.coutGroup), b.dim(p.cin / p.groups)};
  flat.insert(flat.end(), k.begin(), k.end());
  Node *ws = b.flip(b.reshape(b.permute(b.reshape(w, grouped), swap), flat), spatialDims);
  return b.convolution(x, ws, bias, IntList(p.spatial, 1), IntList(p.spatial, 0), p.dilation,
                       p.groups);
}

/// The gemm + col2im form, rounding where it rounds.
Node *asCol2im(GraphBuilder &b, Node *x, Node *w, Node *bias, const Params &p) {
  int64_t taps = std::accumulate(p.kernel.begin(), p.kernel.end(), int64_t{1},
                                 std::multiplies<>());
  int64_t points = std::accumulate(p.sizes.begin(), p.sizes.end(), int64_t{1},
                                   std::multiplies<>());
  SymExpr batch = x->shape()[0];
  Node *xs = b.reshape(x, {batch, b.dim(p.groups), b.dim(p.cin / p.groups), b.dim(points)});
  Node *ws = b.reshape(w, {b.dim(p.groups), b.dim(p.cin / p.groups), b.dim(p.coutGroup * taps)});
  Node *cols = b.matmul(b.permute(ws, {0, 2, 1}), xs); // [N, g, Cout/g * taps, P]
  std::vector<SymExpr> colShape{batch, b.dim(p.groups * p.coutGroup)};
  for (int64_t k : p.kernel)
    colShape.push_back(b.dim(k));
  for (int64_t s : p.sizes)
    colShape.push_back(b.dim(s));
  cols = b.reshape(cols, colShape);
  Node *out = nullptr;
  for (int64_t tap = 0; tap < taps; ++tap) {
    IntList pos(static_cast<size_t>(p.spatial));
    for (int64_t i = p.spatial - 1, rest = tap; i >= 0; --i) {
      pos[i] = rest % p.kernel[i];
      rest /= p.kernel[i];
    }
    bool lands = true; // some element of this tap falls inside the output
    for (int64_t i = 0; i < p.spatial; ++i) {
      int64_t lo = pos[i] * p.dilation[i] - p.padding[i];
      lands &= lo + (p.sizes[i] - 1) * p.stride[i] >= 0 && lo < p.outs[i];
    }
    if (!lands)
      continue;
    Node *h = cols;
    for (int64_t i = 0; i < p.spatial; ++i)
      h = b.select(h, 2, pos[i]);
    for (int64_t i = 0; i < p.spatial; ++i) {
      int64_t d = 2 + i, lo = pos[i] * p.dilation[i] - p.padding[i];
      h = dilate(b, h, d, p.stride[i], p.sizes[i]);
      h = b.pad(h, d, lo, p.outs[i] - lo - ((p.sizes[i] - 1) * p.stride[i] + 1), 0);
    }
    out = out ? b.add(out, h) : h;
  }
  if (!out) {
    std::vector<SymExpr> shape{batch, b.dim(p.groups * p.coutGroup)};
    for (int64_t o : p.outs)
      shape.push_back(b.dim(o));
    out = b.full(0, x->dtype(), shape);
  }
  if (bias) {
    std::vector<SymExpr> shape{b.dim(1), b.dim(p.groups * p.coutGroup)};
    shape.resize(shape.size() + static_cast<size_t>(p.spatial), b.dim(1));
    out = b.add(out, b.reshape(bias, shape));
  }
  return out;
}

} // namespace

bool convTransposeRoundsPerTap(const Node *n, const DecomposeOptions &opts) {
  DType t = n->dtype();
  if (!opts.cpuHalfRounding || (t != DType::Float16 && t != DType::BFloat16))
    return false;
  const attrs::ConvTranspose a(*n);
  const IntList &stride = a.stride();
  const IntList &extra = a.output_padding();
  bool oneDnn =
      std::find(opts.oneDnnHalf.begin(), opts.oneDnnHalf.end(), t) != opts.oneDnnHalf.end();
  for (size_t i = 0; i < stride.size(); ++i)
    oneDnn &= extra[i] < stride[i];
  return !oneDnn;
}

int64_t convTransposeTaps(const Node *n) {
  int64_t taps = 1;
  for (int64_t i = 2; i < n->operand(1)->rank(); ++i)
    taps *= n->operand(1)->shape()[i]->value();
  return taps;
}

Node *decomposeConvTranspose(GraphBuilder &b, Node *n, const DecomposeOptions &opts) {
  Node *x = n->operand(0), *w = n->operand(1);
  Node *bias = attrs::ConvTranspose(*n).bias() ? n->operand(2) : nullptr;
  Params p = paramsOf(n);
  bool half = x->dtype() == DType::Float16 || x->dtype() == DType::BFloat16;
  if (convTransposeRoundsPerTap(n, opts)) {
    if (convTransposeTaps(n) > GraphBuilder::kMaxRoundedTaps)
      BRAZE_USER_ERROR("conv_transpose", n->name())
          << "rounds after each of " << convTransposeTaps(n)
          << " kernel taps, as eager's CPU kernel does; at most "
          << GraphBuilder::kMaxRoundedTaps;
    return asCol2im(b, x, w, bias, p);
  }
  if (!half)
    return asConvolution(b, x, w, bias, p);
  Node *wide = asConvolution(b, upcast(b, x), upcast(b, w), bias ? upcast(b, bias) : nullptr, p);
  return downcastLike(b, wide, x->dtype());
}

} // namespace braze::decomp
