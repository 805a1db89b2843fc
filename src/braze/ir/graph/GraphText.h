#pragma once
/// Text form of the tensor graph IR, and its verifier.
///
///   graph(%a: f32[s0, 8], %b: f32[s0, 8]{1, s0}) {
///     %ceil = ceil(%a) : f32[s0, 8]
///     %sum = sum(%ceil) {dims=[1], keepdim=false} : f32[s0]
///     %full = full() {value=10.0} : f32[]
///     return %sum, %ceil
///   }
///
/// One node per line: `%name = op(operands) {attributes in name order} : type`. Types print
/// with typeToString (strides only when not row-major), attributes with attrToString. Inputs
/// appear in the header in input order; an input's attributes print after its type only when
/// they are not exactly {index=<position>}. Size symbols print by their hint and are declared by
/// their first appearance; when graph.sizeSymbols() is not that order, a leading line
/// `sizes n, m` declares them in binding order. `#` starts a comment that runs to the end of
/// the line. printGraph(parseGraph(printGraph(g))) == printGraph(g).
#include "braze/ir/graph/Graph.h"

#include <memory>
#include <string>
#include <string_view>

namespace braze {

std::string printGraph(const Graph &g);

/// Reads the text form. A syntax error throws Diagnostic("graph-parser", "", "line L, column C:
/// expected X, found Y"). The graph is not verified; call verifyGraph for that.
std::unique_ptr<Graph> parseGraph(std::string_view text);

/// Checks the graph's invariants; returns "" when it is valid, else a description of the first
/// violation that names the node ("node %sum (sum): ...").
std::string verifyGraph(const Graph &g);

} // namespace braze
