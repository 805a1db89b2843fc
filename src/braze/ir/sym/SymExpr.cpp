#include "braze/ir/sym/SymExpr.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"

#include <algorithm>
#include <functional>

namespace braze::sym {

namespace {
[[noreturn]] void overflow(int64_t a, const char *op, int64_t b) {
  BRAZE_USER_ERROR("shape", "") << "integer overflow: " << a << " " << op << " " << b
                                << " does not fit in 64 bits";
}
} // namespace

int64_t checkedAdd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (overflow(a, "+", b), 0) : r;
}

int64_t checkedMul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? (overflow(a, "*", b), 0) : r;
}

int64_t floorDiv(int64_t a, int64_t b) {
  BRAZE_CHECK(b != 0) << "division by zero";
  if (a == INT64_MIN && b == -1)
    overflow(a, "//", b);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    --q;
  return q;
}

int64_t floorMod(int64_t a, int64_t b) {
  BRAZE_CHECK(b != 0) << "division by zero";
  if (b == -1)
    return 0; // a // -1 may overflow; the remainder never does
  return a - floorDiv(a, b) * b;
}

int compareSym(SymExpr a, SymExpr b) {
  if (a == b)
    return 0;
  if (a->kind() != b->kind())
    return static_cast<int>(a->kind()) < static_cast<int>(b->kind()) ? -1 : 1;
  switch (a->kind()) {
  case SymKind::Const:
    return a->value() < b->value() ? -1 : 1;
  case SymKind::Symbol:
    return a->symbolId() < b->symbolId() ? -1 : 1;
  case SymKind::Add:
  case SymKind::Mul:
  case SymKind::FloorDiv:
  case SymKind::Mod:
  case SymKind::Min:
  case SymKind::Max: {
    const auto &x = a->operands(), &y = b->operands();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
      if (int c = compareSym(x[i], y[i]))
        return c;
    if (x.size() != y.size())
      return x.size() < y.size() ? -1 : 1;
    return 0;
  }
  }
  return 0;
}

static bool lessSym(SymExpr a, SymExpr b) { return compareSym(a, b) < 0; }

size_t SymContext::KeyHash::operator()(const SymNode *n) const {
  size_t h = std::hash<int>()(static_cast<int>(n->kind()));
  h = hashCombine(h, std::hash<int64_t>()(n->value()));
  h = hashCombine(h, std::hash<uint64_t>()(n->symbolId()));
  for (SymExpr op : n->operands())
    h = hashCombine(h, std::hash<const void *>()(op));
  return h;
}

bool SymContext::KeyEq::operator()(const SymNode *a, const SymNode *b) const {
  return a->kind() == b->kind() && a->value() == b->value() &&
         a->symbolId() == b->symbolId() && a->operands() == b->operands();
}

SymContext::SymContext() = default;
SymContext::~SymContext() = default;

SymExpr SymContext::intern(SymNode &&node) {
  auto it = table_.find(&node);
  if (it != table_.end())
    return it->second;
  storage_.push_back(std::make_unique<SymNode>(std::move(node)));
  SymExpr p = storage_.back().get();
  table_.emplace(p, p);
  return p;
}

SymExpr SymContext::constant(int64_t v) {
  SymNode n;
  n.kind_ = SymKind::Const;
  n.value_ = v;
  return intern(std::move(n));
}

SymExpr SymContext::sizeSymbol(std::string hint) {
  SymNode n;
  n.kind_ = SymKind::Symbol;
  n.name_ = std::move(hint);
  n.role_ = SymbolRoleKind::Size;
  n.id_ = symbols_.size() + 1;
  SymExpr s = intern(std::move(n));
  symbols_.push_back(s);
  return s;
}

SymExpr SymContext::indexSymbol(std::string hint, SymExpr extent) {
  BRAZE_CHECK(extent != nullptr);
  SymNode n;
  n.kind_ = SymKind::Symbol;
  n.name_ = std::move(hint);
  n.role_ = SymbolRoleKind::Index;
  n.extent_ = extent;
  n.id_ = symbols_.size() + 1;
  SymExpr s = intern(std::move(n));
  symbols_.push_back(s);
  return s;
}

SymExpr SymContext::makeRaw(SymKind kind, std::vector<SymExpr> ops) {
  SymNode n;
  n.kind_ = kind;
  n.ops_ = std::move(ops);
  return intern(std::move(n));
}

