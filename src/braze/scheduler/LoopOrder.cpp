/// The order and shape of a kernel's loops once its members are chosen: store order and
/// flattened loops (LoopOrder.h).
#include "braze/scheduler/LoopOrder.h"

#include "braze/ir/loop/Rewrite.h"

#include <algorithm>
#include <unordered_map>

namespace braze::sched {

namespace {

using loop::Expr;
using loop::ExprKind;

/// Whether e names v anywhere but in the index of a plain Load (an index value, an indirect
/// load's index or binding).
bool namedOtherwise(const Expr *e, SymExpr v) {
  if (e->kind() == ExprKind::IndexValue)
    return sym::mentions(e->index(), v);
  if (e->kind() == ExprKind::Load && !e->indirect().empty()) {
    if (sym::mentions(e->index(), v))
      return true;
    for (const auto &binding : e->indirect())
      if (namedOtherwise(binding.second, v))
        return true;
  }
  for (const Expr *o : e->operands())
    if (namedOtherwise(o, v))
      return true;
  return false;
}

/// Whether kernel k uses the adjacent loop variables a (outer) and b (inner, of constant
/// extent) only as one: every load and store index is c_a * a + c_b * b + rest with
/// c_a == extent(b) * c_b and neither in rest.
bool flattenable(const Kernel &k, SymExpr a, SymExpr b) {
  int64_t eb = 0;
  if (!b->extent()->isConst())
    return false;
  eb = b->extent()->value();
  bool ok = true;
  auto check = [&](SymExpr index) {
    std::optional<int64_t> ca = linearCoefficient(index, a), cb = linearCoefficient(index, b);
    ok &= ca && cb && *ca == *cb * eb;
  };
  for (const Step &st : k.steps) {
    for (const Member &m : st.members) {
      if (namedOtherwise(m.value, a) || namedOtherwise(m.value, b))
        return false;
      loop::forEachLoad(m.value, [&](const Expr *ld) { check(ld->index()); });
      check(m.storeIndex);
    }
    for (const Stash &sh : st.stashes)
      check(sh.index);
  }
  return ok;
}

/// A kernel without inner loops runs its variables in the memory order of its first store
/// (so that a channels-last result, or a permuted one such as attention's q, k and v copied
/// out of a [S, B, 3E] product as [B, H, S, D] with strides {E, D, B*E, 1}, is written in
/// memory order: by the `omp simd` loop and the parallel loops around it on the CPU, by
/// neighbouring threads and then neighbouring blocks on CUDA). Where a stride is not a
/// constant, only the variable the store is contiguous along moves innermost.
void storeOrder(Kernel &k) {
  std::vector<SymExpr> &order = k.outerVars;
  if (!k.innerVars.empty() || order.size() < 2)
    return;
  for (const Step &st : k.steps)
    for (const Member &m : st.members) {
      if (!m.store)
        continue;
      std::vector<std::pair<int64_t, SymExpr>> strides;
      for (SymExpr v : order) {
        std::optional<int64_t> c = linearCoefficient(m.storeIndex, v);
        if (!c || *c <= 0)
          break;
        strides.push_back({*c, v});
      }
      if (strides.size() == order.size()) {
        std::stable_sort(strides.begin(), strides.end(),
                         [](const auto &a, const auto &b) { return a.first > b.first; });
        for (size_t i = 0; i < order.size(); ++i)
          order[i] = strides[i].second;
        return;
      }
      std::optional<int64_t> last = linearCoefficient(m.storeIndex, order.back());
      for (size_t i = 0; i + 1 < order.size() && !(last && *last == 1); ++i) {
        std::optional<int64_t> c = linearCoefficient(m.storeIndex, order[i]);
        if (c && *c == 1) {
          SymExpr v = order[i];
          order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
          order.push_back(v);
          break;
        }
      }
      return;
    }
}

} // namespace

void flattenLoops(Schedule &s, bool innerOnly) {
  sym::SymContext &sy = s.program->sym();
  for (Kernel &k : s.kernels) {
    if (k.standsAlone())
      continue;
    storeOrder(k);
    if (innerOnly && k.innerVars.empty())
      continue;
    std::vector<SymExpr> &vars = k.innerVars.empty() ? k.outerVars : k.innerVars;
    // On CUDA, constant extents only: a row of 16 * s0 elements could not be shown to split
    // into vectors, where its inner 16 did.
    while (vars.size() >= 2 && (!innerOnly || vars[vars.size() - 2]->extent()->isConst()) &&
           flattenable(k, vars[vars.size() - 2], vars.back())) {
      SymExpr a = vars[vars.size() - 2], b = vars.back();
      SymExpr f = sy.indexSymbol(a->name(), sy.mul(a->extent(), b->extent()));
      std::unordered_map<SymExpr, SymExpr> map{{a, sy.constant(0)}, {b, f}};
      for (Step &st : k.steps) {
        for (Member &m : st.members) {
          m.value = loop::substituteIndices(*s.program, m.value, map);
          m.storeIndex = sy.substitute(m.storeIndex, map);
        }
        for (Stash &sh : st.stashes) {
          sh.value = loop::substituteIndices(*s.program, sh.value, map);
          sh.index = sy.substitute(sh.index, map);
        }
      }
      vars.pop_back();
      vars.back() = f;
    }
  }
}

} // namespace braze::sched
