/// Emits one __global__ function per schedule kernel, in one of two shapes:
///   1. Pointwise (no inner space): the outer space is flattened; each thread computes VEC
///      consecutive points of the innermost outer dim ("lanes"), reading and writing operands
///      that are contiguous along it as whole 16-byte words when they are aligned. A large
///      kernel without lanes gives each thread several points a block apart ("spread"), and
///      independent groups of members run over blocks of their own ("groups"). Pointwise
///      kernels, lanes and members are CudaPoints.cpp's.
///   2. Row kernels (an inner space): a group of T threads owns one outer point (a row) and a
///      block holds BLOCK / T rows. Each Loop step strides over the row VEC elements at a time,
///      each thread folds its elements, and the group combines the partial results with warp
///      shuffles (and shared memory across the warps of a group), in a fixed order. When the
///      row fits the register budget (rows per block x row length x cached operands x element
///      size <= the target's budget) the loop is unrolled and every operand that more than one
///      step reads is loaded once into registers ("persistent"); otherwise the loop re-reads.
///      Rows whose elements lie apart in memory while neighbouring rows are neighbours (sums
///      per column) run in column mode: a block's neighbouring threads take neighbouring rows.
/// A kernel that is a matrix product also gets a host-side call of cuBLASLt through the
/// runtime, with the loop kernel as the fallback for layouts cuBLASLt does not take (the host
/// text is in CudaHost.cpp).
/// Launch planning (plan-cuda) is CudaLaunchPlan.cpp's; the emitter's state is declared in
/// CudaEmitter.h.
#include "braze/codegen/cuda/CudaCodegen.h"
#include "braze/codegen/cuda/CudaEmitter.h"

#include "braze/codegen/cuda/CudaAttention.h"
#include "braze/codegen/CFamily.h"
#include "braze/codegen/cuda/CudaHost.h"
#include "braze/codegen/cuda/KernelText.h"
#include "braze/codegen/KernelBody.h"
#include "braze/codegen/SpecialMath.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <map>
#include <optional>

