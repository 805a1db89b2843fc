#include "braze/passes/PassManager.h"

#include <map>
#include <tuple>

namespace braze {

/// Nodes are visited in topological order; a node whose (op, operands, attrs, type) matches an
/// earlier node is replaced by it. Inputs are never merged.
void eliminateCommonSubexpressions(Graph &g) {
  using Key = std::tuple<OpKind, std::vector<int>, std::string, std::string>;
  std::map<Key, Node *> seen;
  std::vector<Node *> nodes;
  for (const auto &n : g.nodes())
    nodes.push_back(n.get());
  for (Node *n : nodes) {
    if (n->op() == OpKind::Input)
      continue;
    std::vector<int> ops;
    for (Node *o : n->operands())
      ops.push_back(o->id());
    std::string attrs;
    for (const auto &[k, v] : n->attrs().all())
      attrs += k + "=" + attrToString(v) + ";";
    Key key{n->op(), ops, attrs, typeToString(g.sym(), n->type())};
    auto [it, inserted] = seen.emplace(key, n);
    if (!inserted)
      g.replaceAllUses(n, it->second);
  }
  g.removeDeadNodes();
}

} // namespace braze
