#include "braze/passes/PassManager.h"

#include "braze/ir/graph/GraphText.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

namespace braze {

const std::vector<PassInfo> &registeredPasses() {
  static const std::vector<PassInfo> passes = {
#define PASS(fn, name, desc) {name, desc, &fn},
#include "braze/passes/Passes.def"
  };
  return passes;
}

const PassInfo *findPass(std::string_view name) {
  for (const PassInfo &p : registeredPasses())
    if (p.name == name)
      return &p;
  return nullptr;
}

std::vector<Node *> nodesOf(const Graph &g, OpKind op) {
  std::vector<Node *> out;
  for (const auto &n : g.nodes())
    if (n->op() == op)
      out.push_back(n.get());
  return out;
}

std::unordered_map<const Node *, int> countReaders(const Graph &g) {
  std::unordered_map<const Node *, int> readers;
  for (const auto &n : g.nodes())
    for (Node *o : n->operands())
      ++readers[o];
  for (Node *o : g.outputs())
    ++readers[o];
  return readers;
}

bool isZeros(const Node *n) {
  return n->op() == OpKind::Full && attrs::Full(*n).value() == 0.0;
}

void runPasses(Graph &g, const std::vector<std::string> &names) {
  for (const std::string &name : names) {
    const PassInfo *p = findPass(name);
    if (!p)
      BRAZE_USER_ERROR("passes", "") << "unknown pass '" << name << "'";
    p->run(g);
    std::string err = verifyGraph(g);
    BRAZE_CHECK(err.empty()) << "pass '" << name << "' broke the graph: " << err;
  }
}

} // namespace braze
