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
/// Two forms that PyTorch's math attention (`_scaled_dot_product_attention_math`) writes out:
///   - the safe softmax, `where(!any(x != -inf), 0, softmax(x))` over the last dim, which gives
///     0 rather than nan for a row whose every key is masked: the op with safe = true (x is
///     then read by the softmax and the guard's comparison);
///   - the f16/bf16 attention computed in f32: q, k and v widened from one half dtype (through
///     reshapes, permutes and scalar scales, which fold into the op's scale) and O rounded back
///     to it. That is the half-precision attention that eager runs as a fused kernel, and the op
///     takes the half operands, so the f32 copies and f32 products are never made.
/// Then an attention's bias that is a mask built from positions (as Hugging Face models build
/// theirs when traced) is folded: `where(key <= query, 0, c)` with c = -inf, or at most f16's
/// lowest value (-65504, for which e^(score + c) is 0 in f32 unless a masked score exceeds the
/// row's largest kept one by 65504), becomes causal = true; a mask that keeps every key
/// (`where(position >= 0, 0, c)`) is dropped. Positions are iotas plus one constant, viewed
/// through reshapes and expands; keys vary along the last dim, queries along the one before.
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

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
  return attrs::Full(*n).value();
}

bool isNegInfinity(const Node *n) {
  std::optional<double> v = scalarConstant(n);
  return v && *v == -std::numeric_limits<double>::infinity();
}

/// Positions `offset + i` along dim `dim` of n's shape (an iota plus a constant, through
/// reshapes that only add or remove unit dims, and expands).
struct Positions {
  int64_t dim = 0, offset = 0;
  SymExpr count;
};

std::optional<Positions> positionsOf(const Node *n) {
  // Down to the iota, remembering the outermost shape: the dim that is not 1 there.
  const std::vector<SymExpr> &outer = n->shape();
  int64_t offset = 0;
  while (true) {
    if (n->op() == OpKind::Reshape || n->op() == OpKind::Expand) {
      n = n->operand(0);
    } else if (n->op() == OpKind::Add && scalarConstant(n->operand(1))) {
      offset += static_cast<int64_t>(*scalarConstant(n->operand(1)));
      n = n->operand(0);
    } else if (n->op() == OpKind::Add && scalarConstant(n->operand(0))) {
      offset += static_cast<int64_t>(*scalarConstant(n->operand(0)));
      n = n->operand(1);
    } else {
      break;
    }
  }
  if (n->op() != OpKind::Iota || n->rank() != 1 || !isIntegral(n->dtype()))
    return std::nullopt;
  Positions p{-1, offset, n->shape()[0]};
  for (size_t i = 0; i < outer.size(); ++i)
    if (!outer[i]->isConst(1)) {
      if (p.dim >= 0 || outer[i] != p.count)
        return std::nullopt; // an expand made it vary along a second dim
      p.dim = static_cast<int64_t>(i);
    }
  return p.dim >= 0 || p.count->isConst(1) ? std::optional<Positions>(p) : std::nullopt;
}

/// What a positional mask keeps.
enum class MaskKind { Other, Causal, Everything };

/// `cond` (true where the mask keeps a score when `keepsWhenTrue`, else where it drops one)
/// over scores whose last two dims are `queries` x `keys`, after broadcasting to `rank` dims.
MaskKind classifyCondition(const Node *cond, bool keepsWhenTrue, SymExpr queries, SymExpr keys,
                           int64_t rank) {
  while (cond->op() == OpKind::Expand || cond->op() == OpKind::Reshape) {
    if (cond->op() == OpKind::Reshape && cond->operand(0)->rank() != cond->rank())
      break;
    cond = cond->operand(0);
  }
  if (cond->operands().size() != 2)
    return MaskKind::Other;
  OpKind op = cond->op();
  const Node *a = cond->operand(0), *b = cond->operand(1);
  // a OP b as b REVERSED-OP a, so that the position operand comes first.
  auto reversed = [](OpKind k) {
    return k == OpKind::Le ? OpKind::Ge : k == OpKind::Ge ? OpKind::Le
         : k == OpKind::Lt ? OpKind::Gt : k == OpKind::Gt ? OpKind::Lt : k;
  };
  if (scalarConstant(a) && !scalarConstant(b)) {
    std::swap(a, b);
    op = reversed(op);
  }
  std::optional<Positions> pa = positionsOf(a);
  if (!pa)
    return MaskKind::Other;
  int64_t lead = rank - cond->rank(); // dims that broadcasting adds in front
  if (std::optional<double> c = scalarConstant(b)) {
    // position OP c for every position: lowest is the offset.
    bool always = (op == OpKind::Ge && pa->offset >= *c) || (op == OpKind::Gt && pa->offset > *c);
    bool never = (op == OpKind::Lt && pa->offset >= *c) || (op == OpKind::Le && pa->offset > *c);
    return (keepsWhenTrue ? always : never) ? MaskKind::Everything : MaskKind::Other;
  }
  std::optional<Positions> pb = positionsOf(b);
  if (!pb || pa->offset != pb->offset)
    return MaskKind::Other;
  int64_t da = pa->dim + lead, db = pb->dim + lead;
  // key <= query keeps (or key > query drops) the causal scores; either operand order.
  bool keyFirst = da == rank - 1 && db == rank - 2 && pa->count == keys && pb->count == queries;
  bool queryFirst = da == rank - 2 && db == rank - 1 && pa->count == queries && pb->count == keys;
  if (!keyFirst && !queryFirst)
    return MaskKind::Other;
  OpKind keyOp = keyFirst ? op : reversed(op); // key OP query
  bool causal = keepsWhenTrue ? keyOp == OpKind::Le : keyOp == OpKind::Gt;
  return causal ? MaskKind::Causal : MaskKind::Other;
}

