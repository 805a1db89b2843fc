// User errors carry the op, the node and the offending values; run-time errors say what was
// wrong with an input; the pipeline compiles and runs graphs built from C++.
#include "braze/driver/Compile.h"
#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/jit/HostCompiler.h"
#include "braze/runtime/CublasLt.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <dlfcn.h>
#include <memory>
#include <vector>

namespace braze {
namespace {

std::string diagnosticOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const Diagnostic &d) {
    return d.what();
  }
  return "(no error)";
}

CompileOptions testOptions() {
  CompileOptions o = CompileOptions::fromEnvironment();
  if (!std::getenv("BRAZE_CACHE_DIR"))
    o.cacheDir = "/tmp/braze-driver-test-cache";
  return o;
}

TEST(DriverTest, ReshapeNamesOpNodeAndValues) {
  Graph g;
  GraphBuilder b(g);
  Node *x = b.input("x", DType::Float32, {b.dim(2), b.dim(3)});
  b.setName("view_3");
  EXPECT_EQ(diagnosticOf([&] { b.reshape(x, {b.dim(4), b.dim(2)}); }),
            "reshape (node 'view_3'): 6 elements cannot become [4, 2]");
}

TEST(DriverTest, BroadcastMismatchShowsShapes) {
  Graph g;
  GraphBuilder b(g);
  Node *x = b.input("x", DType::Float32, {b.dim(2), b.dim(3)});
  Node *y = b.input("y", DType::Float32, {b.dim(4)});
  b.setName("add_1");
  EXPECT_EQ(diagnosticOf([&] { b.add(x, y); }),
            "add (node 'add_1'): shapes [2, 3] and [4] do not broadcast (dim 1: 3 vs 4)");
}

TEST(DriverTest, SoftmaxOfIntegersIsRejected) {
  Graph g;
  GraphBuilder b(g);
  Node *x = b.input("x", DType::Int64, {b.dim(5)});
  b.setName("softmax");
  EXPECT_EQ(diagnosticOf([&] { b.softmax(x, 0); }),
            "softmax (node 'softmax'): needs a floating-point input, got i64");
}

TEST(DriverTest, DimOutOfRange) {
  Graph g;
  GraphBuilder b(g);
  Node *x = b.input("x", DType::Float32, {b.dim(5), b.dim(2)});
  b.setName("sum_2");
  EXPECT_EQ(diagnosticOf([&] { b.reduce(OpKind::Sum, x, {2}, false); }),
            "sum (node 'sum_2'): dim 2 is out of range for a tensor of rank 2");
}

TEST(DriverTest, RunsLayerNormAndChecksInputShapes) {
  Graph g;
  GraphBuilder b(g);
  SymExpr rows = b.sizeSymbol("rows");
  Node *x = b.input("x", DType::Float32, {rows, b.dim(64)});
  b.output({b.layerNorm(x, 1, nullptr, nullptr, 1e-5)});
  CompileResult r = compile(g, testOptions());

  const int64_t n = 7;
  std::vector<float> in(n * 64), out(n * 64);
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = std::sin(0.37f * i) * 3 + (i % 64) * 0.01f;
  r.executable->runRaw({in.data()}, {{n, 64}}, {out.data()});
  for (int64_t row = 0; row < n; ++row) {
    double mean = 0, var = 0;
    for (int j = 0; j < 64; ++j)
      mean += in[row * 64 + j];
    mean /= 64;
    for (int j = 0; j < 64; ++j)
      var += (in[row * 64 + j] - mean) * (in[row * 64 + j] - mean);
    var /= 64;
    for (int j = 0; j < 64; ++j)
      EXPECT_NEAR(out[row * 64 + j], (in[row * 64 + j] - mean) / std::sqrt(var + 1e-5), 1e-4);
  }
  // A wrong static dim is a run-time error that names the input and the dims.
  try {
    r.executable->runRaw({in.data()}, {{n, 32}}, {out.data()});
    FAIL() << "expected a shape error";
  } catch (const runtime::RunError &e) {
    EXPECT_EQ(std::string(e.what()), "input 0 dim 1 is 32 but the compiled graph expects 64 = 64");
  }
}

} // namespace
} // namespace braze

