// Lowering the ops kept whole for a library or a fused kernel: matrix products (a GemmCall's
// operands as strided views), convolutions and their input and weight gradients (channels-last
// copies where cuDNN or oneDNN want them), fused attention parts, and accumulating scatters.
#include "braze/lowering/to_loops/Lowerer.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/ir/loop/Rewrite.h"
#include "braze/lowering/realize/Realize.h"
#include "braze/lowering/to_loops/IndexMaps.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <unordered_map>

namespace braze::to_loops {

Value Lowerer::lowerMatMul(Node *n) {
  std::array<Node *, 2> src = matMulSources(n, opts_.widenedHalfMatMul);
  // The realize step stored the computed operands; a view of a stored value in a layout the
  // product cannot read in place is copied row-major.
  for (Node *o : src) {
    Value &v = values_.at(o);
    if (!v.affineView && !readsInPlace(o, v))
      v = realize(o, v, BufferKind::Intermediate, -1);
  }
  const Value &a = values_.at(src[0]), &b = values_.at(src[1]);
  Buffer *out = p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Intermediate, -1,
                              paddedStrides(n->shape(), n->dtype()));
  Index outIdx, redIdx;
  std::vector<SymExpr> vars = freshVars(n->shape(), "i", outIdx);
  SymExpr k = n->operand(0)->shape().back();
  std::vector<SymExpr> rvars = freshVars({k}, "r", redIdx);
  size_t r = outIdx.size();
  Index ia(outIdx.begin(), outIdx.end() - 1), ib(outIdx.begin(), outIdx.end() - 2);
  ia.push_back(redIdx[0]);
  ib.push_back(redIdx[0]);
  ib.push_back(outIdx[r - 1]);
  DType t = computeType(n->dtype());
  const Expr *value = ex_.op(ScalarOpKind::Mul, {a.load(ia), b.load(ib)}, t);
  p_->addComputation(out, vars, rvars, rvars.empty() ? ReduceKind::None : ReduceKind::Sum, value);
  return bufferValue(out);
}

Value Lowerer::lowerAccumulatingScatter(Node *n) {
  Node *target = n->operand(1), *src = n->operand(2);
  const attrs::Scatter a(*n);
  BRAZE_CHECK(GraphBuilder::scatterIsAccumulating(n->dtype(), a.mode_text(), a.include_self(),
                                                  a.has_max_hits()))
      << "scatter " << n->name() << " reached lowering without combining in place";
  Value out = realize(n, values_.at(n->operand(0)), BufferKind::Intermediate, -1, "",
                      contiguousStrides(s_, n->shape()));
  Index full;
  std::vector<SymExpr> vars = freshVars(src->shape(), "i", full);
  const Expr *value = ex_.cast(values_.at(src).load(full), n->dtype());
  loop::Computation *c =
      p_->addComputation(out.buffer, vars, {}, ReduceKind::None, value);
  attrs::ScatterMode mode = a.mode();
  c->ext = loop::ScatterSpec{ex_.cast(values_.at(target).load(full), DType::Int64),
                             mode == attrs::ScatterMode::Prod   ? ReduceKind::Prod
                             : mode == attrs::ScatterMode::Amax ? ReduceKind::Max
                             : mode == attrs::ScatterMode::Amin ? ReduceKind::Min
                                                                : ReduceKind::Sum};
  return out;
}

const Expr *Lowerer::windowElement(const loop::ConvSpec &spec, Buffer *x,
                                   const std::vector<SymExpr> &xs, SymExpr batch, SymExpr channel,
                                   const Index &pos, const Index &taps, DType t) {
  Index xi{batch, channel};
  const Expr *inside = nullptr;
  for (size_t i = 0; i < pos.size(); ++i) {
    SymExpr at = s_.add(s_.add(s_.mul(pos[i], s_.constant(spec.stride[i])),
                               s_.mul(taps[i], s_.constant(spec.dilation[i]))),
                        s_.constant(-spec.padding[i]));
    SymExpr size = xs[2 + i];
    if (spec.padding[i] == 0) { // the windows stay inside the input
      xi.push_back(at);
      continue;
    }
    xi.push_back(s_.max(s_.constant(0), s_.min(at, s_.sub(size, s_.constant(1)))));
    inside = conjoin(inside, inRange(at, size));
  }
  if (spec.channelsLast)
    xi = toNhwc(xi);
  const Expr *xv = ex_.cast(ex_.load(x, linearIndex(s_, xi, x->strides)), t);
  return inside ? ex_.op(ScalarOpKind::Where, {inside, xv, ex_.constant(0, t)}, t) : xv;
}

