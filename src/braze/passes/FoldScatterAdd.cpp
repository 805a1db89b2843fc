/// fold-scatter-add: a sum of a value and a zero tensor that a scatter added into is a scatter
/// that adds into the value:
///   add(x, scatter(full(0), target, src) {mode="sum", include_self=true})
///     ->  scatter(x, target, src) {mode="sum", include_self=true}
/// with x of the scatter's shape and dtype, and the scatter read by that addition alone. An
/// embedding's backward in a model whose embedding is tied to its output layer is that
/// addition (the layer's weight gradient plus the lookups' scatter): folded, the zeros are never
/// stored and the scatter adds into the weight gradient in place, one table-sized buffer instead
/// of three. The sum is reassociated: x + (v1 + v2 + ..) becomes (x + v1) + v2 + ...
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

#include <unordered_map>
#include <vector>

namespace braze {

namespace {

/// The scatter that adds into zeros, when `s` is one read only by its addition.
bool addsIntoZeros(const Node *s, int readers) {
  if (s->op() != OpKind::Scatter || readers != 1 || !isZeros(s->operand(0)))
    return false;
  const attrs::Scatter a(*s);
  return a.mode() == attrs::ScatterMode::Sum && a.include_self() && !a.has_max_hits();
}

} // namespace

void foldScatterAdd(Graph &g) {
  std::vector<Node *> adds = nodesOf(g, OpKind::Add);
  std::unordered_map<const Node *, int> readers = countReaders(g);
  GraphBuilder b(g);
  bool changed = false;
  for (Node *n : adds)
    for (int side = 0; side < 2; ++side) {
      Node *s = n->operand(side), *x = n->operand(1 - side);
      if (!addsIntoZeros(s, readers[s]) || x->shape() != s->shape() ||
          x->dtype() != s->dtype() || n->dtype() != s->dtype() || n->shape() != s->shape())
        continue;
      b.setName(n->name());
      g.replaceAllUses(n, b.scatter(x, s->operand(1), s->operand(2), "sum", true));
      changed = true;
      break;
    }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