// The generated source depends on the graph alone, not on where the compiler's objects lie in
// memory: a warm process finds every kernel in the on-disk cache only if it generates the same
// text. A layer norm's backward keeps two row values (g * w and the normalized x) from its
// reduction step for its last step; they were once ordered by address, which varies between
// processes with the heap's history, reproduced here by leaving holes of varied sizes in it.
TEST(DriverTest, GeneratedSourceDoesNotDependOnAddresses) {
  const char *text = R"(graph(%x: f32[64, 768], %mean: f32[64, 1], %rstd: f32[64, 1], %g: f32[64, 768], %w: f32[768]) {
  %xc = sub(%x, %mean) : f32[64, 768]
  %xhat = mul(%xc, %rstd) : f32[64, 768]
  %gw = mul(%g, %w) : f32[64, 768]
  %n = full() {value=768.0} : f32[]
  %a = mul(%gw, %n) : f32[64, 768]
  %s1 = sum(%gw) {dims=[1], keepdim=true} : f32[64, 1]
  %p = mul(%gw, %xhat) : f32[64, 768]
  %s2 = sum(%p) {dims=[1], keepdim=true} : f32[64, 1]
  %b = sub(%a, %s1) : f32[64, 768]
  %c = mul(%xhat, %s2) : f32[64, 768]
  %d = sub(%b, %c) : f32[64, 768]
  %r = div(%rstd, %n) : f32[64, 1]
  %dx = mul(%r, %d) : f32[64, 768]
  return %dx
})";
  braze::CompileOptions o;
  o.cuda = braze::CompileOptions::Cuda{};
  auto generate = [&] {
    std::unique_ptr<braze::Graph> g = braze::parseGraph(text);
    std::string code = braze::generateCudaSources(*g, o).device;
    g = braze::parseGraph(text); // and the CPU's
    return code + braze::printStage(*g, braze::StageKind::Code, braze::CompileOptions{});
  };
  const std::string first = generate();
  ASSERT_NE(first.find("rv"), std::string::npos) << "no row values kept: the test lost its point";
  for (int trial = 1; trial < 24; ++trial) {
    std::vector<std::unique_ptr<char[]>> junk;
    for (int i = 0; i < 40 * trial; ++i)
      junk.emplace_back(new char[16 + (i * 37 + trial * 11) % 240]);
    for (size_t i = trial % 2; i < junk.size(); i += 2)
      junk[i].reset();
    EXPECT_EQ(generate(), first) << "trial " << trial;
  }
}

TEST(DriverTest, LinearOverABatchFoldsIntoRows) {
  using braze::runtime::GemmProblem;
  GemmProblem p;
  p.m = 512, p.n = 50257, p.k = 768, p.lda = 768, p.ldb = 768, p.ldc = 50257, p.transB = true;
  p.batch = 8, p.strideA = 512 * 768, p.strideB = 0, p.strideC = 512 * 50257;
  GemmProblem q = p;
  braze::runtime::foldBatchIntoRows(q);
  EXPECT_EQ(q.m, 4096);
  EXPECT_EQ(q.batch, 1);
  // Each of these keeps its batch: B differs per matrix, A transposed, C rows not consecutive.
  for (auto change : {+[](GemmProblem &g) { g.strideB = 768; },
                      +[](GemmProblem &g) { g.transA = true; },
                      +[](GemmProblem &g) { g.strideC += 8; }}) {
    GemmProblem r = p;
    change(r);
    braze::runtime::foldBatchIntoRows(r);
    EXPECT_EQ(r.batch, 8);
    EXPECT_EQ(r.m, 512);
  }
}

