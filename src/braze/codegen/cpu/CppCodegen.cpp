/// Emits, for each kernel:
///   1. the buffer pointers and size symbols it uses, as typed locals;
///   2. its outer loops as its record (sched::CpuLaunch, plan-cpu: CpuLaunchPlan.cpp) says:
///      `omp parallel for` (collapsed) over the shared ones, lanes along one, a loop per
///      independent group, or a parallel region whose inner loops are work-shared when there are
///      no outer dims;
///   3. per outer point, its steps in order: a Loop step is one (simd) loop over the inner space
///      that computes pointwise members and folds reductions; a Scalar step computes values once;
///   4. stores for members whose value must reach memory.
/// Values that stay in the kernel live in C++ locals named after their buffer.
/// The kernels that call a library, and accumulating scatters, are CppLibraryKernels.cpp's;
/// the emitter's state is declared in CpuEmitter.h.
#include "braze/codegen/cpu/CppCodegen.h"
#include "braze/codegen/cpu/AttentionPrelude.h"
#include "braze/codegen/cpu/CpuEmitter.h"
#include "braze/codegen/cpu/DnnlPrelude.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/KernelBody.h"
#include "braze/codegen/SpecialMath.h"
#include "braze/ir/loop/Rewrite.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace braze::codegen {

