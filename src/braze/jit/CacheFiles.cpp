#include "braze/jit/CacheFiles.h"

#include "braze/support/Check.h"
#include "braze/support/Hashing.h"

#include <fstream>
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

void writeFileAtomically(const fs::path &p, const std::string &data) {
  fs::path tmp = p;
  tmp += ".tmp" + std::to_string(::getpid());
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
