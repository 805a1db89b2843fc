// The points of a CUDA kernel: a pointwise kernel's blocks (its independent member groups over
// blocks of their own, each thread's point or spread of points), the vector lanes of a point
// group, and the members' values and stores (CudaCodegen.cpp describes the kernel shapes).
#include "braze/codegen/cuda/CudaEmitter.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/KernelBody.h"
#include "braze/support/Check.h"

#include <algorithm>
#include <map>

namespace braze::codegen::cuda {

void CudaEmitter::emitPointwise(const Kernel &k, const KernelPlan &plan, Writer &w) {
  if (plan.groups <= 1) {
    emitPointwiseBlock(k, plan, w, allMembers(k), "(int64_t)blockIdx.x");
    return;
  }
  // Groups: each independent group's points over blocks of its own, so a thread holds one
  // group's operands (an optimizer's 12 same-sized parameters held 84 arrays a thread).
  emitGroupBlocks(k, std::to_string(plan.block * plan.vec * plan.spread), w);
  emitGroupCases(k, plan.groups, w, [&](const std::vector<const Member *> &members) {
    emitPointwiseBlock(k, plan, w, members, "group_block");
  });
}

void CudaEmitter::emitGroupBlocks(const Kernel &k, const std::string &perBlock, Writer &w) {
  w.line("const int64_t group_blocks = (" + product(k.outerVars) + " + " + perBlock + " - 1) / " +
         perBlock + ";");
  w.line("const int64_t group = (int64_t)blockIdx.x / group_blocks;");
  w.line("const int64_t group_block = (int64_t)blockIdx.x - group * group_blocks;");
}

void CudaEmitter::emitGroupCases(
    const Kernel &k, int groupCount, Writer &w,
    const std::function<void(const std::vector<const Member *> &)> &emit) {
  std::vector<std::vector<Member>> groups = independentMembers(k.steps[0], groupVars(k));
  BRAZE_CHECK(static_cast<int>(groups.size()) == groupCount)
      << k.name << ": launch record of " << groupCount << " groups for " << groups.size();
  w.line("switch (group) {");
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<const Member *> members;
    for (const Member &copy : groups[g])
      for (const Member &m : k.steps[0].members)
        if (m.comp == copy.comp)
          members.push_back(&m);
    w.line("case " + std::to_string(g) + ": {");
    w.indent();
    emit(members);
    w.line("break;");
    w.dedent();
    w.line("}");
  }
  w.line("}");
}

void CudaEmitter::emitPointwiseBlock(const Kernel &k, const KernelPlan &plan, Writer &w,
                                     const std::vector<const Member *> &members,
                                     const std::string &blockIndex) {
  std::set<const Buffer *> writes = written(k);
  SymExpr var = k.outerVars.empty() ? nullptr : k.outerVars.back();
  // The record's block: a record given by hand may make it other than plan-cuda's.
  std::string total = product(k.outerVars), block = std::to_string(plan.block);
  auto emitPoint = [&] { // the members at point `first` (lane 0 of vec)
    std::string base = var ? names_.index(var) + "_base" : "";
    decompose(w, k.outerVars, "first", base);
    Scope outer(nullptr);
    if (var)
      hoistInvariants(w, outer, members, {var}, writes);
    emitLanes(w, outer, members, var, base, plan.vec, writes, {}, "", "");
  };
  if (plan.spread == 1) {
    w.line("const int64_t first = (" + blockIndex + " * " + block + " + threadIdx.x) * " +
           std::to_string(plan.vec) + ";");
    w.line("if (first >= " + total + ") return;");
    emitPoint();
    return;
  }
  // Spread: S points a block apart per thread. In a block whose points all exist, nothing
  // guards them, so their loads are issued together.
  std::string tile = block + " * " + std::to_string(plan.spread);
  w.line("const int64_t tile = " + blockIndex + " * " + tile + ";");
  for (bool whole : {true, false}) {
    w.line(whole ? "if (tile + " + tile + " <= " + total + ") {" : "} else {");
    w.indent();
    w.line("#pragma unroll");
    w.line("for (int u = 0; u < " + std::to_string(plan.spread) + "; ++u) {");
    w.indent();
    w.line("const int64_t first = tile + u * " + block + " + threadIdx.x;");
    if (!whole)
      w.line("if (first >= " + total + ") break;");
    emitPoint();
    w.dedent();
    w.line("}");
    w.dedent();
  }
  w.line("}");
}

