#pragma once
/// Convolution and fused attention on the GPU through cuDNN, loaded at run time (dlopen) like
/// cuBLASLt, so braze builds without the CUDA toolkit and a compiled graph runs without libtorch.
/// Each problem
/// (sizes, strides, dtype, operand alignment) gets a plan once, from cuDNN's heuristics with no
/// trial runs, so a first call may be captured into a CUDA graph: an execution plan of the
/// backend (graph) API, whose calls cost a few microseconds of host time, or, where none can
/// be built, the legacy API's descriptors and algorithm.
#include "braze/runtime/LibraryTuning.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braze::runtime {

/// y = conv(x, w): cross-correlation with PyTorch's semantics; or (direction 1) w = the
/// gradient of the weight from x and y's gradient at y (cuDNN's backward-filter
/// convolution); or (direction 2) x = the gradient of the input from y's gradient at y and w
/// (backward-data). dims and strides in elements, in logical order: x [N, C, spatial..],
/// w [O, C/groups, k..], y [N, O, out..], rank 3-5.
/// A CUDA module's host code fills one as its BrazeConv (codegen/cuda/CudaHost.cpp), which has
/// this layout: plain ints and int64s, no bool.
struct ConvProblem {
  int dtype = 0; ///< of x, w and y: 0 f32, 1 f64, 2 f16, 3 bf16 (accumulation in f32; f64 in f64)
  int rank = 4;
  int64_t xDims[5] = {}, xStrides[5] = {}, wDims[5] = {}, wStrides[5] = {}, yDims[5] = {},
          yStrides[5] = {};
  int64_t groups = 1;
  int64_t stride[3] = {}, padding[3] = {}, dilation[3] = {};
  void *x = nullptr, *w = nullptr, *y = nullptr; ///< the result: y, w (1) or x (2)
  /// f32 only, non-zero: let cuDNN use TF32 tensor cores (torch.backends.cudnn.allow_tf32).
  int allowTf32 = 0;
  int direction = 0; ///< 0 forward, 1 weight gradient, 2 input gradient
};

/// o = softmax(scale * q kᵀ + bias [causal: keys j > i dropped]) v, cuDNN's fused flash
/// attention; or (grad) the gradients of q, k and v, cuDNN's fused flash attention backward. Every operand is 4-d, [batch, heads, sequence, head dim]:
/// q [b, hq, sq, d], k [b, hk, skv, d], v [b, hk, skv, dv], o [b, hq, sq, dv], strides in
/// elements with the last one 1. hq is a multiple of hk: query head h reads key/value head
/// h / (hq / hk) (grouped-query attention). The bias, when not null, is added to the scaled
/// scores in f32: [b or 1, hq or 1, sq or 1, skv] (biasDims; a dim of 1 broadcasts), in q's
/// dtype, its last stride 1 (a boolean mask arrives as 0 and -inf). `stats`, when not null,
/// receives each row's log-sum-exp of those scores (the saved value of training), f32
/// [b, hq, sq, 1] with strides statsStrides. With `grad`, o and stats are read (the forward's
/// output and log-sum-exp), and gradQ (as q), gradK and gradV (as k and v, with hg heads: hk, or
/// hq where each query head's gradient is kept apart) are written from gradOut (as o). A CUDA module's host
/// code fills one as its BrazeAttention (codegen/cuda/CudaHost.cpp), which has this layout.
struct AttentionProblem {
  int dtype = 2; ///< of q, k, v and o: 2 f16, 3 bf16 (as ConvProblem's)
  int causal = 0;
  int64_t b = 0, hq = 0, hk = 0, sq = 0, skv = 0, d = 0, dv = 0;
  int64_t qStrides[4] = {}, kStrides[4] = {}, vStrides[4] = {}, oStrides[4] = {};
  float scale = 1;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void *o = nullptr;
  const void *bias = nullptr;
  int64_t biasDims[4] = {}, biasStrides[4] = {};
  void *stats = nullptr;
  int64_t statsStrides[4] = {};
  int grad = 0;
  int64_t hg = 0;
  const void *gradOut = nullptr;
  void *gradQ = nullptr, *gradK = nullptr, *gradV = nullptr;
  int64_t gradOutStrides[4] = {}, gradQStrides[4] = {}, gradKStrides[4] = {},
          gradVStrides[4] = {};
};

enum class DnnStatus { Done, Declined, Failed };

/// Workspace beyond the common one: `get(bytes)` is device memory of at least `bytes`, or null
/// where none can be had now; `canAllocate()` says whether more than is held may be had now
/// (not while the stream is being captured into a CUDA graph). Both are asked only of a plan
/// being built or one over the common workspace.
struct LargeWorkspace {
  std::function<void *(size_t bytes)> get;
  std::function<bool()> canAllocate;
};

/// The process-wide cuDNN instance. Thread-safe: conv() serializes on an internal mutex.
class Cudnn {
public:
  /// Loads `libraryPath` (libcudnn.so.*) once per process; throws RunError naming the path and
  /// dlerror(), or the missing entry point.
  static Cudnn &load(const std::string &libraryPath);

  /// Enqueues the convolution on `stream` (a CUstream as void*), using `workspace`
  /// (workspaceBytes of device memory). With `large`, a plan built when it can allocate may
  /// take an engine whose workspace is larger, up to 1 GiB, from `large` (cuDNN's first choice
  /// for a ResNet stem's weight gradient needs more than 64 MiB); where that cannot be had
  /// later, the plan is built again within workspaceBytes. Declined: cuDNN takes no such
  /// problem (a weight layout other than contiguous or channels-last, sizes beyond int32, no
  /// algorithm within the workspace); the caller computes it another way. Failed: `error`
  /// names the cuDNN call.
  DnnStatus conv(const ConvProblem &p, void *stream, void *workspace, size_t workspaceBytes,
                 std::string &error, const LargeWorkspace &large = {});

  /// Enqueues the attention (or its backward) on `stream`, as conv() does. Declined: no cuDNN
  /// engine runs this problem (dtype, head dims, alignment, a cuDNN without fused attention,
  /// or, for the backward, one before 9.6 or a workspace too small for its f32 scratch); the
  /// caller launches its own kernels.
  DnnStatus attention(const AttentionProblem &p, void *stream, void *workspace,
                      size_t workspaceBytes, std::string &error);

  static size_t recommendedWorkspaceBytes(); ///< 64 MiB

  /// While set, conv() (and attention(), where `attentions` says so) hands each problem whose
  /// engine this process has not chosen yet, and for which the heuristics offer more than one,
  /// to `tuner` before running it (up to 8 engine configs, built then, while `hasTime()` says
  /// so); the config it returns (0: the heuristics' first) serves that problem from then on.
  /// Empty: none (the default).
  void setTuner(std::function<int(const LibraryTuning &)> tuner,
                std::function<bool()> hasTime = {}, bool attentions = false);
  /// The engine of global index `engine` (LibraryChoice::id) for the convolution or attention
  /// whose LibraryTuning::key is `key`, wherever this process plans it next: a tuned module's
  /// choices, restored when it loads. An engine the heuristics no longer offer among their
  /// first kOfferedEngines is passed over (their first serves).
  void prefer(const std::string &key, int64_t engine);

  Cudnn(const Cudnn &) = delete;
  Cudnn &operator=(const Cudnn &) = delete;
  ~Cudnn();

private:
  Cudnn();
  /// A new instance over `libraryPath` (what load() makes once).
  static std::unique_ptr<Cudnn> openLibrary(const std::string &libraryPath);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace braze::runtime
