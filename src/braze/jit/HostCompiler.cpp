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

} // namespace

/// Libraries come after the source so that --as-needed linkers keep them.
static const char *kLinkFlags = "-lmvec";

std::string hostCompilerFlags(const std::string &optimization) {
  return optimization +
         " -march=native -fopenmp -shared -fPIC -std=c++17 -fno-math-errno -fno-trapping-math -w";
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
  std::string cmd = opts.compiler + " " + hostCompilerFlags(opts.optimization) + " " + src.string() + " -o " +
                    tmpLib.string() + " " + kLinkFlags + " " + opts.linkFlags + " > " + log.string() + " 2>&1";
  int status = std::system(cmd.c_str());
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
