/// (This file is over 800 lines: both kernel shapes share the emitter's lane, cache and scope
/// state; the prelude and the host text are already in files of their own.)
///
/// Emits one __global__ function per schedule kernel, in one of two shapes:
///   1. Pointwise (no inner space): the outer space is flattened; each thread computes VEC
///      consecutive points of the innermost outer dim ("lanes"), reading and writing operands
///      that are contiguous along it as whole 16-byte words when they are aligned. A large
///      kernel without lanes gives each thread several points a block apart ("spread").
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
#include "braze/codegen/cuda/CudaCodegen.h"
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

namespace braze::codegen {

using loop::Buffer;
using sched::Kernel;
using sched::Member;
using sched::PlacementKind;
using sched::Step;
using sched::StepKind;
using sym::SymExpr;

namespace {

constexpr int kPointwiseBlock = 256;
constexpr int kRowBlock = 256;       ///< threads of a block that holds several rows
constexpr int kMaxPerThread = 64;    ///< elements one thread keeps of a persistent row
constexpr int64_t kShortRow = 32;    ///< a strided row this long is one thread's
constexpr int64_t kColumnSteps = 8;  ///< columns: elements per thread the plan aims for
constexpr int kBudgetFraction = 4;   ///< a persistent block may use 1/4 of the register file
constexpr int kSpread = 4;           ///< spread: points per thread of a large scalar kernel
constexpr int64_t kSpreadMin = 1 << 20; ///< spread: from this many points

/// Launched last in a module whose kernels check indices (CudaEmitter::run).
const char *kIndexGuardKernel = R"GUARD(
extern "C" __global__ void braze_index_guard(const int* __restrict__ err) {
  if (*(volatile const int*)err)
    __assertfail("braze: an index is out of bounds (gather/indexing/scatter with an index "
                 "outside the dim)", "braze", 0, "braze_index_guard", 1);
}
)GUARD";

/// The largest power of two not above v (v >= 1).
int64_t prevPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v)
    p <<= 1;
  return p;
}

int64_t nextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v)
    p <<= 1;
  return p;
}

/// A kernel's launch record (plan-cuda's, sched::CudaLaunch) with what its text needs beside
/// it: for persistent rows, the operands loaded once and the values kept between steps.
struct KernelPlan : sched::CudaLaunch {
  std::vector<const loop::Expr *> rowLoads;
  std::vector<std::pair<const loop::Expr *, int>> rowValues;
};

/// A load the lanes of a point group share as one vector, or a row operand kept in registers.
struct VectorLoad {
  const loop::Expr *load = nullptr; ///< a load, or (row values) any expression
  std::string array;
  int step = -1; ///< row values: the Loop step that computes them; -1: loaded before the steps
};

class CudaEmitter {
public:
  CudaEmitter(const sched::Schedule &s, const CudaCodegenOptions &opts)
      : s_(s), opts_(opts), names_(s), sym_(s.program->sym()) {}

