#include "braze/passes/PassManager.h"

#include <map>
#include <tuple>
#include <unordered_map>

namespace braze {

/// Nodes are visited in topological order; a node whose (op, operands, attrs, type) matches an
/// earlier node is replaced by it. Inputs are never merged. A node's operands are compared as
/// the nodes they are merged into, and the uses are rewritten in one walk at the end (a walk
/// per merged node made the pass quadratic in the graph's size).
void eliminateCommonSubexpressions(Graph &g) {
  using Key = std::tuple<OpKind, std::vector<int>, std::string, std::string>;
  std::map<Key, Node *> seen;
  std::unordered_map<const Node *, Node *> merged;
  std::vector<Node *> nodes;
  for (const auto &n : g.nodes())
    nodes.push_back(n.get());
  for (Node *n : nodes) {
    if (n->op() == OpKind::Input)
      continue;
    std::vector<int> ops;
    for (Node *o : n->operands()) {
      auto m = merged.find(o);
      ops.push_back((m == merged.end() ? o : m->second)->id());
    }
    std::string attrs;
    for (const auto &[k, v] : n->attrs().all())
      attrs += k + "=" + attrToString(v) + ";";
    Key key{n->op(), ops, attrs, typeToString(g.sym(), n->type())};
    auto [it, inserted] = seen.emplace(key, n);
    if (!inserted)
      merged[n] = it->second;
  }
  g.replaceUses(merged);
  g.removeDeadNodes();
}

} // namespace braze
