#include "braze/codegen/KernelBody.h"

#include "braze/codegen/CFamily.h"
#include "braze/ir/loop/Rewrite.h"
#include "braze/scheduler/MemoryPlan.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace braze::codegen {

Names::Names(const sched::Schedule &s) {
  const auto &syms = s.program->sizeSymbols();
  for (size_t i = 0; i < syms.size(); ++i)
    sizeIndex_[syms[i]] = static_cast<int>(i);
}

int Names::symbolIndex(sym::SymExpr s) const {
  auto it = sizeIndex_.find(s);
  BRAZE_CHECK(it != sizeIndex_.end()) << "size symbol " << s->name() << " is not bound";
  return it->second;
}

std::string Names::bindIndirect(sym::SymExpr s) {
  std::string n = "t" + std::to_string(nextIndirect_++);
  indirect_[s] = n;
  return n;
}

namespace {

/// Whether e has a minimum, maximum, quotient or remainder. Only such an index is worth int
/// arithmetic: a sum of multiples of indices is one wide multiply-add a term, and in int each
/// access would widen the sum again where the wide form folds its constant steps into the
/// address.
bool clampsOrDivides(sym::SymExpr e) {
  switch (e->kind()) {
  case sym::SymKind::Const:
  case sym::SymKind::Symbol:
    return false;
  case sym::SymKind::Add:
  case sym::SymKind::Mul:
    return std::any_of(e->operands().begin(), e->operands().end(), clampsOrDivides);
  default:
    return true;
  }
}

} // namespace

std::string Names::indexText(sym::SymExpr e, bool narrowed) const {
  auto range = [this](sym::SymExpr s) -> std::optional<IndexRange> {
    if (s->role() != sym::SymbolRoleKind::Index || indirect_.count(s) || !s->extent() ||
        !s->extent()->isConst())
      return std::nullopt;
    return IndexRange{0, s->extent()->value() - 1};
  };
  bool narrow = narrowed && clampsOrDivides(e) && fitsNarrowIndex(e, range);
  return indexExpr(
      e,
      [this](sym::SymExpr s) -> std::string {
        if (s->role() == sym::SymbolRoleKind::Size)
          return symbol(s);
        auto it = indirect_.find(s);
        if (it != indirect_.end())
          return it->second;
        return s->name();
      },
      narrow);
}

std::string Scope::localFor(const loop::Buffer *b, sym::SymExpr index) const {
  for (const Scope *s = this; s; s = s->parent_) {
    auto it = s->locals_.find(b);
    if (it == s->locals_.end())
      continue;
    for (const auto &[name, at] : it->second)
      if (at == index)
        return name;
    return "";
  }
  return "";
}

const std::string *Scope::memo(const loop::Expr *e) const {
  for (const Scope *s = this; s; s = s->parent_) {
    auto it = s->memo_.find(e);
    if (it != s->memo_.end())
      return &it->second;
  }
  return nullptr;
}

std::string ExprWriter::emit(const loop::Expr *e) {
  if (const std::string *m = scope_.memo(e))
    return *m;
  std::string text;
  switch (e->kind()) {
  case loop::ExprKind::Const:
    return literal(e->floatValue(), e->intValue(), e->dtype());
  case loop::ExprKind::IndexValue:
    text = convert(names_.pointIndex(e->index()), DType::Int64, e->dtype());
    break;
  case loop::ExprKind::Load: {
    std::string local = e->indirect().empty() ? scope_.localFor(e->buffer(), e->index()) : "";
    if (!local.empty()) {
      // The local holds the value in its compute type; round it as a store would.
      text = convert(local, computeType(e->buffer()->dtype), e->dtype());
      break;
    }
    for (const auto &[s, v] : e->indirect()) {
      std::string val = emit(v);
      std::string t = names_.bindIndirect(s);
      w_.line("int64_t " + t + " = " + val + ";");
      w_.line("if (" + t + " < 0 || " + t + " >= " + names_.index(s->extent()) + ") { " +
              errorStatement_ + " " + t + " = 0; }");
    }
    text = names_.buffer(*e->buffer()) + "[" + names_.pointIndex(e->index()) + "]";
    break;
  }
  case loop::ExprKind::Op: {
    std::vector<std::string> args;
    std::vector<DType> types;
    for (const loop::Expr *o : e->operands()) {
      args.push_back(emit(o));
      types.push_back(o->dtype());
    }
    text = scalarOp(e->op(), e->dtype(), args, types, e);
    break;
  }
  }
  std::string name = "e" + std::to_string(next_++);
  w_.line("const " + ctype(e->dtype()) + " " + name + " = " + text + ";");
  scope_.remember(e, name);
  return name;
}

