#include "braze/jit/CacheFiles.h"

#include "braze/support/Check.h"
#include "braze/support/Hashing.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <unistd.h>

namespace braze::jit {

namespace fs = std::filesystem;

std::string readFile(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

/// Creates `dir` and a file in it; the error text if either fails.
std::string probeWritable(const fs::path &dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return ec.message();
  fs::path probe = dir / ("probe" + temporaryTag());
  {
    std::ofstream out(probe);
    out << "braze";
    if (!out.good())
      return "cannot write " + probe.string();
  }
  fs::remove(probe, ec);
  return "";
}

} // namespace

fs::path entryDir(const std::string &cacheDir, const std::string &key) {
  static std::mutex mu;
  static std::map<std::string, fs::path> replaced; // unusable cache dir -> temporary folder
  fs::path dir = fs::path(cacheDir) / key.substr(0, 2);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = replaced.find(cacheDir); it != replaced.end()) {
      fs::path d = it->second / key.substr(0, 2);
      fs::create_directories(d);
      return d;
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string why = ec ? ec.message() : "";
  if (why.empty()) {
    // Creating the folder succeeds on a folder that exists read-only: probe a write once.
    static std::mutex probeMu;
    static std::map<std::string, std::string> probed;
    std::lock_guard<std::mutex> lock(probeMu);
    auto it = probed.find(cacheDir);
    if (it == probed.end())
      it = probed.emplace(cacheDir, probeWritable(dir)).first;
    why = it->second;
  }
  if (why.empty())
    return dir;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = replaced.emplace(cacheDir, fs::path());
  if (fresh) {
    it->second = fs::temp_directory_path() / ("braze-cache-" + std::to_string(::getpid()));
    fs::create_directories(it->second);
    std::fprintf(stderr,
                 "braze: the cache directory %s cannot be used (%s); compiling without it, into "
                 "%s\n",
                 cacheDir.c_str(), why.c_str(), it->second.string().c_str());
  }
  fs::path d = it->second / key.substr(0, 2);
  fs::create_directories(d);
  return d;
}

std::string temporaryTag() {
  static std::atomic<uint64_t> next{0};
  return ".tmp" + std::to_string(::getpid()) + "." + std::to_string(next++);
}

std::unique_lock<std::mutex> lockEntry(const std::string &key) {
  static std::mutex mapMutex;
  static std::map<std::string, std::unique_ptr<std::mutex>> locks; // one per key, kept
  std::mutex *m;
  {
    std::lock_guard<std::mutex> guard(mapMutex);
    std::unique_ptr<std::mutex> &slot = locks[key];
    if (!slot)
      slot = std::make_unique<std::mutex>();
    m = slot.get();
  }
  return std::unique_lock<std::mutex>(*m);
}

void writeFileAtomically(const fs::path &p, const std::string &data) {
  fs::path tmp = p;
  tmp += temporaryTag();
  {
    std::ofstream out(tmp, std::ios::binary);
    out << data;
    BRAZE_CHECK(out.good()) << "cannot write " << tmp.string();
  }
  fs::rename(tmp, p);
}

bool cacheEntryIsValid(const fs::path &entry, const fs::path &sum) {
  std::error_code ec;
  if (!fs::exists(entry, ec) || !fs::exists(sum, ec))
    return false;
  return readFile(sum) == sha256Hex(readFile(entry));
}

} // namespace braze::jit