void splitTerm(SymExpr term, int64_t &coef, SymExpr &monomial) {
  if (term->isConst()) {
    coef = term->value();
    monomial = nullptr;
    return;
  }
  coef = 1;
  monomial = term;
  // A Mul with a coefficient stores it as its first operand; the rest is the monomial, which
  // the caller rebuilds (see monomialOf below).
}

namespace {
using TermMap = std::map<SymExpr, int64_t, bool (*)(SymExpr, SymExpr)>;

/// Factors of a monomial (a Mul's non-constant operands, or the term itself).
void factorsOf(SymExpr t, int64_t &coef, std::vector<SymExpr> &factors) {
  coef = 1;
  factors.clear();
  if (t->isConst()) {
    coef = t->value();
    return;
  }
  if (t->kind() == SymKind::Mul) {
    for (SymExpr f : t->operands()) {
      if (f->isConst())
        coef = checkedMul(coef, f->value());
      else
        factors.push_back(f);
    }
    return;
  }
  factors.push_back(t);
}
} // namespace

SymExpr SymContext::addTerms(TermMap &terms, int64_t c) {
  std::vector<SymExpr> ops;
  for (auto &[mono, k] : terms) {
    if (k == 0)
      continue;
    ops.push_back(k == 1 ? mono : mul(constant(k), mono));
  }
  if (ops.empty())
    return constant(c);
  if (c != 0)
    ops.push_back(constant(c));
  if (ops.size() == 1)
    return ops[0];
  return makeRaw(SymKind::Add, std::move(ops));
}

SymExpr SymContext::add(SymExpr a, SymExpr b) {
  if (a->isConst() && b->isConst())
    return constant(checkedAdd(a->value(), b->value()));
  if (a->isConst(0))
    return b;
  if (b->isConst(0))
    return a;
  TermMap terms(&lessSym);
  int64_t c = 0;
  auto addOne = [&](SymExpr t) {
    int64_t coef;
    std::vector<SymExpr> fs;
    factorsOf(t, coef, fs);
    if (fs.empty()) {
      c = checkedAdd(c, coef);
      return;
    }
    SymExpr mono = fs.size() == 1 ? fs[0] : makeRaw(SymKind::Mul, fs);
    int64_t &k = terms[mono];
    k = checkedAdd(k, coef);
  };
  for (SymExpr x : {a, b}) {
    if (x->kind() == SymKind::Add)
      for (SymExpr t : x->operands())
        addOne(t);
    else
      addOne(x);
  }
  // Rule: k*(x // d)*d + k*(x % d) -> k*x, which undoes the split of a flat index. x // d is
  // taken in its canonical form: ((y // a) // b)*b*k + ((y // a) % b)*k is (y // (a*b))*b*k
  // + ((y // a) % b)*k (a heads dim split into groups and back), and folds to (y // a)*k.
  for (auto &[mono, k] : terms) {
    if (k == 0 || mono->kind() != SymKind::Mod)
      continue;
    SymExpr x = mono->lhs(), d = mono->rhs();
    SymExpr div = applySymRules(*this, SymKind::FloorDiv, x, d);
    if (div->isConst())
      continue;
    int64_t dc;
    std::vector<SymExpr> dfs;
    factorsOf(mul(div, d), dc, dfs);
    SymExpr partner = dfs.size() == 1 ? dfs[0] : makeRaw(SymKind::Mul, dfs);
    auto it = terms.find(partner);
    if (it == terms.end() || it->second != checkedMul(k, dc))
      continue;
    int64_t kk = k;
    k = 0;
    it->second = 0;
    return add(addTerms(terms, c), mul(constant(kk), x));
  }
  return addTerms(terms, c);
}

SymExpr SymContext::sub(SymExpr a, SymExpr b) { return add(a, neg(b)); }

