#include "braze/driver/Compile.h"

#include "braze/codegen/cpu/CppCodegen.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/jit/HostCompiler.h"
#include "braze/lowering/decompose/Decompose.h"
#include "braze/lowering/to_loops/ToLoops.h"
#include "braze/passes/PassManager.h"
#include "braze/scheduler/Schedule.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <cstdlib>

namespace braze {

Counters &counters() {
  static Counters c;
  return c;
}

CompileOptions CompileOptions::fromEnvironment() {
  CompileOptions o;
  if (const char *v = std::getenv("BRAZE_LOG"))
    o.log = LogSet::parse(v);
  if (const char *v = std::getenv("BRAZE_STRICT"))
    o.strict = std::string(v) == "1";
  if (const char *v = std::getenv("BRAZE_CACHE_DIR"))
    o.cacheDir = v;
  if (const char *v = std::getenv("BRAZE_CXX"))
    o.cxx = v;
  if (const char *v = std::getenv("BRAZE_BLAS"))
    o.blasLibrary = v;
  if (o.cacheDir.empty()) {
    const char *xdg = std::getenv("XDG_CACHE_HOME");
    const char *home = std::getenv("HOME");
    o.cacheDir = xdg ? std::string(xdg) + "/braze" : std::string(home ? home : "/tmp") + "/.cache/braze";
  }
  return o;
}

namespace {

codegen::BlasSymbols blasSymbolsFor(const std::string &library) {
  codegen::BlasSymbols b;
  if (library.empty())
    return b;
  if (library.find("scipy_openblas64") != std::string::npos) {
    b.sgemm = "scipy_cblas_sgemm64_";
    b.dgemm = "scipy_cblas_dgemm64_";
    b.indexBits = 64;
  } else {
    b.sgemm = "cblas_sgemm";
    b.dgemm = "cblas_dgemm";
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

void simplifyGraph(Graph &g) {
  decompose(g);
  runPasses(g, {"fold-constants", "cse", "dce"});
}

struct Lowered {
  std::unique_ptr<loop::LoopProgram> program;
  sched::Schedule schedule;
  codegen::GeneratedSource code;
};

Lowered lowerAll(Graph &g, const CompileOptions &opts) {
  std::string err = verifyGraph(g);
  if (!err.empty())
    BRAZE_USER_ERROR("compile", "") << "invalid graph: " << err;
  if (opts.log.has(LogStage::Graph))
    logBlock("graph", printGraph(g));
  simplifyGraph(g);
  if (opts.log.has(LogStage::Decomposed))
    logBlock("decomposed", printGraph(g));
  Lowered l;
  l.program = lowerToLoops(g);
  std::string loopErr = loop::verifyProgram(*l.program);
  BRAZE_CHECK(loopErr.empty()) << "lowering produced an invalid loop program: " << loopErr;
  if (opts.log.has(LogStage::Loops))
    logBlock("loops", loop::printProgram(*l.program));
  sched::ScheduleOptions so;
  so.fuse = opts.fuse;
  l.schedule = sched::scheduleProgram(*l.program, Target::hostCpu(), so);
  if (opts.log.has(LogStage::Schedule))
    logBlock("schedule", sched::printSchedule(l.schedule));
  codegen::CpuCodegenOptions co;
  co.blas = blasSymbolsFor(opts.blasLibrary);
  l.code = codegen::generateCpu(l.schedule, co);
  if (opts.log.has(LogStage::OutputCode))
    logBlock("output_code", l.code.source);
  return l;
}

} // namespace

void checkSupported(Graph &g) { lowerAll(g, CompileOptions{}); }

CompileResult compile(Graph &g, const CompileOptions &opts) {
  runtime::ModuleSpec spec;
  for (Node *in : g.inputs())
    spec.inputs.push_back({toDLPack(in->dtype()), in->rank()});
  for (Node *out : g.outputs())
    spec.outputs.push_back({toDLPack(out->dtype()), out->rank()});
  spec.numSymbols = static_cast<int>(g.sizeSymbols().size());
  Lowered l = lowerAll(g, opts);
  jit::HostCompilerOptions jo;
  jo.compiler = opts.cxx;
  jo.cacheDir = opts.cacheDir.empty() ? CompileOptions::fromEnvironment().cacheDir : opts.cacheDir;
  jo.logCache = opts.log.has(LogStage::Cache);
  if (l.code.usesBlas) {
    std::string dir = opts.blasLibrary.substr(0, opts.blasLibrary.find_last_of('/'));
    jo.linkFlags = opts.blasLibrary + " -Wl,-rpath," + dir;
  }
  jit::CompiledLibrary lib = jit::compileCpp(l.code.source, jo);
  spec.libraryPath = lib.path;
  CompileResult r;
  r.executable = runtime::Executable::load(spec);
  r.source = l.code.source;
  r.numKernels = l.code.numKernels;
  r.cacheHit = lib.cacheHit;
  Counters &c = counters();
  ++c.graphsCompiled;
  c.kernelsGenerated += l.code.numKernels;
  ++(lib.cacheHit ? c.cacheHits : c.cacheMisses);
  return r;
}

std::string printStage(Graph &g, StageKind stage, const CompileOptions &opts) {
  if (stage == StageKind::Graph)
    return printGraph(g);
  simplifyGraph(g);
  if (stage == StageKind::Decomposed)
    return printGraph(g);
  auto program = lowerToLoops(g);
  if (stage == StageKind::Loops)
    return loop::printProgram(*program);
  sched::ScheduleOptions so;
  so.fuse = opts.fuse;
  sched::Schedule s = sched::scheduleProgram(*program, Target::hostCpu(), so);
  if (stage == StageKind::Schedule)
    return sched::printSchedule(s);
  codegen::CpuCodegenOptions co;
  co.blas = blasSymbolsFor(opts.blasLibrary);
  return codegen::generateCpu(s, co).source;
}

} // namespace braze
