#pragma once
/// A compiled model that runs without Python, PyTorch or a compiler: what braze.export writes
/// and braze::runtime::Package loads. A package is a directory, or the same as one zip archive of
/// stored entries (PackageArchive.h):
///
///   package.txt          the manifest (below)
///   model.so             the host library braze compiled
///   lib/<name>           the vendor libraries it links (BLAS, oneDNN), unless left out
///   kernels/<n>.cubin    CUDA packages: the kernels, compiled for the exporting GPU
///   weights.safetensors  the parameters, buffers and constants (safetensors: an 8-byte
///                        little-endian header length, a JSON header, then the raw data; each
///                        tensor starts 64-byte aligned, a gap being a U8 __braze_pad_<n>)
///
/// package.txt is one record per line, words separated by single spaces:
///
///   braze-package <format>            first line; this runtime reads formats 1..kFormatVersion
///   braze <version>                   the braze that wrote it
///   device cpu | device cuda <cc>     where it runs; cc: the compute capability the kernels
///                                     were compiled for, as major * 10 + minor (format 2)
///   target <text>                     the exporting machine's target fingerprint (informative)
///   isa <feature>...                  CPU features the library may use (-march=native there)
///   cubin <file> <sha256>             CUDA: a file of kernels
///   kernel <name>                     CUDA: the module's kernels, in its launch numbering
///   cuda-library <cublaslt|cudnn> <path>  CUDA: a library the module calls, where it was at
///                                     export (at load: $BRAZE_CUBLASLT / $BRAZE_CUDNN, else
///                                     that path, else its file name on the loader's path)
///   checks-indices                    CUDA: some kernel bounds-checks an index
///   library <file> <sha256>           the host library
///   module-symbols <n>                the size symbols the library binds (its braze_bind)
///   vendor <file> <sha256>            a bundled vendor library, loaded before the host library
///   vendor-path <absolute path>       a vendor library left where it was
///   weights <file> <sha256> <offset>  the weights file and where its data starts
///   symbol <name> <min> <max>         a size symbol and the range it was exported for
///   input <name> <dtype> <rank> <dim>... user [strides <stride>...]
///   input <name> <dtype> <rank> <dim>... weight <begin> <end> [strides <stride>...]
///   output <name> <dtype> <rank> <dim>...
///   checksum <sha256>                 of every line before this one (newlines included)
///
/// A dim is an integer, a symbol's name, or (outputs only) an expression of symbols. Inputs are
/// the module's inputs in order: user inputs (passed to run) and weights (bytes [begin, end) of
/// the weights data). A weight with strides (format 2) is dense in another order than row-major
/// (a channels-last convolution weight): its bytes are in memory order, and its safetensors
/// entry has the dims in that order. A user input with strides (format 2) was exported in that
/// layout (channels-last) with static sizes, and a call must pass it so. dtypes: bool, u8, i8, i16, i32, i64, f16, bf16, f32, f64. Every file is
/// checked against its checksum at load, so a damaged package is an error, never a crash.
///
/// run is safe to call from several threads at once on one loaded package: each call binds its
/// own sizes and allocates its own scratch memory.
///
/// A CUDA package (format 2) keeps its weights in device memory from load on. Its runs take
/// and give device tensors and enqueue on the caller's stream without waiting (scratch memory
/// is stream-ordered), except where a kernel checks indices: such a run waits for its kernels
/// and raises a bad index as a RunError. It needs the CUDA driver, and cuBLASLt and cuDNN where
/// the model calls them; no CUDA runtime, NVRTC or compiler. Its runs replay CUDA graphs, one
/// per input layout, from a layout's second call on (PackageGraphs.h), unless `cudaGraphs` is
/// false at load or BRAZE_CUDA_GRAPHS=0. Runs of a package on several
/// streams are ordered one after another on the GPU (the libraries' workspaces are shared).
#include "braze/runtime/Executable.h"
#include "braze/runtime/PackageGraphs.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braze::runtime {

struct PackageDim {
  int64_t value = -1; ///< the size, when static
  std::string symbol; ///< else the symbol (or, for outputs, the expression)
};

struct PackageTensor {
  std::string name;
  std::string dtype; ///< bool, u8, ..., f64
  std::vector<PackageDim> shape;
  bool weight = false;        ///< inputs: read from the weights file
  int64_t begin = 0, end = 0; ///< weights: the bytes of the weights data
  std::vector<int64_t> strides; ///< in elements, when not row-major (user inputs: as exported)
};

struct PackageSymbol {
  std::string name;
  int64_t min = 0, max = 0;
};