SymExpr SymContext::mul(SymExpr a, SymExpr b) {
  if (a->isConst() && b->isConst())
    return constant(checkedMul(a->value(), b->value()));
  if (a->isConst(0) || b->isConst(0))
    return constant(0);
  if (a->isConst(1))
    return b;
  if (b->isConst(1))
    return a;
  // Distribute over sums so that the result stays a sum of monomials. Repeated products of
  // sums grow exponentially: past kMaxSymTerms terms that is a user error, not a hang.
  if (a->kind() == SymKind::Add || b->kind() == SymKind::Add) {
    const std::vector<SymExpr> as =
        a->kind() == SymKind::Add ? a->operands() : std::vector<SymExpr>{a};
    const std::vector<SymExpr> bs =
        b->kind() == SymKind::Add ? b->operands() : std::vector<SymExpr>{b};
    if (as.size() * bs.size() > kMaxSymTerms)
      BRAZE_USER_ERROR("shape", "")
          << "size expression too large: the product of a sum of " << as.size()
          << " terms and one of " << bs.size() << " terms has more than " << kMaxSymTerms
          << " terms";
    std::vector<SymExpr> terms;
    for (SymExpr x : as)
      for (SymExpr y : bs)
        terms.push_back(mul(x, y));
    // Pairwise, so that each level of additions costs the size of the result once.
    while (terms.size() > 1) {
      std::vector<SymExpr> next;
      for (size_t i = 0; i < terms.size(); i += 2)
        next.push_back(i + 1 < terms.size() ? add(terms[i], terms[i + 1]) : terms[i]);
      terms = std::move(next);
    }
    return terms[0];
  }
  int64_t ca, cb;
  std::vector<SymExpr> fa, fb;
  factorsOf(a, ca, fa);
  factorsOf(b, cb, fb);
  std::vector<SymExpr> fs = fa;
  fs.insert(fs.end(), fb.begin(), fb.end());
  std::sort(fs.begin(), fs.end(), lessSym);
  int64_t coef = checkedMul(ca, cb);
  if (fs.empty())
    return constant(coef);
  if (coef == 1 && fs.size() == 1)
    return fs[0];
  std::vector<SymExpr> ops;
  if (coef != 1)
    ops.push_back(constant(coef));
  ops.insert(ops.end(), fs.begin(), fs.end());
  return makeRaw(SymKind::Mul, std::move(ops));
}

SymExpr SymContext::floordiv(SymExpr a, SymExpr b) {
  BRAZE_CHECK(!b->isConst(0)) << "floordiv by constant zero: " << toString(a) << " // 0";
  return applySymRules(*this, SymKind::FloorDiv, a, b);
}
SymExpr SymContext::mod(SymExpr a, SymExpr b) {
  BRAZE_CHECK(!b->isConst(0)) << "mod by constant zero: " << toString(a) << " % 0";
  return applySymRules(*this, SymKind::Mod, a, b);
}
SymExpr SymContext::min(SymExpr a, SymExpr b) { return applySymRules(*this, SymKind::Min, a, b); }
SymExpr SymContext::max(SymExpr a, SymExpr b) { return applySymRules(*this, SymKind::Max, a, b); }

SymExpr SymContext::product(const std::vector<SymExpr> &xs) {
  SymExpr p = constant(1);
  for (SymExpr x : xs)
    p = mul(p, x);
  return p;
}

SymExpr SymContext::substitute(SymExpr e, const std::unordered_map<SymExpr, SymExpr> &map) {
  switch (e->kind()) {
  case SymKind::Const:
    return e;
  case SymKind::Symbol: {
    auto it = map.find(e);
    return it == map.end() ? e : it->second;
  }
  case SymKind::Add: {
    SymExpr r = constant(0);
    for (SymExpr t : e->operands())
      r = add(r, substitute(t, map));
    return r;
  }
  case SymKind::Mul: {
    SymExpr r = constant(1);
    for (SymExpr t : e->operands())
      r = mul(r, substitute(t, map));
    return r;
  }
  case SymKind::FloorDiv:
    return floordiv(substitute(e->lhs(), map), substitute(e->rhs(), map));
  case SymKind::Mod:
    return mod(substitute(e->lhs(), map), substitute(e->rhs(), map));
  case SymKind::Min:
    return min(substitute(e->lhs(), map), substitute(e->rhs(), map));
  case SymKind::Max:
    return max(substitute(e->lhs(), map), substitute(e->rhs(), map));
  }
  BRAZE_UNREACHABLE("bad SymKind");
}

