/// Emits, for each kernel:
///   1. the buffer pointers and size symbols it uses, as typed locals;
///   2. its outer loops: `omp parallel for` (collapsed) when there are outer dims, or a
///      parallel region whose inner loops are work-shared when there are none;
///   3. per outer point, its steps in order: a Loop step is one (simd) loop over the inner space
///      that computes pointwise members and folds reductions; a Scalar step computes values once;
///   4. stores for members whose value must reach memory.
/// Values that stay in the kernel live in C++ locals named after their buffer.
/// Over 800 lines for a reason: one CpuEmitter holds the names, scopes and options every kernel
/// form shares (loop nests, lane mode, GEMM, convolution and attention calls, which fall back
/// to the loop nest, and accumulating scatters); the preludes those calls need live in their
/// own files.
#include "braze/codegen/cpu/CppCodegen.h"
#include "braze/codegen/cpu/AttentionPrelude.h"
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

using loop::Buffer;
using loop::ReduceKind;
using sched::Kernel;
using sched::Member;
using sched::PlacementKind;
using sched::Step;
using sched::StepKind;

namespace {

class CpuEmitter {
public:
  CpuEmitter(const sched::Schedule &s, const CpuCodegenOptions &opts)
      : s_(s), opts_(opts), names_(s) {}

