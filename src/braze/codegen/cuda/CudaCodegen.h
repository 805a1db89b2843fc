#pragma once
/// CUDA code generation for a Schedule: one device source per graph (compiled at run time by
/// NVRTC) and one host source with the module ABI (braze_bind, braze_output_shapes,
/// braze_arena_bytes, braze_run), whose braze_run computes launch sizes and calls back into the
/// runtime to launch each kernel or GEMM on the caller's stream (runtime/CudaModule.h).
#include "braze/scheduler/Schedule.h"

#include <map>
#include <string>
#include <vector>

namespace braze::codegen {

/// A kernel that runs only where a library declines its call: a GEMM's loop kernel (cuBLASLt),
/// a convolution's (cuDNN), a cuDNN attention's own kernel. It is compiled at its first launch,
/// so that a graph whose calls the libraries take compiles none of these.
struct DeferredKernel {
  std::string name;   ///< the __global__ function
  std::string source; ///< a whole NVRTC program: the prelude it needs and the kernel
};

struct CudaGeneratedSource {
  std::string device;               ///< CUDA C++ for NVRTC: the kernels compiled with the graph
                                    ///< (empty when there are none)
  std::vector<DeferredKernel> deferred; ///< the kernels compiled at their first launch
  std::string host;                 ///< C++ for the host compiler
  std::vector<std::string> kernels; ///< __global__ names, indexed by the launch calls
                                    ///< (device's and deferred's)
  int numKernels = 0;               ///< schedule kernels (a GEMM with its fallback counts once)
  bool usesGemm = false;            ///< some kernel calls cuBLASLt
  bool usesCudnn = false;           ///< some kernel calls cuDNN (convolution or attention)
  bool checksIndices = false;       ///< some kernel bounds-checks an index (sets the error flag)
  /// The loop kernels launched just as their launch records say (not a library call's
  /// fallback, not attention or scatter), by schedule kernel name: the index of their launch
  /// in `kernels`. These are the kernels the autotuner may time in other forms.
  std::map<std::string, int> loopLaunches;

  /// The generated code as a reader wants it: the device source, each deferred kernel (after a
  /// comment saying so), then the host source.
  std::string text() const;
};

/// What PyTorch's precision flags allow the libraries (read when a graph is compiled).
struct CudaCodegenOptions {
  bool matmulTf32 = false; ///< f32 GEMMs may round inputs to TF32 (torch.backends.cuda.matmul)
  bool convTf32 = false;   ///< f32 convolutions may use TF32 (torch.backends.cudnn.allow_tf32)
  /// f16/bf16 attention outputs call cuDNN's fused attention first (cuDNN is available).
  bool cudnnAttention = false;
};

/// plan-cuda: records in each kernel that codegen writes as loops how it maps its points to
/// threads (sched::Kernel::cudaLaunch: block, threads per row, lanes, spread, columns,
/// persistent rows), from the target and the kernel's loads. generateCuda prints what the
/// records say (and plans a kernel that has none).
void planCudaLaunches(sched::Schedule &s);

/// Puts launch records given by hand (sched::parseLaunchRecords of an edited schedule) in
/// place of plan-cuda's, for the kernels they name. Each is checked against what its kernel's
/// code can do: a user error names the kernel, the field and the rule.
void applyCudaLaunches(sched::Schedule &s,
                       const std::map<std::string, sched::CudaLaunch> &records);

/// One form of a loop kernel for the autotuner (driver/Autotune.h): a launch record that
/// applyCudaLaunches accepts, the kernel's function under it (renamed), and its launch size.
struct CudaKernelForm {
  sched::CudaLaunch launch;
  std::string name;     ///< of its function
  std::string function; ///< an `extern "C" __global__` function, without the prelude
  int64_t blocks = -1;  ///< -1: the kernel's outer space is symbolic
  int threads = 0;      ///< per block
};

/// The forms of loop kernel `kernel` of s worth timing, and the buffers its launch passes.
struct CudaKernelForms {
  /// Its own record first (plan-cuda's or one given by hand), then variations of it (block,
  /// threads per row, lanes, spread, column rows, persistent rows, member groups) that its
  /// code can run, none twice; each function is named `<prefix><i>`.
  std::vector<CudaKernelForm> forms;
  /// The buffers in memory its launches pass, in argument order (the arguments after them
  /// are its size symbols and the error flag), and which of them it writes.
  std::vector<const loop::Buffer *> buffers;
  std::vector<bool> written;
};
/// Empty forms for a kernel not written as loops.
CudaKernelForms cudaKernelForms(const sched::Schedule &s, const std::string &kernel,
                                const std::string &prefix);

/// The whole NVRTC program of `functions` (CudaKernelForm::function texts): the prelude
/// they need, then them.
std::string cudaProgram(const std::string &functions);

/// Raises a Diagnostic for what the CUDA path does not generate yet (special functions).
CudaGeneratedSource generateCuda(const sched::Schedule &s, const CudaCodegenOptions &opts = {});

/// Helper functions every CUDA module starts with (exposed for the NVRTC tests).
std::string cudaPrelude();

} // namespace braze::codegen
