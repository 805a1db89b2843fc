#pragma once
/// Kernel texts compared up to naming: the CUDA emitter compiles once the kernels that differ only
/// in their name and the names codegen numbers (a repeated layer's).
#include <string>

namespace braze::codegen {

/// `text` with the kernel's `name` replaced by a placeholder and every numbered name (b12, e345,
/// acc7, vl3_p, ...) renamed z_0, z_1, ... in order of first use.
std::string canonicalKernel(const std::string &text, const std::string &name);

} // namespace braze::codegen