namespace cpu {

GeneratedSource CpuEmitter::run() {
  std::string out = cPrelude();
  out += "#include <omp.h>\n#include <vector>\n\n";
  bool blas = false, dnnl = false, attention = false;
  std::string kernels;
  for (const Kernel &k : s_.kernels) {
    blas |= usesBlas(k) || (k.attention() && !opts_.blas.sgemm.empty());
    dnnl |= usesDnnl(k);
    attention |= k.attention() != nullptr;
    kernels += k.attention() ? emitAttentionKernel(k)
               : k.scatter()   ? emitScatterKernel(k)
               : usesBlas(k)   ? emitGemmKernel(k)
               : usesDnnl(k)   ? emitConvKernel(k)
                               : emitKernel(k, k.name);
  }
  // The special functions are long; only modules that call one of them get them.
  if (kernels.find(kSpecialMathPrefix) != std::string::npos)
    out += specialMathPrelude(false);
  if (dnnl)
    out += dnnlPrelude();
  if (attention)
    out += attentionPrelude(opts_.blas);
  out += kernels;
  if (!opts_.tuneForms.empty())
    out += emitTuneForms();
  out += emitAbi();
  return GeneratedSource{out, static_cast<int>(s_.kernels.size()), blas, dnnl};
}

std::string CpuEmitter::emitTuneForms() {
  std::string out, cases;
  for (size_t i = 0; i < s_.kernels.size(); ++i) {
    auto forms = opts_.tuneForms.find(s_.kernels[i].name);
    if (forms == opts_.tuneForms.end())
      continue;
    for (size_t f = 0; f < forms->second.size(); ++f) {
      Kernel form = s_.kernels[i];
      form.cpuLaunch = forms->second[f];
      std::string name = form.name + "_form" + std::to_string(f);
      out += emitKernel(form, name);
      cases += "  if (kernel == " + std::to_string(i) + " && form == " + std::to_string(f) +
               ") { " + name + "(bufs, syms, err); return 0; }\n";
    }
  }
  return out +
         "typedef void (*braze_tune_hook_t)(int, void* const*, const int64_t*, int*);\n"
         "static braze_tune_hook_t braze_tune_hook = 0;\n"
         "extern \"C\" void braze_set_tune_hook(braze_tune_hook_t h) { braze_tune_hook = h; }\n"
         "extern \"C\" int braze_tune_form(int kernel, int form, void* const* bufs, "
         "const int64_t* syms, int* err) {\n" + cases + "  return 1;\n}\n\n";
}

void CpuEmitter::emitPointers(const Kernel &k, Writer &w) {
  std::set<int> used;
  std::vector<sym::SymExpr> syms;
  collectKernelUses(k, names_, used, syms);
  for (int id : used) {
    const Buffer &b = *s_.program->buffers()[id];
    if (s_.placement.at(id).kind == PlacementKind::Local)
      continue;
    bool isConst = b.kind == loop::BufferKind::Input;
    // bool elements are read and written as bytes: GCC does not vectorize loops that store
    // `bool` (a mask type to it), and values convert to and from bool as they are used.
    std::string ty = b.dtype == DType::Bool ? "uint8_t" : ctype(b.dtype);
    w.line(std::string(isConst ? "const " : "") + ty + "* __restrict " + names_.buffer(b) +
           " = (" + (isConst ? "const " : "") + ty + "*)bufs[" + std::to_string(id) + "];");
  }
  for (sym::SymExpr sy : syms)
    w.line("const int64_t " + names_.symbol(sy) + " = syms[" +
           std::to_string(names_.symbolIndex(sy)) + "];");
}

std::string CpuEmitter::emitKernel(const Kernel &k, const std::string &name) {
  next_ = 0;
  kernel_ = &k;
  std::string body;
  Writer w(body, 1);
  // 1. Pointers and sizes.
  emitPointers(k, w);
  std::string work = "INT64_C(1)";
  for (sym::SymExpr v : k.outerVars)
    work += " * " + names_.index(v->extent());
  for (sym::SymExpr v : k.innerVars)
    work += " * " + names_.index(v->extent());
  w.line("const int64_t work = " + work + ";");
  w.line("(void)work;");
  // 2-4, as the kernel's record says.
  BRAZE_CHECK(k.cpuLaunch) << k.name << " has no cpu record (plan-cpu did not run)";
  const sched::CpuLaunch &l = *k.cpuLaunch;
  switch (l.shape) {
  case sched::CpuLaunch::Shape::Region:
    emitWithoutOuter(k, w);
    break;
  case sched::CpuLaunch::Shape::Lanes:
    lanes_ = l.lanes;
    emitWithLanes(k, w, static_cast<size_t>(l.along));
    break;
  case sched::CpuLaunch::Shape::Outer:
  case sched::CpuLaunch::Shape::Groups:
    emitWithOuter(k, w, l);
    break;
  }
  return "static void " + name +
         "(void* const* bufs, const int64_t* syms, int* err) {\n" + body + "}\n\n";
}

std::string CpuEmitter::loopHead(sym::SymExpr v) {
  std::string n = names_.index(v);
  return "for (int64_t " + n + " = 0; " + n + " < " + names_.index(v->extent()) + "; ++" + n + ")";
}

std::string CpuEmitter::simdClause(const Step &st) {
  std::string clauses;
  for (const Member &m : st.members) {
    if (!m.comp->isReduction())
      continue;
    const char *op = "+";
    switch (m.comp->reduce) {
    case ReduceKind::Sum:
      op = "+";
      break;
    case ReduceKind::Prod:
      op = "*";
      break;
    case ReduceKind::Max:
      op = "max";
      break;
    case ReduceKind::Min:
      op = "min";
      break;
    case ReduceKind::Any:
      op = "||";
      break;
    case ReduceKind::All:
      op = "&&";
      break;
    case ReduceKind::ArgMax:
    case ReduceKind::ArgMin:
      return ""; // the first position of the extreme: a sequential fold
    case ReduceKind::None:
      break;
    }
    clauses += std::string(" reduction(") + op + ": " + accOf(*m.comp) + ")";
    if (tracksNan(*m.comp))
      clauses += " reduction(|: " + nanFlag(*m.comp) + ")";
  }
  return "#pragma omp simd" + clauses;
}

bool CpuEmitter::tracksNan(const loop::Computation &c) {
  return (c.reduce == ReduceKind::Max || c.reduce == ReduceKind::Min) &&
         isFloating(c.value->dtype());
}

std::string CpuEmitter::innerPosition() {
  std::string pos = "INT64_C(0)";
  for (sym::SymExpr v : kernel_->innerVars)
    pos = "(" + pos + " * " + names_.index(v->extent()) + " + " + names_.index(v) + ")";
  return pos;
}

void CpuEmitter::declareAccumulator(const Member &m, Writer &w) {
  w.line(accType(*m.comp) + " " + names_.acc(*m.comp) + " = " + accumulatorInit(*m.comp) + ";");
  if (isArgReduction(*m.comp))
    w.line("int64_t " + argIndex(*m.comp) + " = 0;");
  if (tracksNan(*m.comp))
    w.line("int " + nanFlag(*m.comp) + " = 0;");
}

void CpuEmitter::applyNanFlags(const Step &st, Writer &w) {
  for (const Member &m : st.members)
    if (m.comp->isReduction() && tracksNan(*m.comp))
      w.line("if (" + nanFlag(*m.comp) + lane_ + ") " + names_.acc(*m.comp) + lane_ +
             " = std::numeric_limits<" + ctype(m.comp->value->dtype()) + ">::quiet_NaN();");
}

std::string CpuEmitter::accFold(const loop::Computation &c, const std::string &acc,
                                const std::string &v) {
  if (isArgReduction(c)) { // selects, not a branch: the values' order is unpredictable
    std::string at = argIndex(c) + lane_;
    return "{ const bool braze_take = " + argBetter(c, acc, v) + "; " + acc +
           " = braze_take ? " + v + " : " + acc + "; " + at + " = braze_take ? (int64_t)" +
           innerPosition() + " : " + at + "; }";
  }
  if (c.reduce == ReduceKind::Max || c.reduce == ReduceKind::Min) {
    std::string cmp = c.reduce == ReduceKind::Max ? " > " : " < ";
    std::string fold = acc + " = " + v + cmp + acc + " ? " + v + " : " + acc;
    return tracksNan(c) ? fold + "; " + nanFlag(c) + lane_ + " |= (" + v + " != " + v + ")"
                        : fold;
  }
  return accumulatorUpdate(c, acc, v);
}

void CpuEmitter::emitWithOuter(const Kernel &k, Writer &w, const sched::CpuLaunch &l) {
  bool scalarOnly = k.innerVars.empty();
  size_t n = k.outerVars.size();
  size_t parallelDims = static_cast<size_t>(l.parallel);
  std::string collapse = parallelDims > 1 ? " collapse(" + std::to_string(parallelDims) + ")" : "";
  Scope top(nullptr);
  std::vector<const Step *> steps;
  for (const Step &st : k.steps)
    steps.push_back(&st);
  hoistLoads(k, steps, allVars(k), w, top);
  if (l.shape == sched::CpuLaunch::Shape::Groups) {
    emitGroups(k, w, top);
    return;
  }
  if (parallelDims > 0)
    w.line(std::string("#pragma omp parallel for") + (l.simd ? " simd" : "") + collapse +
           " if(work >= " + std::to_string(s_.target.minParallelWork) + ")");
  for (size_t i = 0; i < n; ++i) {
    // Without inner loops, the innermost outer loop vectorizes where it is not shared.
    if (scalarOnly && i == n - 1 && i >= parallelDims)
      w.line("#pragma omp simd");
    w.line(loopHead(k.outerVars[i]) + " {");
    w.indent();
  }
  Scope outer(&top);
  for (const Step &st : k.steps) {
    if (st.kind == StepKind::Scalar) {
      emitMembers(st, w, outer);
      continue;
    }
    for (const Member &m : st.members)
      if (m.comp->isReduction())
        declareAccumulator(m, w);
    hoistLoads(k, {&st}, k.innerVars, w, outer);
    size_t n = k.innerVars.size();
    for (size_t i = 0; i + 1 < n; ++i) {
      w.line(loopHead(k.innerVars[i]) + " {");
      w.indent();
    }
    sym::SymExpr last = k.innerVars[n - 1];
    openInnermost(st, w, last, "0", names_.index(last->extent()));
    Scope inner(&outer);
    emitMembers(st, w, inner);
    closeInnermost(st, w);
    for (size_t i = 0; i + 1 < n; ++i) {
      w.dedent();
      w.line("}");
    }
    applyNanFlags(st, w);
    finishReductions(st, w, outer, "");
  }
  for (size_t i = 0; i < n; ++i) {
    w.dedent();
    w.line("}");
  }
}

void CpuEmitter::emitGroups(const Kernel &k, Writer &w, Scope &top) {
  std::vector<std::vector<Member>> groups = independentMembers(k.steps[0], k.outerVars);
  BRAZE_CHECK(groups.size() >= 2) << k.name << ": a groups record for one group";
  w.line("#pragma omp parallel if(work >= " + std::to_string(s_.target.minParallelWork) + ")");
  w.line("{");
  w.indent();
  for (std::vector<Member> &members : groups) {
    w.line("#pragma omp for simd nowait");
    w.line(loopHead(k.outerVars[0]) + " {");
    w.indent();
    Scope scope(&top);
    emitMembers(Step{StepKind::Scalar, std::move(members), {}}, w, scope);
    w.dedent();
    w.line("}");
  }
  w.dedent();
  w.line("}");
}

std::optional<size_t> CpuEmitter::laneVar(const Kernel &k) {
  if (k.innerVars.empty() || k.standsAlone())
    return std::nullopt;
  sym::SymExpr y = k.innerVars.back();
  bool innerContiguous = false;
  std::vector<int> along(k.outerVars.size(), 0);
  for (const Step &st : k.steps) {
    if (st.kind != StepKind::Loop)
      continue;
    for (const Member &m : st.members) {
      loop::forEachLoad(m.value, [&](const loop::Expr *ld) {
        if (!ld->indirect().empty())
          return;
        std::optional<int64_t> cy = sym::linearCoefficient(ld->index(), y);
        innerContiguous |= cy && *cy == 1;
        for (size_t i = 0; i < k.outerVars.size(); ++i) {
          std::optional<int64_t> c = sym::linearCoefficient(ld->index(), k.outerVars[i]);
          along[i] += c && *c == 1;
        }
      });
    }
  }
  if (innerContiguous)
    return std::nullopt;
  for (size_t i = k.outerVars.size(); i-- > 0;)
    if (along[i] > 0)
      return i;
  return std::nullopt;
}

void CpuEmitter::hoistLoads(const Kernel &k, const std::vector<const Step *> &steps,
                            const std::vector<sym::SymExpr> &vars, Writer &w, Scope &scope) {
  std::set<const Buffer *> written;
  for (const Step &st : k.steps)
    for (const Member &m : st.members)
      written.insert(m.comp->out);
  ExprWriter ex(w, scope, names_, next_);
  auto visit = [&](const loop::Expr *ld) {
    if (!ld->indirect().empty() || written.count(ld->buffer()) || mentionsAny(ld->index(), vars))
      return;
    ex.emit(ld);
  };
  for (const Step *st : steps) {
    for (const Member &m : st->members)
      loop::forEachLoad(m.value, visit);
    for (const sched::Stash &sh : st->stashes)
      loop::forEachLoad(sh.value, visit);
  }
}

std::vector<sym::SymExpr> CpuEmitter::allVars(const Kernel &k) {
  std::vector<sym::SymExpr> vars = k.outerVars;
  vars.insert(vars.end(), k.innerVars.begin(), k.innerVars.end());
  return vars;
}

void CpuEmitter::declareLaneLocals(const Step &st, Writer &w) {
  std::string n = "[" + std::to_string(lanes_) + "]";
  for (const Member &m : st.members) {
    const loop::Computation &c = *m.comp;
    if (!c.isReduction()) {
      w.line(ctype(m.value->dtype()) + " " + names_.local(*c.out) + n + ";");
      continue;
    }
    w.line(accType(c) + " " + names_.acc(c) + n + ";");
    if (isArgReduction(c))
      w.line("int64_t " + argIndex(c) + n + ";");
    if (tracksNan(c))
      w.line("int " + nanFlag(c) + n + ";");
    DType localType = isArgReduction(c) ? DType::Int64 : m.value->dtype();
    w.line(ctype(localType) + " " + names_.local(*c.out) + n + ";");
  }
}

void CpuEmitter::emitWithLanes(const Kernel &k, Writer &w, size_t laneIndex) {
  sym::SymExpr lane = k.outerVars[laneIndex];
  std::string x = names_.index(lane), xb = x + "b", extent = names_.index(lane->extent());
  std::vector<sym::SymExpr> rest;
  for (size_t i = 0; i < k.outerVars.size(); ++i)
    if (i != laneIndex)
      rest.push_back(k.outerVars[i]);
  std::string blockHead = "for (int64_t " + xb + " = 0; " + xb + " < " + extent + "; " + xb +
                          " += " + std::to_string(lanes_) + ") {";
  std::string parallel = "#pragma omp parallel for";
  if (rest.size() > 1)
    parallel += " collapse(" + std::to_string(rest.size()) + ")";
  w.line(parallel + " if(work >= " + std::to_string(s_.target.minParallelWork) + ")");
  for (sym::SymExpr v : rest) {
    w.line(loopHead(v) + " {");
    w.indent();
  }
  w.line(blockHead);
  w.indent();
  w.line("const int64_t " + x + "e = braze_imin(" + extent + ", " + xb + " + " +
         std::to_string(lanes_) + ");");
  std::string laneLoop =
      "for (int64_t " + x + " = " + xb + "; " + x + " < " + x + "e; ++" + x + ") {";
  lane_ = "[" + x + " - " + xb + "]";
  auto openLanes = [&] {
    w.line("#pragma omp simd");
    w.line(laneLoop);
    w.indent();
  };
  auto close = [&] {
    w.dedent();
    w.line("}");
  };
  Scope outer(nullptr);
  for (const Step &st : k.steps) {
    declareLaneLocals(st, w);
    if (st.kind == StepKind::Scalar) {
      openLanes();
      Scope body(&outer);
      emitMembers(st, w, body, "", &outer);
      close();
      continue;
    }
    openLanes();
    for (const Member &m : st.members) {
      const loop::Computation &c = *m.comp;
      if (!c.isReduction())
        continue;
      w.line(names_.acc(c) + lane_ + " = " + accumulatorInit(c) + ";");
      if (isArgReduction(c))
        w.line(argIndex(c) + lane_ + " = 0;");
      if (tracksNan(c))
        w.line(nanFlag(c) + lane_ + " = 0;");
    }
    close();
    for (sym::SymExpr v : k.innerVars) {
      w.line(loopHead(v) + " {");
      w.indent();
    }
    openLanes();
    Scope body(&outer);
    emitMembers(st, w, body);
    close();
    for (size_t i = 0; i < k.innerVars.size(); ++i)
      close();
    openLanes();
    applyNanFlags(st, w);
    finishReductions(st, w, outer, "");
    close();
  }
  lane_.clear();
  close(); // the block
  for (size_t i = 0; i < rest.size(); ++i)
    close();
}

void CpuEmitter::emitWithoutOuter(const Kernel &k, Writer &w) {
  w.line("const int nthreads = work >= " + std::to_string(s_.target.minParallelWork) +
         " ? std::min(omp_get_max_threads(), 256) : 1;");
  // Per-thread partial results, combined in thread order (deterministic).
  for (const Step &st : k.steps)
    for (const Member &m : st.members)
      if (m.comp->isReduction()) {
        w.line(accType(*m.comp) + " " + names_.acc(*m.comp) + "_part[256];");
        if (isArgReduction(*m.comp))
          w.line("int64_t " + argIndex(*m.comp) + "_part[256];");
      }
  w.line("#pragma omp parallel num_threads(nthreads)");
  w.line("{");
  w.indent();
  w.line("const int tid = omp_get_thread_num();");
  w.line("(void)tid;");
  Scope region(nullptr);
  for (const Step &st : k.steps) {
    if (st.kind == StepKind::Scalar) {
      emitMembers(st, w, region, "tid == 0");
      continue;
    }
    bool hasReduction = false;
    for (const Member &m : st.members)
      if (m.comp->isReduction()) {
        hasReduction = true;
        declareAccumulator(m, w);
      }
    hoistLoads(k, {&st}, k.innerVars, w, region);
    size_t n = k.innerVars.size();
    if (n == 1) {
      // One inner dim: each thread takes a contiguous chunk and folds it with simd.
      sym::SymExpr v = k.innerVars[0];
      std::string name = names_.index(v), extent = names_.index(v->extent());
      w.line("{");
      w.indent();
      w.line("const int64_t chunk = (" + extent + " + nthreads - 1) / nthreads;");
      w.line("const int64_t lo = std::min<int64_t>(" + extent + ", tid * chunk);");
      w.line("const int64_t hi = std::min<int64_t>(" + extent + ", lo + chunk);");
      openInnermost(st, w, v, "lo", "hi");
    } else {
      // Several inner dims: the threads share all but the last, which each folds with simd.
      w.line(std::string("#pragma omp for") +
             (n > 2 ? " collapse(" + std::to_string(n - 1) + ")" : "") +
             (hasReduction ? " nowait" : ""));
      for (size_t i = 0; i + 1 < n; ++i) {
        w.line(loopHead(k.innerVars[i]) + " {");
        w.indent();
      }
      sym::SymExpr last = k.innerVars[n - 1];
      openInnermost(st, w, last, "0", names_.index(last->extent()));
    }
    Scope inner(&region);
    emitMembers(st, w, inner);
    closeInnermost(st, w);
    for (size_t i = 0; i + 1 < std::max<size_t>(n, 2); ++i) {
      w.dedent();
      w.line("}"); // the chunk's block, or the shared loops
    }
    if (n == 1 && !hasReduction)
      w.line("#pragma omp barrier");
    if (hasReduction) {
      applyNanFlags(st, w);
      for (const Member &m : st.members)
        if (m.comp->isReduction()) {
          w.line(names_.acc(*m.comp) + "_part[tid] = " + names_.acc(*m.comp) + ";");
          if (isArgReduction(*m.comp))
            w.line(argIndex(*m.comp) + "_part[tid] = " + argIndex(*m.comp) + ";");
        }
      w.line("#pragma omp barrier");
      for (const Member &m : st.members)
        if (m.comp->isReduction())
          combinePartials(*m.comp, w);
      finishReductions(st, w, region, "tid == 0");
      w.line("#pragma omp barrier");
    }
  }
  w.dedent();
  w.line("}");
}

void CpuEmitter::combinePartials(const loop::Computation &c, Writer &w) {
  std::string acc = names_.acc(c);
  w.line(acc + " = " + accumulatorInit(c) + ";");
  if (isArgReduction(c)) {
    w.line(argIndex(c) + " = 0;");
    w.line("for (int t = 0; t < nthreads; ++t) if " + argBetter(c, acc, acc + "_part[t]") +
           " { " + acc + " = " + acc + "_part[t]; " + argIndex(c) + " = " + argIndex(c) +
           "_part[t]; }");
    return;
  }
  w.line("for (int t = 0; t < nthreads; ++t) " + accumulatorUpdate(c, acc, acc + "_part[t]") + ";");
}

bool CpuEmitter::foldsInBlocks(const loop::Computation &c) {
  return c.reduce == ReduceKind::Sum && c.value->dtype() == DType::Float32;
}

std::string CpuEmitter::accOf(const loop::Computation &c) {
  auto it = blockAcc_.find(&c);
  return it == blockAcc_.end() ? names_.acc(c) + lane_ : it->second;
}

void CpuEmitter::openInnermost(const Step &st, Writer &w, sym::SymExpr v, const std::string &lo,
                               const std::string &hi) {
  std::string name = names_.index(v);
  blockAcc_.clear();
  bool vectorizes = !simdClause(st).empty();
  for (const Member &m : st.members)
    if (vectorizes && foldsInBlocks(*m.comp))
      blockAcc_[m.comp] = names_.acc(*m.comp) + "_blk";
  blocked_ = !blockAcc_.empty();
  if (blocked_) {
    std::string b = name + "b";
    w.line("for (int64_t " + b + " = " + lo + "; " + b + " < " + hi + "; " + b + " += " +
           std::to_string(kSumBlock) + ") {");
    w.indent();
    for (const Member &m : st.members)
      if (blockAcc_.count(m.comp))
        w.line("float " + blockAcc_[m.comp] + " = 0;");
    w.line(simdClause(st));
    w.line("for (int64_t " + name + " = " + b + "; " + name + " < braze_imin(" + hi + ", " + b +
           " + " + std::to_string(kSumBlock) + "); ++" + name + ") {");
  } else {
    if (std::string clause = simdClause(st); !clause.empty())
      w.line(clause);
    w.line("for (int64_t " + name + " = " + lo + "; " + name + " < " + hi + "; ++" + name + ") {");
  }
  w.indent();
}

void CpuEmitter::closeInnermost(const Step &st, Writer &w) {
  w.dedent();
  w.line("}");
  if (!blocked_)
    return;
  for (const Member &m : st.members)
    if (auto it = blockAcc_.find(m.comp); it != blockAcc_.end())
      w.line(names_.acc(*m.comp) + " += " + it->second + ";");
  w.dedent();
  w.line("}");
  blockAcc_.clear();
  blocked_ = false;
}

std::string CpuEmitter::accType(const loop::Computation &c) {
  DType t = c.value->dtype();
  if (c.reduce == ReduceKind::Sum && isFloating(t))
    return "double";
  return ctype(t);
}

void CpuEmitter::emitMembers(const Step &st, Writer &w, Scope &scope,
                             const std::string &storeGuard, Scope *exportTo) {
  ExprWriter ex(w, scope, names_, next_);
  for (const Member &m : st.members) {
    std::string v = ex.emit(m.value);
    const Buffer &b = *m.comp->out;
    if (m.comp->isReduction()) {
      w.line(accFold(*m.comp, accOf(*m.comp), v) + ";");
      continue;
    }
    std::string local = names_.local(b);
    if (exportTo) {
      local += lane_;
      w.line(local + " = " + v + ";");
      exportTo->defineLocal(&b, local, m.storeIndex);
    } else {
      w.line("const " + ctype(m.value->dtype()) + " " + local + " = " + v + ";");
      scope.defineLocal(&b, local, m.storeIndex);
    }
    if (m.store) {
      std::string st2 = names_.buffer(b) + "[" + names_.index(m.storeIndex) +
                        "] = " + convert(local, m.value->dtype(), b.dtype) + ";";
      w.line(storeGuard.empty() ? st2 : "if (" + storeGuard + ") " + st2);
    }
  }
  for (const sched::Stash &sh : st.stashes)
    w.line(names_.buffer(*sh.buffer) + "[" + names_.index(sh.index) +
           "] = " + convert(ex.emit(sh.value), sh.value->dtype(), sh.buffer->dtype) + ";");
}

void CpuEmitter::finishReductions(const Step &st, Writer &w, Scope &scope,
                                  const std::string &storeGuard) {
  for (const Member &m : st.members) {
    if (!m.comp->isReduction())
      continue;
    const Buffer &b = *m.comp->out;
    std::string local = names_.local(b);
    DType localType = isArgReduction(*m.comp) ? DType::Int64 : m.value->dtype();
    std::string value = (isArgReduction(*m.comp) ? argIndex(*m.comp) : names_.acc(*m.comp)) + lane_;
    if (lane_.empty()) {
      w.line("const " + ctype(localType) + " " + local + " = (" + ctype(localType) + ")" +
             value + ";");
    } else {
      local += lane_; // an array declared before the lane loop (declareLaneLocals)
      w.line(local + " = (" + ctype(localType) + ")" + value + ";");
    }
    scope.defineLocal(&b, local, m.storeIndex);
    if (m.store) {
      std::string st2 = names_.buffer(b) + "[" + names_.index(m.storeIndex) +
                        "] = " + convert(local, localType, b.dtype) + ";";
      w.line(storeGuard.empty() ? st2 : "if (" + storeGuard + ") " + st2);
    }
  }
}

std::string CpuEmitter::emitAbi() {
  std::vector<std::string> calls;
  for (size_t i = 0; i < s_.kernels.size(); ++i)
    calls.push_back((opts_.tuneForms.empty() ? ""
                                             : "if (braze_tune_hook) braze_tune_hook(" +
                                                   std::to_string(i) + ", bufs, syms, &err); ") +
                    s_.kernels[i].name + "(bufs, syms, &err);");
  return emitModuleAbi(s_, names_, calls);
}

} // namespace cpu

