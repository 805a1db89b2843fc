#include "braze/driver/Compile.h"

#include "braze/codegen/cpu/CppCodegen.h"
#include "braze/codegen/cuda/CudaCodegen.h"
#include "braze/driver/Autotune.h"
#include "braze/driver/Manifest.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/jit/HostCompiler.h"
#include "braze/jit/Nvrtc.h"
#include "braze/lowering/decompose/Decompose.h"
#include "braze/lowering/realize/Realize.h"
#include "braze/lowering/split/SplitReductions.h"
#include "braze/lowering/to_loops/ToLoops.h"
#include "braze/passes/PassManager.h"
#include "braze/scheduler/Schedule.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <future>

namespace braze {

Counters &counters() {
  static Counters c;
  return c;
}

namespace {

codegen::BlasSymbols blasSymbolsFor(const std::string &library) {
  codegen::BlasSymbols b;
  if (library.empty())
    return b;
  if (library.find("libtorch_cpu") != std::string::npos) {
    // PyTorch's MKL: Fortran's ILP64 gemm only. Called inside braze's parallel loops it runs
    // on the calling thread (MKL's dynamic threads); its thread count is PyTorch's to set.
    b.sgemm = "braze_mkl_sgemm";
    b.dgemm = "braze_mkl_dgemm";
    b.fortran64 = true;
    b.indexBits = 64;
  } else if (library.find("scipy_openblas64") != std::string::npos) {
    b.sgemm = "scipy_cblas_sgemm64_";
    b.dgemm = "scipy_cblas_dgemm64_";
    b.setThreads = "scipy_openblas_set_num_threads64_";
    b.indexBits = 64;
  } else {
    b.sgemm = "cblas_sgemm";
    b.dgemm = "cblas_dgemm";
    if (library.find("openblas") != std::string::npos)
      b.setThreads = "openblas_set_num_threads";
    b.indexBits = 32;
  }
  return b;
}

DLDataType toDLPack(DType t) {
  switch (t) {
  case DType::Bool:
    return {kDLBool, 8, 1};
  case DType::UInt8:
    return {kDLUInt, 8, 1};
  case DType::Int8:
    return {kDLInt, 8, 1};
  case DType::Int16:
    return {kDLInt, 16, 1};
  case DType::Int32:
    return {kDLInt, 32, 1};
  case DType::Int64:
    return {kDLInt, 64, 1};
  case DType::Float16:
    return {kDLFloat, 16, 1};
  case DType::BFloat16:
    return {kDLBfloat, 16, 1};
  case DType::Float32:
    return {kDLFloat, 32, 1};
  case DType::Float64:
    return {kDLFloat, 64, 1};
  }
  BRAZE_UNREACHABLE("bad dtype");
}

DecomposeOptions decomposeFor(const CompileOptions &opts) {
  DecomposeOptions d;
  d.convolutionLibrary = opts.cuda ? !opts.cuda->cudnnLibrary.empty() : !opts.dnnlLibrary.empty();
  d.halfConvolutions = opts.cuda.has_value();
  d.gradientLibrary = true; // cuDNN's and oneDNN's backward convolutions
  d.cpuHalfRounding = !opts.cuda;
  d.softmaxReciprocal = !opts.cuda;
  if (opts.cuda) { // full-rate f64: the data-center parts
    const int cc = opts.cuda->computeCapability;
    d.wideStatistics = cc == 60 || cc == 70 || cc == 80 || cc == 90 || cc == 100;
  } else {
    d.wideStatistics = true;
  }
  d.oneDnnHalf = opts.oneDnnHalf;
  if (!opts.cuda) { // braze_attention_f32 (codegen/cpu/AttentionPrelude)
    d.fusedAttentionDtypes = {DType::Float32};
    d.fusedAttentionBackwardDtypes = {DType::Float32};
    d.fusedAttentionMaxHeadDim = d.fusedAttentionBackwardMaxHeadDim = 1024;
    d.fusedAttentionDropout = true;
  } else if (opts.cuda->computeCapability >= 80) { // tensor-core mma (codegen/cuda/CudaAttention)
    d.fusedAttentionDtypes = d.fusedAttentionBackwardDtypes = {DType::Float16, DType::BFloat16};
    d.fusedAttentionMaxHeadDim = 256;
    d.fusedAttentionBackwardMaxHeadDim = 128; // wider heads would spill the gradients' registers
  }
  return d;
}

void decomposeStep(Graph &g, const CompileOptions &opts) { decompose(g, decomposeFor(opts)); }

/// Whether some 4-d input of g is stored channels-last (C innermost, more than one channel).
bool hasChannelsLastImage(Graph &g) {
  for (Node *in : g.inputs()) {
    const TensorType &t = in->type();
    if (t.shape.size() == 4 && !t.strides.empty() && t.strides[1]->isConst(1) &&
        !t.shape[1]->isConst(1) && t.strides != contiguousStrides(g.sym(), t.shape))
      return true;
  }
  return false;
}

LoweringOptions loweringFor(const CompileOptions &opts, Graph &g) {
  LoweringOptions lo;
  lo.widenedHalfMatMul = opts.cuda.has_value();
  lo.padRows = opts.cuda.has_value();
  lo.rowMajorConvolution = opts.cuda.has_value();
  lo.permutedAttentionOutput = true; // both targets' attention kernels write strided rows
  lo.takeViewsInPlace = !opts.cuda.has_value();
  lo.takeMatrixViewsInPlace = true;
  // cuDNN's fast kernels are NHWC: a model fed channels-last images is kept channels-last.
  // oneDNN's are too (its NCHW path unfolds windows): a CNN of a few convolutions runs
  // channels-last inside whatever its input's layout.
  int convolutions = 0; // kept whole for a library
  for (const auto &n : g.nodes())
    convolutions += (n->op() == OpKind::Convolution || n->op() == OpKind::ConvWeightGrad ||
                     n->op() == OpKind::ConvInputGrad) &&
                    n->rank() == 4;
  if (opts.cuda) {
    lo.channelsLast = convolutions > 0 && hasChannelsLastImage(g);
    lo.channelsLastWeights = true;
  } else if (!opts.dnnlLibrary.empty()) {
    lo.channelsLast = convolutions >= 3;
  }
  return lo;
}

RealizeOptions realizeFor(const CompileOptions &opts, Graph &g) {
  LoweringOptions lo = loweringFor(opts, g);
  RealizeOptions r;
  r.widenedHalfMatMul = lo.widenedHalfMatMul;
  r.channelsLast = lo.channelsLast;
  r.takeViewsInPlace = lo.takeViewsInPlace;
  r.takeMatrixViewsInPlace = lo.takeMatrixViewsInPlace;
  return r;
}

void realizeStep(Graph &g, const CompileOptions &opts) { realize(g, realizeFor(opts, g)); }

void splitReductionsStep(Graph &g, const CompileOptions &opts) {
  if (!opts.cuda)
    return;
  SplitReductionOptions s;
  s.multiprocessors = opts.cuda->multiprocessors;
  s.channelsLast = loweringFor(opts, g).channelsLast;
  splitReductions(g, s);
}

void simplifyGraph(Graph &g, const CompileOptions &opts) {
  checkDisabledPasses(opts.disabledPasses, "CompileOptions::disabledPasses");
  for (const GraphStep &s : graphSteps())
    if (std::find(opts.disabledPasses.begin(), opts.disabledPasses.end(), s.name) ==
        opts.disabledPasses.end())
      runGraphStep(g, s.name, opts);
}

struct Lowered {
  std::unique_ptr<loop::LoopProgram> program;
  sched::Schedule schedule;
  codegen::GeneratedSource code;    ///< CPU
  codegen::CudaGeneratedSource cuda; ///< CUDA
};

codegen::CudaCodegenOptions cudaCodegenFor(const CompileOptions::Cuda &cuda) {
  codegen::CudaCodegenOptions o;
  o.matmulTf32 = cuda.matmulTf32;
  o.convTf32 = cuda.convTf32;
  o.cudnnAttention = cuda.cudnnAttention && !cuda.cudnnLibrary.empty();
  return o;
}

struct StageInfo {
  StageKind kind;
  std::string_view name;
  LogStage log;
  const char *logName;
};

constexpr StageInfo kStages[] = {
#define STAGE(K, name, log, logName, desc) {StageKind::K, name, LogStage::log, logName},
#include "braze/driver/Stages.def"
};

const StageInfo &stageInfo(StageKind k) {
  for (const StageInfo &s : kStages)
    if (s.kind == k)
      return s;
  BRAZE_UNREACHABLE("bad StageKind");
}

/// Where the pipeline stops: after `stop`, whose text goes to `text` (printStage), or at the
/// end. Each stage's text is also logged under its BRAZE_LOG name (Stages.def).
struct Stop {
  StageKind stop = StageKind::Code;
  std::string *text = nullptr;

