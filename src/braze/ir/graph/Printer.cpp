#include "braze/ir/graph/GraphText.h"

#include <unordered_set>
#include <vector>

namespace braze {

namespace {

/// Appends the symbols of e in the order sym::toString prints them (operands left to right).
void appendInTextOrder(SymExpr e, std::vector<SymExpr> &order,
                       std::unordered_set<SymExpr> &seen) {
  if (e->isSymbol()) {
    if (seen.insert(e).second)
      order.push_back(e);
    return;
  }
  for (SymExpr o : e->operands())
    appendInTextOrder(o, order, seen);
}

void appendInTextOrder(sym::SymContext &ctx, const TensorType &t, std::vector<SymExpr> &order,
                       std::unordered_set<SymExpr> &seen) {
  for (SymExpr d : t.shape)
    appendInTextOrder(d, order, seen);
  if (t.strides != contiguousStrides(ctx, t.shape))
    for (SymExpr s : t.strides)
      appendInTextOrder(s, order, seen);
}

bool isImplicitInputAttrs(const AttrMap &attrs, size_t position) {
  if (attrs.all().size() != 1 || !attrs.has("index"))
    return false;
  const AttrValue &v = attrs.get("index");
  return std::holds_alternative<int64_t>(v) &&
         std::get<int64_t>(v) == static_cast<int64_t>(position);
}

std::string attrsText(const AttrMap &attrs) {
  std::string s = "{";
  bool first = true;
  for (const auto &[name, value] : attrs.all()) {
    s += (first ? "" : ", ") + name + "=" + attrToString(value);
    first = false;
  }
  return s + "}";
}

std::string valueName(const Node *n) { return "%" + n->name(); }

} // namespace

std::string printGraph(const Graph &g) {
  sym::SymContext &ctx = *g.symShared();
  std::string s;

  // Size symbols are declared by first appearance unless the binding order differs.
  std::vector<SymExpr> order;
  std::unordered_set<SymExpr> seen;
  for (const Node *in : g.inputs())
    appendInTextOrder(ctx, in->type(), order, seen);
  for (const auto &n : g.nodes())
    if (n->op() != OpKind::Input)
      appendInTextOrder(ctx, n->type(), order, seen);
  if (!g.sizeSymbols().empty() && order != g.sizeSymbols()) {
    s += "sizes ";
    for (size_t i = 0; i < g.sizeSymbols().size(); ++i)
      s += (i ? ", " : "") + g.sizeSymbols()[i]->name();
    s += '\n';
  }

  s += "graph(";
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Node *in = g.inputs()[i];
    s += (i ? ", " : "") + valueName(in) + ": " + typeToString(ctx, in->type());
    if (!isImplicitInputAttrs(in->attrs(), i))
      s.append(" ").append(attrsText(in->attrs()));
  }
  s += ") {\n";

  for (const auto &n : g.nodes()) {
    if (n->op() == OpKind::Input)
      continue;
    s += "  " + valueName(n.get()) + " = " + std::string(opName(n->op())) + "(";
    for (size_t i = 0; i < n->operands().size(); ++i)
      s += (i ? ", " : "") + valueName(n->operand(i));
    s += ")";
    if (!n->attrs().all().empty())
      s.append(" ").append(attrsText(n->attrs()));
    s += " : " + typeToString(ctx, n->type());
    s += n->storage() == Storage::Stored        ? " stored\n"
         : n->storage() == Storage::StoredAtUse ? " stored_at_use\n"
                                                : "\n";
  }

  s += "  return";
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    s += (i ? ", " : " ") + valueName(g.outputs()[i]);
    const std::vector<SymExpr> &strides = g.outputStrides(i);
    if (!strides.empty()) {
      s += "{";
      for (size_t k = 0; k < strides.size(); ++k)
        s += (k ? ", " : "") + sym::toString(strides[k]);
      s += "}";
    }
  }
  s += "\n}\n";
  return s;
}

} // namespace braze