namespace braze::codegen {

namespace cuda {

namespace {
/// Launched last in a module whose kernels check indices (CudaEmitter::run).
const char *kIndexGuardKernel = R"GUARD(
extern "C" __global__ void braze_index_guard(const int* __restrict__ err) {
  if (*(volatile const int*)err)
    __assertfail("braze: an index is out of bounds (gather/indexing/scatter with an index "
                 "outside the dim)", "braze", 0, "braze_index_guard", 1);
}
)GUARD";
} // namespace

CudaGeneratedSource CudaEmitter::run() {
  CudaGeneratedSource out;
  std::vector<std::string> calls;
  // Kernels whose text is the same but for their name and numbered names (a layer repeated
  // N times) are one function, compiled once: the launches of the others call the first,
  // which is emitted as generated. A function that only runs where a library declines its
  // call (a GEMM's, a convolution's or a cuDNN attention's own kernel) is deferred.
  std::map<std::string, std::string> unique; // canonical text -> the function's name
  std::vector<std::pair<std::string, std::string>> functions; // name, text, in source order
  std::set<std::string> needed; // functions some launch runs unconditionally
  auto add = [&](const Kernel &k, const std::string &text, bool fallbackOnly) {
    std::string canonical = canonicalKernel(text, k.name);
    auto [it, fresh] = unique.emplace(canonical, k.name);
    out.kernels.push_back(it->second);
    if (fresh)
      functions.emplace_back(k.name, text);
    if (!fallbackOnly)
      needed.insert(it->second);
  };
  for (const Kernel &k : s_.kernels) {
    int index = static_cast<int>(out.kernels.size());
    if (k.attention()) {
      // A written-out softmax (not safe) gives nan for a row whose every key is masked,
      // where cuDNN averages the row: such a masked attention runs braze's kernel. cuDNN
      // takes the output (with its log-sum-exp beside it), and the three gradients when one
      // kernel writes them; a lone log-sum-exp or gradient runs braze's kernel.
      const loop::AttentionSpec &spec = *k.attention()->attention();
      if (spec.seed) // decompose keeps dropout whole only for the CPU (fusedAttentionDropout)
        BRAZE_USER_ERROR("attention", k.name)
            << "CUDA's fused attention kernels have no dropout; a loop program for CUDA must "
               "write it out";
      bool cudnn = opts_.cudnnAttention &&
                   (spec.part == loop::AttentionPart::Output || k.attentionGradQ()) &&
                   (!spec.bias || spec.safe);
      add(k, emitCudaAttentionKernel(names_, k, params(k), s_.target), cudnn);
      std::string launch = cudaAttentionLaunch(s_, names_, k, k, index);
      if (k.attentionGradQ()) { // braze's own backward is two kernels: k's and v's, then q's
        Kernel q = gradQKernel(k);
        add(q, emitCudaAttentionKernel(names_, q, params(k), s_.target), cudnn);
        launch += " if (!err) " + cudaAttentionLaunch(s_, names_, q, k, index + 1);
      }
      if (cudnn) {
        out.usesCudnn = true;
        launch = k.attentionGradQ() ? attentionGradStatement(names_, k, launch)
                                    : attentionStatement(names_, k, launch);
      }
      calls.push_back(launch);
      continue;
    }
    if (k.scatter()) {
      add(k, emitScatterKernel(k), false);
      calls.push_back(launchStatement(s_, names_, k, index, kScatterBlock,
                                      std::to_string(kScatterBlock)));
      continue;
    }
    if (k.gemm() && k.gemm()->group && tensorCoreGroupedGemm(k)) {
      add(k, emitGroupedGemmKernel(k), false);
      calls.push_back(groupedGemmLaunch(k, index));
      continue;
    }
    KernelPlan plan = planOf(k);
    if (k.gemm() && k.gemm()->group) { // no library call takes it: its loops compute it
      add(k, emitKernel(k, plan), false);
      calls.push_back(launchCall(k, plan, index));
      out.loopLaunches[k.name] = index;
      continue;
    }
    add(k, emitKernel(k, plan), k.gemm() || k.conv());
    std::string launch = launchCall(k, plan, index);
    if (k.gemm()) {
      out.usesGemm = true;
      calls.push_back(gemmStatement(sym_, names_, k, launch, opts_.matmulTf32));
    } else if (k.conv()) {
      out.usesCudnn = true;
      calls.push_back(convStatement(names_, k, launch, opts_.convTf32));
    } else {
      calls.push_back(launch);
      out.loopLaunches[k.name] = index;
    }
  }
  std::string kernels;
  for (const auto &[name, text] : functions) {
    if (needed.count(name))
      kernels += text;
    else
      out.deferred.push_back({name, withPrelude(text)});
    out.checksIndices = out.checksIndices || text.find("*err = 1;") != std::string::npos;
  }
  out.device = kernels.empty() && !out.checksIndices ? "" : withPrelude(kernels);
  if (out.checksIndices) {
    // Last, when the runtime asks for it (BrazeCudaApi::assertIndices): a bad index this call's
    // kernels found stops the stream with a device-side assertion, as eager's kernels do,
    // and nothing waits for the kernels.
    out.device += kIndexGuardKernel;
    calls.push_back("if (api->assertIndices) { void* args[] = {(void*)&api->err}; err = "
                    "api->launch(api->ctx, " + std::to_string(out.kernels.size()) +
                    ", 1, 1, args); }");
    out.kernels.push_back("braze_index_guard");
  }
  out.host = hostSource(s_, names_, calls);
  out.numKernels = static_cast<int>(s_.kernels.size());
  return out;
}

std::string CudaEmitter::withPrelude(const std::string &kernels) {
  const bool special = kernels.find(kSpecialMathPrefix) != std::string::npos;
  const bool wgmma = kernels.find("braze_grouped_wgmma") != std::string::npos;
  const bool grouped = wgmma || kernels.find("braze_grouped_mm") != std::string::npos;
  const bool attention = grouped || kernels.find("braze_flash_attention") != std::string::npos;
  const bool backward = kernels.find("braze_flash_attention_d") != std::string::npos;
  return cudaPrelude() + (special ? specialMathPrelude(true) : "") +
         (attention ? cudaAttentionPrelude() : "") +
         (backward ? cudaAttentionBackwardPrelude() : "") +
         (grouped ? cudaGroupedGemmPrelude() : "") + (wgmma ? cudaGroupedWgmmaPrelude() : "") +
         kernels;
}

bool CudaEmitter::inMemory(const Buffer &b) const {
  return s_.placement.at(b.id).kind != PlacementKind::Local;
}

std::set<const Buffer *> CudaEmitter::written(const Kernel &k) const {
  std::set<const Buffer *> w;
  for (const Step &st : k.steps)
    for (const Member &m : st.members)
      w.insert(m.comp->out);
  return w;
}

std::string CudaEmitter::params(const Kernel &k) {
  std::set<int> used;
  std::vector<SymExpr> syms;
  collectKernelUses(k, names_, used, syms);
  std::set<const Buffer *> writes = written(k);
  std::string p;
  for (int id : used) {
    const Buffer &b = *s_.program->buffers()[id];
    if (!inMemory(b))
      continue;
    bool readOnly = !writes.count(&b);
    p += std::string(p.empty() ? "" : ", ") + (readOnly ? "const " : "") + ctype(b.dtype) +
         "* __restrict__ " + names_.buffer(b);
  }
  for (SymExpr sy : syms)
    p += std::string(p.empty() ? "" : ", ") + "const int64_t " + names_.symbol(sy);
  return p + std::string(p.empty() ? "" : ", ") + "int* __restrict__ err";
}

void CudaEmitter::decompose(Writer &w, const std::vector<SymExpr> &vars,
                            const std::string &linear, const std::string &lastName) {
  if (vars.empty())
    return;
  // Where every point's number fits 32 bits, the divisions are unsigned 32-bit ones: a
  // division by a constant is then a multiply-high and a shift, where a 64-bit one is a long
  // emulated sequence (it dominated a large pointwise kernel's time).
  SymExpr count = points(vars);
  bool narrow = count->isConst() && count->value() <= INT32_MAX &&
                std::all_of(vars.begin(), vars.end(), [](SymExpr v) { return v->extent()->isConst(); });
  std::string rest = "rest" + std::to_string(next_++);
  w.line(narrow ? "uint32_t " + rest + " = (uint32_t)(" + linear + ");"
                : "int64_t " + rest + " = " + linear + ";");
  for (size_t i = vars.size(); i-- > 0;) {
    std::string name = i + 1 == vars.size() ? lastName : names_.index(vars[i]);
    std::string ext = narrow ? std::to_string(vars[i]->extent()->value()) + "u"
                             : names_.index(vars[i]->extent());
    if (i == 0) {
      w.line("const int64_t " + name + " = " + rest + ";");
    } else {
      w.line("const int64_t " + name + " = " + rest + " % " + ext + ";");
      w.line(rest + " /= " + ext + ";");
    }
  }
  w.line("(void)" + rest + ";");
}

std::string CudaEmitter::emitScatterKernel(const Kernel &k) {
  next_ = 0;
  kernel_ = &k;
  std::string body;
  Writer w(body, 1);
  w.line("const int64_t first = (int64_t)blockIdx.x * " + std::to_string(kScatterBlock) +
         " + threadIdx.x;");
  w.line("if (first >= " + product(k.outerVars) + ") return;");
  if (!k.outerVars.empty())
    decompose(w, k.outerVars, "first", names_.index(k.outerVars.back()));
  Scope scope(nullptr);
  ExprWriter ex(w, scope, names_, next_);
  ex.setErrorStatement("*err = 1;");
  const Member &m = k.steps.at(0).members.at(0);
  const Buffer &b = *k.scatter()->out;
  std::string v = ex.emit(m.value), at = ex.emit(k.scatterAt());
  std::string size = "INT64_C(1)";
  for (SymExpr e : b.shape)
    size += " * " + names_.index(e);
  w.line("const int64_t at = (int64_t)(" + at + ");");
  w.line("if (at < 0 || at >= " + size + ") { *err = 1; return; }");
  std::string combine(loop::scatterCombineName(k.scatter()->scatterCombine()));
  // half precision: its own adds, of an f32 value rounded after each add
  if (b.dtype == DType::Float16 || b.dtype == DType::BFloat16)
    combine += b.dtype == DType::Float16 ? "_f16" : "_bf16";
  w.line("braze_atomic_" + combine + "(" + names_.buffer(b) + " + at, " +
         convert(v, m.value->dtype(), computeType(b.dtype)) + ");");
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kScatterBlock) +
         ") " + k.name + "(" + params(k) + ") {\n" + body + "}\n\n";
}

