/// Where a stored value lives and how it is laid out: a stored intermediate's strides (row-
/// major; channels-last [N, H, W, C] buffers and dim-1-innermost strides in channels-last mode;
/// an output's own dense layout where only pointwise ops and reductions read it), the
/// channels-last copies of images and weights, and the readers these decisions look at.
#include "braze/lowering/to_loops/Lowerer.h"

#include "braze/ir/loop/Rewrite.h"
#include "braze/lowering/to_loops/IndexMaps.h"

#include <algorithm>

namespace braze::to_loops {

std::vector<SymExpr> Lowerer::channelsLastStrides(const std::vector<SymExpr> &shape) {
  std::vector<SymExpr> st(shape.size());
  st[1] = s_.constant(1);
  SymExpr step = shape[1];
  for (size_t i = shape.size(); i-- > 0;) {
    if (i == 1)
      continue;
    st[i] = step;
    step = s_.mul(step, shape[i]);
  }
  return st;
}

Buffer *Lowerer::realizeNhwc(Node *n, const Value &v) {
  if (auto it = nhwc_.find(n); it != nhwc_.end())
    return it->second;
  Buffer *b = p_->addBuffer(n->name() + "_nhwc", n->dtype(), toNhwc(n->shape()),
                            BufferKind::Intermediate);
  Index f;
  std::vector<SymExpr> vars = freshVars(b->shape, "i", f);
  p_->addComputation(b, vars, {}, ReduceKind::None, v.load(fromNhwc(f)));
  return nhwc_[n] = b;
}

Value Lowerer::storeIntermediate(Node *n, const Value &v) {
  if (opts_.channelsLast && n->rank() == 4 && !onlyConvolutionWeight(n))
    return nhwcValue(realizeNhwc(n, v));
  if (opts_.channelsLast && n->rank() == 4 && opts_.channelsLastWeights)
    return realize(n, v, BufferKind::Intermediate, -1, "", channelsLastStrides(n->shape()));
  return realize(n, v, BufferKind::Intermediate, -1, "", intermediateStrides(n));
}

bool Lowerer::onlyConvolutionWeight(const Node *n) const {
  if (isGraphOutput(n))
    return false;
  std::vector<Node *> readers = readersOf(n);
  return !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](const Node *u) {
    return readsAsWeight(u, n) && u->operand(0) != n;
  });
}

bool Lowerer::readsAsWeight(const Node *u, const Node *n) {
  return (u->op() == OpKind::Convolution || u->op() == OpKind::ConvInputGrad) &&
         u->operand(1) == n;
}

std::vector<SymExpr> Lowerer::intermediateStrides(Node *n) {
  if (opts_.channelsLast && n->rank() > 4)
    return channelsLastStrides(n->shape());
  auto out = std::find(g_.outputs().begin(), g_.outputs().end(), n);
  if (out == g_.outputs().end() || n->rank() < 2)
    return {};
  int k = static_cast<int>(out - g_.outputs().begin());
  const std::vector<SymExpr> &want = g_.outputStrides(k);
  if (want.empty() || want == contiguousStrides(s_, n->shape()) || !want.back()->isConst(1) ||
      !loop::denseLayout(s_, n->shape(), want) || !readByPointsOnly(n))
    return {};
  return want;
}

bool Lowerer::readByPointsOnly(const Node *n) const {
  for (Node *u : readersOf(n)) {
    OpCategoryKind c = opCategory(u->op());
    if (c == OpCategoryKind::View ? !readByPointsOnly(u)
                                  : c != OpCategoryKind::Elementwise &&
                                        c != OpCategoryKind::Cast && c != OpCategoryKind::Reduce &&
                                        c != OpCategoryKind::Numel)
      return false;
  }
  return true;
}

Value Lowerer::nhwcValue(Buffer *b) {
  DType compute = computeType(b->dtype);
  return Value{[this, b, compute](const Index &idx) {
                 return ex_.cast(ex_.load(b, linearIndex(s_, toNhwc(idx), b->strides)), compute);
               },
               nullptr, true};
}

bool Lowerer::channelsLastInput(Node *n) {
  if (!opts_.channelsLast || n->rank() != 4 ||
      n->type().strides != channelsLastStrides(n->shape()))
    return false;
  for (Node *u : readersOf(n))
    if (readsAsWeight(u, n))
      return false;
  return true;
}

Buffer *Lowerer::channelsLastWeight(Node *n) {
  if (auto it = filters_.find(n); it != filters_.end())
    return it->second;
  Buffer *w = inMemory(n);
  std::vector<SymExpr> want = channelsLastStrides(n->shape());
  if (w->strides != want)
    w = realize(n, values_.at(n), BufferKind::Intermediate, -1, "_cl", want).buffer;
  return filters_[n] = w;
}

std::vector<Node *> Lowerer::readersOf(const Node *n) const {
  std::vector<Node *> out;
  for (const auto &u : g_.nodes())
    if (std::find(u->operands().begin(), u->operands().end(), n) != u->operands().end())
      out.push_back(u.get());
  return out;
}

} // namespace braze::to_loops
