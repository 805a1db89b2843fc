#include "braze/scheduler/MemoryPlan.h"

#include "braze/ir/loop/Rewrite.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

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

/// Whether kernel `k` may write its stored buffer `n` over `d`, an arena buffer whose last
/// use is this kernel: a kernel of one pointwise step whose member that writes `n` reads `d`
/// only at the position it writes, with elements of the same size and a layout `d` spans at
/// least; any other member that reads `d` comes before that writer, reads it there too (a
/// register value the writer uses, such as GELU's derivative times the incoming gradient) and
/// is in the writer's independent group (independentGroups: codegen may run other groups in
/// other blocks or threads, at the same time; a scatter's initial copy once overwrote, in
/// another group, the sum a mean was still reading). Each point then reads d[i] before it
/// writes n[i], and no other point touches either.
bool writesInPlace(const Kernel &k, const Buffer *d, const Buffer *n) {
  if (k.standsAlone() || k.steps.size() != 1 ||
      k.steps[0].kind != StepKind::Scalar || !k.steps[0].stashes.empty() ||
      dtypeSize(d->dtype) != dtypeSize(n->dtype) || d->strides != n->strides ||
      d->shape != n->shape)
    return false;
  const Member *writer = nullptr;
  for (const Member &m : k.steps[0].members)
    if (m.comp->out == n)
      writer = &m;
  if (!writer || !writer->store)
    return false;
  std::vector<SymExpr> vars = k.outerVars;
  vars.insert(vars.end(), k.innerVars.begin(), k.innerVars.end());
  std::vector<size_t> group = independentGroups(k.steps[0], vars);
  size_t writerGroup = group[static_cast<size_t>(writer - k.steps[0].members.data())];
  bool afterWriter = false;
  for (size_t i = 0; i < k.steps[0].members.size(); ++i) {
    const Member &m = k.steps[0].members[i];
    bool reads = false;
    loop::forEachBufferRead(*m.comp, m.value, [&](const Buffer *b) { reads |= b == d; });
    if (reads && (afterWriter || m.storeIndex != writer->storeIndex || group[i] != writerGroup))
      return false;
    afterWriter |= &m == writer;
    bool atWriterPoint = true;
    loop::forEachLoad(m.value, [&](const loop::Expr *ld) {
      if (ld->buffer() == d)
        atWriterPoint &= ld->indirect().empty() && ld->index() == writer->storeIndex;
    });
    if (!atWriterPoint)
      return false;
  }
  return true;
}

} // namespace

std::vector<size_t> independentGroups(const Step &st, const std::vector<SymExpr> &vars) {
  size_t n = st.members.size();
  std::vector<size_t> parent(n);
  for (size_t i = 0; i < n; ++i)
    parent[i] = i;
  auto root = [&](size_t i) {
    while (parent[i] != i)
      i = parent[i] = parent[parent[i]];
    return i;
  };
  // A buffer's first member to make or read it: a later member that reads it joins that one.
  std::unordered_map<const Buffer *, size_t> first;
  std::unordered_set<const Buffer *> made;
  for (size_t i = 0; i < n; ++i) {
    loop::forEachLoad(st.members[i].value, [&](const Expr *ld) {
      if (ld->indirect().empty() && !sym::mentionsAny(ld->index(), vars) &&
          !made.count(ld->buffer()))
        return; // one value for the whole kernel (a step size), loaded before its loops
      auto [it, fresh] = first.try_emplace(ld->buffer(), i);
      if (!fresh)
        parent[root(i)] = root(it->second);
    });
    first.try_emplace(st.members[i].comp->out, i);
    made.insert(st.members[i].comp->out);
  }
  std::vector<size_t> group(n);
  std::unordered_map<size_t, size_t> number;
  for (size_t i = 0; i < n; ++i)
    group[i] = number.try_emplace(root(i), number.size()).first->second;
  return group;
}

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
  // 2. Constant sizes: a buffer that a pointwise kernel writes over one it reads for the last
  //    time (writesInPlace) shares that buffer's place: the two become one interval. Then
  //    greedy by size. Symbolic sizes: slots in kernel order, a dead buffer's slot reused by a
  //    later buffer provably no larger.
  if (constant) {
    std::unordered_map<const Buffer *, const Buffer *> host; // buffer -> the one it overwrites
    std::unordered_set<const Buffer *> hosts; // overwritten by one buffer (two members of a
                                              // kernel may each read it where they write)
    auto root = [&](const Buffer *b) {
      while (host.count(b))
        b = host.at(b);
      return b;
    };
    for (size_t i = 0; i < xs.size(); ++i) {
      const Kernel &k = s.kernels[xs[i].first];
      for (const Interval &d : xs)
        if (d.last == xs[i].first && d.first < xs[i].first &&
            root(d.buffer) != root(xs[i].buffer) && !host.count(xs[i].buffer) &&
            !hosts.count(d.buffer) && writesInPlace(k, d.buffer, xs[i].buffer)) {
          host[xs[i].buffer] = d.buffer;
          hosts.insert(d.buffer);
          break;
        }
    }
    std::vector<Interval> groups; // one per root, named by it, spanning its buffers
    std::unordered_map<const Buffer *, size_t> groupOf;
    for (const Interval &x : xs) {
      const Buffer *r = root(x.buffer);
      auto [it, fresh] = groupOf.try_emplace(r, groups.size());
      if (fresh)
        groups.push_back({r, x.size, x.first, x.last});
      Interval &g = groups[it->second];
      g.first = std::min(g.first, x.first);
      g.last = std::max(g.last, x.last);
      g.size = ctx.constant(std::max(g.size->value(), x.size->value()));
    }
    std::unordered_map<const Buffer *, int64_t> at;
    s.arenaBytes = ctx.constant(placeBySize(groups, at));
    for (const Interval &x : xs)
      s.placement[x.buffer->id].offsetBytes = ctx.constant(at[root(x.buffer)]);
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
