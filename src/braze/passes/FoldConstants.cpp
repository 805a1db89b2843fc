#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

#include <cmath>

namespace braze {

namespace {
/// Value of a rank-0 Full node, or false.
bool scalarValue(const Node *n, double &v) {
  if (n->op() != OpKind::Full || n->rank() != 0)
    return false;
  v = attrs::Full(*n).value();
  return true;
}
} // namespace

/// Folds convert(full) and the arithmetic ops add/sub/mul/neg on rank-0 float constants. The
/// result is computed in double and rounded to the result dtype, as a kernel would.
void foldConstants(Graph &g) {
  GraphBuilder b(g);
  std::vector<Node *> nodes;
  for (const auto &n : g.nodes())
    nodes.push_back(n.get());
  for (Node *n : nodes) {
    if (n->rank() != 0 || (n->dtype() != DType::Float32 && n->dtype() != DType::Float64))
      continue;
    double a = 0, c = 0, r = 0;
    bool folded = false;
    switch (opCategory(n->op())) {
    case OpCategoryKind::Cast:
      folded = scalarValue(n->operand(0), r);
      break;
    case OpCategoryKind::Elementwise:
      if (n->op() == OpKind::Neg && scalarValue(n->operand(0), a))
        r = -a, folded = true;
      else if (n->operands().size() == 2 && scalarValue(n->operand(0), a) &&
               scalarValue(n->operand(1), c)) {
        folded = true;
        if (n->op() == OpKind::Add)
          r = a + c;
        else if (n->op() == OpKind::Sub)
          r = a - c;
        else if (n->op() == OpKind::Mul)
          r = a * c;
        else
          folded = false;
      }
      break;
    case OpCategoryKind::Input:
    case OpCategoryKind::Full:
    case OpCategoryKind::Reduce:
    case OpCategoryKind::View:
    case OpCategoryKind::Gather:
    case OpCategoryKind::Iota:
    case OpCategoryKind::Numel:
    case OpCategoryKind::Concat:
    case OpCategoryKind::MatMul:
    case OpCategoryKind::Composite:
    case OpCategoryKind::Extern:
      break;
    }
    if (!folded)
      continue;
    if (n->dtype() == DType::Float32)
      r = static_cast<float>(r);
    b.setName(n->name());
    g.replaceAllUses(n, b.full(r, n->dtype()));
  }
  sortTopologically(g);
  g.removeDeadNodes();
}

} // namespace braze
