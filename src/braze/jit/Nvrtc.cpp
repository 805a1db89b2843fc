#include "braze/jit/Nvrtc.h"

#include "braze/jit/CacheFiles.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"
#include "braze/support/Log.h"

#include <dlfcn.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

namespace braze::jit {

namespace fs = std::filesystem;

namespace {

/// NVRTC's C API (nvrtcResult is an int, 0 = NVRTC_SUCCESS; nvrtcProgram an opaque pointer).
struct Nvrtc {
  int (*version)(int *, int *);
  int (*create)(void **, const char *, const char *, int, const char *const *, const char *const *);
  int (*compile)(void *, int, const char *const *);
  int (*logSize)(void *, size_t *);
  int (*log)(void *, char *);
  int (*cubinSize)(void *, size_t *);
  int (*cubin)(void *, char *);
  int (*destroy)(void **);
  std::string version_;
};

const Nvrtc &nvrtc(const std::string &library) {
  static std::mutex mu;
  static std::map<std::string, Nvrtc> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(library);
  if (it != loaded.end())
    return it->second;
  void *h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    BRAZE_USER_ERROR("compile", "") << "cannot load NVRTC from " << library << ": "
                                    << (why ? why : "unknown error")
                                    << "; set BRAZE_NVRTC to the path of libnvrtc.so";
  }
  Nvrtc n;
  auto get = [&](auto &fn, const char *name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn) {
      dlclose(h);
      BRAZE_USER_ERROR("compile", "") << "cannot load NVRTC from " << library << ": it lacks "
                                      << name << "; set BRAZE_NVRTC to the path of libnvrtc.so";
    }
  };
  get(n.version, "nvrtcVersion");
  get(n.create, "nvrtcCreateProgram");
  get(n.compile, "nvrtcCompileProgram");
  get(n.logSize, "nvrtcGetProgramLogSize");
  get(n.log, "nvrtcGetProgramLog");
  get(n.cubinSize, "nvrtcGetCUBINSize");
  get(n.cubin, "nvrtcGetCUBIN");
  get(n.destroy, "nvrtcDestroyProgram");
  int major = 0, minor = 0;
  n.version(&major, &minor);
  n.version_ = std::to_string(major) + "." + std::to_string(minor);
  return loaded.emplace(library, n).first->second;
}

std::vector<std::string> nvrtcFlags(int cc) {
  return {"--gpu-architecture=sm_" + std::to_string(cc), "--std=c++17", "-w"};
}

} // namespace

std::string nvrtcVersion(const std::string &library) { return nvrtc(library).version_; }

CompiledCubin compileCuda(const std::string &source, const NvrtcOptions &opts) {
  BRAZE_CHECK(!opts.cacheDir.empty()) << "no cache directory";
  const Nvrtc &n = nvrtc(opts.library);
  std::vector<std::string> flags = nvrtcFlags(opts.computeCapability);
  std::string flagText;
  for (const std::string &f : flags)
    flagText += f + " ";
  std::string key = sha256Hex(source + "\n//nvrtc " + n.version_ + "\n//" + flagText + "\n//" +
                              kBrazeVersion);
  fs::path dir = entryDir(opts.cacheDir, key);
  fs::path cubin = dir / (key + ".cubin"), sum = dir / (key + ".cubin.sha256");
  CompiledCubin result{cubin.string(), false};
  EntryLock building(dir, key);
  if (cacheEntryIsValid(cubin, sum)) {
    result.cacheHit = true;
    if (opts.logCache)
      logBlock("cache", "hit " + key + " (cubin)\n");
    return result;
  }
  if (opts.logCache)
    logBlock("cache", "miss " + key + " (cubin)\n");
  void *prog = nullptr;
  BRAZE_CHECK(n.create(&prog, source.c_str(), "braze.cu", 0, nullptr, nullptr) == 0)
      << "nvrtcCreateProgram failed";
  std::vector<const char *> argv;
  for (const std::string &f : flags)
    argv.push_back(f.c_str());
  int rc = n.compile(prog, static_cast<int>(argv.size()), argv.data());
  size_t logSize = 0;
  n.logSize(prog, &logSize);
  std::string log(logSize, '\0');
  if (logSize)
    n.log(prog, log.data());
  if (rc != 0) {
    n.destroy(&prog);
    fs::path src = dir / (key + ".failed.cu");
    std::string kept = writeFileAtomically(src, source).empty() ? src.string() : "not kept";
    BRAZE_UNREACHABLE("generated CUDA code failed to compile (" << kept << "):\n"
                                                                << log.substr(0, 4000));
  }
  size_t size = 0;
  n.cubinSize(prog, &size);
  std::string image(size, '\0');
  n.cubin(prog, image.data());
  n.destroy(&prog);
  result.path = storeEntry(opts.cacheDir, cubin, sum, image).string();
  return result;
}

} // namespace braze::jit