std::string cIndexList(const Names &names, const std::vector<sym::SymExpr> &xs) {
  std::string s = "{";
  for (size_t i = 0; i < xs.size(); ++i)
    s += (i ? ", " : "") + names.index(xs[i]);
  return s + "}";
}

std::string cIntList(const std::vector<int64_t> &xs) {
  std::string s = "{";
  for (size_t i = 0; i < xs.size(); ++i)
    s += (i ? ", " : "") + std::string("INT64_C(") + std::to_string(xs[i]) + ")";
  return s + "}";
}

void collectKernelUses(const sched::Kernel &k, const Names &names, std::set<int> &used,
                       std::vector<sym::SymExpr> &syms) {
  auto addSyms = [&](sym::SymExpr e) {
    std::vector<sym::SymExpr> found;
    sym::collectSymbols(e, found);
    for (sym::SymExpr sy : found)
      if (sy->role() == sym::SymbolRoleKind::Size &&
          std::find(syms.begin(), syms.end(), sy) == syms.end())
        syms.push_back(sy);
  };
  for (sym::SymExpr v : k.outerVars)
    addSyms(v->extent());
  for (sym::SymExpr v : k.innerVars)
    addSyms(v->extent());
  auto addExpr = [&](const loop::Expr *e) {
    if (e->kind() == loop::ExprKind::Load)
      used.insert(e->buffer()->id);
    if (e->index())
      addSyms(e->index());
    for (const auto &b : e->indirect())
      addSyms(b.first->extent());
  };
  for (const sched::Step &st : k.steps)
    for (const sched::Member &m : st.members) {
      used.insert(m.comp->out->id);
      addSyms(m.storeIndex);
      forEachExpr(m.value, addExpr);
    }
  if (k.scatterAt()) { // the positions, and the size of the buffer they must lie in
    forEachExpr(k.scatterAt(), addExpr);
    for (sym::SymExpr e : k.scatter()->out->shape)
      addSyms(e);
  }
  if (k.conv()) // a library call takes the buffers' sizes and strides
    for (const loop::Buffer *b : {k.conv()->conv()->operands()[0], k.conv()->conv()->operands()[1],
                                  static_cast<const loop::Buffer *>(k.conv()->out)}) {
      used.insert(b->id);
      for (sym::SymExpr e : b->shape)
        addSyms(e);
      for (sym::SymExpr e : b->strides)
        addSyms(e);
    }
  if (k.attention()) { // the kernel takes each operand's offset and strides, and the output's sizes
    const loop::Computation &c = *k.attention();
    used.insert(c.out->id);
    if (k.attentionPair())
      used.insert(k.attentionPair()->out->id);
    for (sym::SymExpr e : c.out->shape)
      addSyms(e);
    if (k.attentionGradQ()) { // its own launch takes the query rows' sizes
      used.insert(k.attentionGradQ()->out->id);
      for (sym::SymExpr e : k.attentionGradQ()->out->shape)
        addSyms(e);
    }
    for (const loop::AttentionOperand *o : c.attention()->operands()) {
      used.insert(o->buffer->id);
      addSyms(o->offset);
      for (sym::SymExpr e : o->strides)
        addSyms(e);
    }
  }
  std::sort(syms.begin(), syms.end(), [&](sym::SymExpr a, sym::SymExpr b) {
    return names.symbolIndex(a) < names.symbolIndex(b);
  });
}

std::string emitGemmLayout(Writer &w, const sched::GemmCall &g, const Names &names) {
  auto ix = [&](sym::SymExpr e) { return names.index(e); };
  w.line("const int64_t M = " + ix(g.m) + ", N = " + ix(g.n) + ", K = " + ix(g.k) + ";");
  w.line("const int64_t lda = " + ix(g.lda) + ", ldb = " + ix(g.ldb) + ", ldc = " + ix(g.ldc) +
         ";");
  std::string okA = g.transA ? "lda >= braze_imax(1, M)" : "lda >= braze_imax(1, K)";
  std::string okB = g.transB ? "ldb >= braze_imax(1, K)" : "ldb >= braze_imax(1, N)";
  return okA + " && " + okB + " && ldc >= braze_imax(1, N)";
}

std::vector<std::vector<sched::Member>> independentMembers(const sched::Step &st,
                                                           const std::vector<sym::SymExpr> &vars) {
  std::vector<size_t> group = sched::independentGroups(st, vars);
  std::vector<std::vector<sched::Member>> groups;
  for (size_t i = 0; i < st.members.size(); ++i) {
    if (group[i] == groups.size())
      groups.emplace_back();
    groups[group[i]].push_back(st.members[i]);
  }
  return groups;
}

bool isArgReduction(const loop::Computation &c) {
  return c.reduce == loop::ReduceKind::ArgMax || c.reduce == loop::ReduceKind::ArgMin;
}

