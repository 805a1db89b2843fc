#pragma once
/// Compiles generated CUDA C++ to a cubin with NVRTC (loaded at run time from the library the
/// caller names, e.g. the one PyTorch's CUDA wheels install), through the same kind of
/// content-addressed on-disk cache as the host compiler: key = SHA-256 of (source, architecture,
/// NVRTC version, options, braze version); entries written atomically and verified on load, and a
/// cache that cannot take them is left for a temporary folder (CacheFiles.h).
#include <string>

namespace braze::jit {

struct NvrtcOptions {
  std::string library;  ///< path of libnvrtc.so.*; required
  int computeCapability = 90;
  std::string cacheDir; ///< required
  bool logCache = false;
};

struct CompiledCubin {
  std::string path;
  bool cacheHit = false;
};

CompiledCubin compileCuda(const std::string &source, const NvrtcOptions &opts);

/// NVRTC's version as "major.minor"; throws a Diagnostic naming the library and why when it
/// cannot be loaded (missing, not a shared library, or lacking an entry point).
std::string nvrtcVersion(const std::string &library);

} // namespace braze::jit
