#pragma once
/// The whole pipeline: compile(Graph, CompileOptions) -> Executable.
///   graph -> decompose + graph passes -> loops -> schedule -> C++ -> host compiler (cached)
#include "braze/ir/graph/Graph.h"
#include "braze/ir/loop/LoopIR.h"
#include "braze/runtime/Executable.h"
#include "braze/support/Log.h"
#include "braze/target/Target.h"

#include <atomic>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace braze {

struct CompileOptions {
  LogSet log;
  bool strict = false;       ///< Python layer: raise instead of falling back on internal errors
  bool fuse = true;
  /// CUDA: gated activations over grouped products as the product kernel's paired epilogue
  /// (sched::pairGemmEpilogues). Off by default: on an H200 the fused kernel was slower than
  /// the product and a pointwise kernel (BRAZE_PAIRED_EPILOGUE=1 turns it on).
  bool pairedEpilogues = false;
  std::string cacheDir;      ///< empty: the default (BRAZE_CACHE_DIR or ~/.cache/braze)
  /// A cache shared between processes and machines (BRAZE_REMOTE_CACHE=file:///path, a folder
  /// on a shared file system): a graph the local cache misses is looked up there, and a graph
  /// compiled here is stored there too (see Manifest.h). Empty: none.
  std::string remoteCacheDir;
  /// The same in a Redis server (BRAZE_REMOTE_CACHE=redis://host:port): host:port. Empty: none.
  std::string remoteRedis;
  std::string cxx = "g++";
  /// A CBLAS shared library for matrix products (empty: loop nests). Its symbol names are
  /// derived from the file name: scipy-openblas64 (NumPy's OpenBLAS) or plain cblas_*.
  std::string blasLibrary;
  /// oneDNN's shared library (libdnnl.so.3, GNU OpenMP build): CPU f32 convolutions stay whole
  /// and run through it (empty: convolutions decompose into im2col and matrix products).
  std::string dnnlLibrary;
  /// The half-precision dtypes that PyTorch's CPU kernels run through oneDNN on the machine
  /// the model runs on (torch.ops.mkldnn._is_mkldnn_bf16_supported / _fp16_supported): braze
  /// rounds as those kernels do there (DecomposeOptions::oneDnnHalf). The Python frontend asks
  /// PyTorch; a C++ user states the machine's. Not used for CUDA.
  std::vector<DType> oneDnnHalf;

  /// CUDA: set `cuda` to compile for a GPU (the caller describes the device and where NVRTC
  /// and cuBLASLt are; PyTorch's CUDA wheels ship both).
  struct Cuda {
    int device = 0;
    int computeCapability = 90;
    int multiprocessors = 132;
    int64_t registerBytesPerSm = 1 << 18;
    int64_t kernelArgBytes = 4096; ///< see Target::kernelArgBytes
    std::string nvrtcLibrary;
    std::string cublasLtLibrary;
    /// cuDNN (libcudnn.so.*): convolutions stay whole and run through it; empty: they
    /// decompose into im2col and matrix products.
    std::string cudnnLibrary;
    /// PyTorch's precision flags when the graph is compiled: f32 GEMMs may use TF32
    /// (torch.backends.cuda.matmul.allow_tf32), f32 convolutions may
    /// (torch.backends.cudnn.allow_tf32).
    bool matmulTf32 = false, convTf32 = false;
    /// f16/bf16 attention runs on cuDNN's fused attention where cuDNN takes it (with a
    /// cuDNN library; torch.backends.cuda.enable_cudnn_sdp), else on braze's kernel.
    bool cudnnAttention = true;
    /// A printed schedule whose launch records (`kernelN ... launch{...}`, braze-opt
    /// --launch) replace plan-cuda's for the kernels they name; empty: none.
    std::string launchRecords;
  };
  std::optional<Cuda> cuda;
  /// The autotuner (driver/Autotune.h): seconds it may spend per graph timing other forms of
  /// the CUDA loop kernels (BRAZE_AUTOTUNE=1 gives kDefaultAutotuneSeconds, a number that
  /// many); 0: off. The CPU's kernels are not tuned.
  double autotuneSeconds = 0;
  static constexpr double kDefaultAutotuneSeconds = 5;
  /// CPU: a printed schedule whose records (`kernelN ... cpu{...}`, braze-opt --launch)
  /// replace plan-cpu's for the kernels they name; empty: none.
  std::string cpuLaunchRecords;
  /// Graph passes of Pipeline.def's GRAPH_PASS rows that compile skips (BRAZE_DISABLE_PASSES=
  /// a,b): to find which rewrite makes a model slower or wrong. Each name is checked against
  /// the pipeline (checkDisabledPasses); lowering steps (decompose, realize, ...) cannot be.
  std::vector<std::string> disabledPasses;

  /// Reads BRAZE_LOG, BRAZE_STRICT, BRAZE_CACHE_DIR, BRAZE_REMOTE_CACHE, BRAZE_CXX, BRAZE_BLAS, BRAZE_DNNL, BRAZE_PAIRED_EPILOGUE, BRAZE_AUTOTUNE and
  /// BRAZE_DISABLE_PASSES: the one place
  /// braze reads the environment.
  static CompileOptions fromEnvironment();
};

