// plan-cuda: each loop kernel's launch record (sched::CudaLaunch) from its shape and operands,
// the check of a record given by hand (braze-opt --launch), and the row operands and values a
// persistent row keeps in registers.
#include "braze/codegen/cuda/CudaEmitter.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/KernelBody.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <map>

namespace braze::codegen::cuda {

bool CudaEmitter::contiguousIn(SymExpr index, SymExpr var, int group) {
  std::unordered_map<SymExpr, SymExpr> next{{var, sym_.add(var, 1)}};
  if (sym_.sub(sym_.substitute(index, next), index)->isConst(1))
    return true;
  if (group < 2 || !var->extent()->isConst() || var->extent()->value() % group != 0)
    return false;
  int64_t groups = var->extent()->value() / group;
  SymExpr t = sym_.indexSymbol(var->name() + "_group", sym_.constant(groups));
  SymExpr j = sym_.indexSymbol(var->name() + "_lane", sym_.constant(group));
  // Lane 0's index as lane j's with j = 0, so both are in the same simplified form.
  std::unordered_map<SymExpr, SymExpr> lane{{var, sym_.add(sym_.mul(sym_.constant(group), t), j)}};
  std::unordered_map<SymExpr, SymExpr> first{{j, sym_.constant(0)}};
  SymExpr at = sym_.substitute(index, lane);
  return sym_.sub(at, sym_.substitute(at, first)) == j;
}

std::vector<const loop::Expr *>
CudaEmitter::plainLoads(const std::vector<const Member *> &members,
                        const std::set<const Buffer *> &writes) {
  std::vector<const loop::Expr *> out;
  for (const Member *m : members)
    forEachExpr(m->value, [&](const loop::Expr *e) {
      if (e->kind() == loop::ExprKind::Load && e->indirect().empty() && inMemory(*e->buffer()) &&
          !writes.count(e->buffer()) && std::find(out.begin(), out.end(), e) == out.end())
        out.push_back(e);
    });
  return out;
}

int CudaEmitter::laneCount(const std::vector<const Member *> &members, SymExpr var,
                           const std::set<const Buffer *> &writes, int *widest) {
  if (widest)
    *widest = 0;
  if (!var || !var->extent()->isConst())
    return 1;
  int narrowest = 0;
  auto consider = [&](DType t) {
    int b = static_cast<int>(dtypeSize(t));
    narrowest = narrowest == 0 ? b : std::min(narrowest, b);
    if (widest)
      *widest = std::max(*widest, b);
  };
  // An operand contiguous only in groups counts where a vector of it (16 bytes) stays in
  // one group; emitLanes checks each operand again against the lanes chosen.
  auto lanesOf = [](DType t) { return std::max(1, 16 / static_cast<int>(dtypeSize(t))); };
  for (const loop::Expr *l : plainLoads(members, writes))
    if (contiguousIn(l->index(), var, lanesOf(l->buffer()->dtype)))
      consider(l->buffer()->dtype);
  for (const Member *m : members)
    if (m->store && !m->comp->isReduction() &&
        contiguousIn(m->storeIndex, var, lanesOf(m->comp->out->dtype)))
      consider(m->comp->out->dtype);
  if (narrowest == 0)
    return 1;
  int vec = std::max(1, 16 / narrowest);
  int64_t extent = var->extent()->value();
  while (vec > 1 && extent % vec != 0)
    vec /= 2;
  return vec;
}

std::vector<const loop::Expr *> CudaEmitter::rowOperands(const Kernel &k) {
  std::set<const Buffer *> writes = written(k);
  std::vector<std::vector<const loop::Expr *>> perStep;
  std::map<const loop::Expr *, int> steps;
  for (const Step &st : k.steps)
    if (st.kind == StepKind::Loop) {
      perStep.push_back(plainLoads(membersOf(st), writes));
      for (const loop::Expr *l : perStep.back())
        steps[l] += mentionsAny(l->index(), k.innerVars) ? 1 : 0;
    }
  std::vector<const loop::Expr *> out;
  for (const auto &loads : perStep)
    for (const loop::Expr *l : loads)
      if (steps[l] > 1 && std::find(out.begin(), out.end(), l) == out.end())
        out.push_back(l);
  return out;
}

std::vector<std::pair<const loop::Expr *, int>> CudaEmitter::rowValues(const Kernel &k) {
  // Each step's values as a set, and in the order its members visit them: the order the
  // result follows (a set of pointers iterates in address order, which differs from process
  // to process, and so would the kernel's source and its cache key).
  std::vector<std::set<const loop::Expr *>> dags;
  std::vector<std::vector<const loop::Expr *>> visits;
  std::map<const loop::Expr *, bool> inner;
  for (const Step &st : k.steps) {
    if (st.kind != StepKind::Loop)
      continue;
    std::set<const loop::Expr *> dag;
    std::vector<const loop::Expr *> visit;
    for (const Member &m : st.members)
      forEachExpr(m.value, [&](const loop::Expr *e) {
        if (dag.insert(e).second)
          visit.push_back(e);
        bool dep = e->index() && mentionsAny(e->index(), k.innerVars);
        for (const loop::Expr *o : e->operands())
          dep = dep || inner[o];
        for (const auto &b : e->indirect())
          dep = dep || inner[b.second];
        inner[e] = dep;
      });
    dags.push_back(std::move(dag));
    visits.push_back(std::move(visit));
  }
  std::map<const loop::Expr *, int> first, count;
  for (size_t i = 0; i < dags.size(); ++i)
    for (const loop::Expr *e : dags[i]) {
      count[e]++;
      if (!first.count(e))
        first[e] = static_cast<int>(i);
    }
  auto candidate = [&](const loop::Expr *e) {
    if (e->kind() != loop::ExprKind::Op || !inner[e] || count[e] < 2 || !e->indirect().empty())
      return false;
    return !(e->op() == loop::ScalarOpKind::Cast && e->operands()[0]->kind() == loop::ExprKind::Load);
  };
  std::vector<std::pair<const loop::Expr *, int>> out;
  for (size_t i = 0; i < dags.size(); ++i)
    for (const loop::Expr *e : visits[i]) {
      if (first[e] != static_cast<int>(i) || !candidate(e))
        continue;
      // Needed unless every use in a later step is under another candidate.
      bool needed = false;
      for (size_t j = i + 1; j < dags.size() && !needed; ++j) {
        if (!dags[j].count(e))
          continue;
        for (const Step &st : k.steps)
          for (const Member &m : st.members)
            if (m.value == e && dags[j].count(e))
              needed = true;
        for (const loop::Expr *p : dags[j])
          if (!candidate(p) && std::find(p->operands().begin(), p->operands().end(), e) !=
                                   p->operands().end())
            needed = true;
      }
      if (needed)
        out.push_back({e, static_cast<int>(i)});
    }
  return out;
}

bool CudaEmitter::rowsAdjacent(const std::vector<const Member *> &members,
                               const std::vector<SymExpr> &rowVars,
                               const std::set<const Buffer *> &writes) {
  if (rowVars.empty())
    return false;
  std::vector<const loop::Expr *> loads = plainLoads(members, writes);
  return !loads.empty() && std::all_of(loads.begin(), loads.end(), [&](const loop::Expr *l) {
    return contiguousIn(l->index(), rowVars.back());
  });
}

int CudaEmitter::columnBytes(const std::vector<const Member *> &members,
                             const std::vector<SymExpr> &rowVars,
                             const std::vector<SymExpr> &inner,
                             const std::set<const Buffer *> &writes) {
  if (rowVars.empty())
    return 0;
  int bytes = 0;
  for (const loop::Expr *l : plainLoads(members, writes)) {
    if (!sym::mentions(l->index(), rowVars.back()) || !mentionsAny(l->index(), inner))
      continue; // the rows share it, or it is read once per row
    if (!contiguousIn(l->index(), rowVars.back()) || contiguousIn(l->index(), inner.back()))
      return 0;
    int size = static_cast<int>(dtypeSize(l->buffer()->dtype));
    bytes = bytes ? std::min(bytes, size) : size;
  }
  return bytes;
}

SymExpr CudaEmitter::points(const std::vector<SymExpr> &vars) {
  std::vector<SymExpr> extents;
  for (SymExpr v : vars)
    extents.push_back(v->extent());
  return sym_.product(extents);
}

std::vector<const Member *> CudaEmitter::laneMembers(const Kernel &k) {
  std::vector<const Member *> members;
  for (const Step &st : k.steps)
    if (k.innerVars.empty() || st.kind == StepKind::Loop)
      for (const Member &m : st.members)
        members.push_back(&m);
  return members;
}

int CudaEmitter::lanesAllowed(const Kernel &k, const std::set<const Buffer *> &writes,
                              int *widest) {
  SymExpr var = !k.innerVars.empty() ? k.innerVars.back()
                : k.outerVars.empty() ? nullptr
                                      : k.outerVars.back();
  return laneCount(laneMembers(k), var, writes, widest);
}

int CudaEmitter::columnLanes(const Kernel &k, const std::set<const Buffer *> &writes) {
  // One Loop step, then Scalar steps only (each lane's results finish in a scope of their
  // own, with the Scalar steps that read them), and no argmax or argmin.
  if (k.outerVars.empty() || k.steps.empty() || k.steps[0].kind != StepKind::Loop)
    return 1;
  for (size_t i = 1; i < k.steps.size(); ++i)
    if (k.steps[i].kind != StepKind::Scalar)
      return 1;
  for (const Member &m : k.steps[0].members)
    if (isArgReduction(*m.comp))
      return 1;
  // A thread holds V accumulators of each reduction of its member group.
  int reductions = 1;
  std::vector<std::vector<Member>> groups = {k.steps[0].members};
  if (memberGroups(k) > 1)
    groups = independentMembers(k.steps[0], groupVars(k));
  for (const auto &g : groups)
    reductions = std::max<int>(reductions, std::count_if(g.begin(), g.end(), [](const Member &m) {
                                 return m.comp->isReduction();
                               }));
  int lanes = laneCount(membersOf(k.steps[0]), k.outerVars.back(), writes);
  while (lanes > 1 && lanes * reductions > kColumnLaneAccumulators)
    lanes /= 2;
  return lanes;
}

void CudaEmitter::setRowIterations(sched::CudaLaunch &l, int64_t length) {
  int64_t chunk = static_cast<int64_t>(l.threads) * stepLanes(l);
  l.length = length;
  l.iters = (length + chunk - 1) / chunk;
  l.ragged = length % chunk != 0;
}

std::vector<SymExpr> CudaEmitter::groupVars(const Kernel &k) {
  std::vector<SymExpr> vars = k.outerVars;
  vars.insert(vars.end(), k.innerVars.begin(), k.innerVars.end());
  return vars;
}

int CudaEmitter::memberGroups(const Kernel &k) {
  // (A row kernel's Scalar step runs once per row, on its first thread.)
  if (k.steps.size() != 1 || (!k.innerVars.empty() && k.steps[0].kind == StepKind::Scalar))
    return 1;
  return static_cast<int>(std::max<size_t>(1, independentMembers(k.steps[0], groupVars(k)).size()));
}

sched::CudaLaunch CudaEmitter::planLaunch(const Kernel &k) {
  sched::CudaLaunch p;
  std::set<const Buffer *> writes = written(k);
  int widest = 0;
  p.vec = lanesAllowed(k, writes, &widest);
  if (k.innerVars.empty()) {
    p.block = kPointwiseBlock;
    // No access wider than 16 bytes a thread: lanes sized for the narrowest operand give a
    // wider one 32-byte pieces per thread, so each of a warp's vector stores or loads covers
    // every other 16 bytes of a 1 KiB span (an H200: a bf16 gradient widened to f32, 7.25 us
    // at 8 lanes, 6.23 at 4; an f32 + bf16 residual writing both, 15.6 against 8.0;
    // benchmarks/gpu_pointwise_sweep.py). A launch record may still ask for the most lanes.
    while (p.vec > 1 && p.vec * widest > 16)
      p.vec /= 2;
    // Without vector lanes, one scalar access per thread keeps too few bytes in flight for
    // the memory's bandwidth (a [1024, 50257] gradient of unaligned rows): a thread of a
    // large kernel takes kSpread points.
    SymExpr count = points(k.outerVars);
    if (p.vec == 1 && count->isConst() && count->value() >= kSpreadMin)
      p.spread = kSpread;
    p.groups = memberGroups(k);
    return p;
  }
  std::vector<const Member *> all = laneMembers(k);
  SymExpr length = points(k.innerVars);
  // Fewer rows than multiprocessors: the rows' threads are all the kernel has, so lanes give
  // way to threads (a single row of 1,024 values took 16 threads of 16 lanes each).
  SymExpr rowCount = points(k.outerVars);
  if (rowCount->isConst() && length->isConst() && rowCount->value() < s_.target.cores)
    while (p.vec > 1 && length->value() / (4 * p.vec) < s_.target.maxThreadsPerBlock)
      p.vec /= 2;
  // Threads per row: about four vectors per thread, within a block's limit. A short row of
  // elements apart in memory whose neighbouring rows are neighbours (a max pool's window
  // over channels-last values) is one thread's: a warp then reads 32 adjacent rows at each
  // step, where threads sharing a row would each read a few scattered elements.
  int64_t perThread = 4 * p.vec;
  int64_t guess = length->isConst() ? (length->value() + perThread - 1) / perThread : 1024;
  if (p.vec == 1 && length->isConst() && length->value() <= kShortRow &&
      rowsAdjacent(all, k.outerVars, writes))
    guess = 1;
  p.threads = static_cast<int>(std::clamp<int64_t>(nextPow2(guess), 1, s_.target.maxThreadsPerBlock));
  // Many rows whose threads take a few elements each: every row ends in a reduction across
  // its threads, and the rows take many waves of the device. Fewer threads per row, each
  // taking up to kRowWork elements, fill the device about twice over (a stable sort's rank
  // counts, 4,096 rows of 4,096 keys, took 1,024 threads of 4 keys a row: 31 us on an H200).
  if (rowCount->isConst() && length->isConst())
    while (p.threads > 32 && rowCount->value() * p.threads > kRowFill * s_.target.cores &&
           (length->value() + p.threads / 2 - 1) / (p.threads / 2) <= kRowWork)
      p.threads /= 2;
  p.block = std::max(p.threads, kRowBlock);
  if (int bytes = guess > 1 ? columnBytes(all, k.outerVars, k.innerVars, writes) : 0) {
    // Columns: R groups of V neighbouring rows per block (V: column lanes, one vector of each
    // operand a thread and step), the rows a warp reads side by side. Each of a row's T
    // threads reads about kColumnSteps elements. With at least two blocks a multiprocessor
    // at one 32-byte sector a warp row, blocks are of kColumnBlock threads, and a warp row
    // is two sectors, or a 128-byte line, where that still leaves two blocks a
    // multiprocessor; with fewer, R fills one sector and blocks take up to the block limit,
    // so that the device still has loads in flight. From a sweep on an H200 of the first stage
    // of ResNet-50's batch-norm statistics (f32, 4 lanes, 12 shapes, partials x R x T): in
    // blocks of 256 threads, 8,192 rows of 784 took 6.8 us with R = 4 and 512 blocks, 8.3
    // with R = 2 at 2,048 rows; 16,384 rows of 1,568 took 27.5 us with R = 8 (512 blocks),
    // 8,192 rows of 3,136 36.7 with R = 8 (256 blocks) and 29.0 with R = 4; 2,048 rows of
    // 3,136 in blocks of 1,024 threads, 19.8 us against 8.3 in blocks of 256 (256 blocks).
    // BERT's FFN bias gradients (3,072 columns of 2,048) took 13.3 us with R = 4 (192
    // blocks) against 10.3 with R = 2 (384).
    // But blocks of 256 threads for fewer than two blocks a multiprocessor cost ViT-B/16's
    // training step 4% (its bias gradients, [6304, 3072] bf16, are 192 blocks): kept to
    // kernels of many blocks, which split-reductions gives a batch norm's statistics.
    int lanes = columnLanes(k, writes);
    p.columns = true;
    p.vec = lanes;
    p.columnRows = std::max(1, 32 / (bytes * lanes));
    auto blocksOf = [&](int64_t r) { return (rowCount->value() + lanes * r - 1) / (lanes * r); };
    bool manyBlocks = rowCount->isConst() && blocksOf(p.columnRows) >= 2 * s_.target.cores;
    for (int64_t line : {64, 128}) {
      int64_t r = line / (bytes * lanes);
      if (manyBlocks && r > p.columnRows && r <= 32 && blocksOf(r) >= 2 * s_.target.cores)
        p.columnRows = static_cast<int>(r);
    }
    int most = manyBlocks ? kColumnBlock : s_.target.maxThreadsPerBlock;
    int64_t perRow = length->isConst() ? (length->value() + kColumnSteps - 1) / kColumnSteps
                                       : kColumnBlock;
    p.threads = static_cast<int>(std::clamp<int64_t>(  // a block is whole warps
        nextPow2(perRow), std::max(2, 32 / p.columnRows), most / p.columnRows));
    p.block = p.columnRows * p.threads;
  }
  if (!length->isConst())
    return p;
  setRowIterations(p, length->value());
  size_t live = std::max<size_t>(1, rowOperands(k).size() + rowValues(k).size());
  int64_t rows = p.block / p.threads;
  int64_t bytes = rows * p.length * static_cast<int64_t>(live) * 4;
  p.persistent = !(p.columns && p.vec > 1) && p.iters * p.vec <= kMaxPerThread &&
                 bytes <= s_.target.registerBytesPerSm / kBudgetFraction;
  // A row kernel of independent reductions (the weight and bias gradients of every layer
  // norm of a ViT, fused into one column kernel: 50 accumulators a thread over 96 blocks,
  // 415 us on an H200) runs each group over blocks of its own. Persistent rows keep one
  // set of arrays for the whole kernel, so they stay one group.
  if (!p.persistent)
    p.groups = memberGroups(k);
  return p;
}

void CudaEmitter::planLaunches(sched::Schedule &s) {
  for (Kernel &k : s.kernels)
    if (!k.attention() && !k.scatter() && !(k.gemm() && k.gemm()->epilogue))
      k.cudaLaunch = planLaunch(k); // a paired epilogue's product is never written as loops
}

void CudaEmitter::applyLaunches(sched::Schedule &s, const std::map<std::string,
                                sched::CudaLaunch> &records) {
  for (const auto &entry : records) {
    const std::string &name = entry.first;
    const sched::CudaLaunch &record = entry.second;
    auto k = std::find_if(s.kernels.begin(), s.kernels.end(),
                          [&](const Kernel &x) { return x.name == name; });
    if (k == s.kernels.end() || !k->cudaLaunch)
      BRAZE_USER_ERROR("--launch", "")
          << (k == s.kernels.end() ? "the schedule has no kernel " + name
                                   : name + " is not written as loops (no launch record)");
    sched::CudaLaunch l = record;
    if (std::string why = completeLaunch(*k, l); !why.empty())
      BRAZE_USER_ERROR("--launch", "") << "the record of " << name << ": " << why;
    k->cudaLaunch = l;
  }
}

std::string CudaEmitter::completeLaunch(const Kernel &k, sched::CudaLaunch &l) {
  const sched::CudaLaunch planned = planLaunch(k);
  auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
  int most = s_.target.maxThreadsPerBlock;
  if (l.block % 32 != 0 || l.block > most)
    return "block must be a multiple of 32 (whole warps) up to " + std::to_string(most);
  bool rows = !k.innerVars.empty();
  // With columns, vec is the neighbouring rows a thread takes.
  bool columnVec = rows && l.columns;
  int lanes = columnVec ? columnLanes(k, written(k)) : lanesAllowed(k, written(k));
  if (!pow2(l.vec) || lanes % l.vec != 0)
    return "vec must be a power of two dividing " + std::to_string(lanes) +
           (columnVec ? " (the neighbouring rows its accesses, sizes and accumulators allow)"
                      : " (the lanes its accesses and sizes allow)");
  if (!rows) {
    if (l.threads || l.columns || l.persistent || l.iters || l.ragged)
      return "threads, columns and persistent apply to kernels with an inner loop";
    if (l.spread > 1 && l.vec > 1)
      return "spread needs vec=1";
    if (l.groups != 1 && l.groups != planned.groups)
      return planned.groups == 1
                 ? "groups needs independent member groups, and this kernel has one"
                 : "groups must be 1 or " + std::to_string(planned.groups) +
                       " (its independent member groups)";
    l.threads = planned.threads;
    return "";
  }
  if (l.spread != 1)
    return "spread applies to pointwise kernels";
  if (l.groups != 1) {
    int groups = memberGroups(k);
    if (groups == 1)
      return "groups needs independent member groups, and this kernel has one";
    if (l.persistent)
      return "groups needs rows that are not persistent";
    if (l.groups != groups)
      return "groups must be 1 or " + std::to_string(groups) + " (its independent member groups)";
  }
  if (!pow2(l.threads) || l.threads > l.block || l.block % l.threads != 0)
    return "threads must be a power of two that divides block";
  if (l.columns) {
    if (!planned.columns)
      return "columns: its rows' elements are not neighbouring columns (plan-cuda chose "
             "rows)";
    if (l.vec > 1 && l.persistent)
      return "columns with vec > 1 are not persistent";
    if (!pow2(l.columnRows) || l.columnRows > 32 || l.block != l.columnRows * l.threads ||
        l.threads < std::max(2, 32 / l.columnRows))
      return "columns=R needs R a power of two up to 32, block = R x threads, and whole "
             "warps (threads at least 32 / R and 2)";
  } else {
    l.columnRows = planned.columnRows;
  }
  SymExpr length = points(k.innerVars);
  if (!length->isConst()) {
    if (l.persistent)
      return "persistent needs a row length known at compile time";
    l.length = l.iters = 0;
    l.ragged = false;
    return "";
  }
  sched::CudaLaunch derived = l;
  setRowIterations(derived, length->value());
  if (l.persistent) {
    if (l.iters != derived.iters || l.ragged != derived.ragged)
      return "persistent over rows of " + std::to_string(derived.length) + " takes iters=" +
             std::to_string(derived.iters) + (derived.ragged ? " ragged" : " (not ragged)");
    if (derived.iters * l.vec > kMaxPerThread)
      return "persistent keeps at most " + std::to_string(kMaxPerThread) +
             " elements a thread (iters x vec)";
  } else if (l.iters || l.ragged) {
    return "iters and ragged go with persistent";
  }
  l = derived;
  return "";
}

KernelPlan CudaEmitter::planOf(const Kernel &k) {
  KernelPlan p;
  static_cast<sched::CudaLaunch &>(p) = k.cudaLaunch ? *k.cudaLaunch : planLaunch(k);
  if (p.persistent) {
    p.rowLoads = rowOperands(k);
    p.rowValues = rowValues(k);
  }
  return p;
}

} // namespace braze::codegen::cuda
