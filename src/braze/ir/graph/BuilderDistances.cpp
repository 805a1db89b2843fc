// GraphBuilder: pairwise distances (cdist, pdist), Fourier transforms (fft) and complex values
// as pairs (complex, conj), composite ops that lowering/decompose turns into broadcast
// differences and reductions, cdist's matrix-product form, products with twiddle matrices,
// and concatenated parts.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

#include <cmath>

namespace braze {

Node *GraphBuilder::cdist(Node *a, Node *b, double p, bool matmulForm) {
  const char *op = "cdist";
  if (a->rank() < 2 || b->rank() != a->rank())
    BRAZE_USER_ERROR(op, name_) << "needs operands [.., P, M] and [.., R, M] of one rank >= 2, "
                                   "got ranks "
                                << a->rank() << " and " << b->rank();
  if ((a->dtype() != DType::Float32 && a->dtype() != DType::Float64) || b->dtype() != a->dtype())
    BRAZE_USER_ERROR(op, name_) << "needs two f32 or two f64 operands, got "
                                << dtypeName(a->dtype()) << " and " << dtypeName(b->dtype());
  int64_t r = a->rank();
  if (a->shape()[r - 1] != b->shape()[r - 1])
    BRAZE_USER_ERROR(op, name_) << "feature dims differ: " << shapeText(a->shape()) << " and "
                                << shapeText(b->shape());
  if (std::isnan(p) || p < 0)
    BRAZE_USER_ERROR(op, name_) << "p must be >= 0 (or inf), got " << p;
  std::vector<SymExpr> batchA(a->shape().begin(), a->shape().end() - 2),
      batchB(b->shape().begin(), b->shape().end() - 2);
  std::vector<SymExpr> shape = broadcastShapes(op, batchA, batchB);
  shape.push_back(a->shape()[r - 2]);
  shape.push_back(b->shape()[r - 2]);
  AttrMap attrs;
  attrs.set("p", p);
  attrs.set("matmul_form", matmulForm);
  return make(OpKind::Cdist, {a, b}, std::move(attrs), TensorType{a->dtype(), shape, {}});
}

Node *GraphBuilder::pdist(Node *x, double p) {
  const char *op = "pdist";
  int64_t n;
  if (x->rank() != 2 || !sym().constValue(x->shape()[0], n))
    BRAZE_USER_ERROR(op, name_) << "needs a [N, M] operand with a static N, got "
                                << shapeText(x->shape());
  if (x->dtype() != DType::Float32 && x->dtype() != DType::Float64)
    BRAZE_USER_ERROR(op, name_) << "needs an f32 or f64 operand, got " << dtypeName(x->dtype());
  if (n > kMaxPdistRows)
    BRAZE_USER_ERROR(op, name_) << "takes at most " << kMaxPdistRows << " rows, got " << n;
  if (std::isnan(p) || p < 0)
    BRAZE_USER_ERROR(op, name_) << "p must be >= 0 (or inf), got " << p;
  AttrMap attrs;
  attrs.set("p", p);
  return make(OpKind::Pdist, {x}, std::move(attrs),
              TensorType{x->dtype(), {dim(n * (n - 1) / 2)}, {}});
}

std::string fftShape(const std::string &mode, const std::vector<SymExpr> &in, const IntList &dims,
                     int64_t normalization, bool flag, int64_t lastSize, sym::SymContext &ctx,
                     std::vector<SymExpr> &out) {
  if (mode != "c2c" && mode != "r2c" && mode != "c2r")
    return "mode must be \"c2c\", \"r2c\" or \"c2r\", got \"" + mode + "\"";
  bool pairs = mode != "r2c";
  if (pairs && (in.empty() || !in.back()->isConst(2)))
    return "needs a signal held as pairs [.., 2], got " + shapeText(in);
  int64_t rank = static_cast<int64_t>(in.size()) - (pairs ? 1 : 0);
  if (dims.empty() || normalization < 0 || normalization > 2)
    return "needs transformed dims and a normalization of 0, 1 or 2";
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i];
    if (d < 0 || d >= rank || (i > 0 && d <= dims[i - 1]))
      return "dims " + attrToString(dims) + " must be increasing dims of the signal of rank " +
             std::to_string(rank);
    if (!in[d]->isConst() || in[d]->value() < 1 || in[d]->value() > GraphBuilder::kMaxDft)
      return "transformed dim " + std::to_string(d) + " of " + shapeText(in) +
             " must be static and 1 to " + std::to_string(GraphBuilder::kMaxDft) + " long";
  }
  out.assign(in.begin(), in.begin() + rank);
  int64_t last = dims.back(), n = in[last]->value();
  if (mode == "r2c") {
    out[last] = ctx.constant(flag ? n / 2 + 1 : n);
  } else if (mode == "c2r") {
    if (lastSize < 1 || lastSize > GraphBuilder::kMaxDft || lastSize / 2 + 1 > n)
      return "c2r output size " + std::to_string(lastSize) + " does not fit a one-sided "
             "spectrum of " + std::to_string(n);
    out[last] = ctx.constant(lastSize);
  }
  if (mode != "c2r")
    out.push_back(ctx.constant(2));
  return "";
}

Node *GraphBuilder::fft(Node *x, const std::string &mode, IntList dims, int64_t normalization,
                        bool flag, int64_t lastSize) {
  if (!isFloating(x->dtype()))
    BRAZE_USER_ERROR("fft", name_) << "needs a floating-point signal, got " << dtypeName(x->dtype());
  std::vector<SymExpr> shape;
  std::string err = fftShape(mode, x->shape(), dims, normalization, flag, lastSize, sym(), shape);
  if (!err.empty())
    BRAZE_USER_ERROR("fft", name_) << err;
  AttrMap attrs;
  attrs.set("mode", mode);
  attrs.set("dims", dims);
  attrs.set("normalization", normalization);
  attrs.set("flag", flag);
  attrs.set("last_size", lastSize);
  return make(OpKind::Fft, {x}, std::move(attrs), TensorType{x->dtype(), shape, {}});
}

Node *GraphBuilder::complex(Node *re, Node *im) {
  if (!im)
    im = scalar(0, re->dtype());
  DType t = promoteTypes(re->dtype(), im->dtype());
  if (!isFloating(t))
    BRAZE_USER_ERROR("complex", name_) << "needs floating-point parts, got "
                                       << dtypeName(re->dtype()) << " and "
                                       << dtypeName(im->dtype());
  std::vector<SymExpr> shape = broadcastShapes("complex", re->shape(), im->shape());
  std::vector<SymExpr> pairs = shape;
  pairs.push_back(dim(2));
  return make(OpKind::Complex, {expand(convert(re, t), shape), expand(convert(im, t), shape)}, {},
              TensorType{t, pairs, {}});
}

Node *GraphBuilder::conj(Node *x) {
  if (!isPairs(x))
    BRAZE_USER_ERROR("conj", name_) << "needs floating-point pairs [.., 2], got "
                                    << dtypeName(x->dtype()) << shapeText(x->shape());
  return make(OpKind::Conj, {x}, {}, TensorType{x->dtype(), x->shape(), {}});
}

} // namespace braze
