/// Verifier checks of the neural-network composites: convolution (transposed too), pooling,
/// grid sampling and attention (forward, log-sum-exp and gradients).
#include "braze/ir/graph/GraphVerifier.h"
#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>
#include <cmath>

namespace braze::detail {

/// A convolution's stride, padding and dilation: one entry per spatial dim each, strides and
/// dilations at least 1, padding at least 0, none above 2^40.
bool GraphVerifier::checkWindow(const IntList &stride, const IntList &padding,
                                const IntList &dilation, size_t spatial) {
  for (auto [name, v] : {std::pair<const char *, const IntList *>{"stride", &stride},
                         {"padding", &padding},
                         {"dilation", &dilation}}) {
    if (v->size() != spatial)
      return fail(std::string("'") + name + "' needs " + std::to_string(spatial) +
                  " entries (one per spatial dim), not " + std::to_string(v->size()));
    int64_t least = v == &padding ? 0 : 1;
    for (int64_t e : *v)
      if (e < least || e > (int64_t(1) << 40))
        return fail(std::string("'") + name + "' entry " + std::to_string(e) +
                    " is out of range (at least " + std::to_string(least) + ")");
  }
  return true;
}

/// Ranks, per-spatial-dim attribute lengths and ranges, channel counts and the result's
/// rank of a convolution (input [N, C, *S], weight [O, C / groups, *K], bias [O]).
bool GraphVerifier::checkConvolution() {
  const attrs::Convolution a(*node_);
  const Node *x = node_->operand(0), *w = node_->operand(1);
  size_t rank = x->rank();
  if (rank < 3 || rank > 5)
    return fail("input must have rank 3 to 5 (batch, channels, 1-3 spatial dims), not " +
                std::to_string(rank));
  if (static_cast<size_t>(w->rank()) != rank || static_cast<size_t>(node_->rank()) != rank)
    return fail("weight and result must have the input's rank " + std::to_string(rank) +
                ", not " + std::to_string(w->rank()) + " and " +
                std::to_string(node_->rank()));
  size_t spatial = rank - 2;
  if (!sharesNumericDtype())
    return false;
  if (!checkWindow(a.stride(), a.padding(), a.dilation(), spatial))
    return false;
  int64_t groups = a.groups();
  if (groups < 1)
    return fail("'groups' must be at least 1, not " + std::to_string(groups));
  if (node_->operands().size() == 3 && node_->operand(2)->rank() != 1)
    return fail("bias must have rank 1");
  SymExpr c = x->shape()[1], wc = w->shape()[1], o = w->shape()[0];
  if (!c->isConst() || !wc->isConst())
    return fail("input and weight channels must be static, got " + shapeText(x->shape()) +
                " and " + shapeText(w->shape()));
  if (c->value() != wc->value() * groups)
    return fail("input has " + std::to_string(c->value()) + " channels but weight takes " +
                std::to_string(wc->value()) + " per group x " + std::to_string(groups) +
                " groups");
  if (o->isConst() && o->value() % groups != 0)
    return fail("weight has " + std::to_string(o->value()) + " output channels, not a "
                "multiple of groups " + std::to_string(groups));
  if (o->isConst(0))
    return fail("weight has no output channels");
  if (node_->operands().size() == 3 && node_->operand(2)->shape()[0] != o)
    return fail("bias has " + sym::toString(node_->operand(2)->shape()[0]) +
                " entries for " + sym::toString(o) + " output channels");
  if (node_->shape()[0] != x->shape()[0] || node_->shape()[1] != o)
    return fail("result " + shapeText(node_->shape()) + " must have the input's batch " +
                sym::toString(x->shape()[0]) + " and the weight's " + sym::toString(o) +
                " output channels");
  // Each spatial size is what the window gives: (in + 2p - d(k-1) - 1) / s + 1.
  const IntList &st = a.stride(), &pad = a.padding(), &dil = a.dilation();
  for (size_t i = 0; i < spatial; ++i) {
    SymExpr in = x->shape()[2 + i], k = w->shape()[2 + i], out = node_->shape()[2 + i];
    if (!k->isConst())
      return fail("kernel sizes must be static, got weight " + shapeText(w->shape()));
    if (!in->isConst() || !out->isConst()) {
      // A symbolic size must be the window arithmetic's expression, as the builder gives it.
      SymExpr padded = ctx_.add(in, ctx_.constant(2 * pad[i]));
      SymExpr span = ctx_.constant(dil[i] * (k->value() - 1) + 1);
      if (!ctx_.provablyNonNegative(ctx_.sub(padded, span)))
        return fail("spatial dim " + std::to_string(i) + ": the kernel may be larger than the "
                    "padded input " + sym::toString(padded));
      SymExpr want = ctx_.add(ctx_.floordiv(ctx_.sub(padded, span), ctx_.constant(st[i])),
                              ctx_.constant(1));
      if (out != want)
        return fail("spatial dim " + std::to_string(i) + " of the result is " +
                    sym::toString(out) + ", but the window gives " + sym::toString(want));
      continue;
    }
    int64_t want = convWindows(i, in->value(), k->value());
    if (want != out->value())
      return fail("spatial dim " + std::to_string(i) + " of the result is " +
                  std::to_string(out->value()) + ", but the window gives " +
                  (want < 0 ? std::string("none (the kernel is larger than the padded input)")
                            : std::to_string(want)));
  }
  return true;
}

/// A convolution's operands (input, weight, bias) and result: one numeric, non-bool dtype.
bool GraphVerifier::sharesNumericDtype() {
  DType t = node_->dtype();
  bool ok = t != DType::Bool;
  for (const Node *o : node_->operands())
    ok &= o->dtype() == t;
  return ok ? true
            : fail("input, weight, bias and result must share one numeric (non-bool) dtype");
}

/// A transposed convolution (input [N, Cin, *S], weight [Cin, Cout / groups, *K], bias
/// [Cout]): attribute lengths and ranges, static sizes, and the result
/// [N, Cout, (S - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1].
bool GraphVerifier::checkConvTranspose() {
  const attrs::ConvTranspose a(*node_);
  const Node *x = node_->operand(0), *w = node_->operand(1);
  int rank = x->rank();
  if (rank < 3 || rank > 5 || w->rank() != rank || node_->rank() != rank)
    return fail("input, weight and result must share a rank of 3 to 5");
  size_t spatial = static_cast<size_t>(rank - 2);
  if (!sharesNumericDtype())
    return false;
  for (auto [name, v] : {std::pair<const char *, const IntList *>{"stride", &a.stride()},
                         {"padding", &a.padding()},
                         {"dilation", &a.dilation()},
                         {"output_padding", &a.output_padding()}}) {
    if (v->size() != spatial)
      return fail(std::string("'") + name + "' needs " + std::to_string(spatial) +
                  " entries (one per spatial dim), not " + std::to_string(v->size()));
    int64_t least = name[0] == 's' || name[0] == 'd' ? 1 : 0;
    for (int64_t e : *v)
      if (e < least || e > (int64_t(1) << 40))
        return fail(std::string("'") + name + "' entry " + std::to_string(e) +
                    " is out of range (at least " + std::to_string(least) + ")");
  }
  int64_t groups = a.groups();
  std::vector<int64_t> ws;
  for (SymExpr d : w->shape()) {
    if (!d->isConst())
      return fail("the weight's sizes must be static");
    ws.push_back(d->value());
  }
  if (groups < 1 || ws[0] % groups || x->shape()[1] != w->shape()[0])
    return fail("input channels must equal the weight's first dim, a multiple of groups");
  if (node_->operands().size() != 2u + a.bias())
    return fail("operand count does not match the 'bias' attribute");
  std::vector<SymExpr> want{x->shape()[0], ctx_.constant(groups * ws[1])};
  const IntList &st = a.stride(), &pad = a.padding(), &dil = a.dilation(),
                &extra = a.output_padding();
  for (size_t i = 0; i < spatial; ++i) {
    SymExpr in = x->shape()[2 + i];
    if (!in->isConst() || extra[i] >= std::max(st[i], dil[i]))
      return fail("needs static spatial sizes and output padding below the stride or the "
                  "dilation");
    want.push_back(ctx_.constant(GraphBuilder::convTransposeSize(in->value(), st[i], pad[i],
                                                                 dil[i], ws[2 + i], extra[i])));
  }
  if (a.bias() && node_->operand(2)->shape() != std::vector<SymExpr>{want[1]})
    return fail("bias must have shape [" + sym::toString(want[1]) + "]");
  return node_->shape() == want ? true : fail("result must be " + shapeText(want));
}

/// A convolution gradient's shared checks: its operands (`names`) and result of one rank (3 to
/// 5) and floating dtype, its stride, padding and dilation lists, and static sizes, returned in
/// `sizes` (operand 0, operand 1, result).
bool GraphVerifier::checkConvGradient(const char *names,
                                      std::array<std::vector<int64_t>, 3> &sizes) {
  const attrs::ConvWeightGrad a(*node_); // and conv_input_grad, of the same attributes
  const Node *ops[3] = {node_->operand(0), node_->operand(1), node_};
  int rank = ops[0]->rank();
  if (rank < 3 || rank > 5 || ops[1]->rank() != rank || node_->rank() != rank)
    return fail(std::string(names) + " and result must share a rank of 3 to 5");
  if (!isFloating(node_->dtype()) || ops[0]->dtype() != node_->dtype() ||
      ops[1]->dtype() != node_->dtype())
    return fail(std::string(names) + " and result must share one floating dtype");
  size_t spatial = static_cast<size_t>(rank - 2);
  if (!checkWindow(a.stride(), a.padding(), a.dilation(), spatial))
    return false;
  for (int i = 0; i < 3; ++i)
    for (SymExpr d : ops[i]->shape()) {
      if (!d->isConst())
        return fail("needs static sizes, got " + shapeText(ops[0]->shape()) + ", " +
                    shapeText(ops[1]->shape()) + " and result " + shapeText(node_->shape()));
      sizes[i].push_back(d->value());
    }
  return true;
}

/// The windows a kernel of k gives over n positions along spatial dim i (-1: none).
int64_t GraphVerifier::convWindows(size_t i, int64_t n, int64_t k) {
  const attrs::ConvWeightGrad a(*node_); // and conv_input_grad
  int64_t room = n + 2 * a.padding()[i] - a.dilation()[i] * (k - 1) - 1;
  return room < 0 ? -1 : room / a.stride()[i] + 1;
}

/// A convolution's weight gradient (input [N, C, *S], output gradient [N, O, *P], result
/// [O, C / groups, *K]): the shared checks, and P at most the windows K gives over S (a
/// transposed convolution's output padding past its stride leaves windows its input gradient
/// does not have, and the gradient sums over the first P).
bool GraphVerifier::checkConvWeightGrad() {
  std::array<std::vector<int64_t>, 3> s;
  if (!checkConvGradient("input, output gradient", s))
    return false;
  const std::vector<int64_t> &xs = s[0], &ds = s[1], &ws = s[2];
  int64_t groups = attrs::ConvWeightGrad(*node_).groups();
  if (groups < 1 || xs[1] % groups || ds[1] % groups || xs[0] != ds[0] || ws[0] != ds[1] ||
      ws[1] * groups != xs[1])
    return fail("result " + shapeText(node_->shape()) + " must be [output gradient channels, "
                "input channels / groups, kernel..] for input " +
                shapeText(node_->operand(0)->shape()) + ", output gradient " +
                shapeText(node_->operand(1)->shape()) + " and groups " + std::to_string(groups));
  for (size_t i = 0; i + 2 < xs.size(); ++i)
    if (ws[2 + i] < 1 || ds[2 + i] < 1 || convWindows(i, xs[2 + i], ws[2 + i]) < ds[2 + i])
      return fail("spatial dim " + std::to_string(i) + ": a kernel of " +
                  std::to_string(ws[2 + i]) + " over " + std::to_string(xs[2 + i]) +
                  " input positions has fewer windows than the output gradient's " +
                  std::to_string(ds[2 + i]));
  return true;
}

/// A convolution's input gradient (output gradient [N, O, *P], weight [O, C / groups, *K],
/// result [N, C, *S]): the shared checks, and P exactly the windows K gives over S.
bool GraphVerifier::checkConvInputGrad() {
  std::array<std::vector<int64_t>, 3> s;
  if (!checkConvGradient("output gradient, weight", s))
    return false;
  const std::vector<int64_t> &ds = s[0], &ws = s[1], &xs = s[2];
  int64_t groups = attrs::ConvInputGrad(*node_).groups();
  if (groups < 1 || ws[0] % groups || ds[1] != ws[0] || xs[0] != ds[0] ||
      xs[1] != ws[1] * groups)
    return fail("result " + shapeText(node_->shape()) + " must be [batch, weight channels x "
                "groups, input..] for output gradient " + shapeText(node_->operand(0)->shape()) +
                ", weight " + shapeText(node_->operand(1)->shape()) + " and groups " +
                std::to_string(groups));
  for (size_t i = 0; i + 2 < xs.size(); ++i)
    if (ws[2 + i] < 1 || convWindows(i, xs[2 + i], ws[2 + i]) != ds[2 + i])
      return fail("spatial dim " + std::to_string(i) + ": a kernel of " +
                  std::to_string(ws[2 + i]) + " over " + std::to_string(xs[2 + i]) +
                  " input positions does not give the output gradient's " +
                  std::to_string(ds[2 + i]) + " windows");
  return true;
}

/// Pooling over the last kernel.size() (1 to 3) dims: every window list of that length, each
/// window in range (GraphBuilder::poolWindowError), constant pooled dims, and a pooled shape
/// (the result's, or max_pool_grad's gradient and indices) whose leading dims are the
/// input's and whose pooled dims the window arithmetic gives (rounded down, or up in ceil
/// mode). Dtypes: max pools numbers, avg_pool floats and i64, max_pool_grad float gradients.
bool GraphVerifier::checkPooling() {
  const attrs::MaxPool a(*node_); // every pool's window attributes
  const IntList &k = a.kernel(), &st = a.stride(), &p = a.padding(), &d = a.dilation();
  size_t spatial = k.size();
  if (spatial < 1 || spatial > 3 || st.size() != spatial || p.size() != spatial ||
      d.size() != spatial)
    return fail("needs kernel, stride, padding and dilation lists of one length from 1 to 3");
  bool grad = node_->op() == OpKind::MaxPoolGrad;
  const Node *x = node_->operand(grad ? 1 : 0), *pooled = grad ? node_->operand(0) : node_;
  DType t = x->dtype();
  if (grad) {
    if (!isFloating(pooled->dtype()) || node_->dtype() != pooled->dtype() ||
        node_->shape() != x->shape())
      return fail("result must be the gradient's floating-point dtype with the input's shape");
    if (node_->operand(2)->dtype() != DType::Int64 ||
        node_->operand(2)->shape() != pooled->shape())
      return fail("indices must be i64 of the gradient's shape");
  } else if (node_->op() == OpKind::AvgPool) {
    if (!isFloating(t) && t != DType::Int64)
      return fail("needs a floating-point or i64 input");
    if (attrs::AvgPool(*node_).divisor() < 0)
      return fail("divisor must be positive (or 0: the window count)");
  } else if (t == DType::Bool) {
    return fail("needs a numeric input, not bool");
  }
  DType want = node_->op() == OpKind::MaxPoolIndices ? DType::Int64 : t;
  if (!grad && node_->dtype() != want)
    return fail("result must be " + std::string(dtypeName(want)));
  size_t r = x->rank();
  if (r < spatial + 1 || static_cast<size_t>(pooled->rank()) != r)
    return fail("input and pooled shape need one rank of at least " +
                std::to_string(spatial + 1) + ", not " + std::to_string(r) + " and " +
                std::to_string(pooled->rank()));
  for (size_t i = 0; i + spatial < r; ++i)
    if (pooled->shape()[i] != x->shape()[i])
      return fail("dim " + std::to_string(i) + " is not pooled and must equal the input's");
  for (size_t i = 0; i < spatial; ++i) {
    std::string err = GraphBuilder::poolWindowError(k[i], st[i], p[i], d[i]);
    if (!err.empty())
      return fail(err);
    SymExpr in = x->shape()[r - spatial + i], out = pooled->shape()[r - spatial + i];
    if (!in->isConst() || !out->isConst())
      return fail("the pooled dims must be constants");
    int64_t span = d[i] * (k[i] - 1) + 1;
    if (in->value() + 2 * p[i] < span)
      return fail("the window (" + std::to_string(span) + ") is larger than the padded input (" +
                  std::to_string(in->value() + 2 * p[i]) + ")");
    int64_t lo = GraphBuilder::pooledSize(in->value(), k[i], st[i], p[i], d[i], false),
            hi = GraphBuilder::pooledSize(in->value(), k[i], st[i], p[i], d[i], true);
    if (out->value() != lo && out->value() != hi)
      return fail("pooled dim " + std::to_string(r - spatial + i) + " is " +
                  std::to_string(out->value()) + " but the windows give " + std::to_string(lo) +
                  (hi != lo ? " (or " + std::to_string(hi) + " in ceil mode)" : ""));
  }
  return true;
}

/// Adaptive pooling of the last output_size.size() (1 to 3) dims of a floating-point input:
/// static, non-empty pooled dims, and a result of the input's leading dims and output_size.
bool GraphVerifier::checkAdaptivePooling() {
  const IntList &o = attrs::AdaptiveAvgPool(*node_).output_size(); // every adaptive pool's
  OpKind op = node_->op();
  bool grad = op == OpKind::AdaptiveAvgPoolGrad || op == OpKind::AdaptiveMaxPoolGrad;
  // The pooled shape is the result's, or a gradient's (then the result is the input's).
  const Node *x = node_->operand(grad ? 1 : 0), *pooled = grad ? node_->operand(0) : node_;
  size_t spatial = o.size(), r = x->rank();
  if (spatial < 1 || spatial > 3 || r < spatial + 1)
    return fail("needs 1 to 3 output sizes, and an input of a higher rank");
  if (!isFloating(x->dtype()))
    return fail("needs a floating-point input");
  if (grad) {
    if (!isFloating(pooled->dtype()) || node_->dtype() != pooled->dtype() ||
        node_->shape() != x->shape())
      return fail("result must be the gradient's floating-point dtype with the input's shape");
  } else {
    DType want = op == OpKind::AdaptiveMaxPoolIndices ? DType::Int64 : x->dtype();
    if (node_->dtype() != want)
      return fail("result must be " + std::string(dtypeName(want)));
  }
  std::vector<SymExpr> shape(x->shape().begin(), x->shape().end() - spatial);
  int64_t pairs = 1;
  for (size_t i = 0; i < spatial; ++i) {
    SymExpr in = x->shape()[r - spatial + i];
    if (!in->isConst() || in->value() < 1 || o[i] < 1 || o[i] > GraphBuilder::kMaxAdaptiveSize)
      return fail("needs static, non-empty pooled dims and output sizes from 1 to " +
                  std::to_string(GraphBuilder::kMaxAdaptiveSize));
    shape.push_back(ctx_.constant(o[i]));
    if (__builtin_mul_overflow(pairs, in->value(), &pairs) ||
        __builtin_mul_overflow(pairs, o[i], &pairs))
      pairs = INT64_MAX;
  }
  if (pooled->shape() != shape)
    return fail(std::string(grad ? "the gradient" : "result") + " must be " + shapeText(shape));
  if (op == OpKind::AdaptiveMaxPoolGrad) {
    const Node *indices = node_->operand(2);
    if (indices->dtype() != DType::Int64 || indices->shape() != shape)
      return fail("indices must be i64 of the gradient's shape");
    if (pairs > GraphBuilder::kMaxComparisons)
      return fail("compares " + std::to_string(pairs) + " positions and outputs per plane; at "
                  "most " + std::to_string(GraphBuilder::kMaxComparisons));
  }
  return true;
}

/// Grid sampling: the input, grid and modes GraphBuilder::gridSampleShape accepts (static,
/// non-empty spatial dims and static grid points: the decomposition flattens both), and a
/// result of the input's dtype shaped [N, C, *O].
bool GraphVerifier::checkGridSample() {
  const attrs::GridSample a(*node_);
  const Node *x = node_->operand(0);
  std::vector<SymExpr> want;
  std::string err = GraphBuilder::gridSampleShape(x, node_->operand(1), a.mode_text(),
                                                  a.padding_mode_text(), want);
  if (!err.empty())
    return fail(err);
  if (node_->dtype() != x->dtype())
    return fail("result must be " + std::string(dtypeName(x->dtype())));
  return node_->shape() == want ? true : fail("result must be " + shapeText(want));
}

/// Attention's operands and result: q [B.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv] of one
/// floating dtype, a bias of that dtype broadcasting to [B.., Sq, Sk], result [B.., Sq, Dv].
bool GraphVerifier::checkAttention() {
  const Node *q = node_->operand(0), *k = node_->operand(1), *v = node_->operand(2);
  size_t r = q->shape().size();
  if (r < 2 || k->shape().size() != r || v->shape().size() != r)
    return fail("query, key and value must have one rank of at least 2");
  if (!isFloating(q->dtype()) || k->dtype() != q->dtype() || v->dtype() != q->dtype() ||
      node_->dtype() != q->dtype())
    return fail("query, key, value and result must share one floating-point dtype");
  for (size_t i = 0; i + 2 < r; ++i)
    if (k->shape()[i] != q->shape()[i] || v->shape()[i] != q->shape()[i])
      return fail("query, key and value must share their batch dims");
  if (k->shape()[r - 1] != q->shape()[r - 1] || v->shape()[r - 2] != k->shape()[r - 2])
    return fail("key must be [.., Sk, D] for a query [.., Sq, D] and value [.., Sk, Dv]");
  std::vector<SymExpr> want(q->shape().begin(), q->shape().end() - 1);
  want.push_back(v->shape()[r - 1]);
  if (node_->shape() != want)
    return fail("result must be " + shapeText(want));
  if (!checkAttentionDropout(3))
    return false;
  return !attrs::Attention(*node_).bias() ||
         checkAttentionBias(node_->operands().back(), q, k);
}

/// An attention's or its gradient's dropout: p in [0, 1), and for p > 0 an i64 scalar seed
/// at operand `at`; the operand count is `at`, the seed and the bias.
bool GraphVerifier::checkAttentionDropout(size_t at) {
  const attrs::AttentionLse a(*node_); // the attributes of every attention op
  double p = GraphBuilder::attentionDropout(node_);
  if (!(p >= 0 && p < 1))
    return fail("dropout must be in [0, 1)");
  if (node_->operands().size() != at + (p > 0) + a.bias())
    return fail("operand count does not match the 'bias' and 'dropout' attributes");
  if (p > 0 && (node_->operand(at)->dtype() != DType::Int64 ||
                !node_->operand(at)->shape().empty()))
    return fail("dropout's seed must be an i64 scalar");
  return true;
}

/// An attention's bias: the query's dtype, broadcasting to the scores [B.., Sq, Sk].
bool GraphVerifier::checkAttentionBias(const Node *b, const Node *q, const Node *k) {
  size_t r = q->shape().size();
  std::vector<SymExpr> scores(q->shape().begin(), q->shape().end() - 1);
  scores.push_back(k->shape()[r - 2]);
  if (b->dtype() != q->dtype() || b->shape().size() > r)
    return fail("bias must have the query's dtype and a rank of at most " + std::to_string(r));
  size_t lead = r - b->shape().size();
  for (size_t i = 0; i < b->shape().size(); ++i)
    if (!b->shape()[i]->isConst(1) && b->shape()[i] != scores[lead + i])
      return fail("bias " + shapeText(b->shape()) + " does not broadcast to the scores " +
                  shapeText(scores));
  return true;
}

/// attention_lse (q, k[, bias] -> [B.., Sq] in the compute type) and attention_grad
/// (dout, q, k, v, out, lse[, bias] -> the shape and dtype of q, k or v as `wrt` says).
bool GraphVerifier::checkAttentionSaved() {
  const attrs::AttentionLse a(*node_); // and attention_grad's
  bool grad = node_->op() == OpKind::AttentionGrad;
  size_t first = grad ? 1 : 0, operands = node_->operands().size();
  if (grad && !checkAttentionDropout(6))
    return false;
  if (!grad && operands != 2u + a.bias())
    return fail("operand count does not match the 'bias' attribute");
  const Node *q = node_->operand(first), *k = node_->operand(first + 1);
  size_t r = q->shape().size();
  if (r < 2 || k->shape().size() != r || !isFloating(q->dtype()) || k->dtype() != q->dtype())
    return fail("query and key must share one floating-point dtype and a rank of at least 2");
  for (size_t i = 0; i + 2 < r; ++i)
    if (k->shape()[i] != q->shape()[i])
      return fail("query and key must share their batch dims");
  if (k->shape()[r - 1] != q->shape()[r - 1])
    return fail("key must be [.., Sk, D] for a query [.., Sq, D]");
  std::vector<SymExpr> rows(q->shape().begin(), q->shape().end() - 1);
  if (a.bias() && !checkAttentionBias(node_->operand(operands - 1), q, k))
    return false;
  if (!grad)
    return node_->dtype() == computeType(q->dtype()) && node_->shape() == rows
               ? true
               : fail("result must be " + std::string(dtypeName(computeType(q->dtype()))) +
                      shapeText(rows));
  const Node *v = node_->operand(3), *lse = node_->operand(5);
  bool vOk = v->dtype() == q->dtype() && v->shape().size() == r &&
             v->shape()[r - 2] == k->shape()[r - 2];
  for (size_t i = 0; vOk && i + 2 < r; ++i)
    vOk = v->shape()[i] == q->shape()[i];
  if (!vOk)
    return fail("value must be [B.., Sk, Dv] of the query's dtype and batch dims");
  std::vector<SymExpr> outShape = rows;
  outShape.push_back(v->shape()[r - 1]);
  for (const Node *x : {node_->operand(0), node_->operand(4)})
    if (x->dtype() != q->dtype() || x->shape() != outShape)
      return fail("the output and its gradient must be " + shapeText(outShape));
  if (lse->dtype() != computeType(q->dtype()) || lse->shape() != rows)
    return fail("the log-sum-exp must be " + std::string(dtypeName(computeType(q->dtype()))) +
                shapeText(rows));
  attrs::AttentionWrt wrt = attrs::AttentionGrad(*node_).wrt();
  const Node *like = wrt == attrs::AttentionWrt::Q ? q : wrt == attrs::AttentionWrt::K ? k : v;
  if (node_->dtype() != q->dtype() || node_->shape() != like->shape())
    return fail("result must be shaped as the operand named by wrt");
  return true;
}

} // namespace braze::detail
