#pragma once
/// The CUDA side of a compiled graph: the CUDA driver (loaded at run time, so braze builds and
/// runs without the toolkit), the NVRTC-compiled module and its kernels, the error flag kernels
/// set, and the launch and GEMM callbacks that a module's host code (braze_run) calls. Every
/// launch goes to the caller's stream; nothing here synchronizes.
#include "braze/runtime/Cudnn.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace braze::runtime {

struct ModuleSpec;

/// The callbacks a CUDA module's braze_run receives (layout shared with the generated code).
struct CudaGemmCall {
  int dtype; ///< 0 f32, 1 f64, 2 f16, 3 bf16
  int transA, transB;
  int64_t m, n, k;
  const void *a;
  int64_t lda;
  const void *b;
  int64_t ldb;
  void *c;
  int64_t ldc;
  const void *bias; ///< [n] or nullptr
  int64_t batch;    ///< matrices, each stride{A,B,C} elements after the one before
  int64_t strideA, strideB, strideC;
  int outDtype; ///< of C: dtype, or 0 (f32) for f16/bf16 operands
  int allowTf32; ///< f32: inputs may be rounded to TF32
};
/// A convolution, as the generated code's BrazeConv lays it out.
using CudaConvCall = ConvProblem;
/// A fused attention, as the generated code's BrazeAttention lays it out.
using CudaAttentionCall = AttentionProblem;
struct CudaApi {
  void *ctx;
  int (*launch)(void *ctx, int kernel, int64_t blocks, int threads, void **args);
  int (*gemm)(void *ctx, const CudaGemmCall *g);
  /// 0: done; 1: cuDNN declined it (the caller launches the loop kernel); 2: failed.
  int (*conv)(void *ctx, const CudaConvCall *c);
  int *err;
  /// Launch the module's index guard (a device-side assertion on a bad index) after its
  /// kernels, instead of leaving the error flag to synchronizeAndCheck.
  int assertIndices;
  /// As conv: 1 when cuDNN declines it (the caller launches its own attention kernel).
  int (*attention)(void *ctx, const CudaAttentionCall *a);
  /// As launch, with `sharedBytes` of dynamic shared memory (more than 48 KiB allowed).
  int (*launchShared)(void *ctx, int kernel, int64_t blocks, int threads, int sharedBytes,
                      void **args);
};

/// The module's host entry point: braze_run with the callbacks.
using CudaRunFn = int (*)(void *const *, void *const *, char *, const int64_t *, const CudaApi *);

class CudaModule {
public:
  /// Loads spec's cubins on its device (the primary context) and looks up each of its kernels
  /// in them (each is in one, or deferred: compiled at its first launch); cuBLASLt and cuDNN
  /// are loaded from spec's libraries where named. With spec.logFallback, a convolution or
  /// attention cuDNN declines, and a deferred kernel compiled, is said on stderr (once per
  /// reason). Throws RunError naming what failed.
  static std::unique_ptr<CudaModule> load(const ModuleSpec &spec);
  ~CudaModule();

  /// Loads the libraries the first module of `device` would load (cuBLASLt and cuDNN, from
  /// their paths when non-empty), so that a caller can do it on a thread of its own while it
  /// compiles. Never throws: a library that fails here fails again, with its message, in load().
  static void preload(int device, const std::string &cublasLtLibrary,
                      const std::string &cudnnLibrary);

  /// Calls `run` with the callbacks bound to `stream`; throws RunError if a launch or GEMM
  /// fails, or if a kernel of an earlier call on this module reported an error.
  void run(CudaRunFn run, void *const *inputs, void *const *outputs, char *arena,
           const int64_t *syms, void *stream);

  /// Waits for `stream` and raises the error a kernel recorded, if any. Graphs whose kernels
  /// check indices call it after each run, so that a bad index is an error of that call.
  void synchronizeAndCheck(void *stream);

  /// A module whose kernels check indices: with `on`, each run ends with a device-side
  /// assertion when one of its kernels found an index out of bounds, so that no caller waits
  /// for the kernels (the CUDA context is then unusable, as after eager's own assertions);
  /// without, the flag waits for synchronizeAndCheck (the default).
  void setAssertIndices(bool on);

  /// Called twice for each kernel launch of run() (not for a library call): before the launch
  /// (`after` false) and after it is enqueued, with the launch's index in spec.kernels, its
  /// blocks, threads and arguments (each a pointer to the value), on the run's stream. The
  /// autotuner times the launches, and other forms of a kernel, there. Empty: none.
  using LaunchObserver = std::function<void(int kernel, int64_t blocks, int threads,
                                            void **args, void *stream, bool after)>;
  void setLaunchObserver(LaunchObserver observer);

private:
  CudaModule() = default;
  struct State;
  std::unique_ptr<State> state_;
};

/// True when libcuda can be loaded and reports at least one device.
bool cudaDriverAvailable();

// Device memory through the driver, for packages and the programs that run them (no CUDA
// runtime library needed). Each makes the device's primary context current on the calling
// thread and throws RunError naming what failed.

/// The device's compute capability as major * 10 + minor (90 for an H100).
int cudaComputeCapability(int device);
/// The device memory's theoretical bandwidth in bytes per second (memory clock x bus width x
/// 2), or 0 where the driver does not say.
double cudaPeakBandwidth(int device);
/// `bytes` of device memory.
void *cudaAllocate(int device, size_t bytes);
/// `bytes` of device memory ordered on `stream` (null: the default stream): work enqueued there
/// after this call may use it.
void *cudaAllocateOn(int device, size_t bytes, void *stream);
/// Frees what cudaAllocate returned. Never throws.
void cudaRelease(int device, void *p) noexcept;
/// Frees what cudaAllocateOn returned, once the work enqueued on `stream` before is done.
void cudaReleaseOn(int device, void *p, void *stream) noexcept;
/// Copies `bytes` host -> device (`toDevice`) or device -> host; synchronous.
void cudaCopy(int device, void *dst, const void *src, size_t bytes, bool toDevice);
/// Waits for `stream` (null: the whole device).
void cudaSynchronize(int device, void *stream = nullptr);
/// Copies `bytes` device -> device, enqueued on `stream`.
void cudaCopyOn(int device, void *dst, const void *src, size_t bytes, void *stream);

/// Runs `enqueue`, which puts work on `stream`, after the work that went through here on
/// another stream of `device`: the cuBLASLt, cuDNN and padded-result buffers are one per device
/// and process, so calls on two streams would otherwise use them at once on the GPU.
void cudaOrdered(int device, void *stream, const std::function<void()> &enqueue);

/// Why CUDA graphs cannot be used in this process ("" when they can).
std::string cudaGraphsUnavailable();

/// A CUDA graph: the work a function enqueues, captured once and launched again on any stream
/// (its kernels, library calls and copies, with the addresses they had when captured).
class CudaGraph {
public:
  /// Captures what `enqueue` puts on the stream it is given (a stream of the capture's own;
  /// nothing runs). Throws RunError naming what failed: an operation a capture cannot hold (a
  /// synchronization, say) fails it.
  static std::unique_ptr<CudaGraph> capture(int device,
                                            const std::function<void(void *stream)> &enqueue);
  ~CudaGraph();
  CudaGraph(const CudaGraph &) = delete;
  CudaGraph &operator=(const CudaGraph &) = delete;

  /// Enqueues the captured work on `stream`.
  void launch(void *stream) const;

private:
  CudaGraph() = default;
  void *exec_ = nullptr;
  int device_ = 0;
};

} // namespace braze::runtime
