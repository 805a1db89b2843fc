#pragma once
/// Pieces shared by every C-family code generator (C++ for CPUs, CUDA C++): type names,
/// literals, index expressions, and scalar operations as C expressions. Each scalar op's
/// semantics (NaN propagation, floor division, rounding) follows PyTorch's CPU kernels.
#include "braze/ir/loop/LoopIR.h"

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace braze::codegen {

/// C type of a value of dtype t inside a kernel (f16/bf16 are raw uint16_t bits).
std::string ctype(DType t);
/// A literal of dtype t (f32 "1.5f", "INFINITY", int64 "INT64_C(7)").
std::string literal(double value, int64_t ivalue, DType t);
/// Converts a C expression of dtype `from` to dtype `to`.
std::string convert(const std::string &x, DType from, DType to);
/// The C expression for an elementwise op on operands of the given dtypes.
std::string scalarOp(loop::ScalarOpKind op, DType result, const std::vector<std::string> &args,
                     const std::vector<DType> &argTypes, const loop::Expr *e);
/// The values an index expression takes, lo to hi inclusive.
struct IndexRange {
  int64_t lo = 0, hi = 0;
};
/// A symbol's range, or nothing where it has none known (a size, say).
using SymbolRanges = std::function<std::optional<IndexRange>(sym::SymExpr)>;
/// The range of e over its symbols' ranges, or nothing where a part of e is not bounded so: a
/// symbol of no known range, a quotient or remainder by a non-constant, or a part whose range
/// reaches past +-limit (at most 2^62).
std::optional<IndexRange> indexRange(sym::SymExpr e, const SymbolRanges &symbolRange,
                                     int64_t limit = int64_t(1) << 62);
/// Whether e and every part of it lie within +-2^30 for all values of its symbols: int
/// arithmetic computes it exactly, with room for an index a step past its range.
bool fitsNarrowIndex(sym::SymExpr e, const SymbolRanges &symbolRange);
/// An index expression as C; `nameOf` names symbols. int64_t arithmetic, or with `narrow` (for
/// an e that fitsNarrowIndex) int arithmetic: each symbol read as an int, integer literals, and
/// braze_imin32/braze_imax32, which a GPU computes in about half the instructions.
std::string indexExpr(sym::SymExpr e, const std::function<std::string(sym::SymExpr)> &nameOf,
                      bool narrow = false);

/// Helper functions every generated CPU module starts with.
std::string cPrelude();
/// The target-independent part of the helpers (each target defines BRAZE_FN, the 16-bit float
/// conversions and a std:: math library before it).
std::string cCommonHelpers();
/// braze_floordiv_int and braze_remainder_int alone (BRAZE_FN defined by the includer): what
/// index expressions need, in host code too.
const char *cIndexHelpers();

} // namespace braze::codegen
