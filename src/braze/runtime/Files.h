#pragma once
/// Reading a whole file, as the runtime's loaders do (packages, package archives, safetensors,
/// CUDA modules): each says in its own words what it could not read.
#include <string>

namespace braze::runtime {

/// The bytes of the file at `path` into `out`; false if it cannot be opened.
bool readWholeFile(const std::string &path, std::string &out);

} // namespace braze::runtime
