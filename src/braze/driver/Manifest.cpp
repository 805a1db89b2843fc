#include "braze/driver/Manifest.h"

#include "braze/ir/graph/GraphText.h"
#include "braze/jit/CacheFiles.h"
#include "braze/jit/RedisClient.h"
#include "braze/support/Hashing.h"
#include "braze/support/Log.h"
#include "braze/target/Target.h"

#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sys/stat.h>

namespace braze {

namespace fs = std::filesystem;

namespace {

/// This braze build, by content: the SHA-256 of the module that holds this code (read once per
/// process). Two installs of one build (another directory, another machine, a reinstall with a
/// new modification time) share cache entries; any rebuild that changes the code does not.
/// Where the module cannot be read, its path, size and modification time stand in.
const std::string &buildIdentity() {
  static const std::string id = [] {
    Dl_info info{};
    struct stat st{};
    if (!dladdr(reinterpret_cast<void *>(&manifestKey), &info) || !info.dli_fname ||
        stat(info.dli_fname, &st) != 0)
      return std::string("unknown build ") + __DATE__ " " __TIME__;
    std::ifstream in(info.dli_fname, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad() || bytes.size() != static_cast<size_t>(st.st_size))
      return std::string(info.dli_fname) + ";" + std::to_string(st.st_size) + ";" +
             std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
    return "sha256 " + sha256Hex(bytes);
  }();
  return id;
}

/// The options that reach lowering and code generation (not logging, strictness or the
/// device's index), as text.
std::string optionsText(const CompileOptions &o) {
  std::string s = "fuse=" + std::to_string(o.fuse) + (o.pairedEpilogues ? ";paired" : "") +
                  ";cxx=" + o.cxx + ";blas=" + o.blasLibrary +
                  ";dnnl=" + o.dnnlLibrary + ";half=";
  for (DType t : o.oneDnnHalf)
    s += std::string(dtypeName(t)) + ",";
  if (o.cuda) {
    const CompileOptions::Cuda &c = *o.cuda;
    s += ";cuda cc=" + std::to_string(c.computeCapability) +
         ";sms=" + std::to_string(c.multiprocessors) +
         ";regs=" + std::to_string(c.registerBytesPerSm) + ";nvrtc=" + c.nvrtcLibrary +
         ";cublaslt=" + c.cublasLtLibrary + ";cudnn=" + c.cudnnLibrary +
         ";tf32=" + std::to_string(c.matmulTf32) + std::to_string(c.convTf32) +
         ";cudnn_attention=" + std::to_string(c.cudnnAttention);
    if (!c.launchRecords.empty()) // records by hand make other code
      s += ";launch=" + sha256Hex(c.launchRecords);
  }
  if (o.autotuneSeconds > 0) // the tuned module (the budget is not part of the key)
    s += ";autotune";
  if (!o.cpuLaunchRecords.empty())
    s += ";cpu_launch=" + sha256Hex(o.cpuLaunchRecords);
  for (const std::string &p : o.disabledPasses) // other passes, other code
    s += ";no_pass=" + p;
  Target t = targetFor(o);
  return s + ";target=" + t.fingerprint() + ";cores=" + std::to_string(t.cores);
}

void put(std::string &out, const std::string &name, const std::string &value) {
  out += name + " " + std::to_string(value.size()) + "\n" + value + "\n";
}

constexpr const char *kHeader = "braze-manifest 1\n";

/// The line that holds a library choice of `kind` (LibraryChoice), and back.
const char *choiceLine(runtime::LibraryKind kind) {
  switch (kind) {
  case runtime::LibraryKind::Gemm: return "gemm_algorithm";
  case runtime::LibraryKind::Convolution: return "conv_engine";
  case runtime::LibraryKind::Attention: return "attention_engine";
  }
  return "";
}
std::optional<runtime::LibraryKind> choiceKind(const std::string &line) {
  for (auto kind : {runtime::LibraryKind::Gemm, runtime::LibraryKind::Convolution,
                    runtime::LibraryKind::Attention})
    if (line == choiceLine(kind))
      return kind;
  return std::nullopt;
}

fs::path manifestPath(const std::string &cacheDir, const std::string &key) {
  return jit::entryDir(cacheDir, key) / (key + ".manifest");
}

} // namespace

std::string manifestKey(const Graph &g, const CompileOptions &opts) {
  return sha256Hex("manifest\n" + printGraph(g) + "\n" + optionsText(opts) + "\n" +
                   buildIdentity() + "\n" + jit::kBrazeVersion);
}

std::string manifestText(const ManifestEntry &e) {
  std::string out = kHeader;
  put(out, "library", e.libraryPath);
  put(out, "cuda", e.cuda ? "1" : "0");
  for (const std::string &c : e.cubinPaths)
    put(out, "cubin", c);
  for (const std::string &k : e.kernels)
    put(out, "kernel", k);
  for (const auto &[name, program] : e.deferred) {
    put(out, "deferred", name);
    put(out, "program", program);
  }
  put(out, "gemm", e.usesGemm ? "1" : "0");
  put(out, "cudnn", e.usesCudnn ? "1" : "0");
  put(out, "checks", e.checksIndices ? "1" : "0");
  put(out, "kernels", std::to_string(e.numKernels));
  for (const runtime::LibraryChoice &c : e.libraryChoices)
    put(out, choiceLine(c.kind), c.key + " " + std::to_string(c.id));
  put(out, "source", e.source);
  return out;
}

std::optional<ManifestEntry> parseManifest(const std::string &text) {
  std::string_view header = kHeader;
  if (text.compare(0, header.size(), header) != 0)
    return std::nullopt;
  ManifestEntry e;
  size_t at = header.size();
  bool sawSource = false, awaitingProgram = false;
  while (at < text.size()) {
    size_t space = text.find(' ', at), eol = text.find('\n', at);
    if (space == std::string::npos || eol == std::string::npos || space > eol)
      return std::nullopt;
    std::string name = text.substr(at, space - at);
    size_t length = 0;
    for (size_t i = space + 1; i < eol; ++i) {
      if (text[i] < '0' || text[i] > '9' || length > (size_t(1) << 40))
        return std::nullopt;
      length = length * 10 + static_cast<size_t>(text[i] - '0');
    }
    if (eol == space + 1 || eol + 1 + length >= text.size() ||
        text[eol + 1 + length] != '\n')
      return std::nullopt;
    std::string value = text.substr(eol + 1, length);
    at = eol + 2 + length;
    bool flag = value == "1";
    if (awaitingProgram != (name == "program"))
      return std::nullopt;
    if (name == "library") {
      e.libraryPath = value;
    } else if (name == "cuda") {
      e.cuda = flag;
    } else if (name == "cubin") {
      e.cubinPaths.push_back(value);
    } else if (name == "kernel") {
      e.kernels.push_back(value);
    } else if (name == "deferred") {
      e.deferred.push_back({value, ""});
      awaitingProgram = true;
    } else if (name == "program") {
      e.deferred.back().second = value;
      awaitingProgram = false;
    } else if (name == "gemm") {
      e.usesGemm = flag;
    } else if (name == "cudnn") {
      e.usesCudnn = flag;
    } else if (name == "checks") {
      e.checksIndices = flag;
    } else if (name == "kernels") {
      if (value.empty() || value.size() > 9 ||
          value.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
      e.numKernels = std::stoi(value);
    } else if (std::optional<runtime::LibraryKind> kind = choiceKind(name)) {
      size_t sp = value.find(' ');
      if (sp == 0 || sp == std::string::npos || sp + 1 == value.size() || value.size() - sp > 10 ||
          value.find_first_not_of("0123456789", sp + 1) != std::string::npos)
        return std::nullopt;
      e.libraryChoices.push_back({*kind, value.substr(0, sp), std::stoll(value.substr(sp + 1))});
    } else if (name == "source") {
      e.source = value;
      sawSource = true;
    } else {
      return std::nullopt;
    }
  }
  if (!sawSource || awaitingProgram || e.libraryPath.empty())
    return std::nullopt;
  return e;
}

std::optional<ManifestEntry> readManifest(const std::string &cacheDir, const std::string &key,
                                          bool logCache) {
  fs::path path = manifestPath(cacheDir, key), sum = jit::checksumPath(path);
  std::optional<ManifestEntry> e;
  if (jit::cacheEntryIsValid(path, sum))
    e = parseManifest(jit::readFile(path));
  if (e) {
    e->libraryPath = (fs::path(cacheDir) / e->libraryPath).string();
    for (std::string &c : e->cubinPaths)
      c = (fs::path(cacheDir) / c).string();
  }
  // The files it names are checked as their own cache hits would check them: a damaged one
  // makes this a miss, and lowering the graph again rebuilds it.
  auto intact = [](const std::string &p) {
    return jit::cacheEntryIsValid(p, jit::checksumPath(p));
  };
  bool present = e && intact(e->libraryPath);
  for (size_t i = 0; present && i < e->cubinPaths.size(); ++i)
    present = intact(e->cubinPaths[i]);
  if (logCache)
    logBlock("cache", std::string(present ? "hit " : "miss ") + key + " (manifest)\n");
  if (!present)
    return std::nullopt;
  return e;
}

bool copyEntry(const std::string &from, const std::string &to, const std::string &key,
               bool logCache) {
  if (readManifest(to, key, false))
    return true;
  std::optional<ManifestEntry> e = readManifest(from, key, false);
  if (!e)
    return false;
  std::vector<fs::path> files{manifestPath(from, key), e->libraryPath};
  files.insert(files.end(), e->cubinPaths.begin(), e->cubinPaths.end());
  try {
    // The manifest last: a reader that finds it finds the files it names.
    for (size_t i = files.size(); i-- > 0;) {
      fs::path rel = files[i].lexically_relative(from);
      if (rel.empty() || *rel.begin() == "..")
        return false;
      fs::path dst = fs::path(to) / rel;
      fs::create_directories(dst.parent_path());
      std::string bytes = jit::readFile(files[i]);
      if (jit::storeEntry(to, dst, jit::checksumPath(dst), bytes) != dst)
        return false; // `to` cannot take it: said once by storeEntry
    }
  } catch (const std::exception &ex) { // a folder that cannot be made: entryDir said so
    if (logCache)
      logBlock("cache", "not copied " + key + " to " + to + ": " + ex.what() + "\n");
    return false;
  }
  if (logCache)
    logBlock("cache", "copied " + key + " from " + from + " to " + to + "\n");
  return true;
}

void writeManifest(const std::string &cacheDir, const std::string &key, const ManifestEntry &e,
                   bool logCache) {
  // Paths are kept relative to the cache, so that a cache moved or copied whole still serves.
  // Files outside it (a cache that could not take them) are this process's only.
  ManifestEntry rel = e;
  const std::string prefix = (fs::path(cacheDir) / "").string();
  auto relative = [&](std::string &p) {
    bool inside = p.compare(0, prefix.size(), prefix) == 0;
    if (inside)
      p = p.substr(prefix.size());
    return inside;
  };
  if (!relative(rel.libraryPath))
    return;
  for (std::string &c : rel.cubinPaths)
    if (!relative(c))
      return;
  try {
    fs::path path = manifestPath(cacheDir, key);
    jit::storeEntry(cacheDir, path, jit::checksumPath(path), manifestText(rel));
  } catch (const std::exception &ex) {
    if (logCache)
      logBlock("cache", "manifest " + key + " not stored: " + ex.what() + "\n");
  }
}

namespace {
/// Redis keys of a cache entry's file (its path relative to the cache) and of its checksum.
std::string redisKey(const std::string &key, const fs::path &rel, bool sum) {
  return "braze:" + key + (sum ? ":sum:" : ":file:") + rel.generic_string();
}
std::mutex &redisLock() {
  static std::mutex m;
  return m;
}
} // namespace

bool fetchRedisEntry(const std::string &address, const std::string &to, const std::string &key,
                     bool logCache) {
  if (readManifest(to, key, false))
    return true;
  std::lock_guard<std::mutex> hold(redisLock());
  jit::RedisCache &redis = jit::redisCache(address);
  if (!redis.alive())
    return false;
  // A file and its checksum, checked: a damaged or foreign value is a miss.
  auto fetch = [&](const fs::path &rel) -> std::optional<std::string> {
    std::optional<std::string> bytes = redis.get(redisKey(key, rel, false));
    std::optional<std::string> sum = redis.get(redisKey(key, rel, true));
    if (!bytes || !sum || sha256Hex(*bytes) != *sum)
      return std::nullopt;
    return bytes;
  };
  const fs::path manifestRel = manifestPath(to, key).lexically_relative(to);
  std::optional<std::string> text = fetch(manifestRel);
  std::optional<ManifestEntry> e = text ? parseManifest(*text) : std::nullopt;
  if (!e) {
    if (logCache && redis.alive())
      logBlock("cache", "miss " + key + " (remote redis://" + address + ")\n");
    return false;
  }
  std::vector<std::string> files{e->libraryPath};
  files.insert(files.end(), e->cubinPaths.begin(), e->cubinPaths.end());
  try {
    for (const std::string &rel : files) {
      fs::path r(rel);
      if (r.is_absolute() || r.empty() || *r.begin() == "..")
        return false;
      std::optional<std::string> bytes = fetch(r);
      if (!bytes)
        return false;
      fs::path dst = fs::path(to) / r;
      fs::create_directories(dst.parent_path());
      if (jit::storeEntry(to, dst, jit::checksumPath(dst), *bytes) != dst)
        return false;
    }
    // The manifest last: a reader that finds it finds the files it names.
    fs::path dst = fs::path(to) / manifestRel;
    fs::create_directories(dst.parent_path());
    if (jit::storeEntry(to, dst, jit::checksumPath(dst), *text) != dst)
      return false;
  } catch (const std::exception &ex) {
    if (logCache)
      logBlock("cache", "not copied " + key + " from redis://" + address + ": " + ex.what() +
                            "\n");
    return false;
  }
  if (logCache)
    logBlock("cache", "copied " + key + " from remote redis://" + address + " to " + to + "\n");
  return readManifest(to, key, false).has_value();
}

void storeRedisEntry(const std::string &from, const std::string &address, const std::string &key,
                     bool logCache) {
  std::optional<ManifestEntry> e = readManifest(from, key, false);
  if (!e)
    return;
  std::lock_guard<std::mutex> hold(redisLock());
  jit::RedisCache &redis = jit::redisCache(address);
  if (!redis.alive())
    return;
  std::vector<fs::path> files{e->libraryPath};
  files.insert(files.end(), e->cubinPaths.begin(), e->cubinPaths.end());
  files.push_back(manifestPath(from, key)); // last
  for (const fs::path &file : files) {
    fs::path rel = file.lexically_relative(from);
    if (rel.empty() || *rel.begin() == "..")
      return;
    std::string bytes = jit::readFile(file);
    if (!redis.set(redisKey(key, rel, false), bytes) ||
        !redis.set(redisKey(key, rel, true), sha256Hex(bytes)))
      return;
  }
  if (logCache)
    logBlock("cache", "stored " + key + " in remote redis://" + address + "\n");
}

} // namespace braze
