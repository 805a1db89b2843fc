#pragma once
/// GEMM on the GPU through cuBLASLt, loaded at run time (dlopen), so that braze builds and runs
/// without the CUDA toolkit. Row-major problems; descriptors and the chosen algorithm are cached
/// per problem shape, so a repeated call costs a hash lookup and one cublasLtMatmul.
#include "braze/runtime/LibraryTuning.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braze::runtime {

enum class GemmDType { Float32, Float64, Float16, BFloat16 };
enum class GemmEpilogue { None, Relu, GeluTanh };

/// Row-major C[m,n] = op(A)[m,k] * op(B)[k,n] (+ bias[n] broadcast over rows, then the activation).
/// A is stored row-major as [m,k] with row stride lda (transA=false) or as [k,m] with row stride lda
/// (transA=true); B likewise as [k,n] / [n,k] with ldb; C as [m,n] with row stride ldc. Strides in
/// elements; all pointers are device pointers.
struct GemmProblem {
  GemmDType dtype = GemmDType::Float32; ///< of A, B, C and bias; accumulation in f32 (f64 for Float64)
  /// Float16/BFloat16 only: C (and bias) are f32, the f32 product of the operands.
  bool f32Out = false;
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  const void *a = nullptr;
  int64_t lda = 0;
  const void *b = nullptr;
  int64_t ldb = 0;
  void *c = nullptr;
  int64_t ldc = 0;
  const void *bias = nullptr; ///< [n] device pointer, or nullptr
  GemmEpilogue epilogue = GemmEpilogue::None;
  /// `batch` products in one call: matrix i of A, B and C starts stride{A,B,C} * i elements
  /// after matrix 0 (a stride of 0 reads the same operand for every product; C's must not be 0
  /// unless batch == 1).
  int64_t batch = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  /// Float32 only: let cuBLASLt round inputs to TF32. Off by default, matching PyTorch's default
  /// (torch.backends.cuda.matmul.allow_tf32 = False).
  bool allowTf32 = false;
};

/// A batch whose A and C matrices follow one another row after row and share one B (a Linear
/// over [batch, m, k]) becomes one product of batch * m rows, which cuBLASLt tiles better.
void foldBatchIntoRows(GemmProblem &p);

/// The process-wide cuBLASLt instance. Thread-safe: gemm() serializes on an internal mutex.
class CublasLt {
public:
  /// Loads `libraryPath` (a libcublasLt.so.* path) once per process (later calls with any path
  /// return the same object); throws RunError (Executable.h) naming the path and dlerror() when it
  /// cannot, or naming the missing entry point or the failing cublasLtCreate.
  static CublasLt &load(const std::string &libraryPath);

  /// Enqueues the product on `stream` (a CUstream as void*; nullptr = default stream), using
  /// `workspace` (device memory, workspaceBytes long; may be nullptr/0). Never synchronizes.
  /// Returns "" on success, else a message naming the failing cuBLASLt call and its status code
  /// (and the problem's m, n, k, dtype). m == 0 or n == 0 is a no-op; k == 0 is refused (cuBLASLt
  /// does not define it), so the caller fills C itself.
  std::string gemm(const GemmProblem &p, void *stream, void *workspace, size_t workspaceBytes);

  /// Workspace size the wrapper asks heuristics to stay within (32 MiB).
  static size_t recommendedWorkspaceBytes();

  /// Number of cached problem shapes (for tests and diagnostics).
  size_t cachedPlans();

  /// While set, gemm() hands each product whose algorithm this process has not tuned yet, and
  /// for which the heuristics offer more than one, to `tuner` before running it; the
  /// algorithm it returns (0: the heuristics' first) serves that problem from then on. Empty:
  /// none (the default).
  void setTuner(std::function<int(const LibraryTuning &)> tuner);
  /// Algorithm `index` of the heuristics' list (as LibraryTuning numbers them) for the problem
  /// whose LibraryTuning::key is `key`, wherever this process plans it: a tuned module's choices,
  /// restored when it loads. An index the heuristics no longer offer is passed over.
  void prefer(const std::string &key, int index);

  CublasLt(const CublasLt &) = delete;
  CublasLt &operator=(const CublasLt &) = delete;
  ~CublasLt();

private:
  CublasLt();
  /// A new instance over `libraryPath` (what load() makes once).
  static std::unique_ptr<CublasLt> openLibrary(const std::string &libraryPath);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace braze::runtime
