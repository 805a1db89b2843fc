#include "braze/codegen/cuda/KernelText.h"

#include <cctype>
#include <map>

namespace braze::codegen {

namespace {

/// Whether an identifier is one codegen numbers (b12, e345, acc7, vl3_p, v40_41, y0_base,
/// sm_acc2...), as opposed to a type or helper that happens to hold digits (float4, int64_t,
/// braze_bf2f, INT64_C).
bool numberedName(const std::string &id) {
  size_t i = id.rfind("sm_", 0) == 0 ? 3 : 0, letters = i;
  while (i < id.size() && std::islower(static_cast<unsigned char>(id[i])))
    ++i;
  if (i == letters || i == id.size() || !std::isdigit(static_cast<unsigned char>(id[i])))
    return false;
  std::string stem = id.substr(letters, i - letters);
  for (const char *type : {"int", "uint", "float", "double", "half", "short", "ushort", "char",
                           "uchar", "long", "ulong", "longlong", "ulonglong", "bf"})
    if (stem == type)
      return false;
  while (i < id.size() && (std::isdigit(static_cast<unsigned char>(id[i])) || id[i] == '_'))
    ++i;
  std::string rest = id.substr(i);
  return rest.empty() || rest == "base" || rest == "p";
}

} // namespace

/// A kernel's text with its name replaced by a placeholder and every numbered name renamed
/// z_0, z_1, ... in order of first use: equal for kernels that differ only in those names (the
/// same layer's kernels, repeated).
std::string canonicalKernel(const std::string &text, const std::string &name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  out.reserve(text.size());
  std::map<std::string, std::string> renamed;
  bool named = false;
  for (size_t i = 0; i < text.size();) {
    if (!word(text[i]) || std::isdigit(static_cast<unsigned char>(text[i]))) {
      // Not an identifier's start: copy it, with any digits or letters that follow (a number
      // such as 1e5f or 0x1f is not an identifier).
      size_t j = i + 1;
      if (word(text[i]))
        while (j < text.size() && word(text[j]))
          ++j;
      out.append(text, i, j - i);
      i = j;
      continue;
    }
    size_t j = i;
    while (j < text.size() && word(text[j]))
      ++j;
    std::string id = text.substr(i, j - i);
    i = j;
    if (!named && id == name) {
      out += "@KERNEL@";
      named = true;
    } else if (numberedName(id)) {
      auto [it, fresh] = renamed.emplace(id, "");
      if (fresh)
        it->second = "z_" + std::to_string(renamed.size() - 1);
      out += it->second;
    } else {
      out += id;
    }
  }
  return out;
}

} // namespace braze::codegen