std::string CudaEmitter::emitKernel(const Kernel &k, const KernelPlan &plan) {
  next_ = 0;
  kernel_ = &k;
  scratchBytes_ = 0;
  std::string body;
  Writer w(body, 1);
  if (k.innerVars.empty())
    emitPointwise(k, plan, w);
  else
    emitRows(k, plan, w);
  // The reductions' shared scratch (emitCombine), declared once for the largest of them.
  std::string scratch =
      scratchBytes_ ? "  __shared__ __align__(16) unsigned char sm_scratch[" +
                          std::to_string(scratchBytes_) + "];\n"
                    : "";
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(plan.block) + ") " +
         k.name + "(" + params(k) + ") {\n" + scratch + body + "}\n\n";
}

void CudaEmitter::hoistInvariants(Writer &w, Scope &scope,
                                  const std::vector<const Member *> &members,
                                  const std::vector<SymExpr> &vars,
                                  const std::set<const Buffer *> &writes) {
  std::map<const loop::Expr *, bool> invariant;
  ExprWriter ex(w, scope, names_, next_);
  ex.setErrorStatement("*err = 1;");
  for (const Member *m : members)
    forEachExpr(m->value, [&](const loop::Expr *e) {
      bool inv = true;
      if (e->index() && mentionsAny(e->index(), vars))
        inv = false;
      for (const loop::Expr *o : e->operands())
        inv = inv && invariant[o];
      for (const auto &b : e->indirect())
        inv = inv && invariant[b.second];
      if (e->kind() == loop::ExprKind::Load && writes.count(e->buffer()) &&
          scope.localFor(e->buffer(), e->index()).empty())
        inv = false; // written in this kernel and not yet in a local
      invariant[e] = inv;
      if (inv && e->kind() == loop::ExprKind::Op)
        ex.emit(e);
    });
}

