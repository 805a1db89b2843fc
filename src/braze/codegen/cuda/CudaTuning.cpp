// The autotuner's side of plan-cuda: the forms of a loop kernel worth timing (variations of
// its launch record that its code can run) and the kernel's function under each.
#include "braze/codegen/cuda/CudaEmitter.h"

#include "braze/support/Check.h"

#include <algorithm>
#include <set>

namespace braze::codegen {

namespace cuda {

namespace {
constexpr size_t kMaxForms = 12; ///< a kernel's forms, its own record included
} // namespace

/// What is varied was measured on an H200 (BRAZE_AUTOTUNE_NEAR_BOUND=1, every form of 119
/// functions of the kernel suite and five models timed): dropping any one kind of variation,
/// how many functions' chosen forms would have been slower. The block alone (pointwise, 144
/// offered; rows per block, 101) and persistent rows turned off (32) never won, and are not
/// offered; lanes (pointwise 6 functions, rows 6), points per thread (5), threads per row (13),
/// persistent rows turned on (3) and the column forms (19 of 31 functions) did.
std::vector<sched::CudaLaunch> CudaEmitter::launchCandidates(const Kernel &k) {
  const sched::CudaLaunch base = k.cudaLaunch ? *k.cudaLaunch : planLaunch(k);
  const int most = s_.target.maxThreadsPerBlock;
  const bool rows = !k.innerVars.empty();
  std::vector<sched::CudaLaunch> raw{base};
  auto with = [&](const auto &change) {
    sched::CudaLaunch l = base;
    change(l);
    raw.push_back(l);
  };
  if (!rows) {
    for (int v : {1, 2, 4, 8, 16})
      with([&](sched::CudaLaunch &l) { l.vec = v, l.spread = v > 1 ? 1 : l.spread; });
    for (int sp : {2, 4, 8, 1})
      with([&](sched::CudaLaunch &l) { l.spread = sp, l.vec = 1; });
    if (base.groups > 1)
      with([](sched::CudaLaunch &l) { l.groups = 1; });
  } else if (base.columns) {
    // Column lanes as planned, then one column a thread (persistent only there).
    for (int v : {base.vec, 1})
      for (bool persistent : {base.persistent, false})
        for (int r : {2, 8, 32})
          for (int b : {256, 1024})
            with([&](sched::CudaLaunch &l) {
              l.vec = v, l.columnRows = r, l.block = b, l.threads = b / r;
              l.persistent = persistent && v == 1;
            });
  } else {
    for (int t : {base.threads / 2, base.threads * 2, base.threads / 4, base.threads * 4})
      if (t >= 1 && t <= most)
        with([&](sched::CudaLaunch &l) {
          l.threads = t, l.block = std::max(t, base.block);
        });
    for (int v : {1, 2, 4, 8})
      with([&](sched::CudaLaunch &l) { l.vec = v; });
    if (!base.persistent)
      with([](sched::CudaLaunch &l) { l.persistent = true; });
  }
  if (rows) {
    int groups = memberGroups(k);
    if (groups > 1)
      with([&](sched::CudaLaunch &l) {
        l.groups = l.groups > 1 ? 1 : groups;
        l.persistent = l.persistent && l.groups == 1;
      });
  }
  std::vector<sched::CudaLaunch> out;
  std::vector<std::string> seen;
  for (sched::CudaLaunch l : raw) {
    // A record as braze-opt --launch reads it: iterations only with persistent rows, which
    // completeLaunch derives again from the threads and lanes.
    l.length = 0;
    if (!rows)
      l.threads = 0;
    if (!l.persistent)
      l.iters = 0, l.ragged = false;
    else if (SymExpr length = points(k.innerVars); length->isConst())
      setRowIterations(l, length->value());
    if (!completeLaunch(k, l).empty())
      continue;
    std::string text = sched::launchText(l, rows);
    if (std::find(seen.begin(), seen.end(), text) != seen.end())
      continue;
    seen.push_back(text);
    out.push_back(l);
    if (out.size() == kMaxForms)
      break;
  }
  return out;
}

std::string CudaEmitter::variantFunction(const Kernel &k, const sched::CudaLaunch &l,
                                         const std::string &name) {
  Kernel form = k;
  form.name = name;
  form.cudaLaunch = l;
  return emitKernel(form, planOf(form));
}

int64_t CudaEmitter::formBlocks(const Kernel &k, const sched::CudaLaunch &l) {
  SymExpr count = points(k.outerVars);
  if (!count->isConst())
    return -1;
  // As launchCall: points per block are block x vec x spread (pointwise), or rows.
  int64_t per = k.innerVars.empty() ? int64_t(l.block) * l.vec * l.spread : rowsPerBlock(l);
  return (count->value() + per - 1) / per * l.groups;
}

} // namespace cuda

CudaKernelForms cudaKernelForms(const sched::Schedule &s, const std::string &kernel,
                                const std::string &prefix) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cuda) << "kernel forms need a CUDA target";
  auto k = std::find_if(s.kernels.begin(), s.kernels.end(),
                        [&](const sched::Kernel &x) { return x.name == kernel; });
  CudaKernelForms out;
  if (k == s.kernels.end() || !k->cudaLaunch || k->attention() || k->scatter())
    return out;
  cuda::CudaEmitter e(s, {});
  for (const sched::CudaLaunch &l : e.launchCandidates(*k)) {
    CudaKernelForm f;
    f.launch = l;
    f.name = prefix + std::to_string(out.forms.size());
    f.function = e.variantFunction(*k, l, f.name);
    f.blocks = e.formBlocks(*k, l);
    f.threads = l.block;
    out.forms.push_back(std::move(f));
  }
  // As launchBlocks (CudaHost.cpp) passes them.
  Names names(s);
  std::set<int> used;
  std::vector<sym::SymExpr> syms;
  collectKernelUses(*k, names, used, syms);
  std::set<const loop::Buffer *> writes;
  for (const sched::Step &st : k->steps)
    for (const sched::Member &m : st.members)
      writes.insert(m.comp->out);
  for (int id : used)
    if (s.placement.at(id).kind != sched::PlacementKind::Local) {
      const loop::Buffer *b = s.program->buffers()[id].get();
      out.buffers.push_back(b);
      out.written.push_back(writes.count(b) > 0);
    }
  return out;
}

std::string cudaProgram(const std::string &functions) {
  return cuda::CudaEmitter::program(functions);
}

} // namespace braze::codegen
