/// CompileOptions from the environment, and the target they describe.
#include "braze/driver/Compile.h"

#include "braze/support/CommaList.h"
#include "braze/support/Diagnostic.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace braze {

Target targetFor(const CompileOptions &opts) {
  if (!opts.cuda)
    return Target::hostCpu();
  return Target::cudaDevice(opts.cuda->computeCapability, opts.cuda->multiprocessors,
                            opts.cuda->registerBytesPerSm, opts.cuda->kernelArgBytes);
}

CompileOptions CompileOptions::fromEnvironment() {
  CompileOptions o;
  if (const char *v = std::getenv("BRAZE_LOG"))
    o.log = LogSet::parse(v);
  if (const char *v = std::getenv("BRAZE_STRICT"))
    o.strict = std::string(v) == "1";
  if (const char *v = std::getenv("BRAZE_CACHE_DIR"))
    o.cacheDir = v;
  if (const char *v = std::getenv("BRAZE_REMOTE_CACHE"); v && *v) {
    std::string url = v;
    if (url.rfind("file://", 0) == 0 && url.size() > 7) {
      o.remoteCacheDir = url.substr(7);
    } else if (url.rfind("redis://", 0) == 0 && url.size() > 8) {
      o.remoteRedis = url.substr(8);
      if (!o.remoteRedis.empty() && o.remoteRedis.back() == '/')
        o.remoteRedis.pop_back();
    } else {
      static std::once_flag said;
      std::call_once(said, [&] {
        std::fprintf(stderr, "braze: BRAZE_REMOTE_CACHE='%s' is not used: expected "
                             "file:///path (a folder on a shared file system) or "
                             "redis://host:port\n", v);
      });
    }
  }
  if (const char *v = std::getenv("BRAZE_PAIRED_EPILOGUE"))
    o.pairedEpilogues = std::string(v) == "1";
  if (const char *v = std::getenv("BRAZE_AUTOTUNE"); v && *v) {
    char *end = nullptr;
    double seconds = std::strtod(v, &end);
    if (std::string(v) == "1")
      seconds = kDefaultAutotuneSeconds;
    if (*end != '\0' || !(seconds >= 0) || !std::isfinite(seconds))
      BRAZE_USER_ERROR("BRAZE_AUTOTUNE", "")
          << "is '" << v << "'; expected 1 (tune, " << kDefaultAutotuneSeconds
          << " s a graph), 0 (off) or the seconds a graph may spend tuning";
    o.autotuneSeconds = seconds;
  }
  if (const char *v = std::getenv("BRAZE_DISABLE_PASSES"); v && *v) {
    o.disabledPasses = splitCommas(v);
    checkDisabledPasses(o.disabledPasses, "BRAZE_DISABLE_PASSES");
  }
  if (const char *v = std::getenv("BRAZE_CXX"))
    o.cxx = v;
  if (const char *v = std::getenv("BRAZE_BLAS"))
    o.blasLibrary = v;
  if (const char *v = std::getenv("BRAZE_DNNL"))
    o.dnnlLibrary = v;
  if (o.cacheDir.empty()) {
    const char *xdg = std::getenv("XDG_CACHE_HOME");
    const char *home = std::getenv("HOME");
    o.cacheDir = xdg ? std::string(xdg) + "/braze" : std::string(home ? home : "/tmp") + "/.cache/braze";
  }
  return o;
}

} // namespace braze
