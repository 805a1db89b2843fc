#include "braze/scheduler/MemoryPlan.h"

#include "braze/ir/loop/Rewrite.h"

#include <algorithm>
#include <unordered_map>

namespace braze::sched {

SymExpr alignedBytes(sym::SymContext &ctx, const Buffer &b) {
  // The elements a layout spans: its shape's product, or more for padded rows (constant sizes).
  SymExpr elements = ctx.product(b.shape);
  bool constant = b.strides.size() == b.shape.size();
  for (size_t i = 0; constant && i < b.shape.size(); ++i)
    constant = b.shape[i]->isConst() && b.strides[i]->isConst() && b.strides[i]->value() >= 0;
  if (constant && elements->isConst() && elements->value() > 0) {
    int64_t span = 1;
    for (size_t i = 0; i < b.shape.size(); ++i)
      span += (b.shape[i]->value() - 1) * b.strides[i]->value();
    elements = ctx.constant(std::max(span, elements->value()));
  }
  SymExpr bytes = ctx.mul(elements, ctx.constant(dtypeSize(b.dtype)));
  return ctx.mul(ctx.floordiv(ctx.add(bytes, ctx.constant(63)), ctx.constant(64)),
                 ctx.constant(64));
}

void planMemory(Schedule &s) {
  sym::SymContext &ctx = s.program->sym();
  // 1. Placement by kind; stored intermediates go to the arena.
  std::unordered_map<const Buffer *, int> firstKernel, lastKernel;
  for (const auto &b : s.program->buffers()) {
    Placement pl;
    pl.kind = b->kind == loop::BufferKind::Input    ? PlacementKind::Input
              : b->kind == loop::BufferKind::Output ? PlacementKind::Output
                                                    : PlacementKind::Local;
    s.placement[b->id] = pl;
  }
  for (size_t ki = 0; ki < s.kernels.size(); ++ki)
    for (const Step &st : s.kernels[ki].steps)
      for (const Member &m : st.members) {
        if (m.store && m.comp->out->kind == loop::BufferKind::Intermediate) {
          s.placement[m.comp->out->id].kind = PlacementKind::Arena;
          firstKernel[m.comp->out] = static_cast<int>(ki);
        }
        loop::forEachBufferRead(*m.comp, m.value, [&](const loop::Buffer *b) {
          lastKernel[b] = static_cast<int>(ki);
        });
      }
  // 2. Greedy slots in kernel order.
  struct Slot {
    SymExpr offset, size;
    int freeAfter; ///< kernel index after which the slot may be reused
  };
  std::vector<Slot> slots;
  SymExpr end = ctx.constant(0);
  for (size_t ki = 0; ki < s.kernels.size(); ++ki)
    for (const Step &st : s.kernels[ki].steps)
      for (const Member &m : st.members) {
        const Buffer *b = m.comp->out;
        Placement &pl = s.placement[b->id];
        if (pl.kind != PlacementKind::Arena)
          continue;
        SymExpr size = alignedBytes(ctx, *b);
        int last = lastKernel.count(b) ? lastKernel[b] : static_cast<int>(ki);
        Slot *chosen = nullptr;
        for (Slot &sl : slots)
          if (sl.freeAfter < static_cast<int>(ki) && ctx.provablyNonNegative(ctx.sub(sl.size, size))) {
            chosen = &sl;
            break;
          }
        if (!chosen) {
          slots.push_back(Slot{end, size, last});
          end = ctx.add(end, size);
          chosen = &slots.back();
        }
        chosen->freeAfter = last;
        pl.offsetBytes = chosen->offset;
      }
  s.arenaBytes = end;
}

} // namespace braze::sched