std::vector<const Member *> CudaEmitter::allMembers(const Kernel &k) {
  std::vector<const Member *> members;
  for (const Step &st : k.steps)
    for (const Member &m : st.members)
      members.push_back(&m);
  return members;
}

std::string CudaEmitter::innerPosition() {
  std::string pos = "INT64_C(0)";
  for (SymExpr v : kernel_->innerVars)
    pos = "(" + pos + " * " + names_.index(v->extent()) + " + " + names_.index(v) + ")";
  return pos;
}

std::string CudaEmitter::foldText(const loop::Computation &c, const std::string &v) {
  std::string acc = accName(c);
  if (isArgReduction(c))
    return "if " + argBetter(c, acc, v) + " { " + acc + " = " + v + "; " + argIndex(c) +
           " = " + innerPosition() + "; }";
  return accumulatorUpdate(c, acc, v);
}

std::vector<const Member *> CudaEmitter::membersOf(const Step &st) {
  std::vector<const Member *> ms;
  for (const Member &m : st.members)
    ms.push_back(&m);
  return ms;
}

void CudaEmitter::emitRows(const Kernel &k, const KernelPlan &plan, Writer &w) {
  // Column lanes: with columns, vec is the neighbouring rows a thread takes (neighbouring
  // columns of the matrix, read as vectors), and the row loop steps one element at a time.
  const int lanes = rowLanes(plan);
  std::string T = std::to_string(plan.threads), V = std::to_string(stepLanes(plan));
  std::string rowsPerBlock = std::to_string(CudaEmitter::rowsPerBlock(plan));
  std::string rows = product(k.outerVars);
  // Groups: the rows of each independent member group over blocks of their own.
  std::string blockIndex = "(int64_t)blockIdx.x";
  if (plan.groups > 1) {
    emitGroupBlocks(k, rowsPerBlock, w);
    blockIndex = "group_block";
  }
  // A row's threads are neighbours, or (columns) R apart.
  std::string R = std::to_string(plan.columnRows);
  std::string inBlock = plan.columns ? "threadIdx.x % " + R : "threadIdx.x / " + T;
  if (lanes > 1)
    inBlock = "(int64_t)(" + inBlock + ") * " + std::to_string(lanes);
  w.line("const int64_t row_raw = " + blockIndex + " * " + rowsPerBlock + " + " + inBlock + ";");
  w.line("const bool row_ok = row_raw < " + rows + ";");
  w.line("const int64_t row = row_ok ? row_raw : 0;");
  w.line(std::string("const int lr = threadIdx.x ") + (plan.columns ? "/ " + R : "% " + T) + ";");
  w.line("(void)row; (void)lr;");
  // With lanes, the last row variable's name is lane 0's; each lane defines its own.
  SymExpr rowVar = k.outerVars.empty() ? nullptr : k.outerVars.back();
  std::string laneBase = rowVar ? names_.index(rowVar) + "_cb" : "";
  if (!k.outerVars.empty())
    decompose(w, k.outerVars, "row", lanes > 1 ? laneBase : names_.index(rowVar));
  std::set<const Buffer *> writes = written(k);
  SymExpr var = k.innerVars.back();
  std::string base = names_.index(var) + "_base";
  Scope outer(nullptr);
  // Persistent rows: every operand read by more than one step, loaded once, and every value
  // a later step would recompute, kept from the step that computes it first.
  std::vector<VectorLoad> cached;
  if (plan.persistent) {
    for (const loop::Expr *l : plan.rowLoads)
      cached.push_back({l, "rc" + std::to_string(next_++)});
    if (!cached.empty()) {
      std::string n = std::to_string(plan.iters * plan.vec);
      for (const VectorLoad &c : cached)
        w.line(ctype(c.load->buffer()->dtype) + " " + c.array + "[" + n + "];");
      openRowLoop(w, k, plan, base);
      emitCacheFill(w, cached, var, base, plan.vec);
      closeRowLoop(w, plan);
    }
    std::string n = std::to_string(plan.iters * plan.vec);
    for (auto [e, step] : plan.rowValues) {
      cached.push_back({e, "rv" + std::to_string(next_++), step});
      w.line(ctype(e->dtype()) + " " + cached.back().array + "[" + n + "];");
    }
  }
  std::string guard = "row_ok && lr == 0";
  int loopStep = 0;
  // Each lane j's accumulators (one set without lanes), named by accName.
  auto eachLane = [&](const std::function<void(int)> &emit) {
    for (int j = 0; j < lanes; ++j) {
      setAccLane(lanes > 1 ? j : -1);
      emit(j);
    }
    setAccLane(-1);
  };
  // `after`: with lanes, the Scalar steps that follow, written in each lane's scope after its
  // results (planLaunch gives lanes to a kernel of one Loop step and Scalar steps only).
  auto emitStep = [&](Scope &scope, const std::vector<const Member *> &members,
                      const std::vector<const Step *> &after) {
    eachLane([&](int) {
      for (const Member *m : members)
        if (m->comp->isReduction()) {
          w.line(accType(*m->comp) + " " + accName(*m->comp) + " = " +
                 accumulatorInit(*m->comp) + ";");
          if (isArgReduction(*m->comp))
            w.line("int64_t " + argIndex(*m->comp) + " = 0;");
        }
    });
    std::vector<SymExpr> along = k.innerVars;
    if (lanes > 1)
      along.push_back(rowVar);
    hoistInvariants(w, scope, members, along, writes);
    if (lanes > 1)
      hoistAlignment(w, k, members, rowVar, lanes, laneBase, writes);
    else if (plan.vec > 1)
      hoistAlignment(w, k, members, var, plan.vec, "", writes);
    openRowLoop(w, k, plan, base);
    if (lanes > 1) {
      w.line("const int64_t " + names_.index(var) + " = " + base + ";");
      emitLanes(w, scope, members, rowVar, laneBase, lanes, writes, {}, "", "row_ok", loopStep,
                true);
    } else {
      std::string cacheIndex = plan.persistent ? "it * " + V : "";
      emitLanes(w, scope, members, var, base, plan.vec, writes, cached, cacheIndex, "row_ok",
                loopStep);
    }
    closeRowLoop(w, plan);
    alignedOnce_.clear();
    std::vector<CombineSlot> slots;
    for (int j = 0; j < lanes; ++j)
      for (const Member *m : members)
        if (m->comp->isReduction())
          slots.push_back({m->comp, lanes > 1 ? j : -1});
    emitCombine(w, slots, plan);
    if (lanes == 1) {
      finishReductions(w, scope, members, guard);
      return;
    }
    eachLane([&](int j) {
      w.line("{");
      w.indent();
      w.line("const int64_t " + names_.index(rowVar) + " = " + laneBase + " + " +
             std::to_string(j) + ";");
      Scope lane(&scope);
      finishReductions(w, lane, members, guard);
      for (const Step *st : after)
        emitMembers(w, lane, membersOf(*st), guard, {});
      w.dedent();
      w.line("}");
    });
  };
  std::vector<const Step *> trailing;
  if (lanes > 1)
    for (size_t i = 1; i < k.steps.size(); ++i)
      trailing.push_back(&k.steps[i]);
  if (plan.groups > 1) { // one step (memberGroups)
    emitGroupCases(k, plan.groups, w, [&](const std::vector<const Member *> &members) {
      Scope scope(&outer);
      emitStep(scope, members, {});
    });
    return;
  }
  for (const Step &st : k.steps) {
    std::vector<const Member *> members = membersOf(st);
    if (st.kind == StepKind::Scalar) {
      emitMembers(w, outer, members, guard, {});
      continue;
    }
    emitStep(outer, members, trailing);
    ++loopStep;
    if (lanes > 1)
      break;
  }
}