Value Lowerer::lowerConvolution(Node *n) {
  loop::ConvSpec spec = convSpec(n);
  Node *xn = n->operand(0), *wn = n->operand(1);
  Buffer *x = convImage(xn, spec);
  Buffer *w = convWeight(wn, spec);
  spec.input = x;
  spec.weight = w;
  bool bias = attrs::Convolution(*n).bias();
  Buffer *out = p_->addBuffer(bias ? n->name() + "_nobias" : n->name(), n->dtype(),
                              spec.channelsLast ? toNhwc(n->shape()) : n->shape(),
                              BufferKind::Intermediate);
  Index o, r;
  std::vector<SymExpr> vars = freshVars(out->shape, "i", o);
  if (spec.channelsLast)
    o = fromNhwc(o);
  std::vector<SymExpr> rvars = freshVars(withSpatial(wn->shape()[1], wn->shape()), "r", r);
  DType t = computeType(n->dtype());
  SymExpr channel = groupChannel(spec, o[1], r[0], wn->shape()[0], wn->shape()[1]);
  Index pos(o.begin() + 2, o.end()), taps(r.begin() + 1, r.end());
  const Expr *xv = windowElement(spec, x, xn->shape(), o[0], channel, pos, taps, t);
  Index wi{o[1], r[0]};
  wi.insert(wi.end(), taps.begin(), taps.end());
  const Expr *wv = ex_.cast(ex_.load(w, linearIndex(s_, wi, w->strides)), t);
  loop::Computation *c = p_->addComputation(out, vars, rvars, ReduceKind::Sum,
                                            ex_.op(ScalarOpKind::Mul, {xv, wv}, t));
  bool channelsLast = spec.channelsLast;
  c->ext = std::move(spec);
  Value conv = channelsLast ? nhwcValue(out) : bufferValue(out);
  if (!bias) {
    if (channelsLast)
      nhwc_[n] = out;
    return conv;
  }
  const Value &b = operandValue(n, 2);
  return lazy([this, conv, &b, t](const Index &idx) {
    return ex_.op(ScalarOpKind::Add, {conv.load(idx), b.load({idx[1]})}, t);
  });
}

Value Lowerer::lowerConvWeightGrad(Node *n) {
  loop::ConvSpec spec = convSpec(n);
  spec.direction = loop::ConvDirectionKind::WeightGrad;
  Node *xn = n->operand(0), *dn = n->operand(1);
  Buffer *x = convImage(xn, spec), *dy = convImage(dn, spec);
  spec.input = x;
  spec.gradOut = dy;
  Buffer *out = p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Intermediate, -1,
                              spec.channelsLast && opts_.channelsLastWeights
                                  ? channelsLastStrides(n->shape())
                                  : contiguousStrides(s_, n->shape()));
  Index o, r;
  std::vector<SymExpr> vars = freshVars(out->shape, "i", o);
  std::vector<SymExpr> rvars = freshVars(withSpatial(dn->shape()[0], dn->shape()), "r", r);
  DType t = computeType(n->dtype());
  SymExpr channel = groupChannel(spec, o[0], o[1], dn->shape()[1], n->shape()[1]);
  Index pos(r.begin() + 1, r.end()), taps(o.begin() + 2, o.end());
  const Expr *xv = windowElement(spec, x, xn->shape(), r[0], channel, pos, taps, t);
  Index di{r[0], o[0]};
  di.insert(di.end(), pos.begin(), pos.end());
  if (spec.channelsLast)
    di = toNhwc(di);
  const Expr *dv = ex_.cast(ex_.load(dy, linearIndex(s_, di, dy->strides)), t);
  loop::Computation *c = p_->addComputation(out, vars, rvars, ReduceKind::Sum,
                                            ex_.op(ScalarOpKind::Mul, {dv, xv}, t));
  c->ext = std::move(spec);
  return bufferValue(out);
}