std::string accumulatorInit(const loop::Computation &c) {
  DType t = c.value->dtype();
  std::string ty = ctype(t);
  switch (c.reduce) {
  case loop::ReduceKind::Sum:
    return "0";
  case loop::ReduceKind::Prod:
    return "1";
  case loop::ReduceKind::Max:
  case loop::ReduceKind::ArgMax:
    return isFloating(t) ? "-std::numeric_limits<" + ty + ">::infinity()"
                         : "std::numeric_limits<" + ty + ">::lowest()";
  case loop::ReduceKind::Min:
  case loop::ReduceKind::ArgMin:
    return isFloating(t) ? "std::numeric_limits<" + ty + ">::infinity()"
                         : "std::numeric_limits<" + ty + ">::max()";
  case loop::ReduceKind::Any:
    return "false";
  case loop::ReduceKind::All:
    return "true";
  case loop::ReduceKind::None:
    break;
  }
  BRAZE_UNREACHABLE("not a reduction");
}

std::string accumulatorUpdate(const loop::Computation &c, const std::string &acc,
                              const std::string &v) {
  switch (c.reduce) {
  case loop::ReduceKind::Sum:
    return acc + " += " + v;
  case loop::ReduceKind::Prod:
    return acc + " = (" + ctype(c.value->dtype()) + ")(" + acc + " * " + v + ")";
  case loop::ReduceKind::Max:
    return acc + " = braze_max(" + acc + ", " + v + ")";
  case loop::ReduceKind::Min:
    return acc + " = braze_min(" + acc + ", " + v + ")";
  case loop::ReduceKind::Any:
    return acc + " = " + acc + " || " + v;
  case loop::ReduceKind::All:
    return acc + " = " + acc + " && " + v;
  case loop::ReduceKind::ArgMax:
  case loop::ReduceKind::ArgMin:
    break; // combined with their positions by each emitter
  case loop::ReduceKind::None:
    break;
  }
  BRAZE_UNREACHABLE("not a value reduction");
}

std::string argBetter(const loop::Computation &c, const std::string &acc, const std::string &v) {
  std::string cmp = c.reduce == loop::ReduceKind::ArgMax ? " > " : " < ";
  std::string s = "(" + v + cmp + acc;
  if (isFloating(c.value->dtype()))
    s += " || (" + v + " != " + v + " && " + acc + " == " + acc + ")";
  return s + ")";
}

void forEachExpr(const loop::Expr *e, const std::function<void(const loop::Expr *)> &f) {
  std::unordered_set<const loop::Expr *> seen;
  std::function<void(const loop::Expr *)> visit = [&](const loop::Expr *x) {
    if (!x || !seen.insert(x).second)
      return;
    for (const loop::Expr *o : x->operands())
      visit(o);
    for (const auto &b : x->indirect())
      visit(b.second);
    f(x);
  };
  visit(e);
}

