#include "braze/runtime/Files.h"

#include <fstream>
#include <sstream>

namespace braze::runtime {

bool readWholeFile(const std::string &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return false;
  std::ostringstream s;
  s << in.rdbuf();
  out = s.str();
  return true;
}

} // namespace braze::runtime