  GeneratedSource run() {
    std::string out = cPrelude();
    out += "#include <omp.h>\n#include <vector>\n\n";
    bool blas = false, dnnl = false, attention = false;
    std::string kernels;
    for (const Kernel &k : s_.kernels) {
      blas |= usesBlas(k) || (k.attention && !opts_.blas.sgemm.empty());
      dnnl |= usesDnnl(k);
      attention |= k.attention != nullptr;
      kernels += k.attention   ? emitAttentionKernel(k)
                 : k.scatter   ? emitScatterKernel(k)
                 : usesBlas(k) ? emitGemmKernel(k)
                 : usesDnnl(k) ? emitConvKernel(k)
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
    out += emitAbi();
    return GeneratedSource{out, static_cast<int>(s_.kernels.size()), blas, dnnl};
  }

private:
  bool usesBlas(const Kernel &k) const {
    if (!k.gemm || (k.gemm->dtype != DType::Float32 && k.gemm->dtype != DType::Float64) ||
        k.gemm->outDtype != k.gemm->dtype)
      return false;
    return k.gemm->dtype == DType::Float32 ? !opts_.blas.sgemm.empty() : !opts_.blas.dgemm.empty();
  }

  /// Sets the BLAS's own threads to one, once per module, where it has such an entry point:
  /// braze splits products over the OpenMP threads it shares with PyTorch.
  void keepBlasSingleThreaded(Writer &w) {
    if (opts_.blas.setThreads.empty())
      return;
    w.line("static const int blas_single_threaded = (" + opts_.blas.setThreads + "(1), 0);");
    w.line("(void)blas_single_threaded;");
  }

  /// The size symbols kernel k uses, as locals read from `syms`.
  void declareSymbols(const Kernel &k, Writer &w) {
    std::set<int> used;
    std::vector<sym::SymExpr> syms;
    collectKernelUses(k, names_, used, syms);
    for (sym::SymExpr sy : syms)
      w.line("const int64_t " + names_.symbol(sy) + " = syms[" +
             std::to_string(names_.symbolIndex(sy)) + "];");
  }

  bool usesDnnl(const Kernel &k) const {
    return opts_.dnnl && k.conv && k.conv->out->dtype == DType::Float32;
  }

  /// A convolution or a weight gradient through oneDNN (braze_dnnl_conv in the prelude), with
  /// the buffers' own sizes and strides; where oneDNN declines, the loop nest computes it.
  std::string emitConvKernel(const Kernel &k) {
    const loop::Computation &c = *k.conv;
    const loop::ConvSpec &cv = *c.conv;
    const loop::Buffer *x = cv.x(c.out), *wt = cv.w(c.out), *y = cv.y(c.out);
    std::string out = emitKernel(k, k.name + "_loops");
    std::string body;
    Writer w(body, 1);
    declareSymbols(k, w);
    auto list = [&](const std::vector<sym::SymExpr> &xs) { return cIndexList(names_, xs); };
    auto ints = cIntList;
    size_t rank = c.out->shape.size();
    std::string n = "[" + std::to_string(rank) + "]", sp = "[" + std::to_string(rank - 2) + "]";
    w.line("static braze_dnnl_site site;");
    w.line("const int64_t x_dims" + n + " = " + list(cv.logical(x->shape)) + ";");
    w.line("const int64_t x_strides" + n + " = " + list(cv.logical(x->strides)) + ";");
    w.line("const int64_t w_dims" + n + " = " + list(wt->shape) + ";");
    w.line("const int64_t w_strides" + n + " = " + list(wt->strides) + ";");
    w.line("const int64_t y_dims" + n + " = " + list(cv.logical(y->shape)) + ";");
    w.line("const int64_t y_strides" + n + " = " + list(cv.logical(y->strides)) + ";");
    w.line("const int64_t stride" + sp + " = " + ints(cv.stride) + ";");
    w.line("const int64_t padding" + sp + " = " + ints(cv.padding) + ";");
    w.line("const int64_t dilation" + sp + " = " + ints(cv.dilation) + ";");
    auto ptr = [](const loop::Buffer *b) { return "bufs[" + std::to_string(b->id) + "]"; };
    w.line("if (!braze_dnnl_conv(site, " + std::to_string(rank) +
           ", x_dims, x_strides, w_dims, w_strides, y_dims, y_strides, INT64_C(" +
           std::to_string(cv.groups) + "), stride, padding, dilation, " + ptr(x) + ", " + ptr(wt) +
           ", " + ptr(y) + ", " + std::to_string(static_cast<int>(cv.direction)) + "))");
    w.line("  " + k.name + "_loops(bufs, syms, err);");
    return out + "static void " + k.name + "(void* const* bufs, const int64_t* syms, int* err) {\n" +
           body + "}\n\n";
  }

  /// A fused attention part (braze_attention_f32, braze_attention_lse_f32 or
  /// braze_attention_grad_f32 in the prelude) over the operands' logical sizes and strides;
  /// the output is strided with its last dim contiguous (row-major but for the output part).
  std::string emitAttentionKernel(const Kernel &k) {
    const loop::Computation &c = *k.attention;
    const loop::AttentionSpec &a = *c.attention;
    BRAZE_CHECK(a.q.buffer->dtype == DType::Float32) << "CPU attention is f32 only";
    std::string body;
    Writer w(body, 1);
    keepBlasSingleThreaded(w);
    declareSymbols(k, w);
    auto list = [&](const std::vector<sym::SymExpr> &xs) { return cIndexList(names_, xs); };
    size_t rank = a.q.shape.size();
    std::vector<sym::SymExpr> dims(a.q.shape.begin(), a.q.shape.end() - 1);
    dims.push_back(a.k.shape[rank - 2]);
    dims.push_back(a.q.shape[rank - 1]);
    dims.push_back(a.v.buffer ? a.v.shape[rank - 1] : a.q.shape[rank - 1]);
    w.line("const int64_t dims[" + std::to_string(rank + 2) + "] = " + list(dims) + ";");
    auto operand = [&](const std::optional<loop::AttentionOperand> &o, const std::string &name) {
      if (!o || !o->buffer)
        return std::string("nullptr, nullptr");
      w.line("const int64_t " + name + "s[" + std::to_string(o->strides.size()) +
             "] = " + list(o->strides) + ";");
      return "(const float*)bufs[" + std::to_string(o->buffer->id) + "] + " +
             names_.index(o->offset) + ", " + name + "s";
    };
    std::string q = operand(a.q, "q"), kk = operand(a.k, "k"), v = operand(a.v, "v");
    std::string bias = operand(a.bias, "b");
    std::string out = "(float*)bufs[" + std::to_string(c.out->id) + "]";
    std::string tail = literal(a.scale, 0, DType::Float32) + ", " + (a.causal ? "true" : "false");
    std::string r = std::to_string(rank);
    switch (a.part) {
    case loop::AttentionPart::Output:
      w.line("const int64_t os[" + r + "] = " + list(c.out->strides) + ";");
      w.line("braze_attention_f32(" + r + ", dims, " + q + ", " + kk + ", " + v + ", " + bias +
             ", " + out + ", os, " + tail + ", " + (a.safe ? "true" : "false") + ");");
      break;
    case loop::AttentionPart::Lse:
      w.line("braze_attention_lse_f32(" + r + ", dims, " + q + ", " + kk + ", " + bias + ", " +
             out + ", " + tail + ");");
      break;
    case loop::AttentionPart::GradQ:
    case loop::AttentionPart::GradK:
    case loop::AttentionPart::GradV: {
      int wrt = a.part == loop::AttentionPart::GradQ ? 0 : a.part == loop::AttentionPart::GradK ? 1 : 2;
      std::string dout = operand(a.dout, "do"), o = operand(a.out, "o"), lse = operand(a.lse, "l");
      w.line("braze_attention_grad_f32(" + std::to_string(wrt) + ", " + r + ", dims, " + dout +
             ", " + q + ", " + kk + ", " + v + ", " + o + ", " + lse + ", " + bias + ", " + out +
             ", " + tail + ");");
      break;
    }
    }
    return "static void " + k.name + "(void* const* bufs, const int64_t* syms, int* err) {\n" +
           body + "}\n\n";
  }

  /// A matrix product through a single-threaded BLAS, spread over the OpenMP threads braze's
  /// kernels and PyTorch share (one pool: BLAS's own threads are set to one).
  ///   1. The layout BLAS needs is checked once; one it rejects (a zero stride from
  ///      broadcasting) runs the loop nest instead.
  ///   2. The work is cut into tasks: batch points, each split into row blocks (or column blocks
  ///      when rows are few) until there are as many tasks as threads. Small products run on
  ///      the calling thread.
  ///   3. Each task makes one gemm call on its block; blocks never overlap, so any assignment of
  ///      tasks to threads gives the same bits.
  std::string emitGemmKernel(const Kernel &k) {
    const sched::GemmCall &g = *k.gemm;
    std::string out = emitKernel(k, k.name + "_loops");
    bool f32 = g.dtype == DType::Float32;
    std::string fn = f32 ? opts_.blas.sgemm : opts_.blas.dgemm;
    std::string ty = ctype(g.dtype);
    out += blasDeclarations(opts_.blas, g.dtype);
    std::string body;
    Writer w(body, 1);
    keepBlasSingleThreaded(w);
    declareSymbols(k, w);
    auto ix = [&](sym::SymExpr e) { return names_.index(e); };
    w.line("if (!(" + emitGemmLayout(w, g, names_) + ")) {");
    w.line("  " + k.name + "_loops(bufs, syms, err);");
    w.line("  return;");
    w.line("}");
    w.line("const " + ty + "* __restrict A = (const " + ty + "*)bufs[" + std::to_string(g.a->id) + "];");
    w.line("const " + ty + "* __restrict B = (const " + ty + "*)bufs[" + std::to_string(g.b->id) + "];");
    w.line(ty + "* __restrict C = (" + ty + "*)bufs[" + std::to_string(g.c->id) + "];");
    if (g.group) {
      out += emitRowFunction(k, g.group, "_group");
      if (g.rowOf)
        out += emitRowFunction(k, g.rowOf, "_row");
      emitGroupedRuns(k, w, fn);
      return out + "static void " + k.name + "(void* const* bufs, const int64_t* syms, int* err) {\n" +
             body + "}\n\n";
    }
    std::string batch = "INT64_C(1)";
    for (sym::SymExpr v : g.batchVars)
      batch += " * " + ix(v->extent());
    w.line("const int64_t batch = " + batch + ";");
    w.line("if (batch == 0 || M == 0 || N == 0)"); // an empty product: nothing to write
    w.line("  return;");
    w.line("int64_t split = 1;");
    w.line("bool by_rows = true;");
    w.line("const int threads = (double)batch * M * N * K < 4.0e5 ? 1 : omp_get_max_threads();");
    w.line("if (batch < threads) {");
    w.line("  split = (threads + batch - 1) / batch;");
    // Each task packs the whole operand it does not split: split the larger of M and N, so
    // the operand every thread packs again is the smaller one.
    w.line("  by_rows = M >= N ? M >= 8 * split : N < 8 * split;");
    w.line("  split = std::max<int64_t>(1, std::min<int64_t>(split, (by_rows ? M : N) / 8));");
    w.line("}");
    w.line("const int64_t tasks = batch * split;");
    w.line("#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && tasks > 1)");
    w.line("for (int64_t task = 0; task < tasks; ++task) {");
    w.indent();
    w.line("int64_t rest = task / split;");
    for (size_t i = g.batchVars.size(); i-- > 0;) {
      sym::SymExpr v = g.batchVars[i];
      w.line("const int64_t " + ix(v) + " = rest % " + ix(v->extent()) + ";");
      w.line("rest /= " + ix(v->extent()) + ";");
    }
    w.line("(void)rest;");
    w.line("const int64_t part = task % split, extent = by_rows ? M : N;");
    w.line("const int64_t lo = extent * part / split, hi = extent * (part + 1) / split;");
    w.line("const int64_t rows = by_rows ? hi - lo : M, cols = by_rows ? N : hi - lo;");
    w.line("if (rows == 0 || cols == 0) continue;");
    // Row block [lo, hi) of op(A) and C, or column block of op(B) and C.
    std::string aOff = "(by_rows ? lo * " + std::string(g.transA ? "INT64_C(1)" : "lda") + " : 0)";
    std::string bOff = "(by_rows ? 0 : lo * " + std::string(g.transB ? "ldb" : "INT64_C(1)") + ")";
    std::string cOff = "(by_rows ? lo * ldc : lo)";
    w.line(fn + "(101, " + (g.transA ? "112" : "111") + ", " + (g.transB ? "112" : "111") +
           ", rows, cols, K, 1, A + " + ix(g.offA) + " + " + aOff + ", lda, B + " + ix(g.offB) +
           " + " + bOff + ", ldb, 0, C + " + ix(g.offC) + " + " + cOff + ", ldc);");
    w.dedent();
    w.line("}");
    return out + "static void " + k.name + "(void* const* bufs, const int64_t* syms, int* err) {\n" +
           body + "}\n\n";
  }

  /// An integer Expr of a grouped product's row m (GemmCall::group, rowOf) as a function
  /// `<kernel><suffix>(.., m)`.
  std::string emitRowFunction(const Kernel &k, const loop::Expr *e, const std::string &suffix) {
    std::string body;
    Writer w(body, 1);
    emitPointers(k, w);
    Scope scope(nullptr);
    int counter = 0;
    ExprWriter ew(w, scope, names_, counter);
    w.line("return (int64_t)(" + ew.emit(e) + ");");
    return "static inline int64_t " + k.name + suffix + "(void* const* bufs, const int64_t* syms, "
           "int* err, int64_t " + names_.index(k.gemm->mVar) + ") {\n" + body + "}\n\n";
  }

  /// A grouped product: the threads take blocks of A's rows, and each run of rows with one
  /// group in a block is one gemm call with that group's B. Gathered rows of A are copied into
  /// a dense block per run first. A group or row outside its operand sets the error flag, as
  /// the loop nest's indirect load does.
  void emitGroupedRuns(const Kernel &k, Writer &w, const std::string &fn) {
    const sched::GemmCall &g = *k.gemm;
    auto ix = [&](sym::SymExpr e) { return names_.index(e); };
    std::string group = k.name + "_group(bufs, syms, err, ";
    w.line("const int64_t groups = " + ix(g.groupSym->extent()) + ";");
    w.line("if (M == 0 || N == 0)");
    w.line("  return;");
    w.line("const int threads = (double)M * N * K < 4.0e5 ? 1 : (int)std::min<int64_t>(omp_get_max_threads(), M);");
    w.line("#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)");
    w.line("for (int64_t task = 0; task < threads; ++task) {");
    w.line("  const int64_t hi = M * (task + 1) / threads;");
    if (g.rowOf)
      w.line("  std::vector<" + ctype(g.dtype) + "> rows;");
    w.line("  for (int64_t r = M * task / threads; r < hi;) {");
    w.line("    const int64_t t = " + group + "r);");
    w.line("    if (t < 0 || t >= groups) {");
    w.line("      __atomic_store_n(err, 1, __ATOMIC_RELAXED);");
    w.line("      break;");
    w.line("    }");
    w.line("    int64_t e = r + 1;");
    w.line("    while (e < hi && " + group + "e) == t)");
    w.line("      ++e;");
    std::string a = "A + " + ix(g.offA) + " + r * " + (g.transA ? "INT64_C(1)" : "lda");
    if (g.rowOf) {
      std::string ty = ctype(g.dtype);
      a = "rows.data()";
      w.line("    rows.resize((size_t)((e - r) * K));");
      w.line("    bool bad = false;");
      w.line("    for (int64_t i = r; i < e && !bad; ++i) {");
      w.line("      const int64_t src = " + k.name + "_row(bufs, syms, err, i);");
      w.line("      bad = src < 0 || src >= " + ix(g.rowSym->extent()) + ";");
      w.line("      const " + ty + "* from = A + " + ix(g.offA) + " + src * " + ix(g.rowStride) + ";");
      w.line("      for (int64_t kk = 0; kk < K && !bad; ++kk)");
      w.line("        rows[(size_t)((i - r) * K + kk)] = from[kk * " + ix(g.rowStep) + "];");
      w.line("    }");
      w.line("    if (bad) {");
      w.line("      __atomic_store_n(err, 1, __ATOMIC_RELAXED);");
      w.line("      break;");
      w.line("    }");
    }
    w.line("    " + fn + "(101, " + (g.transA ? "112" : "111") + ", " + (g.transB ? "112" : "111") +
           ", e - r, N, K, 1, " + a + ", lda, B + " + ix(g.offB) + " + t * " +
           ix(g.groupStride) + ", ldb, 0, C + " + ix(g.offC) + " + r * ldc, ldc);");
    w.line("    r = e;");
    w.line("  }");
    w.line("}");
  }

  /// An accumulating scatter. A float sum or product runs on threads that each own a
  /// contiguous range of the buffer's positions: every thread walks all the sources in order
  /// and combines those aimed at its range, so each position receives its values in source
  /// order from one thread (the same result on every run and at any thread count, as eager's
  /// CPU kernels), with no atomics; the value of a source is computed only by the thread that
  /// combines it. A combine that no order changes (an integer sum or product, a maximum or a
  /// minimum, a NaN winning) splits the sources among the threads and combines atomically.
  /// Positions are checked against the buffer's size.
  std::string emitScatterKernel(const Kernel &k) {
    next_ = 0;
    kernel_ = &k;
    std::string body;
    Writer w(body, 1);
    emitPointers(k, w);
    const Member &m = k.steps.at(0).members.at(0);
    const Buffer &b = *k.scatter->out;
    std::string size = "INT64_C(1)", sources = "INT64_C(1)";
    for (sym::SymExpr e : b.shape)
      size += " * " + names_.index(e);
    for (sym::SymExpr v : k.outerVars)
      sources += " * " + names_.index(v->extent());
    w.line("const int64_t size = " + size + ", sources = " + sources + ";");
    w.line("const int nthreads = sources < " + std::to_string(s_.target.minParallelWork) +
           " || size < 2 ? 1 : omp_get_max_threads();");
    // A combine whose result no order changes (integer sums and products, maxima, minima)
    // splits the sources among the threads and combines atomically; a float sum or product
    // has each position's values combined in source order by the thread that owns it.
    ReduceKind combine = k.scatter->scatterCombine;
    bool anyOrder = isIntegral(b.dtype) || combine == ReduceKind::Max || combine == ReduceKind::Min;
    if (anyOrder) {
      if (!k.outerVars.empty())
        w.line("#pragma omp parallel for num_threads(nthreads) collapse(" +
               std::to_string(k.outerVars.size()) + ")");
    } else {
      w.line("#pragma omp parallel num_threads(nthreads)");
      w.line("{");
      w.indent();
      w.line("const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();");
      w.line("const int64_t lo = size * thread / threads, hi = size * (thread + 1) / threads;");
    }
    for (sym::SymExpr v : k.outerVars) {
      w.line(loopHead(v) + " {");
      w.indent();
    }
    Scope scope(nullptr);
    ExprWriter ex(w, scope, names_, next_);
    std::string at = ex.emit(k.scatterAt);
    w.line("const int64_t at = (int64_t)(" + at + ");");
    w.line("if (at < 0 || at >= size) {");
    w.line(anyOrder ? "  __atomic_store_n(err, 1, __ATOMIC_RELAXED);"
                    : "  if (thread == 0) __atomic_store_n(err, 1, __ATOMIC_RELAXED);");
    w.line(anyOrder ? "} else {" : "} else if (at >= lo && at < hi) {");
    w.indent();
    std::string dst = names_.buffer(b) + "[at]";
    std::string value = convert(ex.emit(m.value), m.value->dtype(), computeType(b.dtype));
    if (anyOrder)
      combineAtomically(w, b.dtype, combine, dst, value);
    else
      combineInto(w, b.dtype, combine, dst, value);
    w.dedent();
    w.line("}");
    for (size_t i = 0; i < k.outerVars.size(); ++i) {
      w.dedent();
      w.line("}");
    }
    if (!anyOrder) {
      w.dedent();
      w.line("}");
    }
    return "static void " + k.name + "(void* const* bufs, const int64_t* syms, int* err) {\n" +
           body + "}\n\n";
  }

  /// The expression combining `held` and `value` by k: braze_max and braze_min (the C
  /// prelude's) keep a NaN, and `held` where the two are equal.
  static std::string combined(ReduceKind k, const std::string &held, const std::string &value) {
    if (k == ReduceKind::Max || k == ReduceKind::Min)
      return std::string(k == ReduceKind::Max ? "braze_max(" : "braze_min(") + value + ", " +
             held + ")";
    return held + (k == ReduceKind::Prod ? " * " : " + ") + value;
  }

  /// Writes an atomic combine of `value` into `dst` (of dtype t, which is its own compute
  /// type): a fetch-and-add for an integer sum, else a compare-and-swap loop that stops once
  /// the element holds the combined value (the same bits: a maximum that changes nothing).
  void combineAtomically(Writer &w, DType t, ReduceKind k, const std::string &dst,
                         const std::string &value) {
    if (k == ReduceKind::Sum) {
      w.line("__atomic_fetch_add(&" + dst + ", " + value + ", __ATOMIC_RELAXED);");
      return;
    }
    std::string n = std::to_string(next_++), seen = "seen" + n, v = "value" + n;
    std::string ty = ctype(t);
    w.line("const " + ty + " " + v + " = " + value + ";");
    w.line(ty + " " + seen + ";");
    w.line("__atomic_load(&" + dst + ", &" + seen + ", __ATOMIC_RELAXED);");
    w.line("for (;;) {");
    w.line("  " + ty + " next = " + combined(k, seen, v) + ";");
    w.line("  if (__builtin_memcmp(&next, &" + seen + ", sizeof next) == 0 ||");
    w.line("      __atomic_compare_exchange(&" + dst + ", &" + seen +
           ", &next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))");
    w.line("    break;");
    w.line("}");
  }

  /// Writes the statements that combine `value` (in computeType(t)) into `dst`, an element
  /// of dtype t: in place for a sum in t itself; otherwise through the compute type (f32 for
  /// half precision, rounded after each value), a maximum or minimum keeping a NaN.
  void combineInto(Writer &w, DType t, ReduceKind k, const std::string &dst,
                   const std::string &value) {
    DType ct = computeType(t);
    if (ct == t && k == ReduceKind::Sum) {
      w.line(dst + " += " + value + ";");
      return;
    }
    std::string held = "held" + std::to_string(next_++);
    w.line("const " + ctype(ct) + " " + held + " = " + convert(dst, t, ct) + ", value = " +
           value + ";");
    w.line(dst + " = " + convert("(" + combined(k, held, "value") + ")", ct, t) + ";");
  }

  /// The kernel's buffer pointers and size symbols, as locals.
  void emitPointers(const Kernel &k, Writer &w) {
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

  std::string emitKernel(const Kernel &k, const std::string &name) {
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
    // 2-4.
    if (k.outerVars.empty())
      emitWithoutOuter(k, w);
    else if (std::optional<size_t> lane = laneVar(k))
      emitWithLanes(k, w, *lane);
    else
      emitWithOuter(k, w);
    return "static void " + name +
           "(void* const* bufs, const int64_t* syms, int* err) {\n" + body + "}\n\n";
  }

  std::string loopHead(sym::SymExpr v) {
    std::string n = names_.index(v);
    return "for (int64_t " + n + " = 0; " + n + " < " + names_.index(v->extent()) + "; ++" + n + ")";
  }

  /// The `omp simd` line for a Loop step: every accumulator (and NaN flag) as a reduction.
  std::string simdClause(const Step &st) {
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

  /// Float max/min fold with a plain compare (which vectorizes) and remember NaNs separately,
  /// so that a NaN anywhere still makes the result NaN, as in PyTorch.
  static bool tracksNan(const loop::Computation &c) {
    return (c.reduce == ReduceKind::Max || c.reduce == ReduceKind::Min) &&
           isFloating(c.value->dtype());
  }
  std::string nanFlag(const loop::Computation &c) { return "nan" + std::to_string(c.id); }

  std::string argIndex(const loop::Computation &c) { return names_.acc(c) + "_i"; }

  /// Row-major position over the kernel's inner space (what argmax/argmin return).
  std::string innerPosition() {
    std::string pos = "INT64_C(0)";
    for (sym::SymExpr v : kernel_->innerVars)
      pos = "(" + pos + " * " + names_.index(v->extent()) + " + " + names_.index(v) + ")";
    return pos;
  }

  void declareAccumulator(const Member &m, Writer &w) {
    w.line(accType(*m.comp) + " " + names_.acc(*m.comp) + " = " + accumulatorInit(*m.comp) + ";");
    if (isArgReduction(*m.comp))
      w.line("int64_t " + argIndex(*m.comp) + " = 0;");
    if (tracksNan(*m.comp))
      w.line("int " + nanFlag(*m.comp) + " = 0;");
  }

  /// After a step's loop: a NaN seen anywhere becomes the result.
  void applyNanFlags(const Step &st, Writer &w) {
    for (const Member &m : st.members)
      if (m.comp->isReduction() && tracksNan(*m.comp))
        w.line("if (" + nanFlag(*m.comp) + lane_ + ") " + names_.acc(*m.comp) + lane_ +
               " = std::numeric_limits<" + ctype(m.comp->value->dtype()) + ">::quiet_NaN();");
  }

  /// One element folded into an accumulator inside the loop.
  std::string accFold(const loop::Computation &c, const std::string &acc, const std::string &v) {
    if (isArgReduction(c))
      return "if " + argBetter(c, acc, v) + " { " + acc + " = " + v + "; " + argIndex(c) + lane_ +
             " = " + innerPosition() + "; }";
    if (c.reduce == ReduceKind::Max || c.reduce == ReduceKind::Min) {
      std::string cmp = c.reduce == ReduceKind::Max ? " > " : " < ";
      std::string fold = acc + " = " + v + cmp + acc + " ? " + v + " : " + acc;
      return tracksNan(c) ? fold + "; " + nanFlag(c) + lane_ + " |= (" + v + " != " + v + ")"
                          : fold;
    }
    return accumulatorUpdate(c, acc, v);
  }

  void emitWithOuter(const Kernel &k, Writer &w) {
    bool scalarOnly = k.innerVars.empty();
    size_t n = k.outerVars.size();
    // A kernel without inner loops vectorizes its innermost outer loop.
    size_t parallelDims = scalarOnly && n > 1 ? n - 1 : n;
    std::string collapse = parallelDims > 1 ? " collapse(" + std::to_string(parallelDims) + ")" : "";
    bool simdOnParallel = scalarOnly && n == 1;
    Scope top(nullptr);
    std::vector<const Step *> steps;
    for (const Step &st : k.steps)
      steps.push_back(&st);
    hoistLoads(k, steps, allVars(k), w, top);
    if (simdOnParallel && k.steps.size() == 1 && emitGroups(k, w, top))
      return;
    w.line(std::string("#pragma omp parallel for") + (simdOnParallel ? " simd" : "") + collapse +
           " if(work >= " + std::to_string(s_.target.minParallelWork) + ")");
    for (size_t i = 0; i < n; ++i) {
      if (scalarOnly && n > 1 && i == n - 1)
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

  /// A one-dim pointwise kernel whose members fall in independent groups (an optimizer's
  /// updates of same-shaped parameters, joined by earlierKernel): one parallel region with a
  /// work-shared loop per group, none waiting for the others. One loop interleaving every
  /// group's dozens of loads and stores ran at half the speed per element of a loop per group.
  /// False (nothing written) for a single group.
  bool emitGroups(const Kernel &k, Writer &w, Scope &top) {
    std::vector<std::vector<Member>> groups = independentMembers(k.steps[0], k.outerVars);
    if (groups.size() < 2)
      return false;
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
    return true;
  }

  /// Lane mode, for kernels whose reductions read memory along an outer dim (a column sum, a
  /// channels-last pooling window): that dim is cut into blocks of kLanes consecutive values,
  /// and every step runs its inner loops outside a `omp simd` loop over the block's values,
  /// which keep their accumulators and results in arrays. Chosen when no load is contiguous
  /// along the innermost inner variable and some load is along an outer one.
  static constexpr int kLanes = 16;

  std::optional<size_t> laneVar(const Kernel &k) {
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

  /// Emits, into `scope` before a loop nest, the loads of `steps` whose index names none of
  /// `vars` (a per-channel scale read in a loop over the channel's points, a scalar read
  /// everywhere), from buffers this kernel does not write. GCC does not hoist them itself
  /// (it cannot tell a local restrict pointer's stores apart), and such a load feeding a
  /// select stops a loop's vectorization.
  void hoistLoads(const Kernel &k, const std::vector<const Step *> &steps,
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

  static std::vector<sym::SymExpr> allVars(const Kernel &k) {
    std::vector<sym::SymExpr> vars = k.outerVars;
    vars.insert(vars.end(), k.innerVars.begin(), k.innerVars.end());
    return vars;
  }

  /// The lane arrays a step's results live in: its reductions' accumulators, NaN flags,
  /// positions and results, and a Scalar step's values.
  void declareLaneLocals(const Step &st, Writer &w) {
    std::string n = "[" + std::to_string(kLanes) + "]";
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

  void emitWithLanes(const Kernel &k, Writer &w, size_t laneIndex) {
    sym::SymExpr lane = k.outerVars[laneIndex];
    std::string x = names_.index(lane), xb = x + "b", extent = names_.index(lane->extent());
    std::vector<sym::SymExpr> rest;
    for (size_t i = 0; i < k.outerVars.size(); ++i)
      if (i != laneIndex)
        rest.push_back(k.outerVars[i]);
    std::string blockHead = "for (int64_t " + xb + " = 0; " + xb + " < " + extent + "; " + xb +
                            " += " + std::to_string(kLanes) + ") {";
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
           std::to_string(kLanes) + ");");
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

  void emitWithoutOuter(const Kernel &k, Writer &w) {
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

  /// Folds the per-thread partials in thread order: deterministic, and for argmax/argmin the
  /// earlier position wins ties because threads own ascending chunks.
  void combinePartials(const loop::Computation &c, Writer &w) {
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

  /// A float sum folds into a float partial per block of kSumBlock inner points, in `omp simd`
  /// lanes, and each block's partial into its double accumulator: the loop runs at float
  /// width, and no float partial holds more than kSumBlock / lanes terms.
  static constexpr int kSumBlock = 512;
  static bool foldsInBlocks(const loop::Computation &c) {
    return c.reduce == ReduceKind::Sum && c.value->dtype() == DType::Float32;
  }

  /// The accumulator a member folds into inside the loop being emitted.
  std::string accOf(const loop::Computation &c) {
    auto it = blockAcc_.find(&c);
    return it == blockAcc_.end() ? names_.acc(c) + lane_ : it->second;
  }

  /// Opens a Loop step's innermost loop over v in [lo, hi): its `omp simd` line and, when the
  /// step has float sums and vectorizes, the blocks that hold their float partials.
  void openInnermost(const Step &st, Writer &w, sym::SymExpr v, const std::string &lo,
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

  void closeInnermost(const Step &st, Writer &w) {
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

  std::string accType(const loop::Computation &c) {
    DType t = c.value->dtype();
    if (c.reduce == ReduceKind::Sum && isFloating(t))
      return "double";
    return ctype(t);
  }

  /// Emits the members of a step at the current point. Reductions fold into their accumulator;
  /// pointwise members define a local and store it if needed (`storeGuard` limits who stores).
  /// `exportTo` (lane mode's Scalar steps): the members' values are lane arrays declared
  /// before the lane loop (declareLaneLocals), visible to later steps through that scope.
  void emitMembers(const Step &st, Writer &w, Scope &scope,
                   const std::string &storeGuard = "", Scope *exportTo = nullptr) {
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

  void finishReductions(const Step &st, Writer &w, Scope &scope, const std::string &storeGuard) {
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

  std::string emitAbi() {
    std::vector<std::string> calls;
    for (const Kernel &k : s_.kernels)
      calls.push_back(k.name + "(bufs, syms, &err);");
    return emitModuleAbi(s_, names_, calls);
  }

  const sched::Schedule &s_;
  CpuCodegenOptions opts_;
  Names names_;
  int next_ = 0; ///< numbering of expression locals, unique per kernel
  const Kernel *kernel_ = nullptr; ///< the kernel being emitted
  std::unordered_map<const loop::Computation *, std::string> blockAcc_; ///< float partials
  bool blocked_ = false; ///< the innermost loop being emitted runs in blocks
  std::string lane_; ///< lane mode: `[x - xb]`, the lane's element of each lane array
};

} // namespace

std::string blasDeclarations(const BlasSymbols &blas, DType t) {
  std::string fn = t == DType::Float32 ? blas.sgemm : blas.dgemm;
  std::string idx = blas.indexBits == 64 ? "int64_t" : "int";
  std::string ty = ctype(t);
  std::string out = "extern \"C\" void " + fn + "(int, int, int, " + idx + ", " + idx + ", " +
                    idx + ", " + ty + ", const " + ty + "*, " + idx + ", const " + ty + "*, " +
                    idx + ", " + ty + ", " + ty + "*, " + idx + ");\n";
  if (!blas.setThreads.empty())
    out += "extern \"C\" void " + blas.setThreads + "(int);\n";
  return out;
}

GeneratedSource generateCpu(const sched::Schedule &s, const CpuCodegenOptions &opts) {
  return CpuEmitter(s, opts).run();
}

} // namespace braze::codegen
