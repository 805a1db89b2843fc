#pragma once
/// Text form of the loop IR: the parser (Parser.cpp) and what the printer, parser and verifier
/// share. printProgram, printExpr and verifyProgram are declared in LoopIR.h.
///
///   sizes s0, s1
///   buffer %arg0: f32[s0, s1] input 0
///   buffer %arg1: i64[s0] input 1
///   buffer %buf2: f32[s0] intermediate
///   buffer %out0: f32[s0] output 0
///   compute %buf2[i0 < s0] reduce sum over [r0 < s1] {
///     %0 = load %arg0[i0*s1 + r0] : f32
///     %1 = ceil(%0) : f32
///     yield %1
///   }
///   compute %out0[i0 < s0] {
///     %0 = load %arg1[i0] : i64
///     %1 = load %arg0[i0*s1 + t0] where t0 < s1 = %0 : f32
///     %2 = load %buf2[i0] : f32
///     %3 = add(%1, %2) : f32
///     yield %3
///   }
///
/// - `sizes` lists the program's size symbols in binding order; every size used must be there.
/// - `buffer %name: type kind [io index]`; the type prints as typeToString does (strides only
///   when not row-major). Buffers print in creation order, so ids survive a round trip.
/// - `compute %out[vars] [reduce kind] [over [rvars]] { statements yield %v }`. Each var is
///   `name < extent`; index symbols are local to their computation.
/// - Statements are `%N = const V : dtype`, `%N = index(sym) : dtype`,
///   `%N = load %buf[sym] [where t < extent = %k, ...] : dtype` and `%N = op(%a, ...) : dtype`
///   (op names from ElementwiseOps.def, plus `cast`). They are numbered from 0 in each
///   computation in the order of exprPostOrder, so a shared subexpression prints once.
/// - An indirect symbol (`where`) stands for the int64 value of an Expr inside one load's
///   index. Written `t < extent` it is an index symbol with that extent (0 <= t < extent, what
///   a valid gather guarantees); written `t` alone it is a size symbol (only t >= 0 is known).
///   The parser makes one symbol per name and kind in each computation.
/// - `#` starts a comment that runs to the end of the line.
#include "braze/ir/loop/LoopIR.h"

#include <initializer_list>
#include <memory>
#include <string_view>
#include <vector>

namespace braze::loop {

/// Reads the text form. A syntax error throws Diagnostic("loop-parser", "", "line L, column C:
/// expected X, found Y"). The program is not verified; call verifyProgram for that.
std::unique_ptr<LoopProgram> parseProgram(std::string_view text);

/// The Exprs reachable from `root`, each once, operands (and indirect bindings, then the load
/// itself) before their users: the printer's statement order.
std::vector<const Expr *> exprPostOrder(const Expr *root);
/// The same over several roots in turn (a scatter's value, then its position): each Expr once.
std::vector<const Expr *> exprPostOrder(std::initializer_list<const Expr *> roots);

} // namespace braze::loop
