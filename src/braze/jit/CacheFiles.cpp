#include "braze/jit/CacheFiles.h"

#include "braze/support/Check.h"
#include "braze/support/Hashing.h"

#include <atomic>
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
