#include "braze/ir/loop/LoopIR.h"

#include "braze/ir/loop/LoopText.h"
#include "braze/ir/types/TensorType.h"
#include "braze/support/Check.h"
#include "braze/support/NumberText.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace braze::loop {

namespace {

std::string constText(const Expr *e) {
  if (isFloating(e->dtype()))
    return formatDouble(e->floatValue());
  if (e->dtype() == DType::Bool)
    return e->intValue() ? "true" : "false";
  return std::to_string(e->intValue());
}

std::string bufferName(const Buffer *b) { return b ? "%" + b->name : "%<null>"; }

/// `i0 < s0, i1 < 8`
std::string varList(const std::vector<SymExpr> &vars) {
  std::string s;
  for (size_t i = 0; i < vars.size(); ++i) {
    s += i ? ", " : "";
    s += vars[i]->extent() ? vars[i]->name() + " < " + sym::toString(vars[i]->extent())
                           : sym::toString(vars[i]);
  }
  return s;
}

/// `t0 < s1 = %3` for an index symbol, `t0 = %3` for a size symbol.
std::string bindingText(const IndirectBinding &b, const std::string &value) {
  SymExpr s = b.first;
  std::string text = sym::toString(s);
  if (s->isSymbol() && s->role() == sym::SymbolRoleKind::Index && s->extent())
    text += " < " + sym::toString(s->extent());
  return text + " = " + value;
}

} // namespace

std::vector<const Expr *> exprPostOrder(const Expr *root) { return exprPostOrder({root}); }

std::vector<const Expr *> exprPostOrder(std::initializer_list<const Expr *> roots) {
  std::vector<const Expr *> order;
  std::unordered_set<const Expr *> seen;
  std::function<void(const Expr *)> visit = [&](const Expr *e) {
    if (!e || !seen.insert(e).second)
      return;
    for (const IndirectBinding &b : e->indirect())
      visit(b.second);
    for (const Expr *o : e->operands())
      visit(o);
    order.push_back(e);
  };
  for (const Expr *root : roots)
    visit(root);
  return order;
}

std::string printExpr(const Expr *e) {
  if (!e)
    return "<null>";
  std::string dt(dtypeName(e->dtype()));
  switch (e->kind()) {
  case ExprKind::Const:
    return constText(e) + ":" + dt;
  case ExprKind::IndexValue:
    return "index(" + sym::toString(e->index()) + "):" + dt;
  case ExprKind::Load: {
    std::string s = "load " + bufferName(e->buffer()) + "[" + sym::toString(e->index());
    for (size_t i = 0; i < e->indirect().size(); ++i) {
      const IndirectBinding &b = e->indirect()[i];
      s += (i ? ", " : " where ") + bindingText(b, printExpr(b.second));
    }
    return s + "]";
  }
  case ExprKind::Op: {
    std::string s = std::string(scalarOpName(e->op())) + "(";
    for (size_t i = 0; i < e->operands().size(); ++i)
      s += (i ? ", " : "") + printExpr(e->operands()[i]);
    s += ")";
    return e->op() == ScalarOpKind::Cast ? s + ":" + dt : s;
  }
  }
  BRAZE_UNREACHABLE("bad ExprKind");
}

