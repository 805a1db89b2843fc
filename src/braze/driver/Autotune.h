#pragma once
/// The autotuner (CompileOptions::autotuneSeconds, BRAZE_AUTOTUNE, torch.compile's
/// mode="max-autotune"): after a CUDA graph is compiled with its planned launch records, it
/// times other forms of the loop kernels that take the graph's time, on the device, on scratch
/// buffers of the graph's real sizes, and keeps a form only where it is faster than the
/// planned one and writes what the planned one writes.
///
/// - Which kernels: one run of the compiled graph, each launch timed with events, ranks the
///   kernels' functions (a function shared by the layers of a model counts all its launches);
///   they are tuned in that order while the budget lasts.
/// - Their forms: codegen::cudaKernelForms (block, threads per row, lanes, spread, column
///   rows, persistent rows, member groups), compiled by NVRTC in batches.
/// - Timing: at the first launch of each function, in the graph's own run, on the data that
///   run gives it. The buffers the kernel writes are saved first and put back before each
///   form runs and after the last, so a kernel that updates a buffer in place is timed and
///   checked from the same state, and the run goes on as if nothing else had run.
/// - The check: each form's written buffers against the planned form's (exactly for integers
///   and bools, within a tolerance of the dtype for floats, nan where nan). A form that fails to
///   launch or differs never wins.
/// - Matrix products: in one more run of the graph, each cuBLASLt product runs in every
///   algorithm the heuristics offer (up to 8), checked and timed as the forms are; the fastest
///   serves the problem in this process, and the tuned module's manifest records the choices,
///   which its loads restore (runtime::CublasLt::prefer).
/// - The budget: a hard limit on the seconds the tuning spends for one graph (compiling forms
///   and running them; the final compile of the winners is the compile's own).
/// - The cache: each function's result is stored under the cache folder (`autotune/<key>`,
///   keyed by the function's text, its forms and the target), so another graph with the same
///   kernel, and a later process, take it without timing; the compiled graph's manifest holds
///   the tuned module, so a warm compile tunes nothing.
#include "braze/codegen/cpu/CppCodegen.h"
#include "braze/codegen/cuda/CudaCodegen.h"
#include "braze/driver/Compile.h"
#include "braze/jit/Nvrtc.h"
#include "braze/runtime/Executable.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace braze {

struct TuneResult {
  /// Launch records (`kernelN launch{...}`, as braze-opt --launch reads them) for the kernels
  /// whose best form is not their planned one; empty when none.
  std::string records;
  /// The cuBLASLt algorithm chosen for each product timed and the cuDNN engine for each
  /// convolution and attention (the heuristics' first where it stayed fastest).
  std::vector<runtime::LibraryChoice> libraryChoices;
  std::string log; ///< each function's forms, their times and the verdict (BRAZE_LOG=autotune)
  double seconds = 0;
  int functionsTimed = 0, functionsCached = 0, functionsChanged = 0;
  /// Library problems timed, and those of them whose choice is not the heuristics' first.
  int gemms = 0, gemmsChanged = 0, convolutions = 0, convolutionsChanged = 0, attentions = 0,
      attentionsChanged = 0;
};

/// Tunes the loop kernels of `s`, generated as `source` and loaded as `exe` (not yet handed to
/// anyone: the tuner runs it), within opts.autotuneSeconds. A graph it cannot tune (symbolic
/// sizes, no event timing in the driver) gives no records and says why in `log`.
TuneResult autotuneCuda(const sched::Schedule &s, const codegen::CudaGeneratedSource &source,
                        runtime::Executable &exe, const CompileOptions &opts,
                        const jit::NvrtcOptions &nvrtc);

/// Tunes the CPU loop kernels of `s` within opts.autotuneSeconds: `compile` compiles and loads
/// a module of s generated with the CpuCodegenOptions it is given (the tuning module: every
/// kernel's forms beside it, and a hook before each kernel). The kernels with the most points
/// get their forms first (CpuEmitter::launchCandidates: shared outer loops, simd, lanes,
/// groups); in one run on scratch inputs each form runs from the kernel's saved state, is
/// checked against the planned form's output on the host and timed (the median of 5). A graph
/// with symbolic sizes, or whose tuning module's compile leaves no budget, is not tuned.
TuneResult autotuneCpu(
    const sched::Schedule &s, const CompileOptions &opts,
    const std::function<std::shared_ptr<runtime::Executable>(const std::map<
        std::string, std::vector<sched::CpuLaunch>> &)> &compile);

/// The NVRTC program of the tuner's own kernels: scratch inputs filled on the device, and the
/// check of a form's output against the planned form's (the largest magnitude, then the first
/// element beyond the tolerance), with braze_tune_maxabs<K> and braze_tune_compare<K> for each
/// float kind K (0 f32, 1 f64, 2 f16, 3 bf16). Exposed for the tests.
std::string autotuneCheckerSource();

} // namespace braze