void CudaEmitter::hoistAlignment(Writer &w, const Kernel &k,
                                 const std::vector<const Member *> &members, SymExpr var,
                                 int vec, const std::string &laneBase,
                                 const std::set<const Buffer *> &writes) {
  // An access's alignment is the same at every step of the row loop where moving along the
  // inner variables moves it by whole vectors: each inner variable's coefficient a multiple
  // of vec, but var's own when var is inner (the loop gives it multiples of vec only).
  bool varInner = laneBase.empty();
  if (varInner && (!var->extent()->isConst() || var->extent()->value() % vec != 0))
    return;
  auto steady = [&](SymExpr index) {
    std::optional<sym::AffineForm> form = sym::affineIn(sym_, index, k.innerVars);
    if (!form)
      return false;
    for (size_t i = 0; i < k.innerVars.size(); ++i) {
      SymExpr c = form->coef[i];
      if (!c->isConst() || (!(varInner && k.innerVars[i] == var) && c->value() % vec != 0))
        return false;
    }
    return true;
  };
  std::vector<std::pair<const Buffer *, SymExpr>> at;
  for (const loop::Expr *l : plainLoads(members, writes))
    if (contiguousIn(l->index(), var, vec) && steady(l->index())) {
      alignedOnce_.insert(l);
      at.push_back({l->buffer(), l->index()});
    }
  for (const Member *m : members)
    if (m->store && !m->comp->isReduction() && inMemory(*m->comp->out) &&
        contiguousIn(m->storeIndex, var, vec) && steady(m->storeIndex)) {
      alignedOnce_.insert(m);
      at.push_back({m->comp->out, m->storeIndex});
    }
  if (at.empty())
    return;
  // Tested where the inner variables are 0 (and var at lane 0).
  alignedFlag_ = "aligned" + std::to_string(next_++);
  w.line("bool " + alignedFlag_ + " = true;");
  w.line("{");
  w.indent();
  if (!varInner)
    w.line("const int64_t " + names_.index(var) + " = " + laneBase + ";");
  for (SymExpr v : k.innerVars)
    w.line("const int64_t " + names_.index(v) + " = 0; (void)" + names_.index(v) + ";");
  for (auto &[b, index] : at)
    w.line(alignedFlag_ + " = " + alignedFlag_ + " && braze_aligned<" + std::to_string(vec) +
           ">(" + names_.buffer(*b) + " + " + names_.index(index) + ");");
  w.dedent();
  w.line("}");
}

