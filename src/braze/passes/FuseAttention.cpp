/// fuse-attention: attention written out as products and a softmax becomes one attention op,
///   matmul(softmax(scale * matmul(q, kᵀ) + bias), v)  ->  attention(q, k, v, bias, scale)
/// so that a target with a fused kernel runs it without storing the scores (and one without
/// decomposes it back into the same products).
///   1. From each matmul O = P·V, walk P up through reshapes, no-op expands and float
///      conversions (widening, or rounding to the operands' dtype) to a softmax over the last
///      dim.
///   2. From the softmax's operand walk up through conversions, multiplications or divisions by
///      a scalar constant (the scale), additions of a tensor (a bias) and `where(mask, -inf, x)`
///      (a mask) taken at the softmax's shape, and reshapes, to a matmul S = Q·Kᵀ.
///   3. Every value walked through has that one reader, and the products' batch dims hold the
///      same elements as the softmax's. Then O is replaced by the attention op over q, k, v
///      reshaped to the softmax's batch dims, reshaped back to O's shape.
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"

#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <unordered_map>

namespace braze {

namespace {

/// The value of a rank-0 constant, if n is one.
std::optional<double> scalarConstant(const Node *n) {
  if (n->op() != OpKind::Full || n->rank() != 0)
    return std::nullopt;
  return n->attrs().getFloat("value");
}

bool isNegInfinity(const Node *n) {
  std::optional<double> v = scalarConstant(n);
  return v && *v == -std::numeric_limits<double>::infinity();
}

class AttentionMatcher {
public:
  explicit AttentionMatcher(Graph &g) : g_(g), b_(g), users_(countReaders(g)) {}