int64_t evaluate(SymExpr e, const std::unordered_map<SymExpr, int64_t> &values) {
  switch (e->kind()) {
  case SymKind::Const:
    return e->value();
  case SymKind::Symbol: {
    auto it = values.find(e);
    BRAZE_CHECK(it != values.end()) << "unbound symbol " << e->name();
    return it->second;
  }
  case SymKind::Add: {
    int64_t r = 0;
    for (SymExpr t : e->operands())
      r += evaluate(t, values);
    return r;
  }
  case SymKind::Mul: {
    int64_t r = 1;
    for (SymExpr t : e->operands())
      r *= evaluate(t, values);
    return r;
  }
  case SymKind::FloorDiv:
    return floorDiv(evaluate(e->lhs(), values), evaluate(e->rhs(), values));
  case SymKind::Mod:
    return floorMod(evaluate(e->lhs(), values), evaluate(e->rhs(), values));
  case SymKind::Min:
    return std::min(evaluate(e->lhs(), values), evaluate(e->rhs(), values));
  case SymKind::Max:
    return std::max(evaluate(e->lhs(), values), evaluate(e->rhs(), values));
  }
  BRAZE_UNREACHABLE("bad SymKind");
}

void collectSymbols(SymExpr e, std::vector<SymExpr> &out) {
  if (e->isSymbol()) {
    if (std::find(out.begin(), out.end(), e) == out.end()) {
      out.push_back(e);
      std::sort(out.begin(), out.end(), lessSym);
    }
    return;
  }
  for (SymExpr op : e->operands())
    collectSymbols(op, out);
}

bool mentions(SymExpr e, SymExpr v) {
  if (e == v)
    return true;
  for (SymExpr op : e->operands())
    if (mentions(op, v))
      return true;
  return false;
}

bool mentionsAny(SymExpr e, const std::vector<SymExpr> &vars) {
  return std::any_of(vars.begin(), vars.end(), [&](SymExpr v) { return mentions(e, v); });
}

std::optional<int64_t> linearCoefficient(SymExpr e, SymExpr v) {
  std::vector<SymExpr> terms;
  if (e->kind() == SymKind::Add)
    terms = e->operands();
  else
    terms = {e};
  int64_t coef = 0;
  for (SymExpr t : terms) {
    if (t == v) {
      coef += 1;
      continue;
    }
    if (t->kind() == SymKind::Mul && t->operands().size() == 2 && t->operands()[0]->isConst() &&
        t->operands()[1] == v) {
      coef += t->operands()[0]->value();
      continue;
    }
    if (mentions(t, v))
      return std::nullopt;
  }
  return coef;
}

std::optional<AffineForm> affineIn(SymContext &s, SymExpr e, const std::vector<SymExpr> &vars) {
  std::unordered_map<SymExpr, SymExpr> zero;
  for (SymExpr v : vars)
    zero[v] = s.constant(0);
  AffineForm a;
  a.base = s.substitute(e, zero);
  SymExpr rebuilt = a.base;
  for (SymExpr v : vars) {
    std::unordered_map<SymExpr, SymExpr> one = zero;
    one[v] = s.constant(1);
    SymExpr c = s.sub(s.substitute(e, one), a.base);
    std::vector<SymExpr> syms;
    collectSymbols(c, syms);
    for (SymExpr x : syms)
      if (std::find(vars.begin(), vars.end(), x) != vars.end())
        return std::nullopt;
    a.coef.push_back(c);
    rebuilt = s.add(rebuilt, s.mul(c, v));
  }
  if (rebuilt != e)
    return std::nullopt;
  return a;
}

