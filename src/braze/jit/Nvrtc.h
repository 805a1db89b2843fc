#pragma once
/// Compiles generated CUDA C++ to a cubin with NVRTC (loaded at run time from the library the
/// caller names, e.g. the one PyTorch's CUDA wheels install), through the same kind of
/// content-addressed on-disk cache as the host compiler: key = SHA-256 of (source, architecture,
/// NVRTC version, options, braze version); entries written atomically and verified on load, and a
/// cache that cannot take them is left for a temporary folder (CacheFiles.h).
#include <string>
#include <vector>

namespace braze::jit {

struct NvrtcOptions {
  std::string library;  ///< path of libnvrtc.so.*; required
  int computeCapability = 90;
  std::string cacheDir; ///< required
  bool logCache = false;
};

/// The cubins of one source; each kernel is in exactly one of them.
struct CompiledCubin {
  std::vector<std::string> paths;
  bool cacheHit = false; ///< every cubin came from the cache
};

/// Compiles `source` (braze's generated CUDA: a prelude, then `extern "C" __global__` kernels)
/// as several NVRTC programs in parallel, one thread each: the prelude and a share of the
/// kernels, balanced by size (one program per kernel, at most one per hardware thread and
/// 16). One NVRTC program is compiled by one thread, so a 147-kernel BERT source took 23.0 s
/// whole and 2.6 s as 16 programs on a 16-core host. Each program is cached on its own. An
/// empty source has no cubins.
CompiledCubin compileCuda(const std::string &source, const NvrtcOptions &opts);

/// NVRTC's version as "major.minor"; throws a Diagnostic naming the library and why when it
/// cannot be loaded (missing, not a shared library, or lacking an entry point).
std::string nvrtcVersion(const std::string &library);

} // namespace braze::jit