/// An attention's bias as a positional mask.
MaskKind classifyMask(const Node *attention) {
  const Node *bias = attention->operand(3);
  while (bias->op() == OpKind::Expand || bias->op() == OpKind::Reshape ||
         (bias->op() == OpKind::Convert && isFloating(bias->dtype())))
    bias = bias->operand(0);
  if (bias->op() != OpKind::Where)
    return MaskKind::Other;
  auto masking = [](const Node *n) {
    std::optional<double> v = scalarConstant(n);
    return v && *v <= -65504.0;
  };
  auto zero = [](const Node *n) {
    std::optional<double> v = scalarConstant(n);
    return v && *v == 0;
  };
  bool keepsWhenTrue;
  if (zero(bias->operand(1)) && masking(bias->operand(2)))
    keepsWhenTrue = true;
  else if (masking(bias->operand(1)) && zero(bias->operand(2)))
    keepsWhenTrue = false;
  else
    return MaskKind::Other;
  int64_t r = attention->rank();
  return classifyCondition(bias->operand(0), keepsWhenTrue, attention->operand(0)->shape()[r - 2],
                           attention->operand(1)->shape()[r - 2], r);
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
    Node *guarded = nullptr; // the scores, when the safe softmax's guard reads them too
    if (Node *sm = safeSoftmax(p)) {
      guarded = sm->operand(0);
      p = sm;
    }
    if (p->op() != OpKind::Softmax || !single(p) || !isFloating(p->dtype()) ||
        attrs::Softmax(*p).dim() != p->rank() - 1 || p->rank() < 3)
      return false;
    const std::vector<SymExpr> scores = p->shape();
    // 2. The softmax's operand back to S = Q·Kᵀ.
    double scale = 1;
    std::vector<Node *> biases, masks;
    Node *s = p->operand(0);
    while (true) {
      if (s->op() == OpKind::MatMul)
        break;
      if (!single(s) && !(s == guarded && users_[s] == 2))
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
    // The f32 computation of a half attention: the op over the half operands, in their dtype,
    // replacing O's rounding back to it.
    Node *replaced = o;
    if (!isHalf(t)) {
      std::optional<Widened> qw = widened(q3), kw = widened(kt3), vw = widened(v3);
      Node *rounding = roundingOf(o);
      if (qw && kw && vw && rounding && vw->scale == 1) {
        DType h = rounding->dtype();
        if (qw->half->dtype() == h && kw->half->dtype() == h && vw->half->dtype() == h) {
          q3 = replayViews(*qw);
          kt3 = replayViews(*kw);
          v3 = replayViews(*vw);
          scale *= qw->scale * kw->scale;
          t = h;
          replaced = rounding;
        }
      }
    }
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
    // A softmax written out gives nan for a row whose every key is masked: safe = false, unless
    // it is guarded.
    Node *a = b_.attention(q, k, v, bias, scale, /*causal=*/false, /*safe=*/guarded != nullptr);
    g_.replaceAllUses(replaced, a->shape() == replaced->shape() ? a : b_.reshape(a, replaced->shape()));
    return true;
  }

private:
  bool single(Node *n) { return users_[n] == 1; }

  /// The softmax under `where(!any(x != -inf), 0, softmax(x))` (the last dim, kept), as PyTorch's
  /// `_safe_softmax` writes it out (`!= ` as `!(x == -inf)` too); nullptr when p is not one.
  Node *safeSoftmax(Node *p) {
    if (p->op() != OpKind::Where || !single(p) || !isZeros(p->operand(1)) ||
        p->operand(2)->op() != OpKind::Softmax || !single(p->operand(2)))
      return nullptr;
    Node *sm = p->operand(2), *x = sm->operand(0), *g = p->operand(0);
    if (g->op() != OpKind::LogicalNot || !single(g))
      return nullptr;
    Node *any = g->operand(0);
    if (any->op() != OpKind::Any || !single(any) || !attrs::Any(*any).keepdim() ||
        attrs::Any(*any).dims() != IntList{x->rank() - 1})
      return nullptr;
    Node *ne = any->operand(0);
    if (ne->op() == OpKind::LogicalNot && single(ne)) {
      ne = ne->operand(0);
      if (ne->op() != OpKind::Eq)
        return nullptr;
    } else if (ne->op() != OpKind::Ne) {
      return nullptr;
    }
    if (!single(ne) || ne->operand(0) != x || !isNegInfinity(ne->operand(1)))
      return nullptr;
    return sm;
  }

  /// A half tensor widened, then viewed and scaled.
  struct Widened {
    Node *half = nullptr;
    std::vector<Node *> views; ///< reshapes, permutes and expands, the last applied first
    double scale = 1;
  };

  /// x as a widened half tensor, through single-reader reshapes, permutes, expands and
  /// multiplications or divisions by a scalar; nullopt when x is not such a chain.
  std::optional<Widened> widened(Node *x) {
    Widened w;
    while (true) {
      if (!single(x))
        return std::nullopt;
      if (x->op() == OpKind::Convert && isHalf(x->operand(0)->dtype()) &&
          isFloating(x->dtype()) && dtypeSize(x->dtype()) > dtypeSize(x->operand(0)->dtype())) {
        w.half = x->operand(0);
        return w;
      }
      if (x->op() == OpKind::Reshape || x->op() == OpKind::Permute || x->op() == OpKind::Expand) {
        w.views.push_back(x);
      } else if ((x->op() == OpKind::Mul || x->op() == OpKind::Div) &&
                 scalarConstant(x->operand(1))) {
        double c = *scalarConstant(x->operand(1));
        if (c == 0 || !std::isfinite(c))
          return std::nullopt;
        w.scale = x->op() == OpKind::Mul ? w.scale * c : w.scale / c;
      } else {
        return std::nullopt;
      }
      x = x->operand(0);
    }
  }

  /// The half tensor with the chain's views applied to it again.
  Node *replayViews(const Widened &w) {
    Node *h = w.half;
    for (size_t i = w.views.size(); i-- > 0;) {
      Node *view = w.views[i];
      h = view->op() == OpKind::Permute ? b_.permute(h, attrs::Permute(*view).dims())
          : view->op() == OpKind::Expand ? b_.expand(h, view->shape())
                                         : b_.reshape(h, view->shape());
    }
    return h;
  }

  /// The conversion of o to a half dtype that o's only reader is, through single-reader
  /// reshapes; nullptr when there is none.
  Node *roundingOf(Node *o) {
    while (single(o)) {
      Node *reader = onlyReader(o);
      if (!reader)
        return nullptr;
      if (reader->op() == OpKind::Convert && isHalf(reader->dtype()))
        return reader;
      if (reader->op() != OpKind::Reshape)
        return nullptr;
      o = reader;
    }
    return nullptr;
  }

  Node *onlyReader(Node *n) {
    Node *found = nullptr;
    for (const auto &m : g_.nodes())
      for (Node *x : m->operands())
        if (x == n) {
          if (found && found != m.get())
            return nullptr;
          found = m.get();
        }
    return found;
  }

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
  std::vector<Node *> products = nodesOf(g, OpKind::MatMul);
  bool changed = false;
  auto m = std::make_unique<AttentionMatcher>(g);
  for (Node *o : products)
    if (m->tryRewrite(o)) {
      changed = true;
      m = std::make_unique<AttentionMatcher>(g); // the rewrite changed the user counts
    }
  // Positional masks.
  GraphBuilder b(g);
  for (Node *a : nodesOf(g, OpKind::Attention)) {
    const attrs::Attention attn(*a);
    MaskKind kind = attn.bias() ? classifyMask(a) : MaskKind::Other;
    if (kind == MaskKind::Other)
      continue;
    b.setName(a->name());
    double dropout = GraphBuilder::attentionDropout(a);
    Node *plain = b.attention(a->operand(0), a->operand(1), a->operand(2), nullptr,
                              attn.scale(), attn.causal() || kind == MaskKind::Causal,
                              attn.safe(), dropout,
                              dropout > 0 ? a->operand(3) : nullptr);
    g.replaceAllUses(a, plain);
    changed = true;
  }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
