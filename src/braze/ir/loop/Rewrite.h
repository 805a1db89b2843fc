#pragma once
/// Expr rewriting helpers.
#include "braze/ir/loop/LoopIR.h"

#include <functional>
#include <unordered_map>

namespace braze::loop {

/// Replaces index symbols in every index (loads, index values, indirect bindings) of e.
const Expr *substituteIndices(LoopProgram &p, const Expr *e,
                              const std::unordered_map<SymExpr, SymExpr> &map);
/// Calls f on every Load in e (each distinct Load once), operands before users.
void forEachLoad(const Expr *e, const std::function<void(const Expr *)> &f);
/// Calls f on every buffer `c` reads: the buffer of each Load in `value` (c's value, or its
/// rewrite into a kernel's variables), then an attention's operands.
void forEachBufferRead(const Computation &c, const Expr *value,
                       const std::function<void(const Buffer *)> &f);

} // namespace braze::loop
