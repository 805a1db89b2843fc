#pragma once
/// Symbolic integers: shape dims, strides and loop indices.
///
/// A SymExpr is an immutable node hash-consed in a SymContext: equal structure is the same
/// pointer. Construction keeps a canonical polynomial form (sums of monomials with constant
/// coefficients, sorted, like terms merged, products distributed), so that index expressions
/// that are equal as polynomials compare equal by pointer. floordiv / mod / min / max are
/// simplified on construction by the rule table in SymRules.cpp.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace braze::sym {

/// The most terms a product of sums may expand to (SymContext::mul): past it, a size
/// expression is a user error rather than an exponential blow-up.
constexpr size_t kMaxSymTerms = 1024;

enum class SymKind { Const, Symbol, Add, Mul, FloorDiv, Mod, Min, Max };

/// What a symbol stands for: a size (>= 0, bound at run time from input shapes) or a loop
/// index (0 <= v < extent).
enum class SymbolRoleKind { Size, Index };

class SymNode;
using SymExpr = const SymNode *;

class SymNode {
public:
  SymKind kind() const { return kind_; }
  bool isConst() const { return kind_ == SymKind::Const; }
  bool isConst(int64_t v) const { return kind_ == SymKind::Const && value_ == v; }
  bool isSymbol() const { return kind_ == SymKind::Symbol; }
  /// Constant value (Const only).
  int64_t value() const { return value_; }
  /// Printing hint (Symbol only). Two symbols with one hint are still different symbols.
  const std::string &name() const { return name_; }
  SymbolRoleKind role() const { return role_; }
  /// Loop extent of an Index symbol; nullptr for sizes.
  SymExpr extent() const { return extent_; }
  /// Creation number of a symbol; orders symbols deterministically.
  uint64_t symbolId() const { return id_; }
  const std::vector<SymExpr> &operands() const { return ops_; }
  SymExpr lhs() const { return ops_[0]; }
  SymExpr rhs() const { return ops_[1]; }

private:
  friend class SymContext;
  SymKind kind_ = SymKind::Const;
  int64_t value_ = 0;
  std::string name_;
  SymbolRoleKind role_ = SymbolRoleKind::Size;
  SymExpr extent_ = nullptr;
  uint64_t id_ = 0;
  std::vector<SymExpr> ops_;
};

/// Total structural order; symbols compare by creation number. Deterministic across runs.
int compareSym(SymExpr a, SymExpr b);

/// Owns and interns SymExprs. Not thread-safe; one per graph compilation.
class SymContext {
public:
  SymContext();
  ~SymContext();
  SymContext(const SymContext &) = delete;
  SymContext &operator=(const SymContext &) = delete;

  SymExpr constant(int64_t v);
  /// A fresh size symbol (>= 0).
  SymExpr sizeSymbol(std::string hint);
  /// A fresh loop index symbol with 0 <= v < extent.
  SymExpr indexSymbol(std::string hint, SymExpr extent);

  SymExpr add(SymExpr a, SymExpr b);
  SymExpr sub(SymExpr a, SymExpr b);
  SymExpr mul(SymExpr a, SymExpr b);
  SymExpr neg(SymExpr a) { return mul(constant(-1), a); }
  /// Floor division; rounds toward -inf. Division by a constant 0 is an internal error.
  SymExpr floordiv(SymExpr a, SymExpr b);
  /// Floor modulo: the result has the sign of b.
  SymExpr mod(SymExpr a, SymExpr b);
  SymExpr min(SymExpr a, SymExpr b);
  SymExpr max(SymExpr a, SymExpr b);
  SymExpr add(SymExpr a, int64_t b) { return add(a, constant(b)); }
  SymExpr mul(SymExpr a, int64_t b) { return mul(a, constant(b)); }

  /// Product of a list (1 for an empty list).
  SymExpr product(const std::vector<SymExpr> &xs);
  /// Replaces symbols by expressions (simultaneously).
  SymExpr substitute(SymExpr e, const std::unordered_map<SymExpr, SymExpr> &map);

  /// Proves e >= 0 for all values of its symbols (sizes >= 0, indices in range). False means
  /// "not proven", not "negative".
  bool provablyNonNegative(SymExpr e);
  bool provablyLess(SymExpr a, SymExpr b) { return provablyNonNegative(sub(sub(b, a), constant(1))); }
  /// Constant value if e is a constant.
  bool constValue(SymExpr e, int64_t &out) const {
    if (!e->isConst())
      return false;
    out = e->value();
    return true;
  }

  /// Builds a node with no simplification beyond hash-consing. Used by the rule table and by
  /// the parser; everything else calls the simplifying factories above.
  SymExpr makeRaw(SymKind kind, std::vector<SymExpr> ops);
  /// A symbol by its creation number, for the parser; nullptr if unknown.
  const std::vector<SymExpr> &symbols() const { return symbols_; }

private:
  SymExpr intern(SymNode &&node);
  SymExpr addTerms(std::map<SymExpr, int64_t, bool (*)(SymExpr, SymExpr)> &terms, int64_t c);

  struct KeyHash {
    size_t operator()(const SymNode *n) const;
  };
  struct KeyEq {
    bool operator()(const SymNode *a, const SymNode *b) const;
  };
  std::vector<std::unique_ptr<SymNode>> storage_;
  std::unordered_map<const SymNode *, SymExpr, KeyHash, KeyEq> table_;
  std::vector<SymExpr> symbols_;
};

/// Splits a canonical term into coefficient and monomial (the monomial is nullptr for a constant).
void splitTerm(SymExpr term, int64_t &coef, SymExpr &monomial);

/// Applies the rule table to a FloorDiv/Mod/Min/Max node whose operands are already simplified.
SymExpr applySymRules(SymContext &ctx, SymKind kind, SymExpr a, SymExpr b);

/// Evaluates with the given symbol values; every symbol in e must be bound.
int64_t evaluate(SymExpr e, const std::unordered_map<SymExpr, int64_t> &values);
int64_t floorDiv(int64_t a, int64_t b);
int64_t floorMod(int64_t a, int64_t b);
/// a + b and a * b; a user error (a Diagnostic naming the operands) when the result does not
/// fit in int64. Constant folding goes through these, so no symbolic size wraps around.
int64_t checkedAdd(int64_t a, int64_t b);
int64_t checkedMul(int64_t a, int64_t b);

/// Infix text: `s0*s1 + i0 // 4`. Symbols print as their hints.
std::string toString(SymExpr e);

/// Collects the symbols in e (deterministic order: by creation).
void collectSymbols(SymExpr e, std::vector<SymExpr> &out);

/// Whether the symbol v occurs in e.
bool mentions(SymExpr e, SymExpr v);
/// Whether one of the symbols `vars` occurs in e.
bool mentionsAny(SymExpr e, const std::vector<SymExpr> &vars);

/// v's constant coefficient in e's top-level sum (0 when e does not mention v), or nothing
/// when v also appears elsewhere in e (inside a min, a division, a product of symbols).
std::optional<int64_t> linearCoefficient(SymExpr e, SymExpr v);

/// e = base + sum(coef[i] * vars[i]), with base and coefficients free of `vars`.
struct AffineForm {
  SymExpr base = nullptr;
  std::vector<SymExpr> coef;
};
/// e's affine form in `vars`, or nothing when e is not affine in them (a product of two of
/// them, a floordiv of one, ...).
std::optional<AffineForm> affineIn(SymContext &s, SymExpr e, const std::vector<SymExpr> &vars);

} // namespace braze::sym