namespace {
int precedence(SymKind k) {
  switch (k) {
  case SymKind::Add:
    return 1;
  case SymKind::Mul:
  case SymKind::FloorDiv:
  case SymKind::Mod:
    return 2;
  case SymKind::Const:
  case SymKind::Symbol:
  case SymKind::Min:
  case SymKind::Max:
    return 3;
  }
  return 3;
}

void print(SymExpr e, std::string &s, int parentPrec) {
  int prec = precedence(e->kind());
  bool paren = prec < parentPrec || (e->isConst() && e->value() < 0 && parentPrec > 1);
  if (paren)
    s += '(';
  switch (e->kind()) {
  case SymKind::Const:
    s += std::to_string(e->value());
    break;
  case SymKind::Symbol:
    s += e->name();
    break;
  case SymKind::Add: {
    bool first = true;
    for (SymExpr t : e->operands()) {
      int64_t coef;
      std::vector<SymExpr> fs;
      factorsOf(t, coef, fs);
      if (!first && coef < 0) {
        s += " - ";
        if (fs.empty())
          s += std::to_string(-coef);
        else if (coef == -1) {
          for (size_t i = 0; i < fs.size(); ++i) {
            if (i)
              s += '*';
            print(fs[i], s, 3);
          }
        } else {
          s += std::to_string(-coef);
          for (SymExpr f : fs) {
            s += '*';
            print(f, s, 3);
          }
        }
      } else {
        if (!first)
          s += " + ";
        print(t, s, 2);
      }
      first = false;
    }
    break;
  }
  case SymKind::Mul: {
    const auto &fs = e->operands();
    size_t start = 0;
    if (fs[0]->isConst(-1)) {
      s += '-';
      start = 1;
    }
    for (size_t i = start; i < fs.size(); ++i) {
      if (i > start)
        s += '*';
      print(fs[i], s, 3);
    }
    break;
  }
  case SymKind::FloorDiv:
    print(e->lhs(), s, 2);
    s += " // ";
    print(e->rhs(), s, 3);
    break;
  case SymKind::Mod:
    print(e->lhs(), s, 2);
    s += " % ";
    print(e->rhs(), s, 3);
    break;
  case SymKind::Min:
  case SymKind::Max:
    s += e->kind() == SymKind::Min ? "min(" : "max(";
    print(e->lhs(), s, 0);
    s += ", ";
    print(e->rhs(), s, 0);
    s += ')';
    break;
  }
  if (paren)
    s += ')';
}
} // namespace

std::string toString(SymExpr e) {
  std::string s;
  print(e, s, 0);
  return s;
}


bool SymContext::provablyNonNegative(SymExpr e) {
  // 1. Replace each index symbol that occurs in e only as one linear term with a negative
  //    coefficient by the top of its range, extent - 1. That lowers e at every point, so it
  //    suffices to prove the result >= 0. An index that occurs elsewhere too (i - i*s,
  //    3*(i // 2) - i) is kept: e need not be smallest at an end of its range.
  // 2. Each term of what is left must be a non-negative coefficient times non-negative
  //    factors: symbols (sizes and indices are >= 0), x // y and min(x, y) with x, y >= 0,
  //    max(x, y) with x or y >= 0, and x % y with y >= 0 (a defined x % y then has y > 0).
  if (e->isConst())
    return e->value() >= 0;
  const std::vector<SymExpr> terms =
      e->kind() == SymKind::Add ? e->operands() : std::vector<SymExpr>{e};
  std::unordered_map<SymExpr, SymExpr> top;
  for (SymExpr t : terms) {
    int64_t coef;
    std::vector<SymExpr> fs;
    factorsOf(t, coef, fs);
    if (coef >= 0 || fs.size() != 1 || !fs[0]->isSymbol() ||
        fs[0]->role() != SymbolRoleKind::Index)
      continue;
    SymExpr v = fs[0];
    bool elsewhere = std::any_of(terms.begin(), terms.end(),
                                 [&](SymExpr other) { return other != t && mentions(other, v); });
    if (!elsewhere)
      top.emplace(v, sub(v->extent(), constant(1)));
  }
  SymExpr r = top.empty() ? e : substitute(e, top);
  const std::vector<SymExpr> rest =
      r->kind() == SymKind::Add ? r->operands() : std::vector<SymExpr>{r};
  for (SymExpr t : rest) {
    int64_t coef;
    std::vector<SymExpr> fs;
    factorsOf(t, coef, fs);
    if (coef < 0)
      return false;
    for (SymExpr f : fs) {
      bool ok = false;
      switch (f->kind()) {
      case SymKind::Symbol:
        ok = true;
        break;
      case SymKind::FloorDiv:
      case SymKind::Min:
        ok = provablyNonNegative(f->lhs()) && provablyNonNegative(f->rhs());
        break;
      case SymKind::Max:
        ok = provablyNonNegative(f->lhs()) || provablyNonNegative(f->rhs());
        break;
      case SymKind::Mod:
        ok = provablyNonNegative(f->rhs());
        break;
      case SymKind::Const:
      case SymKind::Add:
      case SymKind::Mul:
        ok = false; // not a factor of a canonical monomial
        break;
      }
      if (!ok)
        return false;
    }
  }
  return true;
}

} // namespace braze::sym