void CudaEmitter::openRowLoop(Writer &w, const Kernel &k, const KernelPlan &plan,
                              const std::string &base) {
  // Column lanes take neighbouring rows: the row loop steps one element at a time.
  std::string T = std::to_string(plan.threads), V = std::to_string(stepLanes(plan));
  std::string length = product(k.innerVars);
  if (plan.persistent) {
    w.line("#pragma unroll");
    w.line("for (int it = 0; it < " + std::to_string(plan.iters) + "; ++it) {");
    w.indent();
    w.line("const int64_t rb = ((int64_t)it * " + T + " + lr) * " + V + ";");
    w.line(std::string("if (") + (plan.ragged ? "rb < " + length : "true") + ") {");
  } else {
    // Column lanes step a row at a time: 4 steps' loads in flight a thread (on an H200, the
    // first stage of a batch norm's statistics over channels-last [32, 64, 112, 112] took
    // 38.6 us unrolled, with the alignment tested once, against 42.7).
    if (plan.columns)
      w.line("#pragma unroll 4");
    w.line("for (int64_t rb = (int64_t)lr * " + V + "; rb < " + length + "; rb += (int64_t)" +
           T + " * " + V + ") {");
    w.indent();
    w.line("{");
  }
  w.indent();
  decompose(w, k.innerVars, "rb", base);
}

void CudaEmitter::closeRowLoop(Writer &w, const KernelPlan &) {
  w.dedent();
  w.line("}");
  w.dedent();
  w.line("}");
}

void CudaEmitter::emitCacheFill(Writer &w, const std::vector<VectorLoad> &cached, SymExpr var,
                                const std::string &base, int vec) {
  std::string n = std::to_string(vec), varName = names_.index(var);
  for (const VectorLoad &c : cached) {
    if (c.step >= 0)
      continue;
    const Buffer &b = *c.load->buffer();
    w.line("{");
    w.indent();
    if (vec > 1 && contiguousIn(c.load->index(), var)) {
      w.line("const int64_t " + varName + " = " + base + ";");
      w.line("const " + ctype(b.dtype) + "* p = " + names_.buffer(b) + " + " +
             names_.index(c.load->index()) + ";");
      w.line("if (braze_aligned<" + n + ">(p)) braze_vcopy<" + n + ">(" + c.array + " + it * " +
             n + ", p);");
      w.line("else for (int j = 0; j < " + n + "; ++j) " + c.array + "[it * " + n +
             " + j] = p[j];");
    } else {
      for (int j = 0; j < vec; ++j) {
        w.line("{");
        w.line("  const int64_t " + varName + " = " + base + " + " + std::to_string(j) + ";");
        w.line("  " + c.array + "[it * " + n + " + " + std::to_string(j) + "] = " +
               names_.buffer(b) + "[" + names_.pointIndex(c.load->index()) + "];");
        w.line("}");
      }
    }
    w.dedent();
    w.line("}");
  }
}