void CudaEmitter::emitLanes(Writer &w, Scope &parent, const std::vector<const Member *> &members,
                            SymExpr var, const std::string &base, int vec,
                            const std::set<const Buffer *> &writes,
                            const std::vector<VectorLoad> &cached, const std::string &cacheIndex,
                            const std::string &storeGuard, int step,
                            bool laneAccumulators) {
  // Row values of earlier steps are read from their arrays; this step's are written there.
  auto useCache = [&](Scope &lane, const std::string &slot) {
    for (const VectorLoad &c : cached)
      if (c.step < step)
        lane.remember(c.load, c.array + "[" + slot + "]");
  };
  auto fillCache = [&](Scope &lane, const std::string &slot) {
    for (const VectorLoad &c : cached)
      if (c.step == step)
        if (const std::string *m = lane.memo(c.load))
          w.line(c.array + "[" + slot + "] = " + *m + ";");
  };
  bool anyVector = false;
  if (var && vec > 1) {
    for (const loop::Expr *l : plainLoads(members, writes)) {
      bool isCached = std::any_of(cached.begin(), cached.end(),
                                  [&](const VectorLoad &c) { return c.load == l && c.step < step; });
      anyVector |= !isCached && contiguousIn(l->index(), var, vec);
    }
    for (const Member *m : members)
      anyVector |= m->store && !m->comp->isReduction() && inMemory(*m->comp->out) &&
                   contiguousIn(m->storeIndex, var, vec);
  }
  // One lane after another, each reading memory itself (a single lane when vec == 1).
  auto scalarLanes = [&] {
    for (int j = 0; j < std::max(vec, 1); ++j) {
      w.line("{");
      w.indent();
      if (var)
        w.line("const int64_t " + names_.index(var) + " = " + base + " + " + std::to_string(j) +
               ";");
      Scope lane(&parent);
      std::string slot = cacheIndex + " + " + std::to_string(j);
      useCache(lane, slot);
      setAccLane(laneAccumulators ? j : -1);
      emitMembers(w, lane, members, storeGuard, {});
      setAccLane(-1);
      fillCache(lane, slot);
      w.dedent();
      w.line("}");
    }
  };
  if (!anyVector) {
    scalarLanes();
    return;
  }
  // Vectorizable loads and stores.
  std::vector<VectorLoad> vloads;
  for (const loop::Expr *l : plainLoads(members, writes)) {
    bool isCached = std::any_of(cached.begin(), cached.end(),
                                [&](const VectorLoad &c) { return c.load == l && c.step < step; });
    if (!isCached && contiguousIn(l->index(), var, vec))
      vloads.push_back({l, "vl" + std::to_string(next_++)});
  }
  std::map<const Member *, std::string> vstores;
  for (const Member *m : members)
    if (m->store && !m->comp->isReduction() && inMemory(*m->comp->out) &&
        contiguousIn(m->storeIndex, var, vec))
      vstores[m] = "vs" + std::to_string(next_++);
  std::string n = std::to_string(vec);
  std::string varName = names_.index(var);
  // Pointers at lane 0, for the alignment test and the vector accesses.
  std::vector<std::string> checks;
  auto check = [&](const void *access, const std::string &pointer) {
    std::string c = alignedOnce_.count(access) ? alignedFlag_
                                               : "braze_aligned<" + n + ">(" + pointer + ")";
    if (std::find(checks.begin(), checks.end(), c) == checks.end())
      checks.push_back(c);
  };
  w.line("{");
  w.indent();
  w.line("const int64_t " + varName + " = " + base + ";");
  for (VectorLoad &v : vloads) {
    const Buffer &b = *v.load->buffer();
    w.line("const " + ctype(b.dtype) + "* " + v.array + "_p = " + names_.buffer(b) + " + " +
           names_.index(v.load->index()) + ";");
    check(v.load, v.array + "_p");
  }
  for (auto &[m, arr] : vstores) {
    const Buffer &b = *m->comp->out;
    w.line(ctype(b.dtype) + "* " + arr + "_p = " + names_.buffer(b) + " + " +
           names_.index(m->storeIndex) + ";");
    check(m, arr + "_p");
  }
  std::string aligned = "true";
  for (const std::string &c : checks)
    aligned += " && " + c;
  w.line("if (" + aligned + ") {");
  w.indent();
  for (VectorLoad &v : vloads) {
    std::string t = ctype(v.load->buffer()->dtype);
    w.line("__align__(16) " + t + " " + v.array + "[" + n + "];");
    w.line("braze_vcopy<" + n + ">(" + v.array + ", " + v.array + "_p);");
  }
  for (auto &[m, arr] : vstores)
    w.line("__align__(16) " + ctype(m->comp->out->dtype) + " " + arr + "[" + n + "];");
  for (int j = 0; j < vec; ++j) {
    w.line("{");
    w.indent();
    w.line("const int64_t " + varName + " = " + base + " + " + std::to_string(j) + ";");
    Scope lane(&parent);
    std::string slot = cacheIndex + " + " + std::to_string(j);
    useCache(lane, slot);
    for (const VectorLoad &v : vloads)
      lane.remember(v.load, v.array + "[" + std::to_string(j) + "]");
    std::map<const Member *, std::string> laneStores;
    for (auto &[m, arr] : vstores)
      laneStores[m] = arr + "[" + std::to_string(j) + "]";
    setAccLane(laneAccumulators ? j : -1);
    emitMembers(w, lane, members, storeGuard, laneStores);
    setAccLane(-1);
    fillCache(lane, slot);
    w.dedent();
    w.line("}");
  }
  for (auto &[m, arr] : vstores) {
    std::string st = "braze_vcopy<" + n + ">(" + arr + "_p, " + arr + ");";
    w.line(storeGuard.empty() ? st : "if (" + storeGuard + ") " + st);
  }
  w.dedent();
  w.line("} else {");
  w.indent();
  scalarLanes();
  w.dedent();
  w.line("}");
  w.dedent();
  w.line("}");
}

void CudaEmitter::emitMembers(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                              const std::string &storeGuard, const std::map<const Member *,
                              std::string> &laneStores) {
  ExprWriter ex(w, scope, names_, next_);
  ex.setErrorStatement("*err = 1;");
  for (const Member *m : members) {
    std::string v = ex.emit(m->value);
    const Buffer &b = *m->comp->out;
    if (m->comp->isReduction()) {
      w.line(foldText(*m->comp, v) + ";");
      continue;
    }
    std::string local = names_.local(b) + "_" + std::to_string(next_++);
    w.line("const " + ctype(m->value->dtype()) + " " + local + " = " + v + ";");
    scope.defineLocal(&b, local, m->storeIndex);
    if (!m->store)
      continue;
    std::string value = convert(local, m->value->dtype(), b.dtype);
    auto slot = laneStores.find(m);
    if (slot != laneStores.end()) {
      w.line(slot->second + " = " + value + ";");
      continue;
    }
    std::string st =
        names_.buffer(b) + "[" + names_.pointIndex(m->storeIndex) + "] = " + value + ";";
    w.line(storeGuard.empty() ? st : "if (" + storeGuard + ") " + st);
  }
}

} // namespace braze::codegen::cuda
