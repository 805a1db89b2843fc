#pragma once
/// The graph pass registry (Passes.def) and a runner that verifies after each pass.
#include "braze/ir/graph/Graph.h"

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace braze {

#define PASS(fn, name, desc) void fn(Graph &g);
#include "braze/passes/Passes.def"

struct PassInfo {
  std::string_view name;
  std::string_view description;
  void (*run)(Graph &);
};

const std::vector<PassInfo> &registeredPasses();
/// Looks a pass up by its command-line name; nullptr if unknown.
const PassInfo *findPass(std::string_view name);

/// The nodes of op `op`, in graph order: a snapshot a rewrite may add nodes after.
std::vector<Node *> nodesOf(const Graph &g, OpKind op);

/// How many times each node is read: as an operand of a node, and as a graph output.
std::unordered_map<const Node *, int> countReaders(const Graph &g);

/// Whether n fills its shape with zeros (a full of 0, any rank).
bool isZeros(const Node *n);

/// Runs passes in order; after each one the graph is verified and a failure is an internal
/// error that names the pass.
void runPasses(Graph &g, const std::vector<std::string> &names);

} // namespace braze
