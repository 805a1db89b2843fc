#include "braze/codegen/cuda/CudaHost.h"

#include "braze/codegen/CFamily.h"

namespace braze::codegen {

std::string extentProduct(const Names &names, const std::vector<sym::SymExpr> &vars) {
  std::string p = "INT64_C(1)";
  for (sym::SymExpr v : vars)
    p += " * " + names.index(v->extent());
  return p;
}

std::string launchStatement(const sched::Schedule &s, const Names &names, const sched::Kernel &k,
                            int index, int threads, const std::string &pointsPerBlock) {
  return launchBlocks(s, names, k, index, threads,
                      "(" + extentProduct(names, k.outerVars) + " + " + pointsPerBlock +
                          " - 1) / (" + pointsPerBlock + ")");
}

std::string launchBlocks(const sched::Schedule &s, const Names &names, const sched::Kernel &k,
                         int index, int threads, const std::string &blocks) {
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
  return "{ const int64_t blocks = " + blocks + "; if (blocks > 0) { void* args[] = {" + args +
         "}; err = api->launch(api->ctx, " + std::to_string(index) + ", blocks, " +
         std::to_string(threads) + ", args); } }";
}

namespace {
/// The dtype code BrazeGemm and BrazeConv carry: 0 f32, 1 f64, 2 f16, 3 bf16.
std::string code(DType t) {
  return std::to_string(t == DType::Float32 ? 0 : t == DType::Float64 ? 1
                        : t == DType::Float16 ? 2 : 3);
}
} // namespace

std::string gemmStatement(sym::SymContext &sc, const Names &names, const sched::Kernel &k,
                          const std::string &fallback, bool tf32) {
  const sched::GemmCall &g = *k.gemm;
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

std::string convStatement(const Names &names, const sched::Kernel &k, const std::string &fallback,
                          bool tf32) {
  const loop::Computation &c = *k.conv;
  const loop::ConvSpec &cv = *c.conv;
  DType t = c.out->dtype;
  auto list = [&](const std::vector<sym::SymExpr> &xs) { return cIndexList(names, xs); };
  auto ints = cIntList;
  auto ptr = [](const loop::Buffer *b) { return "bufs[" + std::to_string(b->id) + "]"; };
  std::string out;
  Writer w(out, 1);
  w.line("{");
  w.indent();
  w.line("const BrazeConv c = {" + code(t) + ", " +
         std::to_string(c.out->shape.size()) + ", " + list(cv.logical(cv.input->shape)) + ", " +
         list(cv.logical(cv.input->strides)) + ", " + list(cv.weight->shape) + ", " +
         list(cv.weight->strides) + ", " + list(cv.logical(c.out->shape)) + ", " +
         list(cv.logical(c.out->strides)) +
         ", INT64_C(" + std::to_string(cv.groups) + "), " + ints(cv.stride) + ", " +
         ints(cv.padding) + ", " + ints(cv.dilation) + ", " + ptr(cv.input) + ", " +
         ptr(cv.weight) + ", " + ptr(c.out) + ", " + (tf32 && t == DType::Float32 ? "1" : "0") + "};");
  w.line("err = api->conv(api->ctx, &c);");
  w.line("if (err == 1) {");
  w.line("  err = 0;");
  w.line("  " + fallback);
  w.line("}");
  w.dedent();
  w.line("}");
  return out;
}

  std::string hostSource(const sched::Schedule &s, Names &names,
                       const std::vector<std::string> &calls) {
    std::string out = R"HOST(#include <algorithm>
#include <cstdint>
#include <cstdio>

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
  const void* x; const void* w; void* y;
  int allowTf32; // f32: cuDNN may use TF32
};
struct BrazeCudaApi {
  void* ctx;
  int (*launch)(void* ctx, int kernel, int64_t blocks, int threads, void** args);
  int (*gemm)(void* ctx, const BrazeGemm* g);
  int (*conv)(void* ctx, const BrazeConv* c); // 0 done, 1 declined (launch the loops), 2 failed
  int* err; // device-visible error flag of the kernels
  int assertIndices; // launch braze_index_guard after the kernels that check indices
};

#define BRAZE_FN static inline
)HOST";
    return out + cIndexHelpers() + "\n" + emitModuleAbi(s, names, calls, ", const BrazeCudaApi* api");
  }

} // namespace braze::codegen