  CudaGeneratedSource run() {
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
      if (k.attention) {
        // A written-out softmax (not safe) gives nan for a row whose every key is masked,
        // where cuDNN averages the row: such a masked attention runs braze's kernel. cuDNN
        // takes the output (with its log-sum-exp beside it), and the three gradients when one
        // kernel writes them; a lone log-sum-exp or gradient runs braze's kernel.
        const loop::AttentionSpec &spec = *k.attention->attention;
        bool cudnn = opts_.cudnnAttention &&
                     (spec.part == loop::AttentionPart::Output || k.attentionGradQ) &&
                     (!spec.bias || spec.safe);
        add(k, emitCudaAttentionKernel(names_, k, params(k), s_.target), cudnn);
        std::string launch = cudaAttentionLaunch(s_, names_, k, k, index);
        if (k.attentionGradQ) { // braze's own backward is two kernels: k's and v's, then q's
          Kernel q = gradQKernel(k);
          add(q, emitCudaAttentionKernel(names_, q, params(k), s_.target), cudnn);
          launch += " if (!err) " + cudaAttentionLaunch(s_, names_, q, k, index + 1);
        }
        if (cudnn) {
          out.usesCudnn = true;
          launch = k.attentionGradQ ? attentionGradStatement(names_, k, launch)
                                    : attentionStatement(names_, k, launch);
        }
        calls.push_back(launch);
        continue;
      }
      if (k.scatter) {
        add(k, emitScatterKernel(k), false);
        calls.push_back(launchStatement(s_, names_, k, index, kScatterBlock,
                                        std::to_string(kScatterBlock)));
        continue;
      }
      KernelPlan plan = planOf(k);
      add(k, emitKernel(k, plan), k.gemm || k.conv);
      std::string launch = launchCall(k, plan, index);
      if (k.gemm) {
        out.usesGemm = true;
        calls.push_back(gemmStatement(sym_, names_, k, launch, opts_.matmulTf32));
      } else if (k.conv) {
        out.usesCudnn = true;
        calls.push_back(convStatement(names_, k, launch, opts_.convTf32));
      } else {
        calls.push_back(launch);
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

private:
  /// The helpers `kernels` use, then `kernels`: one NVRTC program's source. The special
  /// functions and the attention templates are long; only programs that call them get them.
  static std::string withPrelude(const std::string &kernels) {
    const bool special = kernels.find(kSpecialMathPrefix) != std::string::npos;
    const bool attention = kernels.find("braze_flash_attention") != std::string::npos;
    const bool backward = kernels.find("braze_flash_attention_d") != std::string::npos;
    return cudaPrelude() + (special ? specialMathPrelude(true) : "") +
           (attention ? cudaAttentionPrelude() : "") +
           (backward ? cudaAttentionBackwardPrelude() : "") + kernels;
  }

  // ---- Facts about a kernel ------------------------------------------------------------------

  bool inMemory(const Buffer &b) const {
    return s_.placement.at(b.id).kind != PlacementKind::Local;
  }

  /// Buffers some member of k writes (their loads must not be hoisted or vectorized).
  std::set<const Buffer *> written(const Kernel &k) const {
    std::set<const Buffer *> w;
    for (const Step &st : k.steps)
      for (const Member &m : st.members)
        w.insert(m.comp->out);
    return w;
  }

  /// index(var + 1) - index(var) == 1.
  bool contiguousIn(SymExpr index, SymExpr var) {
    std::unordered_map<SymExpr, SymExpr> next{{var, sym_.add(var, 1)}};
    return sym_.sub(sym_.substitute(index, next), index)->isConst(1);
  }

  /// Direct loads in members' values, in first-use order, that read memory nobody in k writes.
  std::vector<const loop::Expr *> plainLoads(const std::vector<const Member *> &members,
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

  /// Elements per thread along `var`: 16 bytes of the narrowest operand contiguous along it,
  /// when var's extent is a constant multiple of that; else 1.
  int laneCount(const std::vector<const Member *> &members, SymExpr var,
                const std::set<const Buffer *> &writes) {
    if (!var || !var->extent()->isConst())
      return 1;
    int narrowest = 0;
    auto consider = [&](DType t) {
      int b = static_cast<int>(dtypeSize(t));
      narrowest = narrowest == 0 ? b : std::min(narrowest, b);
    };
    for (const loop::Expr *l : plainLoads(members, writes))
      if (contiguousIn(l->index(), var))
        consider(l->buffer()->dtype);
    for (const Member *m : members)
      if (m->store && !m->comp->isReduction() && contiguousIn(m->storeIndex, var))
        consider(m->comp->out->dtype);
    if (narrowest == 0)
      return 1;
    int vec = std::max(1, 16 / narrowest);
    int64_t extent = var->extent()->value();
    while (vec > 1 && extent % vec != 0)
      vec /= 2;
    return vec;
  }

  // ---- Kernel text ---------------------------------------------------------------------------

  std::string params(const Kernel &k) {
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

  std::string product(const std::vector<SymExpr> &vars) { return extentProduct(names_, vars); }

  /// Defines vars (row-major) from the linear position `linear`; the last one gets `lastName`.
  void decompose(Writer &w, const std::vector<SymExpr> &vars, const std::string &linear,
                 const std::string &lastName) {
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

  /// An accumulating scatter: a thread per source point combines its value atomically at its
  /// position (an atomic add, or a compare-and-swap loop for products, maxima and minima),
  /// which is checked against the buffer's size (the error flag, as an indirect load's index).
  static constexpr int kScatterBlock = 256;
  std::string emitScatterKernel(const Kernel &k) {
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
    const Buffer &b = *k.scatter->out;
    std::string v = ex.emit(m.value), at = ex.emit(k.scatterAt);
    std::string size = "INT64_C(1)";
    for (SymExpr e : b.shape)
      size += " * " + names_.index(e);
    w.line("const int64_t at = (int64_t)(" + at + ");");
    w.line("if (at < 0 || at >= " + size + ") { *err = 1; return; }");
    std::string combine(loop::scatterCombineName(k.scatter->scatterCombine));
    // half precision: its own adds, of an f32 value rounded after each add
    if (b.dtype == DType::Float16 || b.dtype == DType::BFloat16)
      combine += b.dtype == DType::Float16 ? "_f16" : "_bf16";
    w.line("braze_atomic_" + combine + "(" + names_.buffer(b) + " + at, " +
           convert(v, m.value->dtype(), computeType(b.dtype)) + ");");
    return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kScatterBlock) +
           ") " + k.name + "(" + params(k) + ") {\n" + body + "}\n\n";
  }

  std::string emitKernel(const Kernel &k, const KernelPlan &plan) {
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

  /// Emits, in `scope`, every subexpression of the members that does not depend on `vars`
  /// (row statistics, broadcast operands, constants folded with them), so that the loops over
  /// `vars` find them computed once.
  void hoistInvariants(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                       const std::vector<SymExpr> &vars, const std::set<const Buffer *> &writes) {
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

  // ---- Shape 1: pointwise --------------------------------------------------------------------

  std::vector<const Member *> allMembers(const Kernel &k) {
    std::vector<const Member *> members;
    for (const Step &st : k.steps)
      for (const Member &m : st.members)
        members.push_back(&m);
    return members;
  }

  void emitPointwise(const Kernel &k, const KernelPlan &plan, Writer &w) {
    std::vector<const Member *> members = allMembers(k);
    std::set<const Buffer *> writes = written(k);
    SymExpr var = k.outerVars.empty() ? nullptr : k.outerVars.back();
    std::string total = product(k.outerVars), block = std::to_string(kPointwiseBlock);
    auto emitPoint = [&] { // the members at point `first` (lane 0 of vec)
      std::string base = var ? names_.index(var) + "_base" : "";
      decompose(w, k.outerVars, "first", base);
      Scope outer(nullptr);
      if (var)
        hoistInvariants(w, outer, members, {var}, writes);
      emitLanes(w, outer, members, var, base, plan.vec, writes, {}, "", "");
    };
    if (plan.spread == 1) {
      w.line("const int64_t first = ((int64_t)blockIdx.x * " + block + " + threadIdx.x) * " +
             std::to_string(plan.vec) + ";");
      w.line("if (first >= " + total + ") return;");
      emitPoint();
      return;
    }
    // Spread: S points a block apart per thread. In a block whose points all exist, nothing
    // guards them, so their loads are issued together.
    std::string tile = block + " * " + std::to_string(plan.spread);
    w.line("const int64_t tile = (int64_t)blockIdx.x * " + tile + ";");
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

  /// Emits the members for `vec` consecutive values of var (from `base`), each lane in its own
  /// block where var = base + j. With vec > 1, operands contiguous along var are read (and
  /// stored results written) as vectors when every such pointer is aligned; otherwise lane by
  /// lane. `cached` loads read `array[cacheIndex + j]` instead of memory. Reductions fold into
  /// their accumulators; `storeGuard` (C condition) limits stores.
  void emitLanes(Writer &w, Scope &parent, const std::vector<const Member *> &members,
                 SymExpr var, const std::string &base, int vec,
                 const std::set<const Buffer *> &writes, const std::vector<VectorLoad> &cached,
                 const std::string &cacheIndex, const std::string &storeGuard, int step = 0) {
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
        anyVector |= !isCached && contiguousIn(l->index(), var);
      }
      for (const Member *m : members)
        anyVector |= m->store && !m->comp->isReduction() && inMemory(*m->comp->out) &&
                     contiguousIn(m->storeIndex, var);
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
        emitMembers(w, lane, members, storeGuard, {});
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
      if (!isCached && contiguousIn(l->index(), var))
        vloads.push_back({l, "vl" + std::to_string(next_++)});
    }
    std::map<const Member *, std::string> vstores;
    for (const Member *m : members)
      if (m->store && !m->comp->isReduction() && inMemory(*m->comp->out) &&
          contiguousIn(m->storeIndex, var))
        vstores[m] = "vs" + std::to_string(next_++);
    std::string n = std::to_string(vec);
    std::string varName = names_.index(var);
    // Pointers at lane 0, for the alignment test and the vector accesses.
    std::vector<std::string> checks;
    w.line("{");
    w.indent();
    w.line("const int64_t " + varName + " = " + base + ";");
    for (VectorLoad &v : vloads) {
      const Buffer &b = *v.load->buffer();
      w.line("const " + ctype(b.dtype) + "* " + v.array + "_p = " + names_.buffer(b) + " + " +
             names_.index(v.load->index()) + ";");
      checks.push_back("braze_aligned<" + n + ">(" + v.array + "_p)");
    }
    for (auto &[m, arr] : vstores) {
      const Buffer &b = *m->comp->out;
      w.line(ctype(b.dtype) + "* " + arr + "_p = " + names_.buffer(b) + " + " +
             names_.index(m->storeIndex) + ";");
      checks.push_back("braze_aligned<" + n + ">(" + arr + "_p)");
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
      emitMembers(w, lane, members, storeGuard, laneStores);
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

  /// One point of every member: reductions fold, pointwise members define locals and store
  /// (into `laneStores` slots when given, else to memory under `storeGuard`).
  void emitMembers(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                   const std::string &storeGuard,
                   const std::map<const Member *, std::string> &laneStores) {
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
      std::string st = names_.buffer(b) + "[" + names_.index(m->storeIndex) + "] = " + value + ";";
      w.line(storeGuard.empty() ? st : "if (" + storeGuard + ") " + st);
    }
  }

  // ---- Shape 2: rows -------------------------------------------------------------------------

  std::string accType(const loop::Computation &c) { return ctype(c.value->dtype()); }
  std::string argIndex(const loop::Computation &c) { return names_.acc(c) + "_i"; }

  std::string innerPosition() {
    std::string pos = "INT64_C(0)";
    for (SymExpr v : kernel_->innerVars)
      pos = "(" + pos + " * " + names_.index(v->extent()) + " + " + names_.index(v) + ")";
    return pos;
  }

  std::string foldText(const loop::Computation &c, const std::string &v) {
    std::string acc = names_.acc(c);
    if (isArgReduction(c))
      return "if " + argBetter(c, acc, v) + " { " + acc + " = " + v + "; " + argIndex(c) +
             " = " + innerPosition() + "; }";
    return accumulatorUpdate(c, acc, v);
  }

  static std::vector<const Member *> membersOf(const Step &st) {
    std::vector<const Member *> ms;
    for (const Member &m : st.members)
      ms.push_back(&m);
    return ms;
  }

  /// Loads that more than one Loop step of k reads, and that depend on the inner space.
  std::vector<const loop::Expr *> rowOperands(const Kernel &k) {
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

  /// Values (not loads) that a later Loop step of k recomputes: each with the first step that
  /// computes it. Only the outermost such values (a shared value whose every later use is inside
  /// another shared value is left out), and no bare widening of a load.
  std::vector<std::pair<const loop::Expr *, int>> rowValues(const Kernel &k) {
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

  /// Whether every operand the members read in memory is contiguous along the last row
  /// variable, so that neighbouring rows read neighbouring elements.
  bool rowsAdjacent(const std::vector<const Member *> &members,
                    const std::vector<SymExpr> &rowVars, const std::set<const Buffer *> &writes) {
    if (rowVars.empty())
      return false;
    std::vector<const loop::Expr *> loads = plainLoads(members, writes);
    return !loads.empty() && std::all_of(loads.begin(), loads.end(), [&](const loop::Expr *l) {
      return contiguousIn(l->index(), rowVars.back());
    });
  }

  /// Whether the members read columns: every operand in memory that differs between rows and
  /// along the row (`inner`) is contiguous along the last row variable and not along the last
  /// inner one. An operand the rows share (a per-element mean every column reads) or that a row
  /// reads once does not count. The smallest element size of those operands in bytes, or 0
  /// when there are none or they do not.
  int columnBytes(const std::vector<const Member *> &members,
                  const std::vector<SymExpr> &rowVars, const std::vector<SymExpr> &inner,
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

  /// The number of points the loop variables `vars` span (product() writes it as C text).
  SymExpr points(const std::vector<SymExpr> &vars) {
    std::vector<SymExpr> extents;
    for (SymExpr v : vars)
      extents.push_back(v->extent());
    return sym_.product(extents);
  }

  /// The members whose accesses decide k's lanes and row shape: all of a pointwise kernel's,
  /// the Loop steps' of a kernel with an inner loop.
  std::vector<const Member *> laneMembers(const Kernel &k) {
    std::vector<const Member *> members;
    for (const Step &st : k.steps)
      if (k.innerVars.empty() || st.kind == StepKind::Loop)
        for (const Member &m : st.members)
          members.push_back(&m);
    return members;
  }

  /// The most lanes k's accesses and sizes allow along its innermost variable (the inner one,
  /// else the last outer one).
  int lanesAllowed(const Kernel &k, const std::set<const Buffer *> &writes) {
    SymExpr var = !k.innerVars.empty() ? k.innerVars.back()
                  : k.outerVars.empty() ? nullptr
                                        : k.outerVars.back();
    return laneCount(laneMembers(k), var, writes);
  }

  /// A row of constant `length` in `l`: its iterations of threads x vec elements, and whether
  /// the last is partial.
  static void setRowIterations(sched::CudaLaunch &l, int64_t length) {
    int64_t chunk = static_cast<int64_t>(l.threads) * l.vec;
    l.length = length;
    l.iters = (length + chunk - 1) / chunk;
    l.ragged = length % chunk != 0;
  }

  /// The plan-cuda step's choice for loop kernel k: threads, lanes, columns or rows, and
  /// whether a row stays in registers (persistent).
  sched::CudaLaunch planLaunch(const Kernel &k) {
    sched::CudaLaunch p;
    std::set<const Buffer *> writes = written(k);
    p.vec = lanesAllowed(k, writes);
    if (k.innerVars.empty()) {
      p.block = kPointwiseBlock;
      // Without vector lanes, one scalar access per thread keeps too few bytes in flight for
      // the memory's bandwidth (a [1024, 50257] gradient of unaligned rows): a thread of a
      // large kernel takes kSpread points.
      SymExpr count = points(k.outerVars);
      if (p.vec == 1 && count->isConst() && count->value() >= kSpreadMin)
        p.spread = kSpread;
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
    p.block = std::max(p.threads, kRowBlock);
    if (int bytes = guess > 1 ? columnBytes(all, k.outerVars, k.innerVars, writes) : 0) {
      // Columns: R rows per block, the rows a warp reads side by side: enough blocks for every
      // multiprocessor, at least a 32-byte sector per warp row, at most a warp. Each of a
      // row's T threads reads about kColumnSteps elements.
      int64_t r = rowCount->isConst()
                      ? prevPow2(std::max<int64_t>(1, rowCount->value() / std::max(1, s_.target.cores)))
                      : 32;
      p.columns = true;
      p.vec = 1;
      p.columnRows = static_cast<int>(std::clamp<int64_t>(r, std::max(1, 32 / bytes), 32));
      int64_t perRow = length->isConst() ? (length->value() + kColumnSteps - 1) / kColumnSteps
                                         : s_.target.maxThreadsPerBlock;
      p.threads = static_cast<int>(std::clamp<int64_t>(  // a block is whole warps
          nextPow2(perRow), std::max(2, 32 / p.columnRows),
          s_.target.maxThreadsPerBlock / p.columnRows));
      p.block = p.columnRows * p.threads;
    }
    if (!length->isConst())
      return p;
    setRowIterations(p, length->value());
    size_t live = std::max<size_t>(1, rowOperands(k).size() + rowValues(k).size());
    int64_t rows = p.block / p.threads;
    int64_t bytes = rows * p.length * static_cast<int64_t>(live) * 4;
    p.persistent = p.iters * p.vec <= kMaxPerThread &&
                   bytes <= s_.target.registerBytesPerSm / kBudgetFraction;
    return p;
  }

public:
  /// Fills the launch record of every kernel codegen writes as loops (plan-cuda).
  void planLaunches(sched::Schedule &s) {
    for (Kernel &k : s.kernels)
      if (!k.attention && !k.scatter)
        k.cudaLaunch = planLaunch(k);
  }

  /// Replaces the records of the kernels `records` names with those records, each checked
  /// against what its kernel's code can do; a record that names no loop kernel, or asks for
  /// what the code cannot do, is a user error that says which field and why.
  void applyLaunches(sched::Schedule &s, const std::map<std::string, sched::CudaLaunch> &records) {
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

private:
  /// Checks record `l`, given for loop kernel k, and fills in what follows from it (the row
  /// length, iterations and raggedness): "" when the kernel's code can run it, else why not.
  std::string completeLaunch(const Kernel &k, sched::CudaLaunch &l) {
    const sched::CudaLaunch planned = planLaunch(k);
    auto pow2 = [](int64_t v) { return v > 0 && (v & (v - 1)) == 0; };
    int most = s_.target.maxThreadsPerBlock;
    if (l.block % 32 != 0 || l.block > most)
      return "block must be a multiple of 32 (whole warps) up to " + std::to_string(most);
    bool rows = !k.innerVars.empty();
    int lanes = lanesAllowed(k, written(k));
    if (!pow2(l.vec) || lanes % l.vec != 0)
      return "vec must be a power of two dividing " + std::to_string(lanes) +
             " (the lanes its accesses and sizes allow)";
    if (!rows) {
      if (l.threads || l.columns || l.persistent || l.iters || l.ragged)
        return "threads, columns and persistent apply to kernels with an inner loop";
      if (l.spread > 1 && l.vec > 1)
        return "spread needs vec=1";
      l.threads = planned.threads;
      return "";
    }
    if (l.spread != 1)
      return "spread applies to pointwise kernels";
    if (!pow2(l.threads) || l.threads > l.block || l.block % l.threads != 0)
      return "threads must be a power of two that divides block";
    if (l.columns) {
      if (!planned.columns)
        return "columns: its rows' elements are not neighbouring columns (plan-cuda chose "
               "rows)";
      if (l.vec != 1 || !pow2(l.columnRows) || l.columnRows > 32 ||
          l.block != l.columnRows * l.threads || l.threads < std::max(2, 32 / l.columnRows))
        return "columns=R needs vec=1, R a power of two up to 32, block = R x threads, and "
               "whole warps (threads at least 32 / R and 2)";
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

  /// k's plan: its launch record (planned here where the schedule has none), and for
  /// persistent rows the operands and values the record's registers hold.
  KernelPlan planOf(const Kernel &k) {
    KernelPlan p;
    static_cast<sched::CudaLaunch &>(p) = k.cudaLaunch ? *k.cudaLaunch : planLaunch(k);
    if (p.persistent) {
      p.rowLoads = rowOperands(k);
      p.rowValues = rowValues(k);
    }
    return p;
  }

  void emitRows(const Kernel &k, const KernelPlan &plan, Writer &w) {
    std::string T = std::to_string(plan.threads), V = std::to_string(plan.vec);
    std::string rowsPerBlock = std::to_string(plan.block / plan.threads);
    std::string rows = product(k.outerVars);
    // A row's threads are neighbours, or (columns) R apart.
    std::string R = std::to_string(plan.columnRows);
    std::string inBlock = plan.columns ? "threadIdx.x % " + R : "threadIdx.x / " + T;
    w.line("const int64_t row_raw = (int64_t)blockIdx.x * " + rowsPerBlock + " + " + inBlock +
           ";");
    w.line("const bool row_ok = row_raw < " + rows + ";");
    w.line("const int64_t row = row_ok ? row_raw : 0;");
    w.line(std::string("const int lr = threadIdx.x ") + (plan.columns ? "/ " + R : "% " + T) + ";");
    w.line("(void)row; (void)lr;");
    if (!k.outerVars.empty())
      decompose(w, k.outerVars, "row", names_.index(k.outerVars.back()));
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
    for (const Step &st : k.steps) {
      std::vector<const Member *> members = membersOf(st);
      if (st.kind == StepKind::Scalar) {
        emitMembers(w, outer, members, guard, {});
        continue;
      }
      for (const Member *m : members)
        if (m->comp->isReduction()) {
          w.line(accType(*m->comp) + " " + names_.acc(*m->comp) + " = " +
                 accumulatorInit(*m->comp) + ";");
          if (isArgReduction(*m->comp))
            w.line("int64_t " + argIndex(*m->comp) + " = 0;");
        }
      hoistInvariants(w, outer, members, k.innerVars, writes);
      openRowLoop(w, k, plan, base);
      std::string cacheIndex = plan.persistent ? "it * " + V : "";
      emitLanes(w, outer, members, var, base, plan.vec, writes, cached, cacheIndex, "row_ok",
                loopStep++);
      closeRowLoop(w, plan);
      for (const Member *m : members)
        if (m->comp->isReduction())
          emitCombine(w, *m->comp, plan);
      finishReductions(w, outer, members, guard);
    }
  }

  /// Opens the loop over this thread's part of the row and defines the inner vars but the
  /// last, whose lane-0 value is `base`.
  void openRowLoop(Writer &w, const Kernel &k, const KernelPlan &plan, const std::string &base) {
    std::string T = std::to_string(plan.threads), V = std::to_string(plan.vec);
    std::string length = product(k.innerVars);
    if (plan.persistent) {
      w.line("#pragma unroll");
      w.line("for (int it = 0; it < " + std::to_string(plan.iters) + "; ++it) {");
      w.indent();
      w.line("const int64_t rb = ((int64_t)it * " + T + " + lr) * " + V + ";");
      w.line(std::string("if (") + (plan.ragged ? "rb < " + length : "true") + ") {");
    } else {
      w.line("for (int64_t rb = (int64_t)lr * " + V + "; rb < " + length + "; rb += (int64_t)" +
             T + " * " + V + ") {");
      w.indent();
      w.line("{");
    }
    w.indent();
    decompose(w, k.innerVars, "rb", base);
  }

  void closeRowLoop(Writer &w, const KernelPlan &) {
    w.dedent();
    w.line("}");
    w.dedent();
    w.line("}");
  }

  /// Loads each cached row operand for this iteration's lanes into its register array.
  void emitCacheFill(Writer &w, const std::vector<VectorLoad> &cached, SymExpr var,
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
                 names_.buffer(b) + "[" + names_.index(c.load->index()) + "];");
          w.line("}");
        }
      }
      w.dedent();
      w.line("}");
    }
  }

  /// Combines every thread's partial result of a reduction over its row group; afterwards
  /// every thread of the group holds the row's result.
  void emitCombine(Writer &w, const loop::Computation &c, const KernelPlan &plan) {
    std::string acc = names_.acc(c), ai = argIndex(c), ty = accType(c);
    bool arg = isArgReduction(c);
    std::string isMax = c.reduce == loop::ReduceKind::ArgMax ? "true" : "false";
    auto merge = [&](const std::string &ov, const std::string &oi) {
      if (arg)
        return "if (braze_arg_takes<" + isMax + ">(" + acc + ", " + ai + ", " + ov + ", " + oi +
               ")) { " + acc + " = " + ov + "; " + ai + " = " + oi + "; }";
      return accumulatorUpdate(c, acc, ov) + ";";
    };
    // Shuffles over lane distances first, first / 2, ... while `more` holds.
    auto shuffle = [&](const std::string &first, const std::string &more) {
      w.line("#pragma unroll");
      w.line("for (int o = " + first + "; " + more + "; o >>= 1) {");
      w.indent();
      w.line("const " + ty + " ov = braze_shfl_xor(" + acc + ", o);");
      if (arg)
        w.line("const int64_t oi = braze_shfl_xor(" + ai + ", o);");
      w.line(merge("ov", arg ? "oi" : ""));
      w.dedent();
      w.line("}");
    };
    // Through shared memory: threads where `leaves` put their result at `at`; then each thread
    // merges `count` results from `start`, `step` apart. Every reduction of the kernel takes
    // its turn in one scratch (sm_scratch, sized in emitKernel), and waits for all threads to
    // have read it before the next writes: 50 layer-norm weight gradients fused in one column
    // kernel took 2 KB each, over the 48 KB a block may declare.
    auto shared = [&](int n, const std::string &leaves, const std::string &at,
                      const std::string &start, int count, const std::string &step) {
      std::string sm = "sm_" + acc;
      size_t valueBytes = ((dtypeSize(c.value->dtype()) * n + 15) / 16) * 16;
      if (scratchBytes_)
        w.line("__syncthreads();"); // the previous reduction's threads have read the scratch
      scratchBytes_ = std::max(scratchBytes_, valueBytes + (arg ? 8 * n : 0));
      w.line(ty + "* " + sm + " = reinterpret_cast<" + ty + "*>(sm_scratch);");
      if (arg)
        w.line("int64_t* " + sm + "_i = reinterpret_cast<int64_t*>(sm_scratch + " +
               std::to_string(valueBytes) + ");");
      w.line("if (" + leaves + ") { " + sm + "[" + at + "] = " + acc + ";" +
             (arg ? " " + sm + "_i[" + at + "] = " + ai + ";" : "") + " }");
      w.line("__syncthreads();");
      w.line("{");
      w.indent();
      w.line("const int g0 = " + start + ";");
      w.line(acc + " = " + sm + "[g0];");
      if (arg)
        w.line(ai + " = " + sm + "_i[g0];");
      w.line("for (int g = 1; g < " + std::to_string(count) + "; ++g) {");
      std::string k = step == "1" ? "[g0 + g]" : "[g0 + g * " + step + "]";
      w.line("  " + merge(sm + k, sm + "_i" + k));
      w.line("}");
      w.dedent();
      w.line("}");
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

  void finishReductions(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                        const std::string &guard) {
    for (const Member *m : members) {
      if (!m->comp->isReduction())
        continue;
      const Buffer &b = *m->comp->out;
      bool arg = isArgReduction(*m->comp);
      DType t = arg ? DType::Int64 : m->value->dtype();
      std::string local = names_.local(b);
      w.line("const " + ctype(t) + " " + local + " = (" + ctype(t) + ")" +
             (arg ? argIndex(*m->comp) : names_.acc(*m->comp)) + ";");
      scope.defineLocal(&b, local, m->storeIndex);
      if (m->store && inMemory(b))
        w.line("if (" + guard + ") " + names_.buffer(b) + "[" + names_.index(m->storeIndex) +
               "] = " + convert(local, t, b.dtype) + ";");
    }
  }

  // ---- Host side -----------------------------------------------------------------------------

  /// A statement that launches k's kernel (setting `err`).
  std::string launchCall(const Kernel &k, const KernelPlan &plan, int index) {
    // Points per block: VEC (or spread) per thread (pointwise), or one row per group of T
    // threads.
    std::string per = k.innerVars.empty()
                          ? std::to_string(plan.block) + " * " + std::to_string(plan.vec * plan.spread)
                          : std::to_string(plan.block / plan.threads);
    return launchStatement(s_, names_, k, index, plan.block, per);
  }

  const sched::Schedule &s_;
  CudaCodegenOptions opts_;
  size_t scratchBytes_ = 0; ///< the kernel's shared scratch for its reductions so far
  Names names_;
  sym::SymContext &sym_;
  int next_ = 0;
  const Kernel *kernel_ = nullptr;
};

} // namespace

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
  CudaEmitter(s, {}).planLaunches(s);
}

void applyCudaLaunches(sched::Schedule &s,
                       const std::map<std::string, sched::CudaLaunch> &records) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cuda) << "launch records need a CUDA target";
  CudaEmitter(s, {}).applyLaunches(s, records);
}

CudaGeneratedSource generateCuda(const sched::Schedule &s, const CudaCodegenOptions &opts) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cuda) << "generateCuda needs a CUDA target";
  return CudaEmitter(s, opts).run();
}

} // namespace braze::codegen