// The host side of a CUDA module (launches, cuBLASLt, cuDNN and attention calls, shape checks
// and symbolic sizes) is C++ that the host compiler builds on any machine: it compiles and
// loads here, without a GPU, for a batched and a grouped-query product, a fused attention (with
// and without cuDNN), channels-last convolutions and a graph of symbolic size.
namespace braze {
TEST(DriverTest, CudaHostSourceCompilesWithoutAGpu) {
  const char *graphs[] = {
      R"(graph(%q: bf16[2, 4, 8, 16], %k: bf16[2, 1, 16, 8], %k2: bf16[2, 4, 16, 8]) {
  %s0 = matmul(%q, %k2) : bf16[2, 4, 8, 8]
  %ke = expand(%k) : bf16[2, 4, 16, 8]
  %s1 = matmul(%q, %ke) : bf16[2, 4, 8, 8]
  return %s0, %s1
})",
      R"(graph(%x: bf16[32, 32], %w: bf16[32, 96], %b: bf16[96]) {
  %mm = matmul(%x, %w) : bf16[32, 96]
  %y = add(%mm, %b) : bf16[32, 96]
  %r = reshape(%y) : bf16[2, 16, 3, 2, 16]
  %p = permute(%r) {dims=[2, 0, 3, 1, 4]} : bf16[3, 2, 2, 16, 16]
  %q = select(%p) {dim=0, index=0} : bf16[2, 2, 16, 16]
  %k = select(%p) {dim=0, index=1} : bf16[2, 2, 16, 16]
  %v = select(%p) {dim=0, index=2} : bf16[2, 2, 16, 16]
  %a = attention(%q, %k, %v) {bias=false, causal=true, safe=true, scale=0.25} : bf16[2, 2, 16, 16]
  return %a
})",
      R"(graph(%x: f16[2, 6, 9, 7]{378, 1, 42, 6}, %w: f16[4, 6, 3, 3], %b: f16[4]) {
  %c = convolution(%x, %w, %b) {bias=true, dilation=[1, 1], groups=1, padding=[1, 1], stride=[1, 1]} : f16[2, 4, 9, 7]
  %r = relu(%c) : f16[2, 4, 9, 7]
  return %r
})",
      R"(graph(%a: f32[s0, 64], %w: f32[64, 32]) {
  %m = matmul(%a, %w) : f32[s0, 32]
  %s = softmax(%m) {dim=1} : f32[s0, 32]
  return %s
})"};
  CompileOptions base = testOptions();
  for (bool cudnn : {false, true})
    for (const char *text : graphs) {
      CompileOptions o = base;
      o.cuda = CompileOptions::Cuda{};
      if (cudnn)
        o.cuda->cudnnLibrary = "libcudnn.so.9";
      std::unique_ptr<Graph> g = parseGraph(text);
      std::string host = generateCudaSources(*g, o).host;
      ASSERT_NE(host.find("braze_run"), std::string::npos);
      jit::HostCompilerOptions jo;
      jo.compiler = base.cxx;
      jo.cacheDir = base.cacheDir;
      jo.optimization = "-O1";
      jit::CompiledLibrary lib;
      ASSERT_NO_THROW(lib = jit::compileCpp(host, jo)) << text;
      void *h = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
      ASSERT_NE(h, nullptr) << dlerror();
      EXPECT_NE(dlsym(h, "braze_run"), nullptr);
      dlclose(h);
    }
}
// BRAZE_LOG's stages: each one it takes, and an unknown one named beside the whole list.
TEST(DriverTest, LogStagesAreParsedAndAnUnknownOneIsNamed) {
  LogSet set = LogSet::parse(" autotune ,cache");
  EXPECT_TRUE(set.has(LogStage::Autotune));
  EXPECT_TRUE(set.has(LogStage::Cache));
  EXPECT_FALSE(set.has(LogStage::Graph));
  try {
    LogSet::parse("graph,assembly");
    FAIL() << "an unknown stage was taken";
  } catch (const Diagnostic &d) {
    const std::string what = d.what();
    EXPECT_NE(what.find("'assembly'"), std::string::npos) << what;
    EXPECT_NE(what.find("accuracy, autotune, or all"), std::string::npos) << what;
  }
}

} // namespace braze
