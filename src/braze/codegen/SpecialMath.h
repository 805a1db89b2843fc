#pragma once
/// C++ text of the special functions (braze_sp_*) that the special-function scalar ops
/// (Digamma ... Igammac) call; a generated module includes it after cPrelude() only when it
/// calls one of them.

namespace braze::codegen {

/// Definitions of the braze_sp_* functions, in double precision.
const char *specialMathPrelude();

/// The prefix every function of specialMathPrelude() starts with.
inline constexpr const char *kSpecialMathPrefix = "braze_sp_";

} // namespace braze::codegen
