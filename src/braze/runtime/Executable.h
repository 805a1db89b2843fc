#pragma once
/// A compiled graph, ready to run: the loaded module, its ABI entry points, and the input and
/// output descriptions. Depends on nothing in braze but support/, so an exported model needs no
/// compiler.
#include "braze/runtime/DLPack.h"
#include "braze/runtime/LibraryTuning.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace braze::runtime {

struct TensorSpec {
  DLDataType dtype{};
  int rank = 0;
};

struct DeferredCubin {
  std::string kernel;
  std::function<std::string()> compile;
};

struct ModuleSpec {
  std::string libraryPath;
  std::vector<TensorSpec> inputs, outputs;
  int numSymbols = 0;
  // CUDA modules: libraryPath holds the host code, cubinPaths the kernels (each in one).
  bool cuda = false;
  std::vector<std::string> cubinPaths;
  std::vector<std::string> kernels;
  int device = 0;
  std::string cublasLtLibrary; ///< non-empty when the module calls cuBLASLt
  /// The autotuner's cuBLASLt algorithms and cuDNN engines, set in the process when the module
  /// loads (CublasLt::prefer, Cudnn::prefer).
  std::vector<LibraryChoice> libraryChoices;
  std::string cudnnLibrary;    ///< non-empty when the module calls cuDNN
  bool logFallback = false;    ///< say on stderr when a library declines a call
  bool checksIndices = false;  ///< some kernel bounds-checks an index (and may report an error)
  /// Kernels (named in `kernels`, in none of cubinPaths) compiled at their first launch: each
  /// compile returns its cubin's path.
  std::vector<DeferredCubin> deferred;
};

class CudaModule;

/// A tensor whose memory the runtime allocated (64-byte aligned), handed out through DLPack.
class OwnedTensor {
public:
  /// Row-major unless `strides` (in elements, a dense layout) are given; in host memory, or
  /// in a CUDA device's memory for a kDLCUDA `device`.
  OwnedTensor(DLDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {},
              DLDevice device = DLDevice{kDLCPU, 0});
  ~OwnedTensor();
  OwnedTensor(const OwnedTensor &) = delete;
  OwnedTensor &operator=(const OwnedTensor &) = delete;
  void *data() const { return data_; }
  const std::vector<int64_t> &shape() const { return shape_; }
  const std::vector<int64_t> &strides() const { return strides_; }
  DLDataType dtype() const { return dtype_; }
  DLDevice device() const { return device_; }
  size_t bytes() const { return bytes_; }
  /// Transfers ownership to a DLManagedTensor (its deleter frees the memory).
  static DLManagedTensor *release(std::unique_ptr<OwnedTensor> t);

private:
  DLDataType dtype_;
  std::vector<int64_t> shape_, strides_;
  DLDevice device_;
  void *data_ = nullptr;
  size_t bytes_ = 0;
};

/// An error raised by a compiled kernel at run time (bad index, shape mismatch).
class RunError : public std::exception {
public:
  explicit RunError(std::string msg) : msg_(std::move(msg)) {}
  const char *what() const noexcept override { return msg_.c_str(); }

private:
  std::string msg_;
};

class Executable {
public:
  /// Loads the module; throws RunError if the library or an entry point is missing.
  static std::shared_ptr<Executable> load(const ModuleSpec &spec);
  ~Executable();

  const ModuleSpec &spec() const { return spec_; }
  /// Runs on CPU tensors (any strides the compiled graph accepts); returns new outputs.
  std::vector<std::unique_ptr<OwnedTensor>> run(const std::vector<const DLTensor *> &inputs);
  /// Runs on caller-owned buffers: inputs and outputs row-major with the given shapes.
  void runRaw(const std::vector<const void *> &inputs,
              const std::vector<std::vector<int64_t>> &inputShapes,
              const std::vector<void *> &outputs);
  /// Output shapes for the given input shapes (binds the size symbols).
  std::vector<std::vector<int64_t>> outputShapes(const std::vector<const DLTensor *> &inputs);

  /// The size symbols for inputs of these shapes and strides (in elements); throws RunError
  /// naming the input and dim that the compiled graph does not accept.
  std::vector<int64_t> bindShapes(const std::vector<std::vector<int64_t>> &shapes,
                                  const std::vector<std::vector<int64_t>> &strides);
  std::vector<int64_t> bind(const std::vector<const DLTensor *> &inputs);
  struct Layout {
    std::vector<int64_t> shape, strides;
  };
  std::vector<Layout> layoutsFor(const std::vector<int64_t> &syms);
  int64_t arenaBytes(const std::vector<int64_t> &syms);

  /// CPU modules: runs over caller-owned buffers whose sizes `syms` came from bindShapes,
  /// outputs laid out as layoutsFor(syms). Checks only the buffer counts: the lean call of a
  /// graph whose inputs the caller has already checked.
  void runBound(const std::vector<const void *> &inputs, const std::vector<void *> &outputs,
                const std::vector<int64_t> &syms);

  /// CUDA modules: enqueues the graph on `stream` over caller-owned device buffers (outputs
  /// laid out as layoutsFor(syms), an arena of arenaBytes(syms)); never synchronizes. A kernel's
  /// run-time error (an index out of bounds) is reported by the next call or by
  /// synchronizeAndCheck().
  void runCuda(const std::vector<const void *> &inputs, const std::vector<void *> &outputs,
               void *arena, const std::vector<int64_t> &syms, void *stream);
  void synchronizeAndCheck(void *stream = nullptr);
  /// CUDA modules: CudaModule::setAssertIndices.
  void setAssertIndices(bool on);
  /// The module library's symbol `name` (the autotuner's entry points in its own modules), or
  /// null where it has none.
  void *symbol(const char *name) const;
  /// CUDA modules: CudaModule::setLaunchObserver (the autotuner's hook); its arguments are
  /// kernel, blocks, threads, args, stream and after.
  void setLaunchObserver(std::function<void(int, int64_t, int, void **, void *, bool)> observer);

private:
  Executable() = default;
  /// The symbols of a call over caller-owned buffers, padded to at least one value (the
  /// module's functions read a non-null array); throws RunError unless the buffer counts are
  /// the module's.
  std::vector<int64_t> boundSymbols(size_t inputs, size_t outputs,
                                    const std::vector<int64_t> &syms) const;
  /// braze_bind over per-input shape and stride arrays (ranks already checked).
  std::vector<int64_t> bindPointers(const int64_t *const *shapes, const int64_t *const *strides);
  void launch(const std::vector<const void *> &inputs, const std::vector<void *> &outputs,
              const std::vector<int64_t> &syms);

  using BindFn = int (*)(const int64_t *const *, const int64_t *const *, int64_t *, char *, int64_t);
  using ShapesFn = void (*)(const int64_t *, int64_t *, int64_t *);
  using ArenaFn = int64_t (*)(const int64_t *);
  using RunFn = int (*)(void *const *, void *const *, char *, const int64_t *);

  ModuleSpec spec_;
  void *handle_ = nullptr;
  BindFn bind_ = nullptr;
  ShapesFn shapes_ = nullptr;
  ArenaFn arena_ = nullptr;
  RunFn run_ = nullptr;
  std::unique_ptr<CudaModule> cuda_;
};

} // namespace braze::runtime
