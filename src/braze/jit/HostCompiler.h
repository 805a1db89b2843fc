#pragma once
/// Compiles generated C++ into a shared library with the host compiler, through a
/// content-addressed on-disk cache: key = SHA-256 of (source, compiler identity, flags, braze
/// version). Entries are written to a temporary name and renamed into place (atomic), carry a
/// checksum file, and are verified on load; a damaged entry is rebuilt. Processes that compile
/// the same source at once build it once (EntryLock). A cache that cannot be written is left for
/// a temporary folder, said once; a compiler that is missing or fails is a Diagnostic naming it.
#include <string>

namespace braze::jit {

struct HostCompilerOptions {
  std::string compiler = "g++";
  std::string cacheDir;  ///< required
  bool logCache = false; ///< print hits and misses to stderr
  std::string linkFlags; ///< extra libraries, e.g. a BLAS (part of the cache key)
  /// Optimization flags (part of the cache key): kernels get -O3; the host side of a CUDA
  /// module, launch glue that runs once per kernel per call, compiles faster at -O1.
  std::string optimization = "-O3";
};

struct CompiledLibrary {
  std::string path;
  std::string key;
  bool cacheHit = false;
};

/// Never passes -ffast-math: a library loaded into Python must not switch the whole process to
/// flush-to-zero (gcc < 13 links crtfastmath.o for it).
std::string hostCompilerFlags(const std::string &optimization = "-O3");

CompiledLibrary compileCpp(const std::string &source, const HostCompilerOptions &opts);

} // namespace braze::jit
