#include "braze/jit/Nvrtc.h"

#include "braze/jit/CacheFiles.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"
#include "braze/support/Log.h"

#include <algorithm>
#include <dlfcn.h>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
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

/// Compute capability 9.0 compiles for sm_90a, whose cubins run on 9.0 devices alone (as every
/// cubin braze builds is for one device) and which has Hopper's wgmma.
std::vector<std::string> nvrtcFlags(int cc) {
  return {"--gpu-architecture=sm_" + std::to_string(cc) + (cc == 90 ? "a" : ""), "--std=c++17",
          "-w"};
}

} // namespace

std::string nvrtcVersion(const std::string &library) { return nvrtc(library).version_; }

namespace {

/// One NVRTC program: `source` to a cubin in the cache (or found there).
CompiledCubin compileProgram(const std::string &source, const NvrtcOptions &opts) {
  const Nvrtc &n = nvrtc(opts.library);
  std::vector<std::string> flags = nvrtcFlags(opts.computeCapability);
  std::string flagText;
  for (const std::string &f : flags)
    flagText += f + " ";
  std::string key = sha256Hex(source + "\n//nvrtc " + n.version_ + "\n//" + flagText + "\n//" +
                              kBrazeVersion);
  fs::path dir = entryDir(opts.cacheDir, key);
  fs::path cubin = dir / (key + ".cubin"), sum = dir / (key + ".cubin.sha256");
  CompiledCubin result{{cubin.string()}, false};
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
  result.paths[0] = storeEntry(opts.cacheDir, cubin, sum, image).string();
  return result;
}

constexpr std::string_view kKernelStart = "extern \"C\" __global__";

/// The source as its prelude (what precedes the first kernel: helpers and templates) and its
/// kernels, each from its `extern "C" __global__` to the next. Generated kernels use only the
/// prelude, so any subset of them compiles after it.
std::pair<std::string, std::vector<std::string>> splitKernels(const std::string &source) {
  std::vector<size_t> starts;
  for (size_t at = source.find(kKernelStart); at != std::string::npos;
       at = source.find(kKernelStart, at + 1))
    if (at == 0 || source[at - 1] == '\n')
      starts.push_back(at);
  if (starts.empty())
    return {source, {}};
  std::vector<std::string> kernels;
  for (size_t i = 0; i < starts.size(); ++i)
    kernels.push_back(source.substr(starts[i], (i + 1 < starts.size() ? starts[i + 1]
                                                                      : source.size()) -
                                                   starts[i]));
  return {source.substr(0, starts[0]), std::move(kernels)};
}

/// How many programs a source of `kernels` kernels is compiled as: one per kernel, at most one
/// per hardware thread and at most 16. The prelude costs each program about 0.03 s of NVRTC,
/// a kernel 0.1-0.5 s (the flash attention kernel).
size_t programCount(size_t kernels) {
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min({kernels, threads, size_t(16)}));
}

} // namespace

CompiledCubin compileCuda(const std::string &source, const NvrtcOptions &opts) {
  BRAZE_CHECK(!opts.cacheDir.empty()) << "no cache directory";
  if (source.empty()) // a graph whose kernels are all deferred
    return CompiledCubin{{}, true};
  nvrtc(opts.library); // a library that does not load is an error before any thread starts
  // Named, not structured bindings: the worker lambdas capture them (clang 14 cannot capture
  // a structured binding).
  const std::pair<std::string, std::vector<std::string>> split = splitKernels(source);
  const std::string &prelude = split.first;
  const std::vector<std::string> &kernels = split.second;
  size_t count = programCount(kernels.size());
  if (count <= 1)
    return compileProgram(source, opts);
  // Kernels go to programs largest first, each to the program with the least source so far
  // (deterministic, so each program's cache key is stable); a program keeps source order.
  std::vector<size_t> order(kernels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return kernels[a].size() > kernels[b].size(); });
  std::vector<std::vector<size_t>> members(count);
  std::vector<size_t> sizes(count, 0);
  for (size_t k : order) {
    size_t j = std::min_element(sizes.begin(), sizes.end()) - sizes.begin();
    members[j].push_back(k);
    sizes[j] += kernels[k].size();
  }
  std::vector<CompiledCubin> parts(count);
  std::vector<std::exception_ptr> errors(count);
  std::vector<std::thread> workers;
  for (size_t j = 0; j < count; ++j)
    workers.emplace_back([&, j] {
      try {
        std::sort(members[j].begin(), members[j].end());
        std::string text = prelude;
        for (size_t k : members[j])
          text += kernels[k];
        parts[j] = compileProgram(text, opts);
      } catch (...) {
        errors[j] = std::current_exception();
      }
    });
  for (std::thread &t : workers)
    t.join();
  for (const std::exception_ptr &e : errors)
    if (e)
      std::rethrow_exception(e);
  CompiledCubin result{{}, true};
  for (const CompiledCubin &c : parts) {
    result.paths.push_back(c.paths[0]);
    result.cacheHit = result.cacheHit && c.cacheHit;
  }
  return result;
}

} // namespace braze::jit
