// GraphBuilder: windows, padding, convolution and pooling. Convolution and pooling are
// composite ops here (lowering/decompose turns them into unfold + matmul / amax).
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace braze {

namespace {
std::string listText(const IntList &l) {
  std::string s = "[";
  for (size_t i = 0; i < l.size(); ++i)
    s += (i ? ", " : "") + std::to_string(l[i]);
  return s + "]";
}

/// Expands a per-dim parameter given once for all `n` spatial dims.
IntList perDim(const IntList &l, size_t n, int64_t fill) {
  if (l.empty())
    return IntList(n, fill);
  if (l.size() == 1)
    return IntList(n, l[0]);
  return l;
}
} // namespace

Node *GraphBuilder::unfold(Node *x, int64_t d, int64_t size, int64_t step, int64_t dilation) {
  if (x->rank() == 0) {
    // A scalar unfolds as one element: a window of size 1 (or 0) along a new dim.
    if ((d != 0 && d != -1) || size < 0 || size > 1 || step <= 0)
      BRAZE_USER_ERROR("unfold", name_) << "of a scalar takes dim 0 or -1, size 0 or 1 and a "
                                           "positive step, got dim "
                                        << d << ", size " << size << ", step " << step;
    return slice(reshape(x, {dim(1)}), 0, 0, size, 1);
  }
  d = normalizeSizedDim("unfold", d, x->rank());
  if (size <= 0 || step <= 0 || dilation <= 0)
    BRAZE_USER_ERROR("unfold", name_) << "size, step and dilation must be positive, got "
                                      << size << ", " << step << ", " << dilation;
  SymExpr span = dim(dilation * (size - 1) + 1);
  SymExpr n = x->shape()[d];
  sym::SymContext &s = sym();
  if (!s.provablyNonNegative(s.sub(n, span)))
    BRAZE_USER_ERROR("unfold", name_) << "a window of " << sym::toString(span)
                                      << " elements does not fit dim " << d << " of size "
                                      << sym::toString(n);
  std::vector<SymExpr> shape = x->shape();
  shape[d] = s.add(s.floordiv(s.sub(n, span), dim(step)), dim(1));
  shape.push_back(dim(size));
  return make(OpKind::Unfold, {x},
              {{"dim", d}, {"size", size}, {"step", step}, {"dilation", dilation}},
              TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::diagonal(Node *x, int64_t offset, int64_t d1, int64_t d2) {
  d1 = normalizeDim("diagonal", d1, x->rank());
  d2 = normalizeDim("diagonal", d2, x->rank());
  if (d1 == d2)
    BRAZE_USER_ERROR("diagonal", name_) << "dims must differ, got " << d1 << " twice";
  int64_t n1, n2;
  sym::SymContext &s = sym();
  if (!s.constValue(x->shape()[d1], n1) || !s.constValue(x->shape()[d2], n2))
    BRAZE_USER_ERROR("diagonal", name_) << "needs static sizes in the two dims";
  int64_t len = offset >= 0 ? std::min(n1, n2 - offset) : std::min(n1 + offset, n2);
  std::vector<SymExpr> shape;
  for (int64_t i = 0; i < x->rank(); ++i)
    if (i != d1 && i != d2)
      shape.push_back(x->shape()[i]);
  shape.push_back(dim(std::max<int64_t>(len, 0)));
  return make(OpKind::Diagonal, {x}, {{"offset", offset}, {"dim1", d1}, {"dim2", d2}},
              TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::pad(Node *x, int64_t d, int64_t lo, int64_t hi, double value) {
  d = normalizeDim("pad", d, x->rank());
  if (lo < 0 || hi < 0)
    x = slice(x, d, lo < 0 ? -lo : 0, hi < 0 ? hi : INT64_MAX, 1);
  std::vector<Node *> parts;
  auto filler = [&](int64_t amount) {
    std::vector<SymExpr> shape = x->shape();
    shape[d] = dim(amount);
    return full(value, x->dtype(), shape);
  };
  if (lo > 0)
    parts.push_back(filler(lo));
  parts.push_back(x);
  if (hi > 0)
    parts.push_back(filler(hi));
  return parts.size() == 1 ? x : concat(parts, d);
}

Node *GraphBuilder::constantPad(Node *x, IntList pads, double value) {
  if (pads.size() % 2 != 0 || static_cast<int64_t>(pads.size() / 2) > x->rank())
    BRAZE_USER_ERROR("constant_pad", name_)
        << "needs a (low, high) pair per padded dim, at most " << x->rank() << " dims, got "
        << listText(pads);
  for (size_t i = 0; i < pads.size() / 2; ++i)
    x = pad(x, x->rank() - 1 - static_cast<int64_t>(i), pads[2 * i], pads[2 * i + 1], value);
  return x;
}

Node *GraphBuilder::convolution(Node *x, Node *w, Node *bias, IntList stride, IntList padding,
                                IntList dilation, int64_t groups) {
  int64_t spatial = x->rank() - 2;
  if (spatial < 1 || spatial > 3)
    BRAZE_USER_ERROR("convolution", name_) << "supports 1-d, 2-d and 3-d inputs [N, C, ...], got rank "
                                           << x->rank();
  if (w->rank() != x->rank())
    BRAZE_USER_ERROR("convolution", name_) << "weight has rank " << w->rank()
                                           << " but the input has rank " << x->rank();
  // Integer convolutions wrap around like eager PyTorch's (the matmul accumulates in the dtype).
  if (x->dtype() == DType::Bool || x->dtype() != w->dtype())
    BRAZE_USER_ERROR("convolution", name_) << "needs numeric (non-bool) input and weight of one dtype, got "
                                           << dtypeName(x->dtype()) << " and " << dtypeName(w->dtype());
  stride = perDim(stride, spatial, 1);
  padding = perDim(padding, spatial, 0);
  dilation = perDim(dilation, spatial, 1);
  for (const IntList *l : {&stride, &padding, &dilation})
    if (static_cast<int64_t>(l->size()) != spatial)
      BRAZE_USER_ERROR("convolution", name_) << "a parameter list " << listText(*l) << " has "
                                             << l->size() << " entries for " << spatial
                                             << " spatial dims";
  int64_t c, cg;
  if (groups < 1 || !sym().constValue(x->shape()[1], c) || !sym().constValue(w->shape()[1], cg) ||
      c != cg * groups)
    BRAZE_USER_ERROR("convolution", name_)
        << "input channels " << sym::toString(x->shape()[1]) << " must equal weight channels "
        << sym::toString(w->shape()[1]) << " times groups " << groups;
  std::vector<SymExpr> outShape = {x->shape()[0], w->shape()[0]};
  sym::SymContext &s = sym();
  for (int64_t i = 0; i < spatial; ++i) {
    int64_t k;
    if (!s.constValue(w->shape()[2 + i], k))
      BRAZE_USER_ERROR("convolution", name_) << "kernel sizes must be static";
    SymExpr n = s.add(x->shape()[2 + i], dim(2 * padding[i]));
    SymExpr span = dim(dilation[i] * (k - 1) + 1);
    if (!s.provablyNonNegative(s.sub(n, span)))
      BRAZE_USER_ERROR("convolution", name_) << "kernel " << k << " (dilated to "
                                             << sym::toString(span) << ") exceeds padded input "
                                             << sym::toString(n) << " in spatial dim " << i;
    outShape.push_back(s.add(s.floordiv(s.sub(n, span), dim(stride[i])), dim(1)));
  }
  return windowedProduct(OpKind::Convolution, x, w, bias, {stride, padding, dilation, {}},
                         groups, std::move(outShape));
}

Node *GraphBuilder::windowedProduct(OpKind op, Node *x, Node *w, Node *bias,
                                    std::array<IntList, 4> window, int64_t groups,
                                    std::vector<SymExpr> shape) {
  const bool transposed = op == OpKind::ConvTranspose;
  const char *name = transposed ? "conv_transpose" : "convolution";
  if (bias && (bias->rank() != 1 || bias->shape()[0] != shape[1]))
    BRAZE_USER_ERROR(name, name_) << "bias must have shape [" << sym::toString(shape[1]) << "]";
  AttrMap attrs;
  attrs.set("stride", window[0]);
  attrs.set("padding", window[1]);
  attrs.set("dilation", window[2]);
  if (transposed)
    attrs.set("output_padding", window[3]);
  attrs.set("groups", groups);
  attrs.set("bias", bias != nullptr);
  std::vector<Node *> ops{x, w};
  if (bias)
    ops.push_back(convert(bias, x->dtype()));
  return make(op, ops, std::move(attrs), TensorType{x->dtype(), std::move(shape), {}});
}

Node *GraphBuilder::convTranspose(Node *x, Node *w, Node *bias, IntList stride, IntList padding,
                                  IntList dilation, IntList outputPadding, int64_t groups) {
  const char *op = "conv_transpose";
  int64_t spatial = x->rank() - 2;
  if (spatial < 1 || spatial > 3 || w->rank() != x->rank())
    BRAZE_USER_ERROR(op, name_) << "needs an input [N, C, ...] of 1 to 3 spatial dims and a weight "
                                   "of its rank, got ranks "
                                << x->rank() << " and " << w->rank();
  if (x->dtype() == DType::Bool || x->dtype() != w->dtype())
    BRAZE_USER_ERROR(op, name_) << "needs numeric (non-bool) input and weight of one dtype, got "
                                << dtypeName(x->dtype()) << " and " << dtypeName(w->dtype());
  stride = perDim(stride, spatial, 1);
  padding = perDim(padding, spatial, 0);
  dilation = perDim(dilation, spatial, 1);
  outputPadding = perDim(outputPadding, spatial, 0);
  for (const IntList *l : {&stride, &padding, &dilation, &outputPadding})
    if (static_cast<int64_t>(l->size()) != spatial)
      BRAZE_USER_ERROR(op, name_) << "a parameter list " << listText(*l) << " has " << l->size()
                                  << " entries for " << spatial << " spatial dims";
  std::vector<int64_t> sizes, kernel;
  for (int64_t i = 2; i < x->rank(); ++i) {
    int64_t n, k;
    if (!sym().constValue(x->shape()[i], n) || !sym().constValue(w->shape()[i], k))
      BRAZE_USER_ERROR(op, name_) << "needs static spatial and kernel sizes, got "
                                  << shapeText(x->shape()) << " and " << shapeText(w->shape());
    sizes.push_back(n);
    kernel.push_back(k);
  }
  int64_t cin, coutGroup;
  if (groups < 1 || !sym().constValue(w->shape()[0], cin) ||
      !sym().constValue(w->shape()[1], coutGroup) || x->shape()[1] != w->shape()[0] ||
      cin % groups)
    BRAZE_USER_ERROR(op, name_) << "input channels " << sym::toString(x->shape()[1])
                                << " must equal the weight's first dim "
                                << sym::toString(w->shape()[0]) << " and divide by groups "
                                << groups;
  std::vector<SymExpr> shape{x->shape()[0], dim(groups * coutGroup)};
  for (int64_t i = 0; i < spatial; ++i) {
    if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0 || outputPadding[i] < 0 ||
        outputPadding[i] >= std::max(stride[i], dilation[i]))
      BRAZE_USER_ERROR(op, name_) << "needs stride and dilation >= 1, padding >= 0 and output "
                                     "padding below the stride or the dilation, got "
                                  << stride[i] << ", " << dilation[i] << ", " << padding[i]
                                  << " and " << outputPadding[i] << " in spatial dim " << i;
    int64_t out = convTransposeSize(sizes[i], stride[i], padding[i], dilation[i], kernel[i],
                                    outputPadding[i]);
    if (out < 1)
      BRAZE_USER_ERROR(op, name_) << "spatial dim " << i << " would have " << out << " elements";
    shape.push_back(dim(out));
  }
  return windowedProduct(OpKind::ConvTranspose, x, w, bias,
                         {stride, padding, dilation, outputPadding}, groups, std::move(shape));
}


namespace {

/// A convolution gradient's two operands (named `what`, e.g. "an input and an output
/// gradient"): one rank with 1 to 3 spatial dims, `sizes` one entry per spatial dim, one
/// floating dtype. Its attributes, each list filled to one entry per spatial dim.
AttrMap convGradientAttrs(const char *op, const std::string &name, const char *what,
                          const Node *a, const Node *b, const IntList &sizes,
                          const IntList &stride, const IntList &padding,
                          const IntList &dilation, int64_t groups) {
  int64_t spatial = a->rank() - 2;
  if (spatial < 1 || spatial > 3 || b->rank() != a->rank() ||
      static_cast<int64_t>(sizes.size()) != spatial)
    BRAZE_USER_ERROR(op, name) << "needs " << what << " of one rank with 1 to 3 spatial dims "
                               << "and a size per spatial dim, got ranks " << a->rank()
                               << " and " << b->rank() << " and sizes " << listText(sizes);
  if (!isFloating(a->dtype()) || a->dtype() != b->dtype())
    BRAZE_USER_ERROR(op, name) << "needs " << what << " of one floating dtype, got "
                               << dtypeName(a->dtype()) << " and " << dtypeName(b->dtype());
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t v) { return v < 1 || v > (1 << 30); }))
    BRAZE_USER_ERROR(op, name) << "needs sizes from 1 to 2^30, got " << listText(sizes);
  AttrMap attrs;
  attrs.set("stride", perDim(stride, spatial, 1));
  attrs.set("padding", perDim(padding, spatial, 0));
  attrs.set("dilation", perDim(dilation, spatial, 1));
  attrs.set("groups", groups);
  return attrs;
}

} // namespace

Node *GraphBuilder::convWeightGrad(Node *x, Node *gradOut, IntList kernel, IntList stride,
                                   IntList padding, IntList dilation, int64_t groups) {
  const char *op = "conv_weight_grad";
  AttrMap attrs = convGradientAttrs(op, name_, "an input and an output gradient", x, gradOut,
                                    kernel, stride, padding, dilation, groups);
  int64_t c = 0, o = 0;
  if (groups < 1 || !sym().constValue(x->shape()[1], c) ||
      !sym().constValue(gradOut->shape()[1], o) || c % groups || o % groups)
    BRAZE_USER_ERROR(op, name_) << "needs static channel counts that divide by groups " << groups
                                << ", got input " << shapeText(x->shape())
                                << " and output gradient " << shapeText(gradOut->shape());
  std::vector<SymExpr> shape{dim(o), dim(c / groups)};
  for (int64_t k : kernel)
    shape.push_back(dim(k));
  return make(OpKind::ConvWeightGrad, {x, gradOut}, std::move(attrs),
              TensorType{x->dtype(), std::move(shape), {}});
}

Node *GraphBuilder::convInputGrad(Node *gradOut, Node *w, IntList inputSizes, IntList stride,
                                  IntList padding, IntList dilation, int64_t groups) {
  const char *op = "conv_input_grad";
  AttrMap attrs = convGradientAttrs(op, name_, "an output gradient and a weight", gradOut, w,
                                    inputSizes, stride, padding, dilation, groups);
  int64_t perGroup = 0;
  if (groups < 1 || !sym().constValue(w->shape()[1], perGroup) ||
      gradOut->shape()[1] != w->shape()[0])
    BRAZE_USER_ERROR(op, name_) << "needs the output gradient's channels "
                                << shapeText(gradOut->shape()) << " to be the weight's first dim "
                                << shapeText(w->shape()) << " and static channels per group";
  std::vector<SymExpr> shape{gradOut->shape()[0], dim(perGroup * groups)};
  for (int64_t size : inputSizes)
    shape.push_back(dim(size));
  return make(OpKind::ConvInputGrad, {gradOut, w}, std::move(attrs),
              TensorType{gradOut->dtype(), std::move(shape), {}});
}

std::array<Node *, 3> GraphBuilder::convolutionBackward(Node *gradOut, Node *x, Node *w,
                                                        IntList stride, IntList padding,
                                                        IntList dilation, bool transposed,
                                                        int64_t groups, std::array<bool, 3> mask) {
  const char *op = "convolution_backward";
  int64_t spatial = x->rank() - 2;
  if (spatial < 1 || spatial > 3 || w->rank() != x->rank() || gradOut->rank() != x->rank())
    BRAZE_USER_ERROR(op, name_) << "needs input, weight and output gradient of one rank with 1 to 3 "
                                   "spatial dims, got ranks "
                                << x->rank() << ", " << w->rank() << " and " << gradOut->rank();
  stride = perDim(stride, spatial, 1);
  padding = perDim(padding, spatial, 0);
  dilation = perDim(dilation, spatial, 1);
  IntList in, out, kernel;
  for (int64_t i = 0; i < x->rank(); ++i) {
    int64_t a, o, k;
    if (!sym().constValue(x->shape()[i], a) || !sym().constValue(gradOut->shape()[i], o) ||
        !sym().constValue(w->shape()[i], k))
      BRAZE_USER_ERROR(op, name_) << "needs static sizes, got input "
                                  << shapeText(x->shape()) << ", output gradient "
                                  << shapeText(gradOut->shape()) << " and weight "
                                  << shapeText(w->shape());
    in.push_back(a);
    out.push_back(o);
    kernel.push_back(k);
  }
  kernel.erase(kernel.begin(), kernel.begin() + 2);
  std::array<Node *, 3> grads{nullptr, nullptr, nullptr};
  if (!transposed) {
    if (mask[0])
      grads[0] = convInputGrad(gradOut, w, IntList(in.begin() + 2, in.end()), stride, padding,
                               dilation, groups);
    if (mask[1])
      grads[1] = convWeightGrad(x, gradOut, kernel, stride, padding, dilation, groups);
  } else {
    if (mask[0]) {
      grads[0] = convolution(gradOut, w, nullptr, stride, padding, dilation, groups);
      for (int64_t i = 0; i < spatial; ++i) // an output padding past the stride adds windows
        grads[0] = slice(grads[0], 2 + i, 0, in[2 + i], 1);
    }
    if (mask[1])
      grads[1] = convWeightGrad(gradOut, x, kernel, stride, padding, dilation, groups);
  }
  if (mask[2]) {
    std::vector<int64_t> dims{0};
    for (int64_t i = 0; i < spatial; ++i)
      dims.push_back(2 + i);
    grads[2] = reduce(OpKind::Sum, gradOut, dims, false);
  }
  return grads;
}

int64_t GraphBuilder::pooledSize(int64_t n, int64_t kernel, int64_t stride, int64_t padding,
                                 int64_t dilation, bool ceilMode) {
  int64_t span = dilation * (kernel - 1) + 1, padded = n + 2 * padding;
  int64_t out = (padded - span + (ceilMode ? stride - 1 : 0)) / stride + 1;
  // The last window must start inside the input or the left padding.
  if (ceilMode && (out - 1) * stride >= n + padding)
    --out;
  return out;
}

std::string GraphBuilder::poolWindowError(int64_t kernel, int64_t stride, int64_t padding,
                                          int64_t dilation) {
  constexpr int64_t kLimit = int64_t(1) << 32;
  if (kernel < 1 || stride < 1 || dilation < 1 || kernel > kLimit || stride > kLimit ||
      dilation > kLimit)
    return "kernel, stride and dilation must be between 1 and 2^32, not " +
           std::to_string(kernel) + ", " + std::to_string(stride) + " and " +
           std::to_string(dilation);
  if (padding < 0 || 2 * padding > kernel)
    return "padding " + std::to_string(padding) + " must be between 0 and half the kernel " +
           std::to_string(kernel);
  return {};
}

AttrMap GraphBuilder::poolAttrs(const std::string &op, Node *x, int64_t spatial, IntList kernel,
                                IntList stride, IntList padding, IntList dilation, bool ceilMode,
                                std::vector<SymExpr> &shape) {
  if (spatial < 1 || spatial > 3 || (x->rank() != spatial + 1 && x->rank() != spatial + 2))
    BRAZE_USER_ERROR(op, name_) << "pools 1 to 3 trailing dims of a [C, ...] or [N, C, ...] "
                                   "input; got "
                                << spatial << " pooled dims of a rank-" << x->rank() << " input";
  if (kernel.empty())
    BRAZE_USER_ERROR(op, name_) << "needs a kernel size";
  kernel = perDim(kernel, spatial, 1);
  stride = perDim(stride.empty() ? kernel : stride, spatial, 1);
  padding = perDim(padding, spatial, 0);
  dilation = perDim(dilation, spatial, 1);
  for (const IntList *l : {&kernel, &stride, &padding, &dilation})
    if (static_cast<int64_t>(l->size()) != spatial)
      BRAZE_USER_ERROR(op, name_) << "a parameter list " << listText(*l) << " has " << l->size()
                                  << " entries for " << spatial << " pooled dims";
  shape.assign(x->shape().begin(), x->shape().end() - spatial);
  for (int64_t i = 0; i < spatial; ++i) {
    std::string err = poolWindowError(kernel[i], stride[i], padding[i], dilation[i]);
    if (!err.empty())
      BRAZE_USER_ERROR(op, name_) << err;
    int64_t n;
    if (!sym().constValue(x->shape()[x->rank() - spatial + i], n))
      BRAZE_USER_ERROR(op, name_) << "pooled sizes must be static, got " << shapeText(x->shape());
    int64_t out = pooledSize(n, kernel[i], stride[i], padding[i], dilation[i], ceilMode);
    if (out <= 0)
      BRAZE_USER_ERROR(op, name_) << "pooled dim " << i << " would have " << out << " elements";
    shape.push_back(dim(out));
  }
  return {{"kernel", kernel}, {"stride", stride}, {"padding", padding}, {"dilation", dilation}};
}

std::pair<Node *, Node *> GraphBuilder::maxPool(Node *x, int64_t spatial, IntList kernel,
                                                IntList stride, IntList padding, IntList dilation,
                                                bool ceilMode) {
  if (x->dtype() == DType::Bool)
    BRAZE_USER_ERROR("max_pool", name_) << "needs a numeric input, got bool";
  std::vector<SymExpr> shape;
  AttrMap attrs =
      poolAttrs("max_pool", x, spatial, kernel, stride, padding, dilation, ceilMode, shape);
  Node *values = make(OpKind::MaxPool, {x}, attrs, TensorType{x->dtype(), shape, {}});
  Node *indices = make(OpKind::MaxPoolIndices, {x}, attrs, TensorType{DType::Int64, shape, {}});
  return {values, indices};
}

Node *GraphBuilder::avgPool(Node *x, int64_t spatial, IntList kernel, IntList stride,
                            IntList padding, bool ceilMode, bool countIncludePad,
                            int64_t divisor) {
  if (!isFloating(x->dtype()) && x->dtype() != DType::Int64)
    BRAZE_USER_ERROR("avg_pool", name_) << "needs a floating-point or i64 input, got "
                                        << dtypeName(x->dtype());
  if (divisor < 0)
    BRAZE_USER_ERROR("avg_pool", name_) << "divisor must be positive (or 0: the window count), "
                                           "got "
                                        << divisor;
  std::vector<SymExpr> shape;
  AttrMap attrs =
      poolAttrs("avg_pool", x, spatial, kernel, stride, padding, {1}, ceilMode, shape);
  attrs.set("count_include_pad", countIncludePad);
  attrs.set("divisor", divisor);
  return make(OpKind::AvgPool, {x}, std::move(attrs), TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::maxPoolGrad(Node *grad, Node *x, Node *indices, IntList kernel,
                                IntList stride, IntList padding, IntList dilation,
                                bool ceilMode) {
  const char *op = "max_pool_grad";
  int64_t spatial = static_cast<int64_t>(kernel.size());
  if (!isFloating(grad->dtype()))
    BRAZE_USER_ERROR(op, name_) << "needs a floating-point gradient, got "
                                << dtypeName(grad->dtype());
  std::vector<SymExpr> shape;
  AttrMap attrs = poolAttrs(op, x, spatial, kernel, stride, padding, dilation, ceilMode, shape);
  if (grad->shape() != shape || indices->shape() != shape || indices->dtype() != DType::Int64)
    BRAZE_USER_ERROR(op, name_) << "needs a gradient and i64 indices of the pooled shape "
                                << shapeText(shape) << ", got " << shapeText(grad->shape())
                                << " and " << dtypeName(indices->dtype())
                                << shapeText(indices->shape());
  return make(OpKind::MaxPoolGrad, {grad, x, indices}, std::move(attrs),
              TensorType{grad->dtype(), x->shape(), {}});
}

namespace {
/// Checks an adaptive pooling's input and output sizes and returns the result shape.
std::vector<SymExpr> adaptiveShape(GraphBuilder &b, const std::string &op, const std::string &node,
                                   Node *x, const IntList &outputSize) {
  int64_t spatial = static_cast<int64_t>(outputSize.size());
  if (spatial < 1 || spatial > 3 || (x->rank() != spatial + 1 && x->rank() != spatial + 2))
    BRAZE_USER_ERROR(op, node) << "pools 1 to 3 trailing dims of a [C, ...] or [N, C, ...] "
                                  "input; got output size "
                               << listText(outputSize) << " for a rank-" << x->rank() << " input";
  if (!isFloating(x->dtype()))
    BRAZE_USER_ERROR(op, node) << "needs a floating-point input, got " << dtypeName(x->dtype());
  std::vector<SymExpr> shape(x->shape().begin(), x->shape().end() - spatial);
  for (int64_t i = 0; i < spatial; ++i) {
    int64_t n;
    if (!b.sym().constValue(x->shape()[x->rank() - spatial + i], n) || n < 1 ||
        outputSize[i] < 1 || outputSize[i] > GraphBuilder::kMaxAdaptiveSize)
      BRAZE_USER_ERROR(op, node) << "needs static, non-empty pooled dims and output sizes from 1 "
                                    "to "
                                 << GraphBuilder::kMaxAdaptiveSize << ", got input "
                                 << shapeText(x->shape()) << " and output size "
                                 << listText(outputSize);
    shape.push_back(b.dim(outputSize[i]));
  }
  return shape;
}
} // namespace

std::pair<Node *, Node *> GraphBuilder::adaptiveMaxPool(Node *x, IntList outputSize) {
  std::vector<SymExpr> shape = adaptiveShape(*this, "adaptive_max_pool", name_, x, outputSize);
  AttrMap attrs;
  attrs.set("output_size", outputSize);
  Node *values = make(OpKind::AdaptiveMaxPool, {x}, attrs, TensorType{x->dtype(), shape, {}});
  Node *indices =
      make(OpKind::AdaptiveMaxPoolIndices, {x}, attrs, TensorType{DType::Int64, shape, {}});
  return {values, indices};
}

Node *GraphBuilder::adaptiveAvgPool(Node *x, IntList outputSize) {
  std::vector<SymExpr> shape = adaptiveShape(*this, "adaptive_avg_pool", name_, x, outputSize);
  AttrMap attrs;
  attrs.set("output_size", outputSize);
  return make(OpKind::AdaptiveAvgPool, {x}, std::move(attrs), TensorType{x->dtype(), shape, {}});
}

namespace {
/// The output sizes of an adaptive pooling's gradient `grad` for the input x, checked as the
/// forward checks them, and the plane's positions times outputs.
IntList adaptiveGradSizes(GraphBuilder &b, const char *op, const std::string &node, Node *grad,
                          Node *x, int64_t spatial, int64_t &pairs) {
  if (grad->rank() != x->rank() || !isFloating(grad->dtype()) || spatial < 1 ||
      spatial >= x->rank())
    BRAZE_USER_ERROR(op, node) << "needs a floating-point gradient of the input's rank and 1 to "
                                  "3 pooled dims below it, got "
                               << dtypeName(grad->dtype()) << shapeText(grad->shape()) << " and "
                               << spatial;
  IntList out;
  for (int64_t i = grad->rank() - spatial; i < grad->rank(); ++i) {
    int64_t o;
    if (!b.sym().constValue(grad->shape()[i], o))
      BRAZE_USER_ERROR(op, node) << "needs static gradient sizes, got " << shapeText(grad->shape());
    out.push_back(o);
  }
  std::vector<SymExpr> shape = adaptiveShape(b, op, node, x, out);
  if (shape != grad->shape())
    BRAZE_USER_ERROR(op, node) << "needs a gradient of the pooled shape " << shapeText(shape)
                               << ", got " << shapeText(grad->shape());
  pairs = 1;
  for (int64_t i = 0; i < spatial; ++i)
    if (__builtin_mul_overflow(pairs, out[i], &pairs) ||
        __builtin_mul_overflow(pairs, x->shape()[x->rank() - spatial + i]->value(), &pairs))
      pairs = INT64_MAX;
  return out;
}
} // namespace

Node *GraphBuilder::adaptiveAvgPoolGrad(Node *grad, Node *x, int64_t spatial) {
  int64_t pairs;
  IntList out = adaptiveGradSizes(*this, "adaptive_avg_pool_grad", name_, grad, x, spatial, pairs);
  AttrMap attrs;
  attrs.set("output_size", out);
  return make(OpKind::AdaptiveAvgPoolGrad, {grad, x}, std::move(attrs),
              TensorType{grad->dtype(), x->shape(), {}});
}

Node *GraphBuilder::adaptiveMaxPoolGrad(Node *grad, Node *x, Node *indices, int64_t spatial) {
  int64_t pairs;
  IntList out = adaptiveGradSizes(*this, "adaptive_max_pool_grad", name_, grad, x, spatial, pairs);
  if (indices->dtype() != DType::Int64 || indices->shape() != grad->shape())
    BRAZE_USER_ERROR("adaptive_max_pool_grad", name_)
        << "needs i64 indices of the gradient's shape, got " << dtypeName(indices->dtype())
        << shapeText(indices->shape());
  if (pairs > kMaxComparisons)
    BRAZE_USER_ERROR("adaptive_max_pool_grad", name_)
        << "compares " << pairs << " positions and outputs per plane; at most "
        << kMaxComparisons;
  AttrMap attrs;
  attrs.set("output_size", out);
  return make(OpKind::AdaptiveMaxPoolGrad, {grad, x, indices}, std::move(attrs),
              TensorType{grad->dtype(), x->shape(), {}});
}

Node *GraphBuilder::random(const std::string &distribution, DType dtype,
                           std::vector<SymExpr> shape, Node *seed) {
  if (distribution != "uniform" && distribution != "normal")
    BRAZE_USER_ERROR("random", name_) << "distribution must be 'uniform' or 'normal', got '"
                                      << distribution << "'";
  if (!isFloating(dtype))
    BRAZE_USER_ERROR("random", name_) << "needs a floating-point dtype, got " << dtypeName(dtype);
  if (seed->dtype() != DType::Int64 || seed->rank() != 0)
    BRAZE_USER_ERROR("random", name_) << "the seed must be an i64 scalar";
  return random(distribution, dtype, std::move(shape), seed, nextRandomStream_++);
}

Node *GraphBuilder::random(const std::string &distribution, DType dtype,
                           std::vector<SymExpr> shape, Node *seed, int64_t stream) {
  AttrMap attrs;
  attrs.set("distribution", distribution);
  attrs.set("stream", stream);
  return make(OpKind::Random, {seed}, std::move(attrs), TensorType{dtype, std::move(shape), {}});
}

std::string GraphBuilder::randomDrawError(const TensorType &type,
                                          const std::vector<const Node *> &operands,
                                          const AttrMap &a) {
  const std::string &dist = a.getString("distribution");
  const Node *seed = operands[0];
  if (seed->dtype() != DType::Int64 || seed->rank() != 0)
    return "the seed must be an i64 scalar";
  size_t want = dist == "normal" ? 3 : 1;
  if (operands.size() != want)
    return "a " + dist + " draw takes " + std::to_string(want) + " operands";
  if ((dist == "uniform" || dist == "normal") && !isFloating(type.dtype))
    return "a " + dist + " draw needs a floating-point dtype";
  if (dist == "uniform" || dist == "integer") {
    if (!a.has("low") || !a.has("high"))
      return "needs attributes low and high";
    double lo = a.getFloat("low"), hi = a.getFloat("high");
    if (dist == "integer" &&
        (!(lo < hi) || std::fabs(lo) > 9007199254740992.0 || std::fabs(hi) > 9007199254740992.0 ||
         lo != std::floor(lo) || hi != std::floor(hi) || type.dtype == DType::Bool))
      return "an integer draw needs integers low < high within 2^53 and a numeric dtype";
    if (!std::isfinite(lo) || !std::isfinite(hi))
      return "low and high must be finite";
    return "";
  }
  if (dist == "normal") {
    for (size_t i = 1; i < 3; ++i)
      if (operands[i]->shape() != type.shape || !isFloating(operands[i]->dtype()))
        return "mean and std must be floating-point tensors of the result's shape";
    return "";
  }
  if (dist == "geometric")
    return a.has("p") && a.getFloat("p") > 0 && a.getFloat("p") < 1 ? ""
                                                                      : "needs 0 < p < 1";
  if (dist == "bernoulli")
    return a.has("p") && a.getFloat("p") >= 0 && a.getFloat("p") <= 1 ? ""
                                                                        : "needs 0 <= p <= 1";
  return "distribution must be uniform, normal, integer, geometric or bernoulli, got '" + dist +
         "'";
}

Node *GraphBuilder::randomDraw(std::vector<Node *> operands, AttrMap attrs, TensorType type) {
  std::string err =
      randomDrawError(type, std::vector<const Node *>(operands.begin(), operands.end()), attrs);
  if (!err.empty())
    BRAZE_USER_ERROR("random_draw", name_) << err;
  return make(OpKind::RandomDraw, std::move(operands), std::move(attrs), std::move(type));
}

Node *GraphBuilder::randomUniform(DType dtype, std::vector<SymExpr> shape, Node *seed,
                                  double low, double high) {
  AttrMap attrs;
  attrs.set("distribution", std::string("uniform"));
  attrs.set("stream", nextRandomStream_++);
  attrs.set("low", low);
  attrs.set("high", high);
  return randomDraw({seed}, std::move(attrs), TensorType{dtype, std::move(shape), {}});
}

Node *GraphBuilder::randomNormal(DType dtype, std::vector<SymExpr> shape, Node *seed, Node *mean,
                                 Node *std) {
  AttrMap attrs;
  attrs.set("distribution", std::string("normal"));
  attrs.set("stream", nextRandomStream_++);
  DType ct = isFloating(dtype) ? computeType(dtype) : DType::Float32;
  Node *m = expand(convert(mean, ct), shape), *s = expand(convert(std, ct), shape);
  return randomDraw({seed, m, s}, std::move(attrs), TensorType{dtype, std::move(shape), {}});
}

Node *GraphBuilder::randomInteger(DType dtype, std::vector<SymExpr> shape, Node *seed,
                                  int64_t low, int64_t high) {
  AttrMap attrs;
  attrs.set("distribution", std::string("integer"));
  attrs.set("stream", nextRandomStream_);
  nextRandomStream_ += 2; // two draws of 24 bits
  attrs.set("low", static_cast<double>(low));
  attrs.set("high", static_cast<double>(high));
  return randomDraw({seed}, std::move(attrs), TensorType{dtype, std::move(shape), {}});
}

namespace {
/// The attributes of a one-stream draw with probability `p` (geometric, bernoulli).
AttrMap probabilityDraw(const char *distribution, int64_t stream, double p) {
  AttrMap attrs;
  attrs.set("distribution", std::string(distribution));
  attrs.set("stream", stream);
  attrs.set("p", p);
  return attrs;
}
} // namespace

Node *GraphBuilder::randomGeometric(DType dtype, std::vector<SymExpr> shape, Node *seed,
                                    double p) {
  return randomDraw({seed}, probabilityDraw("geometric", nextRandomStream_++, p),
                    TensorType{dtype, std::move(shape), {}});
}

Node *GraphBuilder::randomBernoulli(DType dtype, std::vector<SymExpr> shape, Node *seed,
                                    double p) {
  return randomDraw({seed}, probabilityDraw("bernoulli", nextRandomStream_++, p),
                    TensorType{dtype, std::move(shape), {}});
}

} // namespace braze