void CudaEmitter::emitCombine(Writer &w, const std::vector<CombineSlot> &slots,
                              const KernelPlan &plan) {
  // Each accumulator's text under its lane's name.
  struct Acc {
    std::string acc, ai, ty, isMax;
    bool arg;
    const loop::Computation *c;
  };
  std::vector<Acc> accs;
  for (const CombineSlot &slot : slots) {
    setAccLane(slot.lane);
    const loop::Computation &c = *slot.comp;
    accs.push_back({accName(c), argIndex(c), accType(c),
                    c.reduce == loop::ReduceKind::ArgMax ? "true" : "false",
                    isArgReduction(c), &c});
  }
  setAccLane(-1);
  auto merge = [&](const Acc &a, const std::string &ov, const std::string &oi) {
    if (a.arg)
      return "if (braze_arg_takes<" + a.isMax + ">(" + a.acc + ", " + a.ai + ", " + ov + ", " +
             oi + ")) { " + a.acc + " = " + ov + "; " + a.ai + " = " + oi + "; }";
    return accumulatorUpdate(*a.c, a.acc, ov) + ";";
  };
  // Shuffles over lane distances first, first / 2, ... while `more` holds.
  auto shuffle = [&](const std::string &first, const std::string &more) {
    for (const Acc &a : accs) {
      w.line("#pragma unroll");
      w.line("for (int o = " + first + "; " + more + "; o >>= 1) {");
      w.indent();
      w.line("const " + a.ty + " ov = braze_shfl_xor(" + a.acc + ", o);");
      if (a.arg)
        w.line("const int64_t oi = braze_shfl_xor(" + a.ai + ", o);");
      w.line(merge(a, "ov", a.arg ? "oi" : ""));
      w.dedent();
      w.line("}");
    }
  };
  // Through shared memory: threads where `leaves` put their results at `at`; then each thread
  // merges `count` results from `start`, `step` apart. The accumulators share one barrier
  // pair a batch, each at its own offset of one scratch (sm_scratch, sized in emitKernel) of
  // at most kCombineScratch bytes; a batch waits for all threads to have read the one before
  // it (50 layer-norm weight gradients fused in one column kernel took 2 KB each, over the
  // 48 KB a block may declare). A ResNet-50 batch norm's 8 column sums (2 sums of 4 lanes)
  // took 8 rounds of 2 barriers each.
  auto shared = [&](int n, const std::string &leaves, const std::string &at,
                    const std::string &start, int count, const std::string &step) {
    auto bytesOf = [&](const Acc &a) {
      size_t valueBytes = ((dtypeSize(a.c->value->dtype()) * n + 15) / 16) * 16;
      return std::make_pair(valueBytes, valueBytes + (a.arg ? 8 * n : 0));
    };
    size_t first = 0;
    while (first < accs.size()) {
      size_t last = first, total = 0;
      std::vector<size_t> offsets;
      while (last < accs.size() &&
             (last == first || total + bytesOf(accs[last]).second <= kCombineScratch)) {
        offsets.push_back(total);
        total += bytesOf(accs[last]).second;
        ++last;
      }
      if (scratchBytes_)
        w.line("__syncthreads();"); // the previous reductions' threads have read the scratch
      scratchBytes_ = std::max(scratchBytes_, total);
      for (size_t i = first; i < last; ++i) {
        const Acc &a = accs[i];
        std::string sm = "sm_" + a.acc, off = std::to_string(offsets[i - first]);
        w.line(a.ty + "* " + sm + " = reinterpret_cast<" + a.ty + "*>(sm_scratch + " + off +
               ");");
        if (a.arg)
          w.line("int64_t* " + sm + "_i = reinterpret_cast<int64_t*>(sm_scratch + " + off +
                 " + " + std::to_string(bytesOf(a).first) + ");");
        w.line("if (" + leaves + ") { " + sm + "[" + at + "] = " + a.acc + ";" +
               (a.arg ? " " + sm + "_i[" + at + "] = " + a.ai + ";" : "") + " }");
      }
      w.line("__syncthreads();");
      w.line("{");
      w.indent();
      w.line("const int g0 = " + start + ";");
      for (size_t i = first; i < last; ++i) {
        const Acc &a = accs[i];
        std::string sm = "sm_" + a.acc;
        w.line(a.acc + " = " + sm + "[g0];");
        if (a.arg)
          w.line(a.ai + " = " + sm + "_i[g0];");
      }
      w.line("for (int g = 1; g < " + std::to_string(count) + "; ++g) {");
      std::string k = step == "1" ? "[g0 + g]" : "[g0 + g * " + step + "]";
      for (size_t i = first; i < last; ++i) {
        std::string sm = "sm_" + accs[i].acc;
        w.line("  " + merge(accs[i], sm + k, sm + "_i" + k));
      }
      w.line("}");
      w.dedent();
      w.line("}");
      first = last;
    }
  };
  int warps = plan.block / 32;
  if (plan.columns) {
    // A row's threads are R apart: the 32 / R of them in one warp combine by shuffles, then
    // each warp leaves its R partial results in shared memory, and every thread of a row
    // merges its row's partial results of all warps.
    std::string R = std::to_string(plan.columnRows);
    if (plan.columnRows < 32)
      shuffle("16", "o >= " + R);
    shared(warps * plan.columnRows, "(threadIdx.x & 31) < " + R,
           "(threadIdx.x >> 5) * " + R + " + (threadIdx.x & 31)", "threadIdx.x % " + R, warps,
           R);
    return;
  }
  int warpLanes = std::min(plan.threads, 32);
  if (warpLanes > 1)
    shuffle(std::to_string(warpLanes / 2), "o > 0");
  if (plan.threads <= 32)
    return;
  int perRow = plan.threads / 32;
  shared(warps, "(threadIdx.x & 31) == 0", "threadIdx.x >> 5",
         "(threadIdx.x / " + std::to_string(plan.threads) + ") * " + std::to_string(perRow),
         perRow, "1");
}

