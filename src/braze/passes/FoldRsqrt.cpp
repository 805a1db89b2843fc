/// fold-rsqrt: the reciprocal of a square root in f32 or f64 is one reciprocal square root:
///   reciprocal(sqrt(x))  ->  rsqrt(x)
/// with the square root read by that reciprocal alone. A batch norm's decomposition computes
/// its inverse deviation so, once per element of its result; on CUDA rsqrt is one instruction
/// (as in eager's own batch-norm kernel) where sqrt and a division are each a correctly
/// rounded sequence. Half-precision values are left alone: there the square root is rounded
/// to its dtype before the division, and rsqrt would skip that rounding.
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"

#include <unordered_map>
#include <vector>

namespace braze {

void foldRsqrt(Graph &g) {
  std::vector<Node *> reciprocals = nodesOf(g, OpKind::Reciprocal);
  std::unordered_map<const Node *, int> readers = countReaders(g);
  GraphBuilder b(g);
  bool changed = false;
  for (Node *n : reciprocals) {
    Node *s = n->operand(0);
    if (s->op() != OpKind::Sqrt || readers[s] != 1 || s->dtype() != n->dtype() ||
        (n->dtype() != DType::Float32 && n->dtype() != DType::Float64))
      continue;
    b.setName(n->name());
    g.replaceAllUses(n, b.unary(OpKind::Rsqrt, s->operand(0)));
    changed = true;
  }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
