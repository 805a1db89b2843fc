#pragma once
/// Comma-separated names, as options and environment variables give them.
#include <string>
#include <string_view>
#include <vector>

namespace braze {

/// The names in `list` between commas, in order; empty names (",," or a trailing comma) are
/// skipped.
inline std::vector<std::string> splitCommas(std::string_view list) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string_view::npos)
      end = list.size();
    if (end > pos)
      parts.emplace_back(list.substr(pos, end - pos));
    pos = end + 1;
  }
  return parts;
}

} // namespace braze
