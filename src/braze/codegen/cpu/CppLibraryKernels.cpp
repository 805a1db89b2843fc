// The CPU kernels that call a library, each with the loop nest as its fallback: matrix
// products through a single-threaded BLAS (grouped ones by runs of rows), convolutions through
// oneDNN, fused attention through the attention prelude; and accumulating scatters.
#include "braze/codegen/cpu/CpuEmitter.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/KernelBody.h"
#include "braze/support/Check.h"

#include <optional>
#include <string>

namespace braze::codegen::cpu {

bool CpuEmitter::usesBlas(const Kernel &k) const {
  if (!k.gemm() || (k.gemm()->dtype != DType::Float32 && k.gemm()->dtype != DType::Float64) ||
      k.gemm()->outDtype != k.gemm()->dtype)
    return false;
  return k.gemm()->dtype == DType::Float32 ? !opts_.blas.sgemm.empty() : !opts_.blas.dgemm.empty();
}

void CpuEmitter::keepBlasSingleThreaded(Writer &w) {
  if (opts_.blas.setThreads.empty())
    return;
  w.line("static const int blas_single_threaded = (" + opts_.blas.setThreads + "(1), 0);");
  w.line("(void)blas_single_threaded;");
}

void CpuEmitter::declareSymbols(const Kernel &k, Writer &w) {
  std::set<int> used;
  std::vector<sym::SymExpr> syms;
  collectKernelUses(k, names_, used, syms);
  for (sym::SymExpr sy : syms)
    w.line("const int64_t " + names_.symbol(sy) + " = syms[" +
           std::to_string(names_.symbolIndex(sy)) + "];");
}

bool CpuEmitter::usesDnnl(const Kernel &k) const {
  return opts_.dnnl && k.conv() && k.conv()->out->dtype == DType::Float32;
}

std::string CpuEmitter::emitConvKernel(const Kernel &k) {
  const loop::Computation &c = *k.conv();
  const loop::ConvSpec &cv = *c.conv();
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

std::string CpuEmitter::emitAttentionKernel(const Kernel &k) {
  const loop::Computation &c = *k.attention();
  const loop::AttentionSpec &a = *c.attention();
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
  // Dropout: the seed's i64 and p (a null seed keeps every probability).
  std::string dropout = a.seed ? "(const int64_t*)bufs[" + std::to_string(a.seed->buffer->id) +
                                     "] + " + names_.index(a.seed->offset) + ", " +
                                     literal(a.dropout, 0, DType::Float32)
                               : std::string("nullptr, 0.0f");
  std::string r = std::to_string(rank);
  // The part the same pass writes beside (the output's log-sum-exp, k's gradient's v's).
  const loop::Computation *pairPart = k.attentionPair();
  std::string pair = pairPart ? "(float*)bufs[" + std::to_string(pairPart->out->id) + "]"
                              : std::string("nullptr");
  switch (a.part) {
  case loop::AttentionPart::Output:
    w.line("const int64_t os[" + r + "] = " + list(c.out->strides) + ";");
    w.line("braze_attention_f32(" + r + ", dims, " + q + ", " + kk + ", " + v + ", " + bias +
           ", " + out + ", os, " + tail + ", " + (a.safe ? "true" : "false") + ", " + dropout +
           ", " + pair + ");");
    break;
  case loop::AttentionPart::Lse:
    w.line("braze_attention_lse_f32(" + r + ", dims, " + q + ", " + kk + ", " + bias + ", " +
           out + ", " + tail + ");");
    break;
  case loop::AttentionPart::GradQ:
  case loop::AttentionPart::GradK:
  case loop::AttentionPart::GradV: {
    int wrt = a.part == loop::AttentionPart::GradQ   ? 0
              : a.part == loop::AttentionPart::GradV ? 2
              : k.attentionPair()                    ? 3 // and v's
                                                     : 1;
    std::string dout = operand(a.dout, "do"), o = operand(a.out, "o"), lse = operand(a.lse, "l");
    w.line("braze_attention_grad_f32(" + std::to_string(wrt) + ", " + r + ", dims, " + dout +
           ", " + q + ", " + kk + ", " + v + ", " + o + ", " + lse + ", " + bias + ", " + out +
           ", " + tail + ", " + dropout + ", " + pair + ");");
    break;
  }
  }
  return "static void " + k.name + "(void* const* bufs, const int64_t* syms, int* err) {\n" +
         body + "}\n\n";
}

std::string CpuEmitter::emitGemmKernel(const Kernel &k) {
  const sched::GemmCall &g = *k.gemm();
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

std::string CpuEmitter::emitRowFunction(const Kernel &k, const loop::Expr *e,
                                        const std::string &suffix) {
  std::string body;
  Writer w(body, 1);
  emitPointers(k, w);
  Scope scope(nullptr);
  int counter = 0;
  ExprWriter ew(w, scope, names_, counter);
  w.line("return (int64_t)(" + ew.emit(e) + ");");
  return "static inline int64_t " + k.name + suffix + "(void* const* bufs, const int64_t* syms, "
         "int* err, int64_t " + names_.index(k.gemm()->mVar) + ") {\n" + body + "}\n\n";
}

void CpuEmitter::emitGroupedRuns(const Kernel &k, Writer &w, const std::string &fn) {
  const sched::GemmCall &g = *k.gemm();
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

std::string CpuEmitter::emitScatterKernel(const Kernel &k) {
  next_ = 0;
  kernel_ = &k;
  std::string body;
  Writer w(body, 1);
  emitPointers(k, w);
  const Member &m = k.steps.at(0).members.at(0);
  const Buffer &b = *k.scatter()->out;
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
  ReduceKind combine = k.scatter()->scatterCombine();
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
  std::string at = ex.emit(k.scatterAt());
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

std::string CpuEmitter::combined(ReduceKind k, const std::string &held, const std::string &value) {
  if (k == ReduceKind::Max || k == ReduceKind::Min)
    return std::string(k == ReduceKind::Max ? "braze_max(" : "braze_min(") + value + ", " +
           held + ")";
  return held + (k == ReduceKind::Prod ? " * " : " + ") + value;
}

void CpuEmitter::combineAtomically(Writer &w, DType t, ReduceKind k, const std::string &dst,
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

void CpuEmitter::combineInto(Writer &w, DType t, ReduceKind k, const std::string &dst,
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

} // namespace braze::codegen::cpu