  /// Rewrites the pattern ending at `o`, if it is one; true when it did.
  bool tryRewrite(Node *o) {
    if (o->op() != OpKind::MatMul || o->rank() < 3)
      return false;
    // 1. P back to the softmax.
    Node *p = o->operand(0), *v3 = o->operand(1);
    DType t = v3->dtype();
    while (single(p) && (p->op() == OpKind::Reshape || roundsTo(p, t) ||
                         (p->op() == OpKind::Expand && p->shape() == p->operand(0)->shape())))
      p = p->operand(0);
    if (p->op() != OpKind::Softmax || !single(p) || !isFloating(p->dtype()) ||
        p->attrs().getInt("dim") != p->rank() - 1 || p->rank() < 3)
      return false;
    const std::vector<SymExpr> scores = p->shape();
    // 2. The softmax's operand back to S = Q·Kᵀ.
    double scale = 1;
    std::vector<Node *> biases, masks;
    Node *s = p->operand(0);
    while (true) {
      if (s->op() == OpKind::MatMul)
        break;
      if (!single(s))
        return false;
      if (s->op() == OpKind::Reshape || roundsTo(s, t)) {
        s = s->operand(0);
      } else if ((s->op() == OpKind::Mul || s->op() == OpKind::Div) &&
                 scalarConstant(s->operand(1))) {
        double c = *scalarConstant(s->operand(1));
        if (c == 0 || !std::isfinite(c))
          return false;
        scale = s->op() == OpKind::Mul ? scale * c : scale / c;
        s = s->operand(0);
      } else if ((s->op() == OpKind::Add || s->op() == OpKind::Where) && scale != 1) {
        return false; // a bias or mask added before the scale would be scaled too
      } else if (s->op() == OpKind::Add && s->shape() == scores) {
        size_t chain = reaches(s->operand(0)) ? 0 : 1;
        if (!isFloating(s->operand(1 - chain)->dtype()))
          return false;
        biases.push_back(s->operand(1 - chain));
        s = s->operand(chain);
      } else if (s->op() == OpKind::Where && s->shape() == scores &&
                 s->operand(0)->dtype() == DType::Bool && isNegInfinity(s->operand(1))) {
        masks.push_back(s->operand(0));
        s = s->operand(2);
      } else {
        return false;
      }
    }
    Node *q3 = s->operand(0), *kt3 = s->operand(1);
    int64_t r3 = s->rank();
    if (r3 < 2 || !single(s) || q3->dtype() != v3->dtype() || kt3->dtype() != v3->dtype() ||
        o->dtype() != v3->dtype())
      return false;
    sym::SymContext &sc = g_.sym();
    SymExpr sq = scores[scores.size() - 2], sk = scores.back();
    std::vector<SymExpr> batch(scores.begin(), scores.end() - 2);
    if (q3->shape()[r3 - 2] != sq || kt3->shape()[r3 - 1] != sk || v3->shape()[r3 - 2] != sk ||
        sc.product(std::vector<SymExpr>(q3->shape().begin(), q3->shape().end() - 2)) !=
            sc.product(batch) ||
        v3->rank() != r3 || o->rank() != r3)
      return false;
    // 3. The attention op over the softmax's batch dims.
    b_.setName(o->name());
    auto withBatch = [&](Node *x) {
      std::vector<SymExpr> shape = batch;
      shape.push_back(x->shape()[x->rank() - 2]);
      shape.push_back(x->shape().back());
      return x->shape() == shape ? x : b_.reshape(x, shape);
    };
    std::vector<int64_t> swap(static_cast<size_t>(r3));
    std::iota(swap.begin(), swap.end(), 0);
    std::swap(swap[r3 - 1], swap[r3 - 2]);
    Node *q = withBatch(q3), *k = withBatch(b_.permute(kt3, swap)), *v = withBatch(v3);
    Node *bias = nullptr;
    for (Node *m : masks) {
      Node *term = b_.where(m, b_.scalar(-std::numeric_limits<double>::infinity(), t),
                            b_.scalar(0, t));
      bias = bias ? b_.add(bias, term) : term;
    }
    for (Node *x : biases) {
      Node *term = b_.convert(x, t);
      bias = bias ? b_.add(bias, term) : term;
    }
    // A softmax written out gives nan for a row whose every key is masked: safe = false.
    Node *a = b_.attention(q, k, v, bias, scale, /*causal=*/false, /*safe=*/false);
    g_.replaceAllUses(o, a->shape() == o->shape() ? a : b_.reshape(a, o->shape()));
    return true;
  }

private:
  bool single(Node *n) { return users_[n] == 1; }

  /// n is a conversion between floating dtypes that loses nothing, or rounds to `t`, the
  /// operands' dtype (which the attention op rounds its probabilities to anyway). A rounding
  /// to another dtype (an f64 softmax computed in f32) is not the op's function.
  static bool roundsTo(const Node *n, DType t) {
    if (n->op() != OpKind::Convert || !isFloating(n->dtype()) ||
        !isFloating(n->operand(0)->dtype()))
      return false;
    DType from = n->operand(0)->dtype(), to = n->dtype();
    bool widens = dtypeSize(to) > dtypeSize(from) || to == from;
    return widens || to == t;
  }

  /// Whether n is, or is computed from, a matrix product (the chain side of an addition).
  bool reaches(Node *n) {
    for (int depth = 0; depth < 16; ++depth) {
      if (n->op() == OpKind::MatMul)
        return true;
      if (n->operands().empty())
        return false;
      n = n->operand(0);
    }
    return false;
  }

  Graph &g_;
  GraphBuilder b_;
  std::unordered_map<const Node *, int> users_;
};

} // namespace

void fuseAttention(Graph &g) {
  std::vector<Node *> products;
  for (const auto &n : g.nodes())
    if (n->op() == OpKind::MatMul)
      products.push_back(n.get());
  bool changed = false;
  auto m = std::make_unique<AttentionMatcher>(g);
  for (Node *o : products)
    if (m->tryRewrite(o)) {
      changed = true;
      m = std::make_unique<AttentionMatcher>(g); // the rewrite changed the user counts
    }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
