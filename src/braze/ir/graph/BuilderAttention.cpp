// GraphBuilder: scaled dot-product attention, a composite op. lowering/decompose turns it into
// matmul + softmax + matmul unless the target runs it as one fused kernel.
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace braze {

namespace {

/// q [B.., Sq, D], k [B.., Sk, D] and, when given, v [B.., Sk, Dv]: one floating dtype, one rank
/// of at least 2, shared batch dims.
void checkOperands(const char *op, const std::string &name, Node *q, Node *k, Node *v) {
  std::vector<Node *> xs{q, k};
  if (v)
    xs.push_back(v);
  for (Node *x : xs)
    if (!isFloating(x->dtype()) || x->dtype() != q->dtype())
      BRAZE_USER_ERROR(op, name) << "query, key and value must share one floating-point dtype, got "
                                 << dtypeName(q->dtype()) << ", " << dtypeName(k->dtype())
                                 << (v ? " and " + std::string(dtypeName(v->dtype())) : "");
  int64_t r = q->rank();
  for (Node *x : xs)
    if (r < 2 || x->rank() != r)
      BRAZE_USER_ERROR(op, name) << "query, key and value must have one rank of at least 2, got "
                                 << r << ", " << k->rank()
                                 << (v ? " and " + std::to_string(v->rank()) : "");
  for (int64_t i = 0; i < r - 2; ++i)
    for (Node *x : xs)
      if (x->shape()[i] != q->shape()[i])
        BRAZE_USER_ERROR(op, name) << "batch dims differ: query " << shapeText(q->shape())
                                   << ", key " << shapeText(k->shape())
                                   << (v ? ", value " + shapeText(v->shape()) : "");
  if (k->shape()[r - 1] != q->shape()[r - 1])
    BRAZE_USER_ERROR(op, name) << "key's last dim " << sym::toString(k->shape()[r - 1])
                               << " must equal query's " << sym::toString(q->shape()[r - 1]);
  if (v && v->shape()[r - 2] != k->shape()[r - 2])
    BRAZE_USER_ERROR(op, name) << "value has " << sym::toString(v->shape()[r - 2])
                               << " rows but key has " << sym::toString(k->shape()[r - 2]);
}

/// Checks attention's dropout p and seed, and sets the `dropout` attribute and appends the
/// seed to `ops` where p > 0.
void addDropout(const char *op, const std::string &name, double dropout, Node *seed,
                std::vector<Node *> &ops, AttrMap &attrs) {
  if (!(dropout >= 0 && dropout < 1))
    BRAZE_USER_ERROR(op, name) << "dropout must be in [0, 1), got " << dropout;
  if (dropout == 0)
    return;
  if (!seed || seed->dtype() != DType::Int64 || seed->rank() != 0)
    BRAZE_USER_ERROR(op, name) << "dropout needs an i64 scalar seed, got "
                               << (seed ? std::string(dtypeName(seed->dtype())) +
                                              shapeText(seed->shape())
                                        : std::string("none"));
  attrs.set("dropout", dropout);
  ops.push_back(seed);
}

/// The scores' shape [B.., Sq, Sk].
std::vector<SymExpr> scoresShape(Node *q, Node *k) {
  std::vector<SymExpr> scores(q->shape().begin(), q->shape().end() - 1);
  scores.push_back(k->shape()[k->rank() - 2]);
  return scores;
}

} // namespace

Node *GraphBuilder::repeatHeads(const char *op, Node *x, Node *q) {
  int64_t r = q->rank();
  if (r < 3 || x->rank() != r || x->shape()[r - 3] == q->shape()[r - 3])
    return x;
  SymExpr heads = q->shape()[r - 3], own = x->shape()[r - 3];
  if (!heads->isConst() || !own->isConst() || own->value() == 0 ||
      heads->value() % own->value() != 0)
    BRAZE_USER_ERROR(op, name_) << "key and value heads (" << sym::toString(own)
                                << ") must be a static divisor of the query's ("
                                << sym::toString(heads) << "), got key "
                                << shapeText(x->shape()) << " for query " << shapeText(q->shape());
  std::vector<SymExpr> grouped = x->shape();
  grouped.insert(grouped.end() - 2, dim(heads->value() / own->value()));
  std::vector<SymExpr> repeated = x->shape();
  repeated[r - 3] = heads;
  return reshape(expand(unsqueeze(x, r - 2), grouped), repeated);
}

Node *GraphBuilder::attentionBias(const char *op, Node *bias, Node *q, Node *k) {
  std::vector<SymExpr> scores = scoresShape(q, k);
  int64_t r = q->rank();
  if (bias->rank() > r)
    BRAZE_USER_ERROR(op, name_) << "bias has rank " << bias->rank() << " but the scores "
                                << shapeText(scores) << " have rank " << r;
  int64_t lead = r - bias->rank();
  for (int64_t i = 0; i < bias->rank(); ++i)
    if (!bias->shape()[i]->isConst(1) && bias->shape()[i] != scores[lead + i])
      BRAZE_USER_ERROR(op, name_) << "bias " << shapeText(bias->shape())
                                  << " does not broadcast to the scores " << shapeText(scores);
  if (bias->dtype() == DType::Bool)
    bias = where(bias, scalar(0, q->dtype()),
                 scalar(-std::numeric_limits<double>::infinity(), q->dtype()));
  else if (!isFloating(bias->dtype()))
    BRAZE_USER_ERROR(op, name_) << "bias must be bool or floating-point, got "
                                << dtypeName(bias->dtype());
  return convert(bias, q->dtype());
}

Node *GraphBuilder::attention(Node *q, Node *k, Node *v, Node *bias, double scale, bool causal,
                              bool safe, double dropout, Node *seed) {
  const char *op = "attention";
  k = repeatHeads(op, k, q);
  v = repeatHeads(op, v, q);
  checkOperands(op, name_, q, k, v);
  if (!std::isfinite(scale))
    BRAZE_USER_ERROR(op, name_) << "scale must be finite, got " << scale;
  std::vector<Node *> ops{q, k, v};
  AttrMap attrs;
  addDropout(op, name_, dropout, seed, ops, attrs);
  if (bias)
    ops.push_back(attentionBias(op, bias, q, k));
  int64_t r = q->rank();
  std::vector<SymExpr> shape(q->shape().begin(), q->shape().end() - 1);
  shape.push_back(v->shape()[r - 1]);
  attrs.set("scale", scale);
  attrs.set("causal", causal);
  attrs.set("safe", safe);
  attrs.set("bias", bias != nullptr);
  return make(OpKind::Attention, ops, std::move(attrs), TensorType{q->dtype(), shape, {}});
}

Node *GraphBuilder::attentionLse(Node *q, Node *k, Node *bias, double scale, bool causal) {
  const char *op = "attention_lse";
  k = repeatHeads(op, k, q);
  checkOperands(op, name_, q, k, nullptr);
  if (!std::isfinite(scale))
    BRAZE_USER_ERROR(op, name_) << "scale must be finite, got " << scale;
  std::vector<Node *> ops{q, k};
  if (bias)
    ops.push_back(attentionBias(op, bias, q, k));
  std::vector<SymExpr> shape(q->shape().begin(), q->shape().end() - 1);
  AttrMap attrs;
  attrs.set("scale", scale);
  attrs.set("causal", causal);
  attrs.set("bias", bias != nullptr);
  return make(OpKind::AttentionLse, ops, std::move(attrs),
              TensorType{computeType(q->dtype()), shape, {}});
}

namespace {

/// How a fused kernel's log-sum-exp of shape `layout` holds [B.., Sq] (`rows`): 0 the same
/// shape, -1 with a trailing unit dim, or the count of padding rows after Sq (> 0); nullopt
/// for any other shape.
std::optional<int64_t> lseLayout(const std::vector<SymExpr> &rows,
                                 const std::vector<SymExpr> &layout) {
  if (layout.size() == rows.size() + 1 && layout.back()->isConst(1) &&
      std::equal(rows.begin(), rows.end(), layout.begin()))
    return -1;
  if (rows.empty() || layout.size() != rows.size() ||
      !std::equal(rows.begin(), rows.end() - 1, layout.begin()))
    return std::nullopt;
  SymExpr sq = rows.back(), p = layout.back();
  if (p == sq)
    return 0;
  if (p->isConst() && sq->isConst() && p->value() > sq->value())
    return p->value() - sq->value();
  return std::nullopt;
}

} // namespace

Node *GraphBuilder::lseInLayout(Node *lse, std::vector<SymExpr> shape) {
  std::optional<int64_t> layout = lseLayout(lse->shape(), shape);
  if (!layout)
    BRAZE_USER_ERROR("attention_lse", name_)
        << "no log-sum-exp layout " << shapeText(shape) << " for " << shapeText(lse->shape())
        << " query rows: it must be that shape, with a trailing unit dim, or with more rows";
  if (*layout < 0)
    return reshape(lse, std::move(shape));
  return *layout == 0 ? lse : pad(lse, lse->rank() - 1, 0, *layout, 0.0);
}

Node *GraphBuilder::lseFromLayout(Node *saved, Node *q) {
  std::vector<SymExpr> rows(q->shape().begin(), q->shape().end() - 1);
  std::optional<int64_t> layout = lseLayout(rows, saved->shape());
  if (!layout)
    BRAZE_USER_ERROR("attention_grad", name_)
        << "a saved log-sum-exp of shape " << shapeText(saved->shape()) << " does not hold the "
        << shapeText(rows) << " query rows";
  if (*layout < 0)
    return reshape(saved, std::move(rows));
  return *layout == 0 ? saved : slice(saved, saved->rank() - 1, 0, rows.back()->value(), 1);
}

Node *GraphBuilder::attentionGrad(const std::string &wrt, Node *dout, Node *q, Node *k, Node *v,
                                  Node *out, Node *lse, Node *bias, double scale, bool causal,
                                  double dropout, Node *seed) {
  const char *op = "attention_grad";
  Node *own = wrt == "k" ? k : v; // the operand whose gradient a grouped head sums
  k = repeatHeads(op, k, q);
  v = repeatHeads(op, v, q);
  checkOperands(op, name_, q, k, v);
  if (wrt != "q" && wrt != "k" && wrt != "v")
    BRAZE_USER_ERROR(op, name_) << "wrt must be \"q\", \"k\" or \"v\", got \"" << wrt << "\"";
  if (!std::isfinite(scale))
    BRAZE_USER_ERROR(op, name_) << "scale must be finite, got " << scale;
  int64_t r = q->rank();
  std::vector<SymExpr> outShape(q->shape().begin(), q->shape().end() - 1);
  outShape.push_back(v->shape()[r - 1]);
  std::vector<SymExpr> lseShape(q->shape().begin(), q->shape().end() - 1);
  for (auto [x, what] : {std::pair{dout, "output gradient"}, std::pair{out, "output"}})
    if (x->dtype() != q->dtype() || x->shape() != outShape)
      BRAZE_USER_ERROR(op, name_) << "the " << what << " must be " << dtypeName(q->dtype())
                                  << shapeText(outShape) << ", got " << dtypeName(x->dtype())
                                  << shapeText(x->shape());
  if (lse->dtype() != computeType(q->dtype()) || lse->shape() != lseShape)
    BRAZE_USER_ERROR(op, name_) << "the log-sum-exp must be " << dtypeName(computeType(q->dtype()))
                                << shapeText(lseShape) << ", got " << dtypeName(lse->dtype())
                                << shapeText(lse->shape());
  std::vector<Node *> ops{dout, q, k, v, out, lse};
  AttrMap attrs;
  addDropout(op, name_, dropout, seed, ops, attrs);
  if (bias)
    ops.push_back(attentionBias(op, bias, q, k));
  Node *like = wrt == "q" ? q : wrt == "k" ? k : v;
  attrs.set("wrt", wrt);
  attrs.set("scale", scale);
  attrs.set("causal", causal);
  attrs.set("bias", bias != nullptr);
  Node *grad = make(OpKind::AttentionGrad, ops, std::move(attrs),
                    TensorType{q->dtype(), like->shape(), {}});
  if (wrt == "q" || own->shape() == like->shape())
    return grad;
  // Grouped-query attention: [.., H, S, D] as [.., Hk, H / Hk, S, D], summed over the group.
  std::vector<SymExpr> grouped = own->shape();
  grouped.insert(grouped.end() - 2, dim(like->shape()[r - 3]->value() /
                                        own->shape()[r - 3]->value()));
  return reduce(OpKind::Sum, reshape(grad, grouped), {r - 2}, false);
}

} // namespace braze
