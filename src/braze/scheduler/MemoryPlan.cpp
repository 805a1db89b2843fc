#include "braze/scheduler/MemoryPlan.h"

#include "braze/ir/loop/Rewrite.h"

#include <unordered_map>

namespace braze::sched {

SymExpr alignedBytes(sym::SymContext &ctx, const Buffer &b) {
  SymExpr bytes = ctx.mul(ctx.product(b.shape), ctx.constant(dtypeSize(b.dtype)));
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