Value Lowerer::lowerConvInputGrad(Node *n) {
  loop::ConvSpec spec = convSpec(n);
  spec.direction = loop::ConvDirectionKind::InputGrad;
  Node *dn = n->operand(0), *wn = n->operand(1);
  Buffer *dy = convImage(dn, spec);
  Buffer *w = convWeight(wn, spec);
  spec.gradOut = dy;
  spec.weight = w;
  Buffer *out = p_->addBuffer(n->name(), n->dtype(),
                              spec.channelsLast ? toNhwc(n->shape()) : n->shape(),
                              BufferKind::Intermediate);
  Index o, r;
  std::vector<SymExpr> vars = freshVars(out->shape, "i", o);
  if (spec.channelsLast)
    o = fromNhwc(o);
  SymExpr perGroupOut = s_.floordiv(wn->shape()[0], s_.constant(spec.groups));
  std::vector<SymExpr> rvars = freshVars(withSpatial(perGroupOut, wn->shape()), "r", r);
  DType t = computeType(n->dtype());
  SymExpr perGroupIn = wn->shape()[1], channel = o[1], outChannel = r[0];
  if (spec.groups > 1) {
    SymExpr group = s_.floordiv(o[1], perGroupIn);
    channel = s_.mod(o[1], perGroupIn);
    outChannel = s_.add(s_.mul(group, perGroupOut), r[0]);
  }
  Index di{o[0], outChannel}, wi{outChannel, channel};
  const Expr *inside = nullptr;
  for (size_t i = 0; i < spec.stride.size(); ++i) {
    // The window position p of input position s under tap k: p * stride = s + padding - k *
    // dilation, when that is a multiple of the stride in [0, P * stride).
    SymExpr tap = r[1 + i], windows = dn->shape()[2 + i];
    SymExpr at = s_.add(s_.add(o[2 + i], s_.constant(spec.padding[i])),
                        s_.mul(tap, s_.constant(-spec.dilation[i])));
    SymExpr stride = s_.constant(spec.stride[i]);
    SymExpr clamped = s_.max(s_.constant(0), s_.min(at, s_.sub(s_.mul(windows, stride),
                                                                s_.constant(1))));
    di.push_back(s_.floordiv(clamped, stride));
    wi.push_back(tap);
    inside = conjoin(inside, inRange(at, s_.mul(windows, stride)));
    if (spec.stride[i] > 1)
      inside = conjoin(inside, ex_.op(ScalarOpKind::Eq,
                                      {ex_.indexValue(s_.mod(clamped, stride), DType::Int64),
                                       ex_.constant(0, DType::Int64)},
                                      DType::Bool));
  }
  if (spec.channelsLast)
    di = toNhwc(di);
  const Expr *dv = ex_.cast(ex_.load(dy, linearIndex(s_, di, dy->strides)), t);
  dv = ex_.op(ScalarOpKind::Where, {inside, dv, ex_.constant(0, t)}, t);
  const Expr *wv = ex_.cast(ex_.load(w, linearIndex(s_, wi, w->strides)), t);
  loop::Computation *c = p_->addComputation(out, vars, rvars, ReduceKind::Sum,
                                            ex_.op(ScalarOpKind::Mul, {dv, wv}, t));
  c->ext = std::move(spec);
  if (c->conv()->channelsLast) {
    nhwc_[n] = out;
    return nhwcValue(out);
  }
  return bufferValue(out);
}

loop::AttentionOperand Lowerer::stridedOperand(Node *n, bool unitLast) {
  auto withUnitDims = [&](loop::AttentionOperand o) { // a unit dim: 0 (1 when it is last)
    for (size_t i = 0; i < o.strides.size(); ++i)
      if (n->shape()[i]->isConst(1))
        o.strides[i] = s_.constant(i + 1 == o.strides.size() ? 1 : 0);
    return o;
  };
  Value &v = values_.at(n);
  Index full;
  std::vector<SymExpr> vars;
  if (const Expr *e = plainLoad(n, v, full, vars)) {
    if (auto form = sym::affineIn(s_, e->index(), vars)) {
      loop::AttentionOperand o{e->buffer(), form->base, n->shape(), {}};
      size_t next = 0;
      for (SymExpr d : full)
        o.strides.push_back(d->isConst(0) ? s_.constant(0) : form->coef[next++]);
      o = withUnitDims(std::move(o));
      if (!unitLast || o.strides.back()->isConst(1))
        return o;
    }
  }
  Buffer *b = inMemory(n);
  if (b->strides != contiguousStrides(s_, b->shape))
    b = realize(n, v, BufferKind::Intermediate, -1, "_rows").buffer;
  return withUnitDims({b, s_.constant(0), n->shape(), b->strides});
}

