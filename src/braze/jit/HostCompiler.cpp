#include "braze/jit/HostCompiler.h"

#include "braze/jit/CacheFiles.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"
#include "braze/support/Log.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <sys/wait.h>
#include <unistd.h>

namespace braze::jit {

namespace fs = std::filesystem;

namespace {
/// "exit status N" or "killed by signal N (name)", from a wait status of std::system/pclose.
std::string describeStatus(int status) {
  if (status == -1)
    return std::string("could not be started: ") + std::strerror(errno);
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

/// First line of `<compiler> --version`, computed once per compiler; a Diagnostic naming the
/// compiler when it cannot be run.
std::string compilerIdentity(const std::string &compiler) {
  static std::mutex mu;
  static std::string cachedFor, cached;
  std::lock_guard<std::mutex> lock(mu);
  if (cachedFor == compiler)
    return cached;
  std::string cmd = compiler + " --version 2>/dev/null";
  FILE *f = popen(cmd.c_str(), "r");
  std::string line;
  int status = -1;
  if (f) {
    char buf[256];
    if (fgets(buf, sizeof buf, f))
      line = buf;
    while (fgets(buf, sizeof buf, f)) {
    }
    status = pclose(f);
  }
  if (line.empty() || status != 0)
    BRAZE_USER_ERROR("compile", "")
        << "host compiler '" << compiler << "' not found or not working: '" << compiler
        << " --version' " << (status == 0 ? "printed nothing" : describeStatus(status))
        << "; set BRAZE_CXX to a C++ compiler";
  cachedFor = compiler;
  cached = line;
  return cached;
}

/// PRECOMPILED HEADER (GCC): the standard headers that every generated CPU module includes
/// (codegen's kCpuHeader and the CPU emitter's) are parsed once into <key>.h.gch in the cache,
/// per compiler, flags and braze version, and named with -include ahead of each source that
/// includes all of them; the source's own includes of them are then no-ops. It changes no
/// code: the library is the same, and its cache key does not mention the header. Parsing
/// them took 0.42 s of a small graph's 0.90 s compile on a 2-core x86 machine (g++ 12, -O3);
/// with the header, 0.39 s, and the same machine code (objdump). Building it takes 1.3 s and
/// 24 MB, once per cache: into a cache without one, it is built at a process's third cache
/// miss (kPrecompileAfterMisses), so that a process compiling a graph or two into a fresh
/// cache does not pay for it. A header that fails a compile which its text passes (damaged, or
/// a compiler that reads .gch files otherwise) is not used again by the process.
constexpr const char *kPrecompiled[] = {"algorithm", "cmath",  "cstdint", "cstdio",
                                        "cstring",   "limits", "omp.h",   "vector"};

constexpr int kPrecompileAfterMisses = 2;

bool includesAllPrecompiled(const std::string &source) {
  for (const char *h : kPrecompiled)
    if (source.find(std::string("#include <") + h + ">\n") == std::string::npos)
      return false;
  return true;
}

bool isGcc(const std::string &identity) {
  auto has = [&](const char *s) { return identity.find(s) != std::string::npos; };
  if (has("clang") || has("Clang"))
    return false;
  return has("g++") || has("gcc") || has("GCC") || identity.rfind("c++ (", 0) == 0;
}

struct PrecompiledHeaders {
  std::mutex mu;
  /// cache dir and key -> the header's path, "" where none can be had
  std::unordered_map<std::string, std::string> header;
  int misses = 0;
  bool off = false; ///< a header failed a compile: none is used by this process
};

PrecompiledHeaders &precompiledHeaders() {
  static PrecompiledHeaders p;
  return p;
}

/// The header to name with -include when compiling `source` (a cache miss) with its
/// precompiled form beside it, built into the cache if need be; "" where none serves.
std::string precompiledHeader(const std::string &source, const HostCompilerOptions &opts,
                              const std::string &identity) {
  if (!isGcc(identity) || !includesAllPrecompiled(source))
    return "";
  PrecompiledHeaders &p = precompiledHeaders();
  std::lock_guard<std::mutex> lock(p.mu);
  ++p.misses;
  if (p.off)
    return "";
  std::string text;
  for (const char *h : kPrecompiled)
    text += std::string("#include <") + h + ">\n";
  std::string flags = hostCompilerFlags(opts.optimization);
  std::string key =
      "pch-" + sha256Hex(text + "//" + identity + "\n//" + flags + "\n//" + kBrazeVersion);
  std::string where = opts.cacheDir + "\n" + key;
  if (auto it = p.header.find(where); it != p.header.end())
    return it->second;
  fs::path dir = entryDir(opts.cacheDir, key);
  fs::path gch = dir / (key + ".h.gch");
  EntryLock building(dir, key);
  if (!cacheEntryIsValid(gch, checksumPath(gch))) {
    if (p.misses <= kPrecompileAfterMisses)
      return "";
    std::string tag = temporaryTag();
    fs::path scratch = scratchDir();
    fs::path header = scratch / (key + tag + ".h"), built = scratch / (key + tag + ".h.gch"),
             log = scratch / (key + tag + ".log");
    std::string cmd = opts.compiler + " " + flags + " -x c++-header " + header.string() +
                      " -o " + built.string() + " > " + log.string() + " 2>&1";
    int status = writeFile(header, text).empty() ? std::system(cmd.c_str()) : -1;
    std::string image = status == 0 ? readFile(built) : "";
    std::error_code ec;
    for (const fs::path &f : {header, built, log})
      fs::remove(f, ec);
    if (image.empty()) {
      if (opts.logCache)
        logBlock("cache", "no precompiled header: the compiler failed to build it (" +
                              describeStatus(status) + ")\n");
      return p.header[where] = "";
    }
    gch = storeEntry(opts.cacheDir, gch, checksumPath(gch), image);
    if (opts.logCache)
      logBlock("cache", "built precompiled header " + gch.string() + "\n");
  }
  fs::path header = gch.parent_path() / (key + ".h");
  if (readFile(header) != text && !writeFileAtomically(header, text).empty())
    return p.header[where] = "";
  return p.header[where] = header.string();
}

/// After a compile with precompiled header `header` failed and one without it succeeded.
void dropPrecompiledHeaders(const std::string &header, const HostCompilerOptions &opts) {
  PrecompiledHeaders &p = precompiledHeaders();
  std::lock_guard<std::mutex> lock(p.mu);
  p.off = true;
  if (opts.logCache)
    logBlock("cache", "precompiled header " + header +
                          " failed a compile that its text passes; this process uses none\n");
}

} // namespace

/// Libraries come after the source so that --as-needed linkers keep them.
static const char *kLinkFlags = "-lmvec";

/// On x86-64 the loops take 512-bit vectors where the machine has them: g++ 12's -march=native
/// on an AVX-512 Xeon otherwise prefers 256-bit ones. On a 2-core AVX-512 Xeon (KVM), the
/// softmax of 2048x4096 f32 took 2.65 ms with them against 3.31 ms without (the generated
/// kernel alone, 2 threads); benchmarks/cpu_suite.py gives the whole effect. Elsewhere the
/// flag means nothing, and on other machines it is not one the compiler takes.
#if defined(__x86_64__)
static const char *kVectorFlags = " -mprefer-vector-width=512";
#else
static const char *kVectorFlags = "";
#endif

std::string hostCompilerFlags(const std::string &optimization) {
  return optimization + " -march=native" + kVectorFlags +
         " -fopenmp -shared -fPIC -std=c++17 -fno-math-errno -fno-trapping-math -w";
}

/// Steps: 1. the key, from the source and everything that shapes the library; 2. under the
/// entry's lock, a valid entry is a hit; 3. otherwise the compiler builds the library in the
/// scratch folder, and 4. storeEntry puts it into the cache (or, when the cache cannot take
/// it, keeps it in the scratch folder).
CompiledLibrary compileCpp(const std::string &source, const HostCompilerOptions &opts) {
  BRAZE_CHECK(!opts.cacheDir.empty()) << "no cache directory";
  std::string identity = compilerIdentity(opts.compiler);
  std::string key = sha256Hex(source + "\n//" + identity + "\n//" + hostCompilerFlags(opts.optimization) + " " +
                              kLinkFlags + " " + opts.linkFlags + "\n//" +
                              kBrazeVersion);
  fs::path dir = entryDir(opts.cacheDir, key);
  fs::path lib = dir / (key + ".so"), sum = dir / (key + ".sha256");
  CompiledLibrary result{lib.string(), key, false};
  EntryLock building(dir, key);
  if (cacheEntryIsValid(lib, sum)) {
    result.cacheHit = true;
    if (opts.logCache)
      logBlock("cache", "hit " + key + "\n");
    return result;
  }
  if (opts.logCache)
    logBlock("cache", "miss " + key + "\n");
  // The compiler never writes into the cache: a full or read-only cache cannot fail it.
  std::string tag = temporaryTag();
  fs::path scratch = scratchDir();
  fs::path src = scratch / (key + tag + ".cpp"), tmpLib = scratch / (key + tag + ".so"),
           log = scratch / (key + tag + ".log");
  if (std::string why = writeFile(src, source); !why.empty())
    BRAZE_USER_ERROR("compile", "") << "cannot write the generated source: " << why;
  auto command = [&](const std::string &header) {
    return opts.compiler + " " + hostCompilerFlags(opts.optimization) +
           (header.empty() ? "" : " -include " + header) + " " + src.string() + " -o " +
           tmpLib.string() + " " + kLinkFlags + " " + opts.linkFlags + " > " + log.string() +
           " 2>&1";
  };
  std::string header = precompiledHeader(source, opts, identity);
  int status = std::system(command(header).c_str());
  if (status != 0 && !header.empty()) {
    status = std::system(command("").c_str());
    if (status == 0)
      dropPrecompiledHeaders(header, opts);
  }
  std::string errors = readFile(log);
  std::error_code ec;
  fs::remove(log, ec);
  std::string image = status == 0 ? readFile(tmpLib) : "";
  fs::remove(tmpLib, ec);
  if (status != 0 || image.empty())
    BRAZE_USER_ERROR("compile", "")
        << "the host compiler '" << opts.compiler << "' failed to compile the generated code ("
        << (status != 0 ? describeStatus(status) : "it wrote no library") << "; the source is "
        << src.string() << "):\n"
        << errors.substr(0, 4000);
  fs::remove(src, ec);
  result.path = storeEntry(opts.cacheDir, lib, sum, image).string();
  return result;
}

} // namespace braze::jit
