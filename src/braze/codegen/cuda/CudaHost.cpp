#include "braze/codegen/cuda/CudaHost.h"

#include "braze/codegen/CFamily.h"
#include "braze/support/Check.h"

namespace braze::codegen {

std::string extentProduct(const Names &names, const std::vector<sym::SymExpr> &vars) {
  std::string p = "INT64_C(1)";
  for (sym::SymExpr v : vars)
    p += " * " + names.index(v->extent());
  return p;
}

std::string launchStatement(const sched::Schedule &s, const Names &names, const sched::Kernel &k,
                            int index, int threads, const std::string &pointsPerBlock,
                            int groups) {
  std::string blocks = "(" + extentProduct(names, k.outerVars) + " + " + pointsPerBlock +
                       " - 1) / (" + pointsPerBlock + ")";
  return launchBlocks(s, names, k, index, threads,
                      groups > 1 ? std::to_string(groups) + " * (" + blocks + ")" : blocks);
}

std::string launchBlocks(const sched::Schedule &s, const Names &names, const sched::Kernel &k,
                         int index, int threads, const std::string &blocks, int sharedBytes) {
  // Arguments in the order of the kernel's parameters: buffers in memory, then sizes, then the
  // error flag; each a pointer to the value.
  std::set<int> used;
  std::vector<sym::SymExpr> syms;
  collectKernelUses(k, names, used, syms);
  std::string args;
  for (int id : used)
    if (s.placement.at(id).kind != sched::PlacementKind::Local)
      args += "(void*)&bufs[" + std::to_string(id) + "], ";
  for (sym::SymExpr sy : syms)
    args += "(void*)&" + names.symbol(sy) + ", ";
  args += "(void*)&api->err";
  std::string launch = sharedBytes ? "api->launchShared(api->ctx, " : "api->launch(api->ctx, ";
  return "{ const int64_t blocks = " + blocks + "; if (blocks > 0) { void* args[] = {" + args +
         "}; err = " + launch + std::to_string(index) + ", blocks, " + std::to_string(threads) +
         (sharedBytes ? ", " + std::to_string(sharedBytes) : "") + ", args); } }";
}

namespace {
/// Writes `err = call;` and, where the library declined the call (1), `fallback` (the launch
/// of braze's own kernel) in its place.
void callOrFallback(Writer &w, const std::string &call, const std::string &fallback) {
  w.line("err = " + call + ";");
  w.line("if (err == 1) {");
  w.line("  err = 0;");
  w.line("  " + fallback);
  w.line("}");
}

/// The dtype code BrazeGemm and BrazeConv carry: 0 f32, 1 f64, 2 f16, 3 bf16.
std::string code(DType t) {
  return std::to_string(t == DType::Float32 ? 0 : t == DType::Float64 ? 1
                        : t == DType::Float16 ? 2 : 3);
}
} // namespace

std::string gemmStatement(sym::SymContext &sc, const Names &names, const sched::Kernel &k,
                          const std::string &fallback, bool tf32) {
  const sched::GemmCall &g = *k.gemm();
  const sched::StridedBatch run = sched::stridedBatch(sc, g);
  auto ix = [&](sym::SymExpr e) { return names.index(e); };
  std::string out;
  Writer w(out, 1);
  w.line("{");
  w.indent();
  // cuBLASLt does not define k == 0: the loop kernel writes the zeros. Nor more than INT32_MAX
  // matrices in one call.
  w.line("const int64_t batch = " + ix(run.count) + ";");
  w.line("if (!(K > 0 && batch <= INT32_MAX && " + emitGemmLayout(w, g, names) + ")) {");
  w.line("  " + fallback);
  w.line("} else if (M > 0 && N > 0 && batch > 0) {");
  w.indent();
  std::string esz = std::to_string(dtypeSize(g.dtype)), cesz = std::to_string(dtypeSize(g.outDtype));
  for (size_t i = 0; i < run.outer; ++i) {
    sym::SymExpr v = g.batchVars[i];
    w.line("for (int64_t " + ix(v) + " = 0; " + ix(v) + " < " + ix(v->extent()) + " && !err; ++" +
           ix(v) + ") {");
    w.indent();
  }
  w.line("BrazeGemm g = {" + code(g.dtype) + ", " + (g.transA ? "1" : "0") + ", " +
         (g.transB ? "1" : "0") + ", M, N, K, (const char*)bufs[" + std::to_string(g.a->id) +
         "] + (" + ix(run.offA) + ") * " + esz + ", lda, (const char*)bufs[" +
         std::to_string(g.b->id) + "] + (" + ix(run.offB) + ") * " + esz + ", ldb, (char*)bufs[" +
         std::to_string(g.c->id) + "] + (" + ix(run.offC) + ") * " + cesz + ", ldc, " +
         (g.bias ? "bufs[" + std::to_string(g.bias->id) + "]" : std::string("nullptr")) +
         ", batch, " + ix(run.strideA) + ", " + ix(run.strideB) + ", " + ix(run.strideC) + ", " +
         code(g.outDtype) + ", " + (tf32 && g.dtype == DType::Float32 ? "1" : "0") + "};");
  w.line("err = api->gemm(api->ctx, &g);");
  for (size_t i = 0; i < run.outer; ++i) {
    w.dedent();
    w.line("}");
  }
  w.dedent();
  w.line("}");
  w.dedent();
  w.line("}");
  return out;
}

/// Whether y has every window the kernel gives over x (floor((x + 2p - d(k - 1) - 1) / s) + 1
/// positions per spatial dim), as cuDNN's problems do. A weight gradient may read fewer (a
/// transposed convolution whose output padding passes its stride).
bool allWindows(const loop::ConvSpec &cv, const loop::Buffer *out) {
  std::vector<sym::SymExpr> x = cv.logical(cv.x(out)->shape), y = cv.logical(cv.y(out)->shape);
  const std::vector<sym::SymExpr> &w = cv.w(out)->shape;
  for (size_t i = 0; i < cv.stride.size(); ++i) {
    if (!x[2 + i]->isConst() || !w[2 + i]->isConst() || !y[2 + i]->isConst())
      return false;
    int64_t room = x[2 + i]->value() + 2 * cv.padding[i] -
                   cv.dilation[i] * (w[2 + i]->value() - 1) - 1;
    if (room < 0 || room / cv.stride[i] + 1 != y[2 + i]->value())
      return false;
  }
  return true;
}

std::string convStatement(const Names &names, const sched::Kernel &k, const std::string &fallback,
                          bool tf32) {
  const loop::Computation &c = *k.conv();
  const loop::ConvSpec &cv = *c.conv();
  if (cv.direction == loop::ConvDirectionKind::WeightGrad && !allWindows(cv, c.out))
    return fallback; // not a problem cuDNN states: the loops compute it
  const loop::Buffer *x = cv.x(c.out), *wt = cv.w(c.out), *y = cv.y(c.out);
  DType t = c.out->dtype;
  auto list = [&](const std::vector<sym::SymExpr> &xs) { return cIndexList(names, xs); };
  auto ints = cIntList;
  auto ptr = [](const loop::Buffer *b) { return "bufs[" + std::to_string(b->id) + "]"; };
  std::string out;
  Writer w(out, 1);
  w.line("{");
  w.indent();
  w.line("const BrazeConv c = {" + code(t) + ", " +
         std::to_string(c.out->shape.size()) + ", " + list(cv.logical(x->shape)) + ", " +
         list(cv.logical(x->strides)) + ", " + list(wt->shape) + ", " + list(wt->strides) + ", " +
         list(cv.logical(y->shape)) + ", " + list(cv.logical(y->strides)) +
         ", INT64_C(" + std::to_string(cv.groups) + "), " + ints(cv.stride) + ", " +
         ints(cv.padding) + ", " + ints(cv.dilation) + ", " + ptr(x) + ", " + ptr(wt) + ", " +
         ptr(y) + ", " + (tf32 && t == DType::Float32 ? "1" : "0") + ", " +
         std::to_string(static_cast<int>(cv.direction)) + "};");
  callOrFallback(w, "api->conv(api->ctx, &c)", fallback);
  w.dedent();
  w.line("}");
  return out;
}

namespace {
/// An attention's operands in C text: an operand's address, a list of sizes or strides.
struct AttentionFill {
  const Names &names;
  size_t rank = 0;
  std::string at(const loop::AttentionOperand &o) const {
    return "(const char*)bufs[" + std::to_string(o.buffer->id) + "] + (" + names.index(o.offset) +
           ") * " + std::to_string(dtypeSize(o.buffer->dtype));
  }
  std::string list(const std::vector<sym::SymExpr> &xs) const { return cIndexList(names, xs); }
};

/// Writes the lines that fill BrazeAttention `a` with attention kernel k's operands (q, k, v,
/// sizes, scale) and the stride arrays `batch`, `qs`, `ks` and `vs`.
AttentionFill fillAttention(Writer &w, const Names &names, const sched::Kernel &k) {
  const loop::AttentionSpec &a = *k.attention()->attention();
  size_t r = a.q.shape.size();
  auto ix = [&](sym::SymExpr e) { return names.index(e); };
  AttentionFill f{names, r};
  std::vector<sym::SymExpr> batch(a.q.shape.begin(), a.q.shape.end() - 2);
  w.line("BrazeAttention a = {};");
  w.line("a.dtype = " + code(a.q.buffer->dtype) + ";");
  w.line("a.causal = " + std::string(a.causal ? "1" : "0") + ";");
  w.line("a.sq = " + ix(a.q.shape[r - 2]) + "; a.skv = " + ix(a.k.shape[r - 2]) + ";");
  w.line("a.d = " + ix(a.q.shape[r - 1]) + "; a.dv = " + ix(a.v.shape[r - 1]) + ";");
  w.line("a.scale = " + literal(a.scale, 0, DType::Float32) + ";");
  w.line("a.q = " + f.at(a.q) + "; a.k = " + f.at(a.k) + "; a.v = " + f.at(a.v) + ";");
  w.line("const int64_t batch[] = " + f.list(batch) + ";");
  w.line("const int64_t qs[] = " + f.list(a.q.strides) + ", ks[] = " + f.list(a.k.strides) +
         ", vs[] = " + f.list(a.v.strides) + ";");
  return f;
}

/// A log-sum-exp's strides ([B.., Sq]) as [B.., Sq, 1] (C text).
std::string rowStrides(const AttentionFill &f, const std::vector<sym::SymExpr> &strides) {
  std::string ls = f.list(strides);
  ls.insert(ls.size() - 1, ", INT64_C(1)");
  return ls;
}

/// `mapped` (C text: whether the operands map to cuDNN's) with the bias's mapping, and the
/// call or `fallback` in its place.
void callAttention(Writer &w, const AttentionFill &f, const loop::AttentionSpec &a,
                   std::string mapped, const std::string &fallback) {
  if (a.bias) {
    w.line("a.bias = " + f.at(*a.bias) + ";");
    w.line("const int64_t bs[] = " + f.list(a.bias->strides) + ";");
    mapped += " && braze_attention_bias(&a, " + std::to_string(f.rank) + ", batch, bs)";
  }
  callOrFallback(w, mapped + " ? api->attention(api->ctx, &a) : 1", fallback);
}
} // namespace

std::string attentionStatement(const Names &names, const sched::Kernel &k,
                               const std::string &fallback) {
  const loop::Computation &c = *k.attention();
  const loop::AttentionSpec &a = *c.attention();
  std::string out;
  Writer w(out, 1);
  w.line("{");
  w.indent();
  AttentionFill f = fillAttention(w, names, k);
  w.line("a.o = bufs[" + std::to_string(c.out->id) + "];");
  w.line("const int64_t os[] = " + f.list(c.out->strides) + ";");
  std::string stats = "0";
  if (k.attentionPair()) { // the log-sum-exp beside the output: cuDNN's statistics
    const loop::Buffer &l = *k.attentionPair()->out;
    w.line("a.stats = bufs[" + std::to_string(l.id) + "];");
    w.line("const int64_t ls[] = " + rowStrides(f, l.strides) + ";");
    stats = "ls";
  }
  callAttention(w, f, a,
                "braze_attention_layout(&a, " + std::to_string(f.rank) +
                    ", batch, qs, ks, vs, os, " + stats + ")",
                fallback);
  w.dedent();
  w.line("}");
  return out;
}

std::string attentionGradStatement(const Names &names, const sched::Kernel &k,
                                   const std::string &fallback) {
  const loop::Computation &c = *k.attention();
  const loop::AttentionSpec &a = *c.attention();
  BRAZE_CHECK(k.attentionPair() && k.attentionGradQ()) << "a cuDNN backward writes three gradients";
  auto buffer = [](const loop::Computation &x) {
    return "bufs[" + std::to_string(x.out->id) + "]";
  };
  std::string out;
  Writer w(out, 1);
  w.line("{");
  w.indent();
  AttentionFill f = fillAttention(w, names, k);
  w.line("a.o = (void*)(" + f.at(*a.out) + "); a.stats = (void*)(" + f.at(*a.lse) + ");");
  w.line("a.grad_out = " + f.at(*a.dout) + ";");
  w.line("a.grad_q = " + buffer(*k.attentionGradQ()) + "; a.grad_k = " + buffer(c) +
         "; a.grad_v = " + buffer(*k.attentionPair()) + ";");
  w.line("const int64_t os[] = " + f.list(a.out->strides) + ", ls[] = " +
         rowStrides(f, a.lse->strides) + ";");
  w.line("const int64_t gs[] = " + f.list(a.dout->strides) + ", dqs[] = " +
         f.list(k.attentionGradQ()->out->strides) + ", dks[] = " + f.list(c.out->strides) +
         ", dvs[] = " + f.list(k.attentionPair()->out->strides) + ";");
  std::string r = std::to_string(f.rank);
  callAttention(w, f, a,
                "braze_attention_layout(&a, " + r + ", batch, qs, ks, vs, os, ls) && " +
                    "braze_attention_grads(&a, " + r + ", batch, gs, dqs, dks, dvs)",
                fallback);
  w.dedent();
  w.line("}");
  return out;
}

std::string hostSource(const sched::Schedule &s, Names &names,
                       const std::vector<std::string> &calls) {
    std::string out = R"HOST(#include <stdint.h>
#include <stdio.h>

// The runtime's side of a CUDA module (runtime/CudaModule.cpp): launches kernels by index,
// GEMMs through cuBLASLt and convolutions through cuDNN, on the stream of the current call.
struct BrazeGemm {
  int dtype; // 0 f32, 1 f64, 2 f16, 3 bf16
  int transA, transB;
  int64_t m, n, k;
  const void* a; int64_t lda;
  const void* b; int64_t ldb;
  void* c; int64_t ldc;
  const void* bias; // [n], added before C is rounded; or null
  int64_t batch; // matrices, each stride{A,B,C} elements after the one before
  int64_t strideA, strideB, strideC;
  int outDtype; // of C, as dtype: dtype, or f32 for f16/bf16 operands
  int allowTf32; // f32: inputs may be rounded to TF32
};
struct BrazeConv {
  int dtype; // as BrazeGemm's
  int rank;
  int64_t x_dims[5], x_strides[5], w_dims[5], w_strides[5], y_dims[5], y_strides[5];
  int64_t groups;
  int64_t stride[3], padding[3], dilation[3];
  void* x; void* w; void* y; // the result: y, or (direction 1) w, or (direction 2) x
  int allowTf32; // f32: cuDNN may use TF32
  int direction; // 0: y = conv(x, w); 1: w = the weight gradient from x and y's gradient;
                 // 2: x = the input gradient from y's gradient and w
};
struct BrazeAttention {
  int dtype; // 2 f16, 3 bf16
  int causal;
  int64_t b, hq, hk, sq, skv, d, dv; // q [b, hq, sq, d], k [b, hk, skv, d], v [b, hk, skv, dv]
  int64_t q_strides[4], k_strides[4], v_strides[4], o_strides[4];
  float scale;
  const void* q; const void* k; const void* v; void* o;
  const void* bias; // [b|1, hq|1, sq|1, skv] (1 broadcasts), added to the scaled scores; or null
  int64_t bias_dims[4], bias_strides[4];
  void* stats; // or null: each row's log-sum-exp, f32 [b, hq, sq, 1] (read with grad)
  int64_t stats_strides[4];
  int grad; // 1: the gradients of q, k and v from grad_out (of o), o (read) and stats (read)
  int64_t hg; // heads of grad_k and grad_v: hk, or hq where each query head has its own
  const void* grad_out; void* grad_q; void* grad_k; void* grad_v; // with grad
  int64_t grad_out_strides[4], grad_q_strides[4], grad_k_strides[4], grad_v_strides[4];
};
struct BrazeCudaApi {
  void* ctx;
  int (*launch)(void* ctx, int kernel, int64_t blocks, int threads, void** args);
  int (*gemm)(void* ctx, const BrazeGemm* g);
  int (*conv)(void* ctx, const BrazeConv* c); // 0 done, 1 declined (launch the loops), 2 failed
  int* err; // device-visible error flag of the kernels
  int assertIndices; // launch braze_index_guard after the kernels that check indices
  int (*attention)(void* ctx, const BrazeAttention* a); // as conv (1: launch braze's kernel)
  int (*launchShared)(void* ctx, int kernel, int64_t blocks, int threads, int shared_bytes, void** args);
};

// An attention operand's strides s of rank r ([batch.., s, d]) as cuDNN's [b, h, s, d] strides
// in dst; its heads, or 0 where they do not map. r = 3 has one head; r = 5 merges its two head
// dims, where keys and values may repeat along the second (stride 0: grouped-query attention).
static int64_t braze_attention_strides(int r, const int64_t* batch, int64_t b,
                                       const int64_t* s, int64_t* dst) {
  int64_t heads;
  if ((b > 1 && s[0] <= 0) || s[r - 1] != 1)
    return 0;
  dst[0] = s[0];
  dst[2] = s[r - 2];
  dst[3] = 1;
  if (r == 3) {
    heads = 1, dst[1] = s[0];
  } else if (r == 4) {
    int repeated = s[1] == 0 && batch[1] > 1;
    heads = repeated ? 1 : batch[1], dst[1] = repeated ? s[0] : s[1];
  } else if (batch[2] == 1 || s[1] == s[2] * batch[2]) {
    heads = batch[1] * batch[2], dst[1] = batch[2] == 1 ? s[1] : s[2];
  } else if (s[2] == 0) {
    heads = batch[1], dst[1] = s[1];
  } else {
    return 0;
  }
  return heads > 1 && dst[1] <= 0 ? 0 : heads;
}

// An attention's operands of rank r ([batch.., s, d]; strides qs, ks, vs and os, the output's,
// and ls, the log-sum-exp's as [batch.., sq, 1], or null) as cuDNN's [b, h, s, d] in a: 0 where
// they do not map.
static int braze_attention_layout(BrazeAttention* a, int r, const int64_t* batch,
                                  const int64_t* qs, const int64_t* ks, const int64_t* vs,
                                  const int64_t* os, const int64_t* ls) {
  if (r < 3 || r > 5 || a->sq <= 0 || a->skv <= 0 || batch[0] <= 0)
    return 0;
  a->b = batch[0];
  a->hq = braze_attention_strides(r, batch, a->b, qs, a->q_strides);
  a->hk = braze_attention_strides(r, batch, a->b, ks, a->k_strides);
  return a->hq > 0 && a->hk > 0 && a->hq % a->hk == 0 &&
         braze_attention_strides(r, batch, a->b, vs, a->v_strides) == a->hk &&
         braze_attention_strides(r, batch, a->b, os, a->o_strides) == a->hq &&
         (!ls || braze_attention_strides(r, batch, a->b, ls, a->stats_strides) == a->hq);
}

// The gradients' strides after braze_attention_layout (the output's gradient's as the output's,
// q's as q's, k's and v's as k's, or with each query head's own: a->hg) in a: 0 where they do
// not map.
static int braze_attention_grads(BrazeAttention* a, int r, const int64_t* batch,
                                 const int64_t* gs, const int64_t* dqs, const int64_t* dks,
                                 const int64_t* dvs) {
  a->grad = 1;
  a->hg = braze_attention_strides(r, batch, a->b, dks, a->grad_k_strides);
  return braze_attention_strides(r, batch, a->b, gs, a->grad_out_strides) == a->hq &&
         braze_attention_strides(r, batch, a->b, dqs, a->grad_q_strides) == a->hq &&
         (a->hg == a->hk || a->hg == a->hq) &&
         braze_attention_strides(r, batch, a->b, dvs, a->grad_v_strides) == a->hg;
}

// The bias of an attention of rank r ([batch.., sq, skv], strides bs; a stride 0 broadcasts)
// as cuDNN's [b|1, h|1, sq|1, skv] in a, after braze_attention_layout: 0 where it does not map.
static int braze_attention_bias(BrazeAttention* a, int r, const int64_t* batch,
                                const int64_t* bs) {
  int64_t* d = a->bias_dims;
  int64_t* s = a->bias_strides;
  if (bs[r - 1] != 1)
    return 0;
  d[3] = a->skv, s[3] = 1;
  d[2] = bs[r - 2] == 0 || a->sq == 1 ? 1 : a->sq, s[2] = bs[r - 2];
  d[0] = bs[0] == 0 || a->b == 1 ? 1 : a->b, s[0] = bs[0];
  if (r == 3) {
    d[1] = 1;
  } else if (r == 4 || batch[2] == 1) {
    d[1] = bs[1] == 0 || batch[1] == 1 ? 1 : a->hq, s[1] = bs[1];
  } else if (bs[1] == 0 && bs[2] == 0) {
    d[1] = 1;
  } else if (bs[1] == bs[2] * batch[2] || batch[1] == 1) {
    d[1] = a->hq, s[1] = bs[2];
  } else {
    return 0;
  }
  for (int i = 2; i >= 0; --i) {
    if (s[i] == 0)
      d[i] = 1; // broadcast
    if (d[i] == 1)
      s[i] = s[i + 1] * d[i + 1];
  }
  return 1;
}

#define BRAZE_FN static inline
)HOST";
    return out + cIndexHelpers() + "\n" + emitModuleAbi(s, names, calls, ", const BrazeCudaApi* api");
  }

} // namespace braze::codegen
