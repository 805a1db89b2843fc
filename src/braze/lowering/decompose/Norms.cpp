/// mean(x) = sum(x) / n
/// var(x)  = sum((x - mean(x))^2) / max(n - correction, 0)       (two passes; no cancellation)
///         = (sum(x^2) - sum(x) * sum(x) / n) / max(n - correction, 0)   in f64, one pass, for
///           large column statistics (onePass, DecomposeOptions::wideStatistics: a batch norm's)
/// layer_norm(x, w, b) = (x - mean(x)) * rsqrt(var(x) + eps) * w + b   over the trailing dims
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>

namespace braze::decomp {

namespace {

/// Whether a mean or variance over `dims` of x is summed in f64, a variance in one pass: x is
/// f32 (or half) with constant sizes, the sum runs over at least kOnePassMinTerms elements,
/// and the reduced dims are not the trailing ones alone. A batch norm's statistics (over N, H,
/// W of [N, C, H, W]) are column sums whose input is read from memory twice by two passes; a
/// layer norm's row lies in one thread's or block's registers, where a second pass is free.
constexpr int64_t kOnePassMinTerms = 1 << 14;

bool onePass(const Node *x, const std::vector<int64_t> &dims) {
  if (x->dtype() != DType::Float32 || dims.empty())
    return false;
  const int64_t rank = x->rank();
  std::vector<bool> reduced(rank, false);
  int64_t terms = 1;
  for (int64_t d : dims) {
    d = d < 0 ? d + rank : d;
    const SymExpr &size = x->shape()[d];
    if (!size->isConst())
      return false;
    reduced[d] = true;
    terms *= size->value();
  }
  const int64_t k = std::count(reduced.begin(), reduced.end(), true);
  const bool trailing = std::all_of(reduced.end() - k, reduced.end(), [](bool r) { return r; });
  return terms >= kOnePassMinTerms && !trailing;
}

} // namespace

Node *decomposeMean(GraphBuilder &b, Node *n, const DecomposeOptions &opts) {
  const attrs::Mean a(*n);
  Node *x = upcast(b, n->operand(0));
  std::vector<int64_t> dims = a.dims();
  if (opts.wideStatistics && onePass(x, dims)) { // the f64 sum of decomposeVar (cse merges)
    Node *w = b.convert(x, DType::Float64);
    Node *s = b.reduce(OpKind::Sum, w, dims, a.keepdim());
    Node *mean = b.div(s, b.numel(w, dims, DType::Float64));
    return downcastLike(b, b.convert(mean, x->dtype()), n->dtype());
  }
  Node *s = b.reduce(OpKind::Sum, x, dims, a.keepdim());
  Node *count = b.numel(x, dims, x->dtype());
  return downcastLike(b, b.div(s, count), n->dtype());
}

Node *decomposeVar(GraphBuilder &b, Node *n, const DecomposeOptions &opts) {
  const attrs::Var a(*n);
  Node *x = upcast(b, n->operand(0));
  std::vector<int64_t> dims = a.dims();
  if (opts.wideStatistics && onePass(x, dims)) {
    // One pass in f64: the sum and the sum of squares, then ss - s * mean. f64 keeps the
    // cancellation harmless: its error, relative to the variance, is about 1e-16 times
    // (mean / std)^2, far below f32's rounding unless the mean is 10^4 stds from zero.
    Node *w = b.convert(x, DType::Float64);
    Node *s = b.reduce(OpKind::Sum, w, dims, a.keepdim());
    Node *ss = b.reduce(OpKind::Sum, b.mul(w, w), dims, a.keepdim());
    Node *count = b.numel(w, dims, DType::Float64);
    Node *dev = b.sub(ss, b.mul(s, b.div(s, count)));
    dev = b.binary(OpKind::Maximum, dev, b.scalar(0.0, DType::Float64));
    Node *denom = b.binary(OpKind::Maximum,
                           b.sub(count, b.scalar(a.correction(), DType::Float64)),
                           b.scalar(0.0, DType::Float64));
    return downcastLike(b, b.convert(b.div(dev, denom), x->dtype()), n->dtype());
  }
  Node *mean = b.mean(x, dims, true);
  Node *d = b.sub(x, mean);
  Node *ss = b.reduce(OpKind::Sum, b.mul(d, d), dims, a.keepdim());
  Node *count = b.numel(x, dims, x->dtype());
  Node *denom = b.binary(OpKind::Maximum, b.sub(count, b.scalar(a.correction(), x->dtype())),
                         b.scalar(0.0, x->dtype()));
  return downcastLike(b, b.div(ss, denom), n->dtype());
}

Node *decomposeLayerNorm(GraphBuilder &b, Node *n) {
  const attrs::LayerNorm a(*n);
  Node *x = upcast(b, n->operand(0));
  int64_t axis = a.axis();
  std::vector<int64_t> dims;
  for (int64_t i = axis; i < x->rank(); ++i)
    dims.push_back(i);
  Node *mean = b.mean(x, dims, true);
  Node *var = b.var(x, dims, 0.0, true);
  Node *rstd = b.unary(OpKind::Rsqrt, b.add(var, b.scalar(a.eps(), x->dtype())));
  Node *y = b.mul(b.sub(x, mean), rstd);
  size_t next = 1;
  if (a.weight())
    y = b.mul(y, upcast(b, n->operand(next++)));
  if (a.bias())
    y = b.add(y, upcast(b, n->operand(next++)));
  return downcastLike(b, y, n->dtype());
}

} // namespace braze::decomp
