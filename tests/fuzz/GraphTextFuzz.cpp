/// libFuzzer target: graph text -> parse -> verify -> every stage of the pipeline, for the CPU
/// and for CUDA (code generation only: nothing is compiled or run). A user error (Diagnostic) is
/// the expected answer to bad text; anything else is a bug the fuzzer reports:
///   - an internal check failure on a verified graph (InternalError, or any other exception),
///     reported as an uncaught exception;
///   - a sanitizer report (the target is built with ASan and UBSan), a crash or a hang.
/// Text that is not a graph is tried as loop IR (parse, verify, print).
/// `make fuzz` runs it for FUZZ_SECONDS, seeded from tests/lit and tests/fuzz/regressions.
#include "braze/driver/Compile.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/ir/loop/LoopIR.h"
#include "braze/ir/loop/LoopText.h"
#include "braze/passes/PassManager.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

/// The configurations each graph goes through: they reach the different decompositions
/// (libraries kept whole or not) and code generators.
std::vector<braze::CompileOptions> configurations() {
  std::vector<braze::CompileOptions> all;
  braze::CompileOptions cpu;
  cpu.blasLibrary = "libscipy_openblas64_.so";
  all.push_back(cpu);

  braze::CompileOptions cpuLibraries = cpu;
  cpuLibraries.fuse = false;
  cpuLibraries.dnnlLibrary = "libdnnl.so.3";
  all.push_back(cpuLibraries);

  braze::CompileOptions cuda;
  cuda.cuda = braze::CompileOptions::Cuda{};
  all.push_back(cuda);

  braze::CompileOptions cudaLibraries = cuda;
  cudaLibraries.cuda->cudnnLibrary = "libcudnn.so.9";
  cudaLibraries.cuda->matmulTf32 = cudaLibraries.cuda->convTf32 = true;
  cudaLibraries.cuda->computeCapability = 80;
  all.push_back(cudaLibraries);
  return all;
}

[[noreturn]] void bug(const char *what, const std::exception &e) {
  std::fprintf(stderr, "braze-fuzz: %s: %s\n", what, e.what());
  std::abort();
}

/// Every graph pass in registration order, then the graph must still verify.
void runEveryPass(std::string_view text) {
  std::unique_ptr<braze::Graph> g = braze::parseGraph(text);
  std::vector<std::string> names;
  for (const braze::PassInfo &p : braze::registeredPasses())
    names.emplace_back(p.name);
  braze::runPasses(*g, names);
  std::string err = braze::verifyGraph(*g);
  if (!err.empty())
    bug("the passes broke a verified graph", std::runtime_error(err));
  braze::printGraph(*g);
}

void fuzzGraph(std::string_view text) {
  static const std::vector<braze::CompileOptions> configs = configurations();
  std::unique_ptr<braze::Graph> g;
  try {
    g = braze::parseGraph(text);
    if (!braze::verifyGraph(*g).empty())
      return;
  } catch (const braze::Diagnostic &) {
    return;
  }
  // Verified: from here on, every stage either succeeds or reports a user error (an op the
  // target cannot compile); an internal check failure is a bug.
  try {
    runEveryPass(text);
    for (const braze::CompileOptions &opts : configs) {
      std::unique_ptr<braze::Graph> copy = braze::parseGraph(text);
      try {
        braze::printStage(*copy, braze::StageKind::Code, opts);
      } catch (const braze::Diagnostic &) {
      }
    }
  } catch (const braze::Diagnostic &) {
  } catch (const std::exception &e) {
    bug("internal error on a verified graph", e);
  }
}

void fuzzLoops(std::string_view text) {
  std::unique_ptr<braze::loop::LoopProgram> p;
  try {
    p = braze::loop::parseProgram(text);
    if (!braze::loop::verifyProgram(*p).empty())
      return;
  } catch (const braze::Diagnostic &) {
    return;
  }
  try {
    braze::loop::printProgram(*p);
  } catch (const std::exception &e) {
    bug("internal error printing a verified loop program", e);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view text(reinterpret_cast<const char *>(data), size);
  try {
    if (text.find("graph") != std::string_view::npos)
      fuzzGraph(text);
    else
      fuzzLoops(text);
  } catch (const std::exception &e) {
    bug("internal error", e);
  }
  return 0;
}
