#include "braze/ir/loop/Rewrite.h"

#include "braze/support/Check.h"

#include <unordered_set>

namespace braze::loop {

namespace {
const Expr *rewrite(LoopProgram &p, const Expr *e, const std::unordered_map<SymExpr, SymExpr> &map,
                    std::unordered_map<const Expr *, const Expr *> &memo) {
  auto it = memo.find(e);
  if (it != memo.end())
    return it->second;
  sym::SymContext &s = p.sym();
  ExprContext &ex = p.exprs();
  const Expr *r = e;
  switch (e->kind()) {
  case ExprKind::Const:
    break;
  case ExprKind::IndexValue:
    r = ex.indexValue(s.substitute(e->index(), map), e->dtype());
    break;
  case ExprKind::Load: {
    std::vector<IndirectBinding> ind;
    for (const auto &[sy, v] : e->indirect())
      ind.push_back({sy, rewrite(p, v, map, memo)});
    r = ex.load(e->buffer(), s.substitute(e->index(), map), std::move(ind));
    break;
  }
  case ExprKind::Op: {
    std::vector<const Expr *> ops;
    bool same = true;
    for (const Expr *o : e->operands()) {
      ops.push_back(rewrite(p, o, map, memo));
      same &= ops.back() == o;
    }
    if (!same)
      r = ex.op(e->op(), std::move(ops), e->dtype());
    break;
  }
  }
  memo.emplace(e, r);
  return r;
}
} // namespace

const Expr *substituteIndices(LoopProgram &p, const Expr *e,
                              const std::unordered_map<SymExpr, SymExpr> &map) {
  std::unordered_map<const Expr *, const Expr *> memo;
  return rewrite(p, e, map, memo);
}

void forEachLoad(const Expr *e, const std::function<void(const Expr *)> &f) {
  if (!e)
    return;
  std::unordered_set<const Expr *> seen;
  std::vector<std::pair<const Expr *, bool>> stack{{e, false}};
  while (!stack.empty()) {
    auto [x, expanded] = stack.back();
    stack.pop_back();
    if (expanded) {
      if (x->kind() == ExprKind::Load)
        f(x);
      continue;
    }
    if (!seen.insert(x).second)
      continue;
    stack.push_back({x, true});
    for (const Expr *o : x->operands())
      stack.push_back({o, false});
    for (const auto &b : x->indirect())
      stack.push_back({b.second, false});
  }
}

void forEachBufferRead(const Computation &c, const Expr *value,
                       const std::function<void(const Buffer *)> &f) {
  forEachLoad(value, [&](const Expr *ld) { f(ld->buffer()); });
  if (c.scatterAt()) // the positions (in c's own variables: only the buffers matter here)
    forEachLoad(c.scatterAt(), [&](const Expr *ld) { f(ld->buffer()); });
  if (c.attention())
    for (const AttentionOperand *o : c.attention()->operands())
      f(o->buffer);
}

} // namespace braze::loop