std::string emitModuleAbi(const sched::Schedule &s, Names &names,
                          const std::vector<std::string> &kernelCalls,
                          const std::string &runParams) {
  const loop::LoopProgram &p = *s.program;
  std::string out = "extern \"C\" {\n\nint braze_abi_version(void) { return 2; }\n\n";
  // braze_bind: sizes from the first input dim that is exactly the symbol, then checks.
  std::string body;
  Writer w(body, 1);
  std::unordered_set<sym::SymExpr> bound;
  std::vector<loop::Buffer *> inputs = p.inputs();
  for (const loop::Buffer *b : inputs)
    for (size_t d = 0; d < b->seenShape().size(); ++d) {
      sym::SymExpr e = b->seenShape()[d];
      if (e->isSymbol() && bound.insert(e).second)
        w.line("syms[" + std::to_string(names.symbolIndex(e)) + "] = shapes[" +
               std::to_string(b->ioIndex) + "][" + std::to_string(d) + "];");
    }
  // Then from a dim that is the symbol plus a constant (s - 1: a sliced dim).
  for (const loop::Buffer *b : inputs)
    for (size_t d = 0; d < b->seenShape().size(); ++d) {
      sym::SymExpr e = b->seenShape()[d];
      if (e->kind() != sym::SymKind::Add || e->operands().size() != 2)
        continue;
      sym::SymExpr x = e->lhs(), c = e->rhs();
      if (x->isConst())
        std::swap(x, c);
      if (!x->isSymbol() || !c->isConst() || !bound.insert(x).second)
        continue;
      std::string sy = "syms[" + std::to_string(names.symbolIndex(x)) + "]";
      std::string i = std::to_string(b->ioIndex), ds = std::to_string(d);
      w.line(sy + " = shapes[" + i + "][" + ds + "] - (" + std::to_string(c->value()) + ");");
      w.line("if (" + sy + " < 0) { snprintf(msg, msglen, \"input " + i + " dim " + ds +
             " is %lld but the compiled graph expects " + sym::toString(e) +
             " with " + x->name() + " >= 0\", (long long)shapes[" + i + "][" + ds +
             "]); return 1; }");
    }
  for (sym::SymExpr sy : p.sizeSymbols())
    if (!bound.count(sy))
      BRAZE_USER_ERROR("compile", "") << "size symbol '" << sy->name()
                                      << "' is not a dim of any input, so it cannot be bound";
  for (sym::SymExpr sy : p.sizeSymbols())
    w.line("const int64_t " + names.symbol(sy) + " = syms[" + std::to_string(names.symbolIndex(sy)) +
           "]; (void)" + names.symbol(sy) + ";");
  for (const loop::Buffer *b : inputs)
    for (size_t d = 0; d < b->seenShape().size(); ++d) {
      std::string i = std::to_string(b->ioIndex), ds = std::to_string(d);
      std::string want = names.index(b->seenShape()[d]);
      w.line("if (shapes[" + i + "][" + ds + "] != " + want + ") { snprintf(msg, msglen, " +
             "\"input " + i + " dim " + ds + " is %lld but the compiled graph expects " +
             sym::toString(b->seenShape()[d]) + " = %lld\", (long long)shapes[" + i + "][" + ds +
             "], (long long)(" + want + ")); return 1; }");
    }
  // Strides only once every dim is known to match (a wrong dim explains a wrong stride).
  for (const loop::Buffer *b : inputs)
    for (size_t d = 0; d < b->seenShape().size(); ++d) {
      std::string i = std::to_string(b->ioIndex), ds = std::to_string(d);
      w.line("if (shapes[" + i + "][" + ds + "] > 1 && strides[" + i + "][" + ds + "] != " +
             names.index(b->seenStrides()[d]) + ") { snprintf(msg, msglen, \"input " + i + " dim " + ds +
             " has stride %lld but the compiled graph expects %lld\", (long long)strides[" + i +
             "][" + ds + "], (long long)(" + names.index(b->seenStrides()[d]) + ")); return 1; }");
    }
  out += "int braze_bind(const int64_t* const* shapes, const int64_t* const* strides, "
         "int64_t* syms, char* msg, int64_t msglen) {\n" +
         body + "  return 0;\n}\n\n";
  // Symbol unpacking shared by the remaining functions.
  std::string unpack;
  for (sym::SymExpr sy : p.sizeSymbols())
    unpack += "  const int64_t " + names.symbol(sy) + " = syms[" +
              std::to_string(names.symbolIndex(sy)) + "]; (void)" + names.symbol(sy) + ";\n";
  out += "void braze_output_shapes(const int64_t* syms, int64_t* shapes, int64_t* strides) {\n" +
         unpack;
  size_t k = 0;
  for (const loop::Buffer *b : p.outputs())
    for (size_t d = 0; d < b->seenShape().size(); ++d, ++k) {
      out += "  shapes[" + std::to_string(k) + "] = " + names.index(b->seenShape()[d]) + ";\n";
      out += "  strides[" + std::to_string(k) + "] = " + names.index(b->seenStrides()[d]) +
             ";\n";
    }
  out += "}\n\n";
  out += "int64_t braze_arena_bytes(const int64_t* syms) {\n" + unpack + "  return " +
         names.index(s.arenaBytes) + ";\n}\n\n";
  out += "int braze_run(void* const* inputs, void* const* outputs, char* arena, "
         "const int64_t* syms" + runParams + ") {\n" +
         unpack + "  (void)arena;\n  void* bufs[" +
         std::to_string(std::max<size_t>(1, p.buffers().size())) + "] = {};\n";
  for (const auto &b : p.buffers()) {
    const sched::Placement &pl = s.placement.at(b->id);
    std::string slot = "  bufs[" + std::to_string(b->id) + "] = ";
    switch (pl.kind) {
    case sched::PlacementKind::Input:
      out += slot + "inputs[" + std::to_string(b->ioIndex) + "];\n";
      break;
    case sched::PlacementKind::Output:
      out += slot + "outputs[" + std::to_string(b->ioIndex) + "];\n";
      break;
    case sched::PlacementKind::Arena:
      out += slot + "arena + " + names.index(pl.offsetBytes) + ";\n";
      break;
    case sched::PlacementKind::Local:
      break;
    }
  }
  out += "  int err = 0;\n";
  for (const std::string &call : kernelCalls)
    out += "  " + call + "\n  if (err) return err;\n";
  out += "  return 0;\n}\n\n} // extern \"C\"\n";
  return out;
}

} // namespace braze::codegen
