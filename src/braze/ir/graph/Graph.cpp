#include "braze/ir/graph/Graph.h"

#include "braze/ir/graph/OpAttrs.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <unordered_set>

namespace braze {

std::string_view opName(OpKind k) {
  switch (k) {
#define BRAZE_OP(E, cat, text, lo, hi, attrs)                                  \
  case OpKind::E:                                                              \
    return text;
#include "braze/ir/graph/Ops.def"
  }
  BRAZE_UNREACHABLE("bad OpKind");
}

OpCategoryKind opCategory(OpKind k) {
  switch (k) {
#define BRAZE_OP(E, cat, text, lo, hi, attrs)                                  \
  case OpKind::E:                                                              \
    return OpCategoryKind::cat;
#include "braze/ir/graph/Ops.def"
  }
  BRAZE_UNREACHABLE("bad OpKind");
}

bool isAttentionFamily(OpKind k) {
  return k == OpKind::Attention || k == OpKind::AttentionLse || k == OpKind::AttentionGrad;
}

bool parseOpKind(std::string_view name, OpKind &out) {
#define BRAZE_OP(E, cat, text, lo, hi, attrs)                                  \
  if (name == text) {                                                          \
    out = OpKind::E;                                                           \
    return true;                                                               \
  }
#include "braze/ir/graph/Ops.def"
  return false;
}

namespace {

std::vector<OpSchema> buildSchemas() {
  std::vector<OpSchema> out;
#define ATTR(name, kind) AttrSpec{#name, AttrKind::kind, false, {}},
#define OPT_ATTR(name, kind) AttrSpec{#name, AttrKind::kind, true, {}},
#define ENUM_ATTR(name, type)                                                  \
  AttrSpec{#name, AttrKind::String, false, attrs::enumTexts<attrs::type>()},
// (Variadic: the specs' commas would split an argument; composites and externs are listed
// directly.)
#define BRAZE_OP(E, cat, text, lo, hi, ...) out.push_back(OpSchema{lo, hi, {__VA_ARGS__}});
#define BRAZE_COMPOSITE(E, text, lo, hi, ...) out.push_back(OpSchema{lo, hi, {__VA_ARGS__}});
#define BRAZE_EXTERN(E, text, lo, hi, ...) out.push_back(OpSchema{lo, hi, {__VA_ARGS__}});
#include "braze/ir/graph/Ops.def"
  return out;
}

} // namespace

const OpSchema &opSchema(OpKind k) {
  static const std::vector<OpSchema> kSchemas = buildSchemas();
  return kSchemas.at(static_cast<size_t>(k));
}

std::string_view attrKindText(AttrKind k) {
  switch (k) {
  case AttrKind::Bool:
    return "a bool";
  case AttrKind::Int:
    return "an integer";
  case AttrKind::Number:
    return "a number";
  case AttrKind::String:
    return "a string";
  case AttrKind::Ints:
    return "an integer list";
  }
  BRAZE_UNREACHABLE("bad AttrKind");
}

namespace {
enum class ResultKind { Same, Bool, Float };

ResultKind resultKind(OpKind op) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (op == OpKind::E)                                                         \
    return std::string_view(#result) == "bool"                                 \
               ? ResultKind::Bool                                              \
               : (std::string_view(#result) == "float" ? ResultKind::Float : ResultKind::Same);
#include "braze/ir/types/ElementwiseOps.def"
  BRAZE_UNREACHABLE("not elementwise: " << opName(op));
}

int categoryRank(DType t) { return t == DType::Bool ? 0 : (isFloating(t) ? 2 : 1); }
} // namespace

DType elementwisePromotedType(OpKind op, const std::vector<std::pair<DType, bool>> &operands) {
  std::optional<DType> dimensioned, zeroDim;
  for (size_t i = op == OpKind::Where ? 1 : 0; i < operands.size(); ++i) {
    std::optional<DType> &slot = operands[i].second ? zeroDim : dimensioned;
    slot = slot ? promoteTypes(*slot, operands[i].first) : operands[i].first;
  }
  BRAZE_CHECK(dimensioned || zeroDim) << opName(op) << " has no operand to promote";
  if (!dimensioned)
    return *zeroDim;
  if (zeroDim && categoryRank(*zeroDim) > categoryRank(*dimensioned))
    return *zeroDim;
  return *dimensioned;
}

DType elementwiseOperandType(OpKind op, DType promoted) {
  DType result = elementwiseResultType(op, promoted);
  bool widened = !isFloating(promoted) && isFloating(result);
  return widened && op != OpKind::PhiloxUniform ? result : promoted;
}

DType elementwiseResultType(OpKind op, DType promoted) {
  switch (resultKind(op)) {
  case ResultKind::Bool:
    return DType::Bool;
  case ResultKind::Float:
    return isFloating(promoted) ? promoted : DType::Float32;
  case ResultKind::Same:
    return promoted;
  }
  BRAZE_UNREACHABLE("bad ResultKind");
}

int elementwiseArity(OpKind k) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (k == OpKind::E)                                                          \
    return arity;
#include "braze/ir/types/ElementwiseOps.def"
  BRAZE_UNREACHABLE("not elementwise: " << opName(k));
}

bool broadcastShape(const std::vector<SymExpr> &a, const std::vector<SymExpr> &b,
                    std::vector<SymExpr> &out, size_t &badDim) {
  size_t n = std::max(a.size(), b.size());
  out.assign(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    SymExpr x = i < n - a.size() ? nullptr : a[i - (n - a.size())];
    SymExpr y = i < n - b.size() ? nullptr : b[i - (n - b.size())];
    if (!x || x->isConst(1)) {
      out[i] = y ? y : x;
    } else if (!y || y->isConst(1) || x == y) {
      out[i] = x;
    } else {
      badDim = i;
      return false;
    }
  }
  return true;
}

const AttrValue &AttrMap::get(const std::string &name) const {
  auto it = attrs_.find(name);
  BRAZE_CHECK(it != attrs_.end()) << "missing attribute '" << name << "'";
  return it->second;
}

int64_t AttrMap::getInt(const std::string &name) const {
  const AttrValue &v = get(name);
  BRAZE_CHECK(std::holds_alternative<int64_t>(v)) << "attribute '" << name << "' is not an int";
  return std::get<int64_t>(v);
}

double AttrMap::getFloat(const std::string &name) const {
  const AttrValue &v = get(name);
  if (std::holds_alternative<int64_t>(v))
    return static_cast<double>(std::get<int64_t>(v));
  BRAZE_CHECK(std::holds_alternative<double>(v)) << "attribute '" << name << "' is not a float";
  return std::get<double>(v);
}

bool AttrMap::getBool(const std::string &name) const {
  const AttrValue &v = get(name);
  BRAZE_CHECK(std::holds_alternative<bool>(v)) << "attribute '" << name << "' is not a bool";
  return std::get<bool>(v);
}

const std::string &AttrMap::getString(const std::string &name) const {
  const AttrValue &v = get(name);
  BRAZE_CHECK(std::holds_alternative<std::string>(v))
      << "attribute '" << name << "' is not a string";
  return std::get<std::string>(v);
}

const IntList &AttrMap::getInts(const std::string &name) const {
  const AttrValue &v = get(name);
  BRAZE_CHECK(std::holds_alternative<IntList>(v)) << "attribute '" << name << "' is not a list";
  return std::get<IntList>(v);
}


std::string attrToString(const AttrValue &v) {
  if (std::holds_alternative<bool>(v))
    return std::get<bool>(v) ? "true" : "false";
  if (std::holds_alternative<int64_t>(v))
    return std::to_string(std::get<int64_t>(v));
  if (std::holds_alternative<double>(v))
    return formatDouble(std::get<double>(v));
  if (std::holds_alternative<std::string>(v))
    return "\"" + std::get<std::string>(v) + "\"";
  std::string s = "[";
  const IntList &l = std::get<IntList>(v);
  for (size_t i = 0; i < l.size(); ++i)
    s += (i ? ", " : "") + std::to_string(l[i]);
  return s + "]";
}

Graph::Graph() : sym_(std::make_shared<sym::SymContext>()) {}
Graph::~Graph() = default;

std::string Graph::uniqueName(const std::string &hint) {
  std::string base = hint.empty() ? "v" : hint;
  for (char &c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'))
      c = '_';
  auto [it, inserted] = names_.emplace(base, 0);
  if (inserted)
    return base;
  while (true) {
    std::string cand = base + "_" + std::to_string(++it->second);
    if (names_.emplace(cand, 0).second)
      return cand;
  }
}

SymExpr Graph::newSizeSymbol(const std::string &hint) {
  SymExpr s = sym_->sizeSymbol(hint);
  sizeSymbols_.push_back(s);
  return s;
}

Node *Graph::addNode(OpKind op, std::vector<Node *> operands, AttrMap attrs, TensorType type,
                     std::string name) {
  for (size_t i = 0; i < type.shape.size(); ++i) {
    int64_t v;
    if (sym_->constValue(type.shape[i], v) && v < 0)
      BRAZE_USER_ERROR(std::string(opName(op)), name)
          << "dim " << i << " is " << v << "; sizes must be non-negative";
  }
  auto n = std::make_unique<Node>();
  n->id_ = nextId_++;
  n->op_ = op;
  n->operands_ = std::move(operands);
  n->attrs_ = std::move(attrs);
  if (type.strides.empty())
    type.strides = contiguousStrides(*sym_, type.shape);
  n->type_ = std::move(type);
  n->name_ = uniqueName(name.empty() ? std::string(opName(op)) : name);
  Node *p = n.get();
  nodes_.push_back(std::move(n));
  if (op == OpKind::Input)
    inputs_.push_back(p);
  return p;
}

void Graph::replaceAllUses(Node *from, Node *to) {
  for (auto &n : nodes_)
    for (Node *&o : n->operands_)
      if (o == from)
        o = to;
  for (Node *&o : outputs_)
    if (o == from)
      o = to;
  outputStrides_.resize(outputs_.size());
}

void Graph::replaceUses(const std::unordered_map<const Node *, Node *> &map) {
  if (map.empty())
    return;
  auto replaced = [&](Node *o) {
    auto it = map.find(o);
    return it == map.end() ? o : it->second;
  };
  for (auto &n : nodes_)
    for (Node *&o : n->operands_)
      o = replaced(o);
  for (Node *&o : outputs_)
    o = replaced(o);
}

void Graph::removeDeadNodes() {
  std::unordered_set<Node *> live(inputs_.begin(), inputs_.end());
  std::vector<Node *> work(outputs_.begin(), outputs_.end());
  while (!work.empty()) {
    Node *n = work.back();
    work.pop_back();
    if (!live.insert(n).second && n->op() != OpKind::Input)
      continue;
    for (Node *o : n->operands())
      if (!live.count(o))
        work.push_back(o);
  }
  std::vector<std::unique_ptr<Node>> kept;
  for (auto &n : nodes_)
    if (live.count(n.get()))
      kept.push_back(std::move(n));
  nodes_ = std::move(kept);
}

void Graph::reorder(std::vector<Node *> order) {
  BRAZE_CHECK(order.size() == nodes_.size()) << "reorder must keep every node";
  std::vector<std::unique_ptr<Node>> sorted;
  for (Node *p : order) {
    auto it = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const std::unique_ptr<Node> &u) { return u.get() == p; });
    BRAZE_CHECK(it != nodes_.end() && *it) << "reorder: unknown or repeated node";
    sorted.push_back(std::move(*it));
  }
  nodes_ = std::move(sorted);
}

} // namespace braze
