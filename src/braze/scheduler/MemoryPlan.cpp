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

namespace {

/// An arena buffer: its size in bytes and the kernels from its first write to its last use.
struct Interval {
  const Buffer *buffer;
  SymExpr size;
  int first, last;
};

/// Offsets for buffers of constant sizes, largest first, each at the lowest offset that no
/// buffer live at the same time covers (greedy by size, as offline planners do): a small
/// buffer fills a gap a large one left. Returns the arena's bytes.
int64_t placeBySize(const std::vector<Interval> &xs,
                    std::unordered_map<const Buffer *, int64_t> &at) {
  std::vector<size_t> order(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return xs[a].size->value() > xs[b].size->value();
  });
  std::vector<size_t> placed;
  int64_t end = 0;
  for (size_t i : order) {
    const Interval &x = xs[i];
    std::vector<std::pair<int64_t, int64_t>> taken; // [offset, end) of live neighbours
    for (size_t j : placed)
      if (xs[j].first <= x.last && x.first <= xs[j].last)
        taken.push_back({at[xs[j].buffer], at[xs[j].buffer] + xs[j].size->value()});
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0, size = x.size->value();
    for (const auto &[lo, hi] : taken) {
      if (offset + size <= lo)
        break;
      offset = std::max(offset, hi);
    }
    at[x.buffer] = offset;
    end = std::max(end, offset + size);
    placed.push_back(i);
  }
  return end;
}

} // namespace

void planMemory(Schedule &s) {
  sym::SymContext &ctx = s.program->sym();
  // 1. Placement by kind; stored intermediates go to the arena, live from the first kernel
  //    that writes them to the last that reads or writes them.
  std::unordered_map<const Buffer *, int> firstKernel, lastKernel;
  std::vector<const Buffer *> arena;
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
        int k = static_cast<int>(ki);
        if (m.store && m.comp->out->kind == loop::BufferKind::Intermediate) {
          s.placement[m.comp->out->id].kind = PlacementKind::Arena;
          if (firstKernel.emplace(m.comp->out, k).second)
            arena.push_back(m.comp->out);
          lastKernel[m.comp->out] = std::max(lastKernel[m.comp->out], k);
        }
        loop::forEachBufferRead(*m.comp, m.value, [&](const loop::Buffer *b) {
          lastKernel[b] = std::max(lastKernel[b], k);
        });
      }
  std::vector<Interval> xs;
  bool constant = true;
  for (const Buffer *b : arena) {
    xs.push_back({b, alignedBytes(ctx, *b), firstKernel[b], lastKernel[b]});
    constant &= xs.back().size->isConst();
  }
  // 2. Constant sizes: greedy by size. Symbolic ones: slots in kernel order, a dead buffer's
  //    slot reused by a later buffer provably no larger.
  if (constant) {
    std::unordered_map<const Buffer *, int64_t> at;
    s.arenaBytes = ctx.constant(placeBySize(xs, at));
    for (const Interval &x : xs)
      s.placement[x.buffer->id].offsetBytes = ctx.constant(at[x.buffer]);
    return;
  }
  struct Slot {
    SymExpr offset, size;
    int freeAfter; ///< kernel index after which the slot may be reused
  };
  std::vector<Slot> slots;
  SymExpr end = ctx.constant(0);
  for (const Interval &x : xs) {
    Slot *chosen = nullptr;
    for (Slot &sl : slots)
      if (sl.freeAfter < x.first && ctx.provablyNonNegative(ctx.sub(sl.size, x.size))) {
        chosen = &sl;
        break;
      }
    if (!chosen) {
      slots.push_back(Slot{end, x.size, x.last});
      end = ctx.add(end, x.size);
      chosen = &slots.back();
    }
    chosen->freeAfter = x.last;
    s.placement[x.buffer->id].offsetBytes = chosen->offset;
  }
  s.arenaBytes = end;
}

} // namespace braze::sched