std::vector<SymExpr> Lowerer::attentionOutputStrides(Node *n) {
  if (!opts_.permutedAttentionOutput)
    return {};
  // Strided rows need static sizes (loop::stridedRows): symbolic ones stay row-major.
  for (SymExpr d : n->shape())
    if (!d->isConst())
      return {};
  const std::vector<Node *> &outs = g_.outputs();
  if (auto at = std::find(outs.begin(), outs.end(), n); at != outs.end()) {
    const std::vector<SymExpr> &want = g_.outputStrides(static_cast<size_t>(at - outs.begin()));
    if (std::find(at + 1, outs.end(), n) == outs.end() && !want.empty() &&
        want.back()->isConst(1) && loop::denseLayout(s_, n->shape(), want))
      return want;
    return {};
  }
  // A grouped attention's result [.., G, R, S, D] (grouped-attention) is read through one
  // reshape that merges G and R back into the heads: its strides are the merged value's,
  // split.
  Node *m = n;
  std::vector<Node *> readers = readersOf(n);
  size_t h = n->rank() >= 4 ? static_cast<size_t>(n->rank()) - 4 : 0;
  bool grouped = readers.size() == 1 && readers[0]->op() == OpKind::Reshape &&
                 n->rank() >= 4 && readers[0]->rank() + 1 == n->rank() &&
                 !isGraphOutput(readers[0]) && mergesDims(n->shape(), readers[0]->shape(), h);
  if (grouped)
    m = readers[0];
  std::optional<IntList> dims;
  for (Node *u : readersOf(m)) {
    if (u->op() != OpKind::Permute || (dims && *dims != attrs::Permute(*u).dims()))
      return {};
    dims = attrs::Permute(*u).dims();
  }
  size_t rank = m->shape().size();
  if (!dims || dims->size() != rank || dims->back() != static_cast<int64_t>(rank) - 1)
    return {};
  std::vector<SymExpr> strides(rank);
  SymExpr step = s_.constant(1);
  for (size_t i = rank; i-- > 0;) {
    strides[(*dims)[i]] = step;
    step = s_.mul(step, m->shape()[(*dims)[i]]);
  }
  if (grouped)
    strides.insert(strides.begin() + static_cast<std::ptrdiff_t>(h),
                   s_.mul(strides[h], n->shape()[h + 1]));
  return strides;
}

Value Lowerer::lowerAttention(Node *n) {
  const attrs::AttentionLse a(*n); // scale, causal and bias: attention, _lse or _grad
  loop::AttentionSpec spec;
  bool grad = n->op() == OpKind::AttentionGrad, lse = n->op() == OpKind::AttentionLse;
  Node *q = n->operand(grad), *k = n->operand(grad + 1);
  spec.q = stridedOperand(q, true);
  spec.k = stridedOperand(k, true);
  if (!lse)
    spec.v = stridedOperand(n->operand(grad + 2), true);
  if (grad) {
    attrs::AttentionWrt wrt = attrs::AttentionGrad(*n).wrt();
    spec.part = wrt == attrs::AttentionWrt::Q   ? loop::AttentionPart::GradQ
                : wrt == attrs::AttentionWrt::K ? loop::AttentionPart::GradK
                                                : loop::AttentionPart::GradV;
    spec.dout = stridedOperand(n->operand(0), true);
    spec.out = stridedOperand(n->operand(4), true);
    spec.lse = stridedOperand(n->operand(5), false);
  }
  spec.part = lse ? loop::AttentionPart::Lse : spec.part;
  spec.safe = grad || lse || attrs::Attention(*n).safe();
  spec.scale = a.scale();
  spec.causal = a.causal();
  if (double p = GraphBuilder::attentionDropout(n); p > 0) { // the seed follows the tensors
    spec.dropout = p;
    Buffer *seed = inMemory(n->operand(grad ? 6 : 3));
    spec.seed = loop::AttentionOperand{seed, s_.constant(0), {}, {}};
  }
  if (a.bias()) {
    Node *bn = n->operands().back();
    loop::AttentionOperand b = stridedOperand(bn, false);
    size_t rank = static_cast<size_t>(q->rank()), lead = rank - static_cast<size_t>(bn->rank());
    std::vector<SymExpr> strides(lead, s_.constant(0));
    for (size_t i = 0; i < b.strides.size(); ++i)
      strides.push_back(bn->shape()[i]->isConst(1) ? s_.constant(0) : b.strides[i]);
    b.strides = std::move(strides);
    b.shape.assign(q->shape().begin(), q->shape().end() - 1);
    b.shape.push_back(k->shape()[rank - 2]);
    spec.bias = std::move(b);
  }
  std::vector<SymExpr> strides;
  if (spec.part == loop::AttentionPart::Output)
    strides = attentionOutputStrides(n);
  Buffer *out = p_->addBuffer(n->name(), n->dtype(), n->shape(), BufferKind::Intermediate, -1,
                              std::move(strides));
  Index o;
  p_->addComputation(out, freshVars(out->shape, "i", o), {}, ReduceKind::None, nullptr)
      ->ext = std::move(spec);
  return bufferValue(out);
}

} // namespace braze::to_loops
