#include "braze/support/NumberText.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace braze {

std::string formatDouble(double d) {
  // Shortest text that reads back to the same double, always with a '.', 'e', "inf" or "nan".
  if (d != d)
    return "nan";
  if (d == __builtin_inf())
    return "inf";
  if (d == -__builtin_inf())
    return "-inf";
  char buf[64];
  if (std::nearbyint(d) == d && std::fabs(d) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.1f", d);
    return buf;
  }
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d)
      break;
  }
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

} // namespace braze
