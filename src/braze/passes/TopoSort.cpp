#include "braze/passes/PassManager.h"

#include <unordered_set>

namespace braze {

/// Depth-first from the inputs (in order) and then the outputs; a node comes after all of its
/// operands. Nodes keep their relative order where the dependencies allow it.
void sortTopologically(Graph &g) {
  std::vector<Node *> order;
  std::unordered_set<Node *> done;
  std::vector<std::pair<Node *, size_t>> stack;
  auto visit = [&](Node *root) {
    if (done.count(root))
      return;
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto &[n, i] = stack.back();
      if (i < n->operands().size()) {
        Node *o = n->operands()[i++];
        if (!done.count(o))
          stack.push_back({o, 0});
        continue;
      }
      if (done.insert(n).second)
        order.push_back(n);
      stack.pop_back();
    }
  };
  for (Node *in : g.inputs())
    visit(in);
  for (const auto &n : g.nodes())
    visit(n.get());
  g.reorder(std::move(order));
}

} // namespace braze
