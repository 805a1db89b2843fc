#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/GraphText.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/passes/PassManager.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <type_traits>

namespace braze {

namespace decomp {
Node *upcast(GraphBuilder &b, Node *x) { return b.convert(x, computeType(x->dtype())); }
Node *i64(GraphBuilder &b, int64_t v) { return b.scalar(static_cast<double>(v), DType::Int64); }
Node *downcastLike(GraphBuilder &b, Node *x, DType dtype) { return b.convert(x, dtype); }
} // namespace decomp

namespace {
/// Calls a rule with the options when it takes them.
template <class F>
Node *callRule(F rule, GraphBuilder &b, Node *n, const DecomposeOptions &opts) {
  if constexpr (std::is_invocable_v<F, GraphBuilder &, Node *, const DecomposeOptions &>)
    return rule(b, n, opts);
  else
    return rule(b, n);
}

/// The rule for a composite or extern op: Ops.def's BRAZE_COMPOSITE and BRAZE_EXTERN entries,
/// each lowered by decomp::decompose<Enum>.
decomp::Rule ruleFor(OpKind op) {
  static const std::pair<OpKind, decomp::Rule> kRules[] = {
#define BRAZE_OP(E, cat, text, lo, hi, attrs)
#define BRAZE_COMPOSITE(E, text, lo, hi, attrs)                                                \
  {OpKind::E, [](GraphBuilder &b, Node *n, const DecomposeOptions &o) {                        \
     return callRule(decomp::decompose##E, b, n, o);                                           \
   }},
#define BRAZE_EXTERN(E, text, lo, hi, attrs) BRAZE_COMPOSITE(E, text, lo, hi, attrs)
#include "braze/ir/graph/Ops.def"
  };
  for (const auto &[k, rule] : kRules)
    if (k == op)
      return rule;
  BRAZE_UNREACHABLE("no decomposition for " << opName(op));
}

/// Whether an attention-family node runs as the target's fused kernel: its operands' dtype is
/// one the kernel takes (attention_lse and attention_grad have kernels of their own) and both
/// head dims are constants within the kernel's limit.
bool fusedAttention(const Node *n, const DecomposeOptions &opts) {
  bool saved = n->op() != OpKind::Attention;
  const Node *q = n->operand(n->op() == OpKind::AttentionGrad ? 1 : 0);
  const auto &ts = saved ? opts.fusedAttentionBackwardDtypes : opts.fusedAttentionDtypes;
  if (std::find(ts.begin(), ts.end(), q->dtype()) == ts.end())
    return false;
  if (GraphBuilder::attentionDropout(n) > 0 && !opts.fusedAttentionDropout)
    return false;
  std::vector<SymExpr> dims{q->shape().back()};
  if (n->op() != OpKind::AttentionLse)
    dims.push_back(n->operand(n->op() == OpKind::AttentionGrad ? 3 : 2)->shape().back());
  int64_t most = saved ? opts.fusedAttentionBackwardMaxHeadDim : opts.fusedAttentionMaxHeadDim;
  for (SymExpr d : dims)
    if (!d->isConst() || d->value() < 1 || d->value() > most)
      return false;
  return true;
}

/// Whether `n` is a scatter that to_loops lowers itself (GraphBuilder::scatterIsAccumulating)
/// because it has more pairs than the reductions take, or (a half-precision sum in order)
/// more values per element than they follow.
bool accumulatingScatter(const Node *n) {
  if (n->op() != OpKind::Scatter)
    return false;
  const attrs::Scatter a(*n);
  int64_t maxHits = a.has_max_hits() ? a.max_hits() : 0;
  if (!GraphBuilder::scatterIsAccumulating(n->dtype(), a.mode_text(), a.include_self(),
                                           maxHits > 0))
    return false;
  if (maxHits > GraphBuilder::kMaxScatterHits)
    return true;
  int64_t self = 1, src = 1;
  for (SymExpr d : n->operand(0)->shape())
    self *= d->value();
  for (SymExpr d : n->operand(2)->shape())
    src *= d->value();
  return GraphBuilder::scatterAccumulates(n->dtype(), a.mode_text(), maxHits > 0, self, src);
}

/// Whether decompose leaves extern op `n` whole under `opts` (a convolution or a weight gradient
/// a library takes, an attention the target fuses, an accumulating scatter).
bool keptWhole(const Node *n, const DecomposeOptions &opts) {
  DType t = n->dtype();
  if (accumulatingScatter(n))
    return true;
  if (isAttentionFamily(n->op()))
    return fusedAttention(n, opts);
  bool library = n->op() == OpKind::Convolution ||
                 ((n->op() == OpKind::ConvWeightGrad || n->op() == OpKind::ConvInputGrad) &&
                  opts.gradientLibrary);
  return opts.convolutionLibrary && library &&
         (t == DType::Float32 ||
          (opts.halfConvolutions && (t == DType::Float16 || t == DType::BFloat16)));
}
} // namespace

void decompose(Graph &g, const DecomposeOptions &opts) {
  GraphBuilder b(g);
  // Rules may create composite ops themselves (layer_norm uses mean and var), so iterate.
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<Node *> nodes;
    for (const auto &n : g.nodes())
      nodes.push_back(n.get());
    for (Node *n : nodes) {
      OpCategoryKind cat = opCategory(n->op());
      if (cat != OpCategoryKind::Composite && (cat != OpCategoryKind::Extern || keptWhole(n, opts)))
        continue;
      b.setName(n->name());
      Node *r = ruleFor(n->op())(b, n, opts);
      if (r->shape() != n->shape() || r->dtype() != n->dtype())
        BRAZE_USER_ERROR(std::string(opName(n->op())), n->name())
            << "declared " << dtypeName(n->dtype()) << shapeText(n->shape())
            << " but its operands give " << dtypeName(r->dtype()) << shapeText(r->shape());
      g.replaceAllUses(n, r);
      changed = true;
    }
    sortTopologically(g);
    g.removeDeadNodes();
  }
  eliminateCommonSubexpressions(g);
}

void checkCompositeTypes(const Graph &g) {
  std::unique_ptr<Graph> copy = parseGraph(printGraph(g));
  decompose(*copy, DecomposeOptions{});
}

} // namespace braze