std::string blasDeclarations(const BlasSymbols &blas, DType t) {
  std::string fn = t == DType::Float32 ? blas.sgemm : blas.dgemm;
  std::string idx = blas.indexBits == 64 ? "int64_t" : "int";
  std::string ty = ctype(t);
  if (blas.fortran64) {
    // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: the operands swap.
    std::string f = t == DType::Float32 ? "sgemm_64_" : "dgemm_64_";
    std::string guard = "BRAZE_" + fn;
    return "#ifndef " + guard + "\n#define " + guard + "\nextern \"C\" void " + f +
           "(const char*, const char*, const int64_t*, const int64_t*, const int64_t*, const " +
           ty + "*, const " + ty + "*, const int64_t*, const " + ty + "*, const int64_t*, const " +
           ty + "*, " + ty + "*, const int64_t*);\n"
           "static inline void " + fn + "(int, int ta, int tb, int64_t m, int64_t n, int64_t k, " +
           ty + " alpha, const " + ty + "* a, int64_t lda, const " + ty + "* b, int64_t ldb, " +
           ty + " beta, " + ty + "* c, int64_t ldc) {\n"
           "  const char fa = ta == 112 ? 'T' : 'N', fb = tb == 112 ? 'T' : 'N';\n"
           "  " + f + "(&fb, &fa, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);\n"
           "}\n#endif\n";
  }
  std::string out = "extern \"C\" void " + fn + "(int, int, int, " + idx + ", " + idx + ", " +
                    idx + ", " + ty + ", const " + ty + "*, " + idx + ", const " + ty + "*, " +
                    idx + ", " + ty + ", " + ty + "*, " + idx + ");\n";
  if (!blas.setThreads.empty())
    out += "extern \"C\" void " + blas.setThreads + "(int);\n";
  return out;
}

GeneratedSource generateCpu(const sched::Schedule &s, const CpuCodegenOptions &opts) {
  return cpu::CpuEmitter(s, opts).run();
}

} // namespace braze::codegen