namespace {

/// The statements of one computation body, numbered from %0.
void printBody(const Expr *value, const Expr *scatterAt, std::string &s) {
  std::unordered_map<const Expr *, std::string> names;
  auto nameOf = [&](const Expr *e) {
    auto it = names.find(e);
    return it == names.end() ? std::string("%<null>") : it->second;
  };
  for (const Expr *e : exprPostOrder({value, scatterAt})) {
    std::string name = std::string("%").append(std::to_string(names.size()));
    s += "  " + name + " = ";
    switch (e->kind()) {
    case ExprKind::Const:
      s += "const " + constText(e);
      break;
    case ExprKind::IndexValue:
      s += "index(" + sym::toString(e->index()) + ")";
      break;
    case ExprKind::Load:
      s += "load " + bufferName(e->buffer()) + "[" + sym::toString(e->index()) + "]";
      for (size_t i = 0; i < e->indirect().size(); ++i)
        s += (i ? ", " : " where ") +
             bindingText(e->indirect()[i], nameOf(e->indirect()[i].second));
      break;
    case ExprKind::Op:
      s += std::string(scalarOpName(e->op())) + "(";
      for (size_t i = 0; i < e->operands().size(); ++i)
        s += (i ? ", " : "") + nameOf(e->operands()[i]);
      s += ")";
      break;
    }
    s += " : " + std::string(dtypeName(e->dtype())) + "\n";
    names.emplace(e, name);
  }
  s += value ? "  yield " + nameOf(value) : "  yield";
  s += scatterAt ? " at " + nameOf(scatterAt) + "\n" : "\n";
}

std::string intList(const std::vector<int64_t> &xs) {
  std::string s = "[";
  for (size_t i = 0; i < xs.size(); ++i)
    s += (i ? ", " : "") + std::to_string(xs[i]);
  return s + "]";
}

/// `conv(%x, %w, stride=[..], padding=[..], dilation=[..], groups=g[, layout=nhwc])`,
/// `conv_weight_grad(%x, %dy, ...)` or `conv_input_grad(%dy, %w, ...)`
std::string convText(const ConvSpec &c) {
  return std::string(c.name()) + "(" + bufferName(c.operands()[0]) + ", " +
         bufferName(c.operands()[1]) + ", stride=" +
         intList(c.stride) + ", padding=" + intList(c.padding) + ", dilation=" +
         intList(c.dilation) + ", groups=" + std::to_string(c.groups) +
         (c.channelsLast ? ", layout=nhwc)" : ")");
}

/// `(%buf, offset, [size, ..], [stride, ..])`
std::string operandText(const AttentionOperand &o) {
  auto list = [](const std::vector<SymExpr> &xs) {
    std::string s = "[";
    for (size_t i = 0; i < xs.size(); ++i)
      s += (i ? ", " : "") + sym::toString(xs[i]);
    return s + "]";
  };
  return "(" + bufferName(o.buffer) + ", " + sym::toString(o.offset) + ", " + list(o.shape) +
         ", " + list(o.strides) + ")";
}

/// `PART(NAME=(..), .., scale=s, causal=true|false[, safe=false][, dropout=p])`: PART is
/// attention (q, k, v), attention_lse (q, k) or attention_grad_q|k|v (dout, q, k, v, out, lse),
/// then seed (with dropout) and bias when there are.
std::string attentionText(const AttentionSpec &a) {
  std::string s = std::string(attentionPartName(a.part)) + "(";
  std::vector<std::pair<const char *, const AttentionOperand *>> named{{"q", &a.q}, {"k", &a.k}};
  if (a.v.buffer)
    named.push_back({"v", &a.v});
  if (a.dout)
    named.insert(named.begin(), {"dout", &*a.dout});
  if (a.out)
    named.push_back({"out", &*a.out});
  if (a.lse)
    named.push_back({"lse", &*a.lse});
  if (a.seed)
    named.push_back({"seed", &*a.seed});
  if (a.bias)
    named.push_back({"bias", &*a.bias});
  for (const auto &[name, o] : named)
    s += std::string(name) + "=" + operandText(*o) + ", ";
  return s + "scale=" + formatDouble(a.scale) + ", causal=" + (a.causal ? "true" : "false") +
         (a.safe ? "" : ", safe=false") +
         (a.seed ? ", dropout=" + formatDouble(a.dropout) : "") + ")";
}

} // namespace

std::string printProgram(const LoopProgram &p) {
  sym::SymContext &ctx = *p.symShared();
  std::string s;
  if (!p.sizeSymbols().empty()) {
    s += "sizes ";
    for (size_t i = 0; i < p.sizeSymbols().size(); ++i)
      s += (i ? ", " : "") + sym::toString(p.sizeSymbols()[i]);
    s += "\n";
  }
  for (const auto &b : p.buffers()) {
    TensorType type{b->dtype, b->shape, b->strides};
    s += "buffer %" + b->name + ": " + typeToString(ctx, type) + " " +
         std::string(bufferKindName(b->kind));
    if (b->ioIndex != -1)
      s.append(" ").append(std::to_string(b->ioIndex));
    if (!b->callerShape.empty()) {
      s += " as [";
      for (size_t i = 0; i < b->callerShape.size(); ++i)
        s += (i ? ", " : "") + sym::toString(b->callerShape[i]);
      s += "]{";
      for (size_t i = 0; i < b->callerStrides.size(); ++i)
        s += (i ? ", " : "") + sym::toString(b->callerStrides[i]);
      s += "}";
    }
    s += "\n";
  }
  for (const auto &c : p.computations()) {
    s += "compute " + bufferName(c->out) + "[" + varList(c->vars) + "]";
    if (c->isReduction())
      s += " reduce " + std::string(reduceKindName(c->reduce));
    if (!c->rvars.empty())
      s += " over [" + varList(c->rvars) + "]";
    if (c->conv())
      s += " " + convText(*c->conv());
    if (c->attention())
      s += " " + attentionText(*c->attention());
    if (c->scatterAt())
      s += " scatter " + std::string(scatterCombineName(c->scatterCombine()));
    s += " {\n";
    printBody(c->value, c->scatterAt(), s);
    s += "}\n";
  }
  return s;
}

} // namespace braze::loop
