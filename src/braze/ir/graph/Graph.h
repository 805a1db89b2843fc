#pragma once
/// The tensor graph IR: SSA nodes in topological order. Each node has an OpKind (Ops.def),
/// operands, typed attributes and one result TensorType. A graph owns its SymContext, so the
/// symbols in its shapes live exactly as long as the graph.
#include "braze/ir/sym/SymExpr.h"
#include "braze/ir/types/TensorType.h"
#include "braze/support/NumberText.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace braze {

using sym::SymExpr;

enum class OpKind : uint16_t {
#define BRAZE_OP(E, cat, text, lo, hi, attrs) E,
#include "braze/ir/graph/Ops.def"
};

enum class OpCategoryKind {
  Input,
  Full,
  Elementwise,
  Cast,
  Reduce,
  View,
  Gather,
  Iota,
  Numel,
  Concat,
  MatMul,
  Composite, ///< removed by decompose
  Extern     ///< a composite a target may keep whole, as one call (Ops.def's BRAZE_EXTERN)
};

std::string_view opName(OpKind k);
OpCategoryKind opCategory(OpKind k);
/// attention, attention_lse or attention_grad: the ops a target may run as one fused kernel.
bool isAttentionFamily(OpKind k);
bool parseOpKind(std::string_view name, OpKind &out);
/// Number of operands of an elementwise op.
int elementwiseArity(OpKind k);
/// PyTorch's promotion of an elementwise op's operands, given as (dtype, zero-dim): zero-dim
/// operands only raise the category; where's condition does not take part.
DType elementwisePromotedType(OpKind op, const std::vector<std::pair<DType, bool>> &operands);
/// The op's result dtype for operands promoted to `promoted`: bool for predicates, f32 for a
/// floating op of integer operands, the promoted type otherwise.
DType elementwiseResultType(OpKind op, DType promoted);
/// The dtype every operand (but where's condition) has: the promoted one, or the f32 result of
/// a floating op of integer operands (philox_uniform keeps its i64 seed and counter exact).
DType elementwiseOperandType(OpKind op, DType promoted);

/// An op's schema, from Ops.def: how many operands it takes (max -1: no limit) and its typed
/// attributes.
enum class AttrKind { Bool, Int, Number, String, Ints };
struct AttrSpec {
  std::string name;
  AttrKind kind;
  bool optional = false;
  /// A string attribute of an enum (ENUM_ATTR, AttrEnums.def): the values it may take, in the
  /// enum's order; empty: any.
  std::vector<std::string_view> values;
};
struct OpSchema {
  int minOperands = 0, maxOperands = 0;
  std::vector<AttrSpec> attrs;
};
const OpSchema &opSchema(OpKind k);
/// "a bool", "an integer", "a number", "a string", "an integer list".
std::string_view attrKindText(AttrKind k);

/// NumPy-style broadcast of two shapes (trailing-aligned; a dim of constant 1 stretches).
/// Returns false and sets `badDim` (an index into `out`'s rank) if they do not broadcast.
bool broadcastShape(const std::vector<SymExpr> &a, const std::vector<SymExpr> &b,
                    std::vector<SymExpr> &out, size_t &badDim);

using IntList = std::vector<int64_t>;

/// Where a value lives (Node::storage), printed after the node's type: computed inside each
/// reader (nothing printed), stored where it is computed (`stored`: a value several readers
/// share), or stored where it is first read (`stored_at_use`: a value a reader needs in
/// memory, such as a library call's operand, stored next to that reader).
enum class Storage : uint8_t { Inline, Stored, StoredAtUse };
using AttrValue = std::variant<bool, int64_t, double, std::string, IntList>;

/// Attributes by name, iterated in name order (deterministic printing and hashing).
class AttrMap {
public:
  AttrMap() = default;
  AttrMap(std::initializer_list<std::pair<const std::string, AttrValue>> attrs) : attrs_(attrs) {}
  void set(const std::string &name, AttrValue v) { attrs_[name] = std::move(v); }
  bool has(const std::string &name) const { return attrs_.count(name) != 0; }
  int64_t getInt(const std::string &name) const;
  double getFloat(const std::string &name) const; ///< accepts an int attribute too
  bool getBool(const std::string &name) const;
  const std::string &getString(const std::string &name) const;
  const IntList &getInts(const std::string &name) const;
  const AttrValue &get(const std::string &name) const;
  const std::map<std::string, AttrValue> &all() const { return attrs_; }
  bool operator==(const AttrMap &o) const { return attrs_ == o.attrs_; }

private:
  std::map<std::string, AttrValue> attrs_;
};