  /// Logs `stage`'s text when asked and says whether the pipeline ends here.
  bool after(StageKind stage, const CompileOptions &opts,
             const std::function<std::string()> &print) const {
    const StageInfo &info = stageInfo(stage);
    bool here = text && stage == stop;
    if (!here && !opts.log.has(info.log))
      return false;
    std::string t = print();
    if (opts.log.has(info.log))
      logBlock(info.logName, t);
    if (here)
      *text = std::move(t);
    return here;
  }
};

void scheduleStep(Lowered &l, const CompileOptions &opts) {
  sched::ScheduleOptions so;
  so.fuse = opts.fuse;
  so.pairedEpilogues = opts.pairedEpilogues;
  l.schedule = sched::scheduleProgram(*l.program, targetFor(opts), so);
}

void planCudaStep(Lowered &l, const CompileOptions &opts) {
  if (!opts.cuda)
    return;
  codegen::planCudaLaunches(l.schedule);
  if (!opts.cuda->launchRecords.empty())
    codegen::applyCudaLaunches(l.schedule, sched::parseLaunchRecords(opts.cuda->launchRecords));
}

void planCpuStep(Lowered &l, const CompileOptions &opts) {
  if (opts.cuda)
    return;
  codegen::planCpuLaunches(l.schedule);
  if (!opts.cpuLaunchRecords.empty())
    codegen::applyCpuLaunches(l.schedule, sched::parseCpuLaunchRecords(opts.cpuLaunchRecords));
}

codegen::CpuCodegenOptions cpuCodegenFor(const CompileOptions &opts) {
  codegen::CpuCodegenOptions co;
  co.blas = blasSymbolsFor(opts.blasLibrary);
  co.dnnl = !opts.dnnlLibrary.empty();
  return co;
}

void codegenStep(Lowered &l, const CompileOptions &opts) {
  if (opts.cuda) {
    l.cuda = codegen::generateCuda(l.schedule, cudaCodegenFor(*opts.cuda));
    return;
  }
  l.code = codegen::generateCpu(l.schedule, cpuCodegenFor(opts));
}

/// The back half's steps (Pipeline.def), in order.
struct LoopStep {
  std::string_view name;
  void (*run)(Lowered &, const CompileOptions &);
  StageKind stage;
};
constexpr LoopStep kLoopSteps[] = {
#define LOOP_STEP(name, fn, stage, desc) {name, &fn, StageKind::stage},
#include "braze/driver/Pipeline.def"
};

/// The text of the back-half stage `stage` of `l`.
std::string stageText(const Lowered &l, StageKind stage, const CompileOptions &opts) {
  if (stage == StageKind::Schedule)
    return sched::printSchedule(l.schedule);
  return opts.cuda ? l.cuda.text() : l.code.source;
}

/// The pipeline from loops on: verify the loop program, then the back half's steps in order,
/// each stage printed (or logged) after its last step.
Lowered lowerLoops(std::unique_ptr<loop::LoopProgram> program, const CompileOptions &opts,
                   const Stop &stop) {
  Lowered l;
  l.program = std::move(program);
  std::string loopErr = loop::verifyProgram(*l.program);
  BRAZE_CHECK(loopErr.empty()) << "lowering produced an invalid loop program: " << loopErr;
  if (stop.after(StageKind::Loops, opts, [&] { return loop::printProgram(*l.program); }))
    return l;
  size_t n = std::size(kLoopSteps);
  for (size_t i = 0; i < n; ++i) {
    kLoopSteps[i].run(l, opts);
    StageKind stage = kLoopSteps[i].stage;
    if ((i + 1 == n || kLoopSteps[i + 1].stage != stage) &&
        stop.after(stage, opts, [&] { return stageText(l, stage, opts); }))
      return l;
  }
  return l;
}

/// The whole pipeline, once: it serves compile, the logs and printStage.
Lowered lowerAll(Graph &g, const CompileOptions &opts, const Stop &stop = {}) {
  std::string err = verifyGraph(g);
  if (!err.empty())
    BRAZE_USER_ERROR("compile", "") << "invalid graph: " << err;
  if (stop.after(StageKind::Graph, opts, [&] { return printGraph(g); }))
    return {};
  simplifyGraph(g, opts);
  if (stop.after(StageKind::Decomposed, opts, [&] { return printGraph(g); }))
    return {};
  return lowerLoops(lowerToLoops(g, loweringFor(opts, g)), opts, stop);
}

void countCompile(int kernels, bool cacheHit) {
  Counters &c = counters();
  ++c.graphsCompiled;
  c.kernelsGenerated += kernels;
  ++(cacheHit ? c.cacheHits : c.cacheMisses);
}

/// Seconds since `start`, and restarts it.
double lap(std::chrono::steady_clock::time_point &start) {
  auto now = std::chrono::steady_clock::now();
  double s = std::chrono::duration<double>(now - start).count();
  start = now;
  return s;
}

/// NVRTC's options for the kernels of a graph compiled with `cuda`, cached where `jo` caches.
jit::NvrtcOptions nvrtcFor(const CompileOptions::Cuda &cuda, const jit::HostCompilerOptions &jo) {
  jit::NvrtcOptions no;
  no.library = cuda.nvrtcLibrary;
  no.computeCapability = cuda.computeCapability;
  no.cacheDir = jo.cacheDir;
  no.logCache = jo.logCache;
  return no;
}

/// Loads what a compile produced (just now, or recorded in a manifest) as the module `spec`
/// describes with it.
CompileResult loadCompiled(const ManifestEntry &e, runtime::ModuleSpec spec,
                           const CompileOptions &opts, const jit::HostCompilerOptions &jo,
                           CompileTimes times, std::chrono::steady_clock::time_point clock) {
  spec.libraryPath = e.libraryPath;
  spec.cuda = e.cuda;
  if (e.cuda) {
    const CompileOptions::Cuda &cuda = *opts.cuda;
    spec.cubinPaths = e.cubinPaths;
    spec.kernels = e.kernels;
    spec.device = cuda.device;
    if (e.usesGemm)
      spec.cublasLtLibrary = cuda.cublasLtLibrary;
    if (e.usesCudnn)
      spec.cudnnLibrary = cuda.cudnnLibrary;
    spec.checksIndices = e.checksIndices;
    spec.libraryChoices = e.libraryChoices;
    jit::NvrtcOptions no = nvrtcFor(cuda, jo);
    for (const auto &[name, program] : e.deferred)
      spec.deferred.push_back({name, [source = program, no] {
                                 ++counters().deferredKernelsLoaded;
                                 return jit::compileCuda(source, no).paths.at(0);
                               }});
  }
  CompileResult r;
  r.executable = runtime::Executable::load(spec);
  times.load = lap(clock);
  r.times = times;
  r.source = e.source;
  r.numKernels = e.numKernels;
  return r;
}

/// The host code through the host compiler and, at the same time, the kernels through NVRTC;
/// both cached. times.hostCompile and times.nvrtc are each compiler's own time (they overlap).
/// What they produced, for loadCompiled and the manifest; `cacheHit` when both were cached.
ManifestEntry compileCudaModule(Lowered &l, const jit::HostCompilerOptions &jo,
                                const CompileOptions::Cuda &cuda, CompileTimes &times,
                                std::chrono::steady_clock::time_point &clock, bool &cacheHit) {
  if (cuda.nvrtcLibrary.empty())
    BRAZE_USER_ERROR("compile", "") << "compiling for CUDA needs NVRTC, and none was found";
  if (l.cuda.usesGemm && cuda.cublasLtLibrary.empty())
    BRAZE_USER_ERROR("compile", "") << "this graph multiplies matrices on CUDA, which needs "
                                       "cuBLASLt, and none was found";
  std::future<std::pair<jit::CompiledLibrary, double>> hostJob =
      std::async(std::launch::async, [&] {
        auto start = std::chrono::steady_clock::now();
        // Launch glue: a few integer products per launch, beside a launch's microseconds. At
        // -O0 it compiles in about 3/4 of -O1's time (H100 host, six models: 0.33-1.82 s
        // against 0.41-2.46 s), with no change measured per call.
        jit::HostCompilerOptions host = jo;
        host.optimization = "-O0";
        jit::CompiledLibrary lib = jit::compileCpp(l.cuda.host, host);
        return std::make_pair(lib, lap(start));
      });
  jit::CompiledCubin cubin;
  try {
    cubin = jit::compileCuda(l.cuda.device, nvrtcFor(cuda, jo));
  } catch (...) {
    hostJob.wait(); // it reads `l` and `jo`
    throw;
  }
  times.nvrtc = lap(clock);
  auto [host, hostSeconds] = hostJob.get();
  times.hostCompile = hostSeconds;
  lap(clock);
  ManifestEntry e;
  e.libraryPath = host.path;
  e.cuda = true;
  e.cubinPaths = cubin.paths;
  e.kernels = l.cuda.kernels;
  for (const codegen::DeferredKernel &k : l.cuda.deferred)
    e.deferred.push_back({k.name, k.source});
  e.usesGemm = l.cuda.usesGemm;
  e.usesCudnn = l.cuda.usesCudnn;
  e.checksIndices = l.cuda.checksIndices;
  e.source = l.cuda.text();
  e.numKernels = l.cuda.numKernels;
  cacheHit = host.cacheHit && cubin.cacheHit;
  return e;
}

} // namespace

Support supports(const Graph &g, const CompileOptions &opts) {
  std::string err = verifyGraph(g);
  if (!err.empty())
    return {false, "invalid graph: " + err};
  DecomposeOptions d = decomposeFor(opts);
  for (const auto &n : g.nodes()) {
    if (n->op() == OpKind::ConvTranspose && decomp::convTransposeRoundsPerTap(n.get(), d) &&
        decomp::convTransposeTaps(n.get()) > GraphBuilder::kMaxRoundedTaps)
      return {false, "a half-precision transposed convolution of " +
                         std::to_string(decomp::convTransposeTaps(n.get())) +
                         " kernel taps rounds after each, as eager's CPU kernel does; braze "
                         "does for at most " + std::to_string(GraphBuilder::kMaxRoundedTaps)};
  }
  return {};
}

void checkSupported(Graph &g) { lowerAll(g, CompileOptions{}); }

CudaSources generateCudaSources(Graph &g, const CompileOptions &opts) {
  CompileOptions o = opts;
  if (!o.cuda)
    o.cuda = CompileOptions::Cuda{};
  Lowered l = lowerAll(g, o);
  CudaSources c{l.cuda.device, l.cuda.host, {}};
  for (const codegen::DeferredKernel &k : l.cuda.deferred)
    c.deferred.push_back(k.source);
  return c;
}

/// The C++ through the host compiler (cached), linked with the libraries it calls.
ManifestEntry compileCpuModule(const Lowered &l, const CompileOptions &opts,
                               jit::HostCompilerOptions jo, CompileTimes &times,
                               std::chrono::steady_clock::time_point &clock, bool &cacheHit) {
  auto link = [&](const std::string &library) {
    std::string dir = library.substr(0, library.find_last_of('/'));
    jo.linkFlags += (jo.linkFlags.empty() ? "" : " ") + library + " -Wl,-rpath," + dir;
  };
  if (l.code.usesBlas)
    link(opts.blasLibrary);
  if (l.code.usesDnnl)
    link(opts.dnnlLibrary);
  jit::CompiledLibrary lib = jit::compileCpp(l.code.source, jo);
  times.hostCompile = lap(clock);
  ManifestEntry e;
  e.libraryPath = lib.path;
  e.source = l.code.source;
  e.numKernels = l.code.numKernels;
  cacheHit = lib.cacheHit;
  return e;
}

/// The autotuner over a graph just compiled (`e`, loaded as r): where some kernels' other
/// forms win, the schedule takes their records and the graph is compiled again, and `e` and
/// `r` become that compile's. A tuner that fails leaves the planned module, and says why.
static void autotune(Lowered &l, ManifestEntry &e, CompileResult &r,
                     const runtime::ModuleSpec &spec,
              const CompileOptions &opts, const jit::HostCompilerOptions &jo,
              std::chrono::steady_clock::time_point &clock) {
  const bool log = opts.log.has(LogStage::Autotune);
  lap(clock);
  const auto tuneStart = clock; // the compiles below lap `clock` for their own stages
  const CompileTimes planned = r.times;
  TuneResult t;
  // The CPU's tuning module: the graph's code with each chosen kernel's forms beside it.
  auto compileForms = [&](const std::map<std::string, std::vector<sched::CpuLaunch>> &forms) {
    codegen::GeneratedSource saved = l.code;
    codegen::CpuCodegenOptions co = cpuCodegenFor(opts);
    co.tuneForms = forms;
    l.code = codegen::generateCpu(l.schedule, co);
    CompileTimes ignored;
    bool hit = false;
    ManifestEntry te;
    try {
      te = compileCpuModule(l, opts, jo, ignored, clock, hit);
    } catch (...) {
      l.code = std::move(saved);
      throw;
    }
    l.code = std::move(saved);
    runtime::ModuleSpec ts = spec;
    ts.libraryPath = te.libraryPath;
    return std::shared_ptr<runtime::Executable>(runtime::Executable::load(ts));
  };
  try {
    t = opts.cuda ? autotuneCuda(l.schedule, l.cuda, *r.executable, opts, nvrtcFor(*opts.cuda, jo))
                  : autotuneCpu(l.schedule, opts, compileForms);
  } catch (const std::exception &ex) {
    t.log += std::string("not tuned: ") + ex.what() + "\n";
    t.records.clear();
    t.libraryChoices.clear();
  }
  if (!t.records.empty() && !opts.cuda) {
    codegen::applyCpuLaunches(l.schedule, sched::parseCpuLaunchRecords(t.records));
    codegenStep(l, opts);
    CompileTimes again;
    bool hit = false; // the winners' compile is the autotuner's time
    e = compileCpuModule(l, opts, jo, again, clock, hit);
  } else if (!t.records.empty()) {
    codegen::applyCudaLaunches(l.schedule, sched::parseLaunchRecords(t.records));
    codegenStep(l, opts);
    CompileTimes again;
    bool hit = false;  // the winners' compile is the autotuner's time
    e = compileCudaModule(l, jo, *opts.cuda, again, clock, hit);
  }
  e.libraryChoices = t.libraryChoices; // the CPU's: none
  if (!t.records.empty() || !t.libraryChoices.empty())
    r = loadCompiled(e, spec, opts, jo, CompileTimes{}, clock);
  r.times = planned;
  lap(clock);
  r.times.autotune = std::chrono::duration<double>(clock - tuneStart).count();
  if (log)
    logBlock("autotune", t.log + (t.records.empty() ? "" : "records:\n" + t.records));
}

CompileResult compile(std::unique_ptr<loop::LoopProgram> program, const CompileOptions &opts) {
  if (opts.cuda)
    BRAZE_USER_ERROR("compile", "") << "a loop program compiles for the CPU only";
  runtime::ModuleSpec spec;
  for (const loop::Buffer *b : program->inputs())
    spec.inputs.push_back({toDLPack(b->dtype), static_cast<int>(b->seenShape().size())});
  for (const loop::Buffer *b : program->outputs())
    spec.outputs.push_back({toDLPack(b->dtype), static_cast<int>(b->seenShape().size())});
  spec.numSymbols = static_cast<int>(program->sizeSymbols().size());
  auto clock = std::chrono::steady_clock::now();
  CompileTimes times;
  jit::HostCompilerOptions jo;
  jo.compiler = opts.cxx;
  jo.cacheDir = opts.cacheDir.empty() ? CompileOptions::fromEnvironment().cacheDir : opts.cacheDir;
  Lowered l = lowerLoops(std::move(program), opts, {});
  times.lower = lap(clock);
  bool cacheHit = false;
  ManifestEntry e = compileCpuModule(l, opts, jo, times, clock, cacheHit);
  CompileResult r = loadCompiled(e, spec, opts, jo, times, clock);
  r.cacheHit = cacheHit;
  countCompile(r.numKernels, r.cacheHit);
  return r;
}

CompileResult compile(Graph &g, const CompileOptions &opts) {
  runtime::ModuleSpec spec;
  for (Node *in : g.inputs())
    spec.inputs.push_back({toDLPack(in->dtype()), in->rank()});
  for (Node *out : g.outputs())
    spec.outputs.push_back({toDLPack(out->dtype()), out->rank()});
  spec.numSymbols = static_cast<int>(g.sizeSymbols().size());
  auto clock = std::chrono::steady_clock::now();
  CompileTimes times;
  jit::HostCompilerOptions jo;
  jo.compiler = opts.cxx;
  std::optional<CompileOptions> env; // read once, where an option is left to the environment
  if (opts.cacheDir.empty() || (opts.remoteCacheDir.empty() && opts.remoteRedis.empty()))
    env = CompileOptions::fromEnvironment();
  jo.cacheDir = opts.cacheDir.empty() ? env->cacheDir : opts.cacheDir;
  const bool ownRemote = !opts.remoteCacheDir.empty() || !opts.remoteRedis.empty();
  const std::string remote = ownRemote ? opts.remoteCacheDir : env->remoteCacheDir;
  const std::string redis = ownRemote ? opts.remoteRedis : env->remoteRedis;
  jo.logCache = opts.log.has(LogStage::Cache);
  spec.logFallback = opts.log.has(LogStage::Fallback);
  // A graph compiled before (by any process, with this build and these options): load what
  // that compile produced, without lowering; unless a stage's log asks to see the lowering.
  bool logsStage = false;
  for (const StageInfo &s : kStages)
    logsStage = logsStage || opts.log.has(s.log);
  const std::string key = manifestKey(g, opts);
  std::optional<ManifestEntry> recorded;
  if (!logsStage) {
    recorded = readManifest(jo.cacheDir, key, jo.logCache);
    if (!recorded && !remote.empty() && copyEntry(remote, jo.cacheDir, key, jo.logCache))
      recorded = readManifest(jo.cacheDir, key, jo.logCache);
    if (!recorded && !redis.empty() && fetchRedisEntry(redis, jo.cacheDir, key, jo.logCache))
      recorded = readManifest(jo.cacheDir, key, jo.logCache);
  }
  if (recorded) {
    times.lower = lap(clock);
    CompileResult r = loadCompiled(*recorded, spec, opts, jo, times, clock);
    r.cacheHit = true;
    countCompile(r.numKernels, true);
    return r;
  }
  Lowered l = lowerAll(g, opts);
  times.lower = lap(clock);
  ManifestEntry e;
  bool cacheHit = false;
  if (opts.cuda)
    e = compileCudaModule(l, jo, *opts.cuda, times, clock, cacheHit);
  else
    e = compileCpuModule(l, opts, jo, times, clock, cacheHit);
  CompileResult r = loadCompiled(e, spec, opts, jo, times, clock);
  if (opts.autotuneSeconds > 0)
    autotune(l, e, r, spec, opts, jo, clock);
  r.cacheHit = cacheHit;
  countCompile(r.numKernels, r.cacheHit);
  writeManifest(jo.cacheDir, key, e, jo.logCache);
  if (!remote.empty())
    copyEntry(jo.cacheDir, remote, key, jo.logCache);
  if (!redis.empty())
    storeRedisEntry(jo.cacheDir, redis, key, jo.logCache);
  return r;
}

std::string printStage(Graph &g, StageKind stage, const CompileOptions &opts) {
  std::string text;
  lowerAll(g, opts, Stop{stage, &text});
  return text;
}

std::string printKernelForms(Graph &g, const CompileOptions &opts) {
  Lowered l = lowerAll(g, opts);
  std::string out;
  for (const sched::Kernel &k : l.schedule.kernels) {
    if (!opts.cuda) {
      std::vector<sched::CpuLaunch> forms = codegen::cpuKernelForms(l.schedule, k.name);
      for (size_t i = 0; forms.size() > 1 && i < forms.size(); ++i)
        out += k.name + " form" + std::to_string(i) + " " +
               sched::cpuLaunchText(forms[i], k.outerVars) + "\n";
      continue;
    }
    if (!l.cuda.loopLaunches.count(k.name))
      continue; // a library call's, attention's or scatter's: not timed in other forms
    codegen::CudaKernelForms forms = codegen::cudaKernelForms(l.schedule, k.name, "form");
    for (size_t i = 0; i < forms.forms.size(); ++i)
      out += k.name + " form" + std::to_string(i) + " " +
             sched::launchText(forms.forms[i].launch, !k.innerVars.empty()) +
             " blocks=" + std::to_string(forms.forms[i].blocks) + "\n";
  }
  return out;
}

std::string printStage(std::unique_ptr<loop::LoopProgram> program, StageKind stage,
                       const CompileOptions &opts) {
  if (stage == StageKind::Graph || stage == StageKind::Decomposed)
    BRAZE_USER_ERROR("print", "") << "a loop program has no graph stage; print loops, schedule "
                                     "or code";
  std::string err = loop::verifyProgram(*program);
  if (!err.empty())
    BRAZE_USER_ERROR("compile", "") << "invalid loop program: " << err;
  std::string text;
  lowerLoops(std::move(program), opts, Stop{stage, &text});
  return text;
}

std::vector<std::string> compileCudaSource(const std::string &source, const std::string &library,
                                           int computeCapability, const std::string &cacheDir) {
  jit::NvrtcOptions o;
  o.library = library;
  o.computeCapability = computeCapability;
  o.cacheDir = cacheDir;
  return jit::compileCuda(source, o).paths;
}

std::string nvrtcVersion(const std::string &library) { return jit::nvrtcVersion(library); }

std::optional<StageKind> stageByName(std::string_view name) {
  for (const StageInfo &s : kStages)
    if (s.name == name)
      return s.kind;
  return std::nullopt;
}

const std::vector<GraphStep> &graphSteps() {
  auto pass = [](std::string_view name) {
    const PassInfo *p = findPass(name);
    BRAZE_CHECK(p) << "Pipeline.def names '" << name << "', which Passes.def does not have";
    return GraphStep{name, p->description, nullptr};
  };
  static const std::vector<GraphStep> steps = {
#define GRAPH_PASS(name) pass(name),
#define GRAPH_STEP(name, fn, desc) GraphStep{name, desc, &fn},
#include "braze/driver/Pipeline.def"
  };
  return steps;
}

const std::vector<LoopStepInfo> &loopSteps() {
  static const std::vector<LoopStepInfo> steps = {
#define LOOP_STEP(name, fn, stage, desc) LoopStepInfo{name, desc},
#include "braze/driver/Pipeline.def"
  };
  return steps;
}

void checkDisabledPasses(const std::vector<std::string> &names, std::string_view where) {
  for (const std::string &name : names) {
    bool pass = false;
    std::string passes;
    for (const GraphStep &s : graphSteps())
      if (!s.lowering) {
        pass = pass || s.name == name;
        passes += (passes.empty() ? "" : ", ") + std::string(s.name);
      }
    if (!pass)
      BRAZE_USER_ERROR(std::string(where), "")
          << "names '" << name << "', which is not a graph pass of the pipeline; "
          << "the passes that can be disabled: " << passes;
  }
}

void runGraphStep(Graph &g, std::string_view name, const CompileOptions &opts) {
  for (const GraphStep &s : graphSteps())
    if (s.name == name && s.lowering) {
      s.lowering(g, opts);
      std::string err = verifyGraph(g);
      BRAZE_CHECK(err.empty()) << "step '" << name << "' broke the graph: " << err;
      return;
    }
  runPasses(g, {std::string(name)});
}

std::vector<std::string_view> stageNames() {
  std::vector<std::string_view> out;
  for (const StageInfo &s : kStages)
    out.push_back(s.name);
  return out;
}

} // namespace braze