void CudaEmitter::finishReductions(Writer &w, Scope &scope,
                                   const std::vector<const Member *> &members,
                                   const std::string &guard) {
  for (const Member *m : members) {
    if (!m->comp->isReduction())
      continue;
    const Buffer &b = *m->comp->out;
    bool arg = isArgReduction(*m->comp);
    DType t = arg ? DType::Int64 : m->value->dtype();
    std::string local = names_.local(b);
    w.line("const " + ctype(t) + " " + local + " = (" + ctype(t) + ")" +
           (arg ? argIndex(*m->comp) : accName(*m->comp)) + ";");
    scope.defineLocal(&b, local, m->storeIndex);
    if (m->store && inMemory(b))
      w.line("if (" + guard + ") " + names_.buffer(b) + "[" + names_.pointIndex(m->storeIndex) +
             "] = " + convert(local, t, b.dtype) + ";");
  }
}

std::string CudaEmitter::launchCall(const Kernel &k, const KernelPlan &plan, int index) {
  // Points per block: VEC (or spread) per thread (pointwise), or one row per group of T
  // threads (VEC rows with column lanes).
  std::string per = k.innerVars.empty()
                        ? std::to_string(plan.block) + " * " + std::to_string(plan.vec * plan.spread)
                        : std::to_string(rowsPerBlock(plan));
  return launchStatement(s_, names_, k, index, plan.block, per, plan.groups);
}

} // namespace cuda

std::string CudaGeneratedSource::text() const {
  std::string t = device;
  for (const DeferredKernel &k : deferred) {
    size_t start = k.source.find("extern \"C\" __global__");
    t += "\n// " + k.name +
         ": compiled at its first launch, where the library declines the call\n" +
         k.source.substr(start == std::string::npos ? 0 : start);
  }
  return t + "\n" + host;
}

void planCudaLaunches(sched::Schedule &s) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cuda) << "plan-cuda needs a CUDA target";
  cuda::CudaEmitter(s, {}).planLaunches(s);
}

void applyCudaLaunches(sched::Schedule &s,
                       const std::map<std::string, sched::CudaLaunch> &records) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cuda) << "launch records need a CUDA target";
  cuda::CudaEmitter(s, {}).applyLaunches(s, records);
}

CudaGeneratedSource generateCuda(const sched::Schedule &s, const CudaCodegenOptions &opts) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cuda) << "generateCuda needs a CUDA target";
  return cuda::CudaEmitter(s, opts).run();
}

} // namespace braze::codegen
