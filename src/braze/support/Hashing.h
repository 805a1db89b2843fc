#pragma once
/// Hashing: a combiner for in-memory tables, and a stable SHA-256 for content addresses
/// (cache keys must not depend on pointer values or on the process).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace braze {

inline size_t hashCombine(size_t seed, size_t v) {
  return seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

/// Lower-case hex SHA-256 of `data`.
std::string sha256Hex(std::string_view data);

} // namespace braze
