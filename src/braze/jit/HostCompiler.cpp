#include "braze/jit/HostCompiler.h"

#include "braze/jit/CacheFiles.h"

#include "braze/support/Check.h"
#include "braze/support/Hashing.h"
#include "braze/support/Log.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unistd.h>

namespace braze::jit {

namespace fs = std::filesystem;

namespace {
/// First line of `<compiler> --version`, computed once per compiler.
std::string compilerIdentity(const std::string &compiler) {
  static std::mutex mu;
  static std::string cachedFor, cached;
  std::lock_guard<std::mutex> lock(mu);
  if (cachedFor == compiler)
    return cached;
  std::string cmd = compiler + " --version 2>/dev/null";
  FILE *f = popen(cmd.c_str(), "r");
  std::string line;
  if (f) {
    char buf[256];
    if (fgets(buf, sizeof buf, f))
      line = buf;
    pclose(f);
  }
  BRAZE_CHECK(!line.empty()) << "host compiler '" << compiler << "' not found";
  cachedFor = compiler;
  cached = line;
  return cached;
}

} // namespace

/// Libraries come after the source so that --as-needed linkers keep them.
static const char *kLinkFlags = "-lmvec";

std::string hostCompilerFlags() {
  return "-O3 -march=native -fopenmp -shared -fPIC -std=c++17 -fno-math-errno -fno-trapping-math -w";
}

CompiledLibrary compileCpp(const std::string &source, const HostCompilerOptions &opts) {
  BRAZE_CHECK(!opts.cacheDir.empty()) << "no cache directory";
  std::string identity = compilerIdentity(opts.compiler);
  std::string key = sha256Hex(source + "\n//" + identity + "\n//" + hostCompilerFlags() + " " +
                              kLinkFlags + " " + opts.linkFlags + "\n//" +
                              kBrazeVersion);
  fs::path dir = entryDir(opts.cacheDir, key);
  fs::path lib = dir / (key + ".so"), sum = dir / (key + ".sha256");
  CompiledLibrary result{lib.string(), key, false};
  std::unique_lock<std::mutex> building = lockEntry(key);
  if (cacheEntryIsValid(lib, sum)) {
    result.cacheHit = true;
    if (opts.logCache)
      logBlock("cache", "hit " + key + "\n");
    return result;
  }
  if (opts.logCache)
    logBlock("cache", "miss " + key + "\n");
  // Compile into temporary names, then rename into place.
  std::string tag = temporaryTag();
  fs::path src = dir / (key + tag + ".cpp"), tmpLib = dir / (key + tag + ".so"),
           log = dir / (key + tag + ".log");
  {
    std::ofstream out(src);
    out << source;
  }
  std::string cmd = opts.compiler + " " + hostCompilerFlags() + " " + src.string() + " -o " +
                    tmpLib.string() + " " + kLinkFlags + " " + opts.linkFlags + " > " + log.string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::string errors = readFile(log);
  std::error_code ec;
  fs::remove(log, ec);
  if (rc != 0) {
    fs::remove(tmpLib, ec);
    BRAZE_UNREACHABLE("generated code failed to compile (" << src.string() << "):\n"
                                                           << errors.substr(0, 4000));
  }
  fs::remove(src, ec);
  writeFileAtomically(sum, sha256Hex(readFile(tmpLib)));
  fs::rename(tmpLib, lib);
  return result;
}

} // namespace braze::jit