/// Where one compile spent its time, in seconds (BRAZE_LOG=compile_time prints it).
struct CompileTimes {
  double lower = 0;       ///< verify, decompose, graph passes, to loops, schedule, codegen
  double hostCompile = 0; ///< the host C++ compiler (or its cache)
  double nvrtc = 0;       ///< NVRTC (or its cache); CUDA only
  double load = 0;        ///< loading the module (and the CUDA module)
  double autotune = 0;    ///< the autotuner, and compiling its winners again
};

struct CompileResult {
  std::shared_ptr<runtime::Executable> executable;
  std::string source; ///< CPU: the C++; CUDA: the device source, then the host source
  int numKernels = 0;
  bool cacheHit = false;
  CompileTimes times;
};

/// The target `opts` describes: the CUDA device of opts.cuda, else this machine's CPU.
Target targetFor(const CompileOptions &opts);

/// Compiles `g` (which is consumed: passes rewrite it in place).
CompileResult compile(Graph &g, const CompileOptions &opts);
/// Compiles a loop program (loop IR text parsed) for the CPU, from the schedule on; not
/// recorded in the compile cache's manifest (braze-opt --run of a loop program).
CompileResult compile(std::unique_ptr<loop::LoopProgram> program, const CompileOptions &opts);

/// Each stage's text, for braze-opt and the logs: the pipeline `compile` runs, stopped after
/// `stage`. A loop program (loop IR text) starts at the Loops stage.
enum class StageKind {
#define STAGE(K, name, log, logName, desc) K,
#include "braze/driver/Stages.def"
};
/// A stage by its --print name, or nothing; and the names, in pipeline order.
std::optional<StageKind> stageByName(std::string_view name);
std::vector<std::string_view> stageNames();
std::string printStage(Graph &g, StageKind stage, const CompileOptions &opts);
std::string printStage(std::unique_ptr<loop::LoopProgram> program, StageKind stage,
                       const CompileOptions &opts);

/// The forms the autotuner would time of each loop kernel of `g` (consumed), planned record
/// first (braze-opt --forms): `kernelN formI launch{...} blocks=B` lines for CUDA, `kernelN
/// formI cpu{...}` for the CPU (kernels with one form are not listed).
std::string printKernelForms(Graph &g, const CompileOptions &opts);

/// The graph steps of the pipeline (Pipeline.def), in the order compile runs them: graph
/// passes (passes/Passes.def) and lowering steps (`decompose`). runGraphStep runs one of them,
/// or any other graph pass, on g (verified after it); `decompose` takes its options from
/// `opts`' target.
struct GraphStep {
  std::string_view name, description;
  /// A lowering step (its options come from CompileOptions); null for a graph pass.
  void (*lowering)(Graph &, const CompileOptions &);
};
const std::vector<GraphStep> &graphSteps();

/// The back half's steps (Pipeline.def's LOOP_STEP rows: schedule, plan-cuda, codegen), in the
/// order lowering runs them after to_loops; what braze-opt --help lists.
struct LoopStepInfo {
  std::string_view name, description;
};
const std::vector<LoopStepInfo> &loopSteps();
void runGraphStep(Graph &g, std::string_view name, const CompileOptions &opts);
/// A user error (naming `where`, the option or variable they came from) unless every name is
/// a graph pass of the pipeline (CompileOptions::disabledPasses).
void checkDisabledPasses(const std::vector<std::string> &names, std::string_view where);

/// Whether braze compiles `g` for the target `opts` describes, answered without lowering it:
/// the graph verifies (the builder and the verifier state what every op takes), and the
/// target generates each of its ops (CUDA has no special functions; a CPU half-precision
/// transposed convolution that rounds per kernel tap has at most kMaxRoundedTaps taps). A
/// refusal says why.
struct Support {
  bool ok = true;
  std::string reason;
};
Support supports(const Graph &g, const CompileOptions &opts);

/// The trial behind `supports`: graph-level lowering (decompose, passes, to_loops, schedule,
/// codegen for the CPU) without compiling; raises a Diagnostic if braze cannot take the graph.
/// The frontend runs it only to find the nodes of a graph that `supports` accepted but that
/// failed to compile.
void checkSupported(Graph &g);

/// The CUDA sources braze generates for `g` (consumed), without compiling them.
struct CudaSources {
  std::string device, host;
  std::vector<std::string> deferred; ///< one NVRTC program per kernel compiled at first launch
};
CudaSources generateCudaSources(Graph &g, const CompileOptions &opts);

/// Compiles CUDA source with NVRTC (libnvrtc at `library`) for compute capability
/// `computeCapability`, cached under `cacheDir`: the cubins' paths. And the library's version.
/// The Python module reaches the JIT through these.
std::vector<std::string> compileCudaSource(const std::string &source, const std::string &library,
                                           int computeCapability, const std::string &cacheDir);
std::string nvrtcVersion(const std::string &library);

/// Cumulative counts for this process.
struct Counters {
  std::atomic<int64_t> graphsCompiled{0}, kernelsGenerated{0}, cacheHits{0}, cacheMisses{0};
  /// Deferred CUDA kernels (codegen::DeferredKernel) compiled, or found in the cache, and loaded
  /// at their first launch, because a library declined the call they stand in for.
  std::atomic<int64_t> deferredKernelsLoaded{0};
};
Counters &counters();

} // namespace braze
