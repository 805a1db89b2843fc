#pragma once
/// C++ text of the special functions (braze_sp_*) that the special-function scalar ops
/// (Digamma ... Igammac) call; a generated module, CPU or CUDA, includes it after its prelude
/// only when it calls one of them.
#include <string>

namespace braze::codegen {

/// Definitions of the braze_sp_* functions, in double precision, as host functions or (`cuda`)
/// as CUDA device functions.
std::string specialMathPrelude(bool cuda);

/// The prefix every function of specialMathPrelude() starts with.
inline constexpr const char *kSpecialMathPrefix = "braze_sp_";

} // namespace braze::codegen
