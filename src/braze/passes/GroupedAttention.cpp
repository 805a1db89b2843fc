/// grouped-attention: attention whose keys and values are shared by groups of query heads
/// (grouped-query and multi-query attention), read through a copy per query head, reads them
/// once per group instead:
///   attention(q, reshape(expand(reshape(k, [B, G, 1, S, D]), [B, G, R, S, D]), [B, G*R, S, D]),
///                same for v)
///     ->  reshape(attention(reshape(q, [B, G, R, Sq, D]), expand(reshape(k, [B, G, 1, S, D])),
///                           expand(reshape(v, [B, G, 1, S, DV]))), [B, G*R, Sq, DV])
/// The expanded keys and values are views with a zero stride along R, which the fused attention
/// reads in place: the B*G*R*S*D copies of k and v (a LLaMA-style model's repeat_kv) are never
/// stored. A bias [.., 1 or G*R, Sq, Sk] (a mask, broadcast over the heads or one per head) is
/// regrouped with the heads: reshape(bias, [.., 1, 1, Sq, Sk]) or [.., G, R, Sq, Sk]; one of
/// lower rank first gains leading unit dims. For attention ops kept whole after decompose.
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

#include <optional>
#include <vector>

namespace braze {

namespace {

/// For n = reshape(expand(reshape(x, [.., G, 1, S, D]), [.., G, R, S, D]), [.., G*R, S, D]):
/// the grouped view expand(reshape(x)) [.., G, R, S, D] (the inner two nodes) and R.
struct Grouped {
  Node *view = nullptr; ///< the expand
  SymExpr groups, repeats;
};

std::optional<Grouped> groupedHeads(sym::SymContext &s, Node *n) {
  if (n->op() != OpKind::Reshape || n->rank() < 3)
    return std::nullopt;
  Node *e = n->operand(0);
  if (e->op() != OpKind::Expand || e->rank() != n->rank() + 1)
    return std::nullopt;
  Node *r = e->operand(0);
  if (r->op() != OpKind::Reshape || r->rank() != e->rank())
    return std::nullopt;
  size_t h = static_cast<size_t>(n->rank()) - 3; // the heads dim of n
  const std::vector<SymExpr> &ns = n->shape(), &es = e->shape(), &rs = r->shape();
  const std::vector<SymExpr> &xs = r->operand(0)->shape();
  // r splits heads G into [G, 1]: x is [.., G, S, D] and r is [.., G, 1, S, D].
  if (xs.size() != ns.size() || !rs[h + 1]->isConst(1) || es[h + 1]->isConst(1))
    return std::nullopt;
  for (size_t d = 0; d < ns.size(); ++d) {
    size_t rd = d <= h ? d : d + 1;
    if (xs[d] != rs[rd] || (d != h && (ns[d] != es[rd] || es[rd] != rs[rd])))
      return std::nullopt;
  }
  Grouped g{e, es[h], es[h + 1]};
  if (s.mul(g.groups, g.repeats) != ns[h] || es[h] != rs[h])
    return std::nullopt;
  return g;
}

} // namespace

void groupAttentionHeads(Graph &g) {
  GraphBuilder b(g);
  bool changed = false;
  for (Node *n : nodesOf(g, OpKind::Attention)) {
    std::optional<Grouped> k = groupedHeads(g.sym(), n->operand(1)),
                           v = groupedHeads(g.sym(), n->operand(2));
    Node *q = n->operand(0);
    if (!k || !v || k->groups != v->groups || k->repeats != v->repeats ||
        GraphBuilder::attentionDropout(n) > 0) // the draws' positions are the ungrouped scores'
      continue;
    size_t h = static_cast<size_t>(q->rank()) - 3;
    std::vector<SymExpr> qShape(q->shape());
    qShape[h] = k->groups;
    qShape.insert(qShape.begin() + static_cast<std::ptrdiff_t>(h) + 1, k->repeats);
    const attrs::Attention a(*n);
    b.setName(n->name() + "_grouped");
    Node *bias = nullptr;
    if (a.bias()) {
      // The bias as [.., heads, Sq, Sk] at q's rank, then its heads split as q's are.
      bias = n->operand(3);
      std::vector<SymExpr> shape(bias->shape());
      shape.insert(shape.begin(), q->rank() - bias->rank(), g.sym().constant(1));
      if (!shape[h]->isConst(1) && shape[h] != q->shape()[h])
        continue;
      bool perHead = !shape[h]->isConst(1);
      shape[h] = perHead ? k->groups : g.sym().constant(1);
      shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(h) + 1,
                   perHead ? k->repeats : g.sym().constant(1));
      bias = b.reshape(bias, shape);
    }
    Node *grouped = b.attention(b.reshape(q, qShape), k->view, v->view, bias,
                                a.scale(), a.causal(), a.safe());
    b.setName(n->name());
    g.replaceAllUses(n, b.reshape(grouped, n->shape()));
    changed = true;
  }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