std::string attrToString(const AttrValue &v);

class Node {
public:
  int id() const { return id_; }
  OpKind op() const { return op_; }
  const std::vector<Node *> &operands() const { return operands_; }
  Node *operand(size_t i) const { return operands_.at(i); }
  const AttrMap &attrs() const { return attrs_; }
  const TensorType &type() const { return type_; }
  DType dtype() const { return type_.dtype; }
  const std::vector<SymExpr> &shape() const { return type_.shape; }
  int rank() const { return type_.rank(); }
  /// Printing hint and the name diagnostics use (the FX node's name where there is one).
  const std::string &name() const { return name_; }
  /// The realize step's decision (lowering/realize): whether this value, which to-loops would
  /// otherwise compute inside each reader, is stored in a buffer once and read from there.
  Storage storage() const { return storage_; }
  bool stored() const { return storage_ != Storage::Inline; }

private:
  friend class Graph;
  int id_ = 0;
  Storage storage_ = Storage::Inline;
  OpKind op_ = OpKind::Input;
  std::vector<Node *> operands_;
  AttrMap attrs_;
  TensorType type_;
  std::string name_;
};

class Graph {
public:
  Graph();
  ~Graph();
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;

  sym::SymContext &sym() { return *sym_; }
  std::shared_ptr<sym::SymContext> symShared() const { return sym_; }

  /// Appends a node. Types are computed by the caller (GraphBuilder); the verifier checks them.
  Node *addNode(OpKind op, std::vector<Node *> operands, AttrMap attrs, TensorType type,
                std::string name);
  void setOutputs(std::vector<Node *> outputs) {
    outputs_ = std::move(outputs);
    outputStrides_.assign(outputs_.size(), {});
  }
  /// Strides (in elements) output k must be written with; empty means row-major. A layout must
  /// be dense (a permutation of row-major), which the verifier checks.
  void setOutputStrides(size_t k, std::vector<SymExpr> strides) { outputStrides_.at(k) = std::move(strides); }
  const std::vector<SymExpr> &outputStrides(size_t k) const { return outputStrides_.at(k); }

  const std::vector<std::unique_ptr<Node>> &nodes() const { return nodes_; }
  const std::vector<Node *> &inputs() const { return inputs_; }
  const std::vector<Node *> &outputs() const { return outputs_; }
  /// Size symbols in the order they were declared (runtime binding order).
  const std::vector<SymExpr> &sizeSymbols() const { return sizeSymbols_; }
  SymExpr newSizeSymbol(const std::string &hint);

  void setStorage(Node *n, Storage storage) { n->storage_ = storage; }
  /// Whether the realize step has decided which values are stored (to-loops needs it to have).
  bool realized() const { return realized_; }
  void setRealized(bool realized) { realized_ = realized; }

  /// Replaces every use of `from` (operands and outputs) with `to`.
  void replaceAllUses(Node *from, Node *to);
  /// replaceAllUses for many nodes at once, in one walk (to-nodes are not looked up again).
  void replaceUses(const std::unordered_map<const Node *, Node *> &map);
  /// Keeps only nodes reachable from the outputs and the inputs; renumbers ids.
  void removeDeadNodes();
  /// Moves the nodes into a fresh order (must be topological); used by passes that rebuild.
  void reorder(std::vector<Node *> order);

  /// A name not used yet in this graph, derived from `hint`.
  std::string uniqueName(const std::string &hint);

private:
  std::shared_ptr<sym::SymContext> sym_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Node *> inputs_, outputs_;
  std::vector<std::vector<SymExpr>> outputStrides_;
  std::vector<SymExpr> sizeSymbols_;
  std::map<std::string, int> names_;
  int nextId_ = 0;
  bool realized_ = false;
};

} // namespace braze