struct PackageSignature {
  std::vector<PackageTensor> inputs; ///< user inputs only, in the order run takes them
  std::vector<PackageTensor> outputs;
  std::vector<PackageSymbol> symbols;
};

class Package {
public:
  /// 1: CPU packages; 2: CUDA packages too (CPU packages are still written as format 1).
  static constexpr int kFormatVersion = 2;

  /// Loads the package in directory `path`, or in the package archive (a file) `path`; a CUDA
  /// package onto CUDA device `device`. Throws RunError naming what is wrong (a missing or
  /// damaged file, a newer format, a CPU without a feature the library needs, a damaged
  /// archive, no CUDA device or one of another architecture, a missing CUDA library).
  /// `cudaGraphs`: whether a CUDA package may replay CUDA graphs (BRAZE_CUDA_GRAPHS=0 turns
  /// them off too).
  static std::shared_ptr<Package> load(const std::string &path, int device = 0,
                                       bool cudaGraphs = true);
  ~Package();

  const PackageSignature &signature() const { return signature_; }
  /// The format version the package was written in.
  int formatVersion() const { return format_; }
  /// Where it runs: the CPU, or the CUDA device it was loaded onto.
  DLDevice device() const { return device_; }

  /// Runs on tensors on the package's device, one per user input (row-major or any strides
  /// the graph accepts); returns new outputs there. CUDA packages enqueue on `stream` (null:
  /// the default stream). Throws RunError naming an input of the wrong device, dtype, rank or
  /// size.
  std::vector<std::unique_ptr<OwnedTensor>> run(const std::vector<const DLTensor *> &inputs,
                                                void *stream = nullptr) const;
  /// Runs into caller-owned outputs, which must have the shapes and strides outputShapes gives.
  void run(const std::vector<const DLTensor *> &inputs, const std::vector<DLTensor *> &outputs,
           void *stream = nullptr) const;
  /// Runs on row-major buffers (device pointers for a CUDA package): user inputs with the given
  /// shapes, outputs row-major.
  void runRaw(const std::vector<const void *> &inputs,
              const std::vector<std::vector<int64_t>> &inputShapes,
              const std::vector<void *> &outputs, void *stream = nullptr) const;
  /// The outputs' shapes for user inputs of these shapes.
  std::vector<std::vector<int64_t>>
  outputShapes(const std::vector<std::vector<int64_t>> &inputShapes) const;
  /// The outputs' layouts (shapes and strides in elements) for these inputs, as run writes them.
  std::vector<Executable::Layout> outputLayouts(const std::vector<const DLTensor *> &inputs) const;
  /// CUDA packages: the CUDA graphs made, replayed and not, and why none are made if so.
  PackageGraphs::Stats cudaGraphStats() const;

private:
  Package() = default;
  /// Checks the user inputs against the signature and returns the module's inputs (user
  /// inputs and weights, in the module's order); the weights' tensors and shapes are kept in
  /// `weights` and `shapes`.
  std::vector<const DLTensor *> moduleInputs(const std::vector<const DLTensor *> &inputs,
                                             std::vector<DLTensor> &weights,
                                             std::vector<std::vector<int64_t>> &shapes) const;

  /// Checks caller-owned `outputs` against `layouts` and runs the module into them.
  void runInto(const std::vector<const DLTensor *> &all, const std::vector<int64_t> &syms,
               const std::vector<Executable::Layout> &layouts,
               const std::vector<DLTensor *> &outputs, void *stream) const;

  std::string path_;
  int format_ = 0;
  PackageSignature signature_;
  std::vector<PackageTensor> moduleInputs_; ///< every module input, in order
  std::vector<void *> vendors_;             ///< dlopen handles, closed after the module
  std::shared_ptr<Executable> exe_;
  void *weights_ = nullptr; ///< the weights data (64-byte aligned; device memory for CUDA)
  size_t weightBytes_ = 0;
  DLDevice device_{kDLCPU, 0};
  bool checksIndices_ = false; ///< CUDA: runs wait for their kernels and check the error flag
  std::unique_ptr<PackageGraphs> graphs_; ///< CUDA: every run goes through it
};

/// Where braze's runtime lives in this process and its size: the file holding this code (the
/// program when braze::runtime is linked statically, else the shared object), and its bytes.
struct RuntimeFile {
  std::string path;
  int64_t bytes = 0;
};
RuntimeFile runtimeFile();

/// The CPU features of this machine among those a package records (isa), by their GCC names.
std::vector<std::string> cpuFeatures();

/// DLPack's type for a package dtype name; throws RunError for an unknown name.
DLDataType packageDType(const std::string &name);

} // namespace braze::runtime
