#pragma once
/// Text to SymExpr: the inverse of toString.
#include "braze/ir/sym/SymExpr.h"

#include <functional>
#include <string_view>

namespace braze::sym {

constexpr int kMaxSymNesting = 256;

/// Parses what toString prints, so `parseSym(ctx, toString(e), lookup) == e`. Grammar (Python
/// precedence; binary operators are left-associative, unary minus binds tighter than `*`):
///
///   sum     := product (('+' | '-') product)*
///   product := unary (('*' | '//' | '%') unary)*
///   unary   := '-' unary | primary
///   primary := integer | name | ('min' | 'max') '(' sum ',' sum ')' | '(' sum ')'
///   name    := [A-Za-z_][A-Za-z0-9_]*
///
/// Nesting (parentheses, min/max calls, unary minus) deeper than kMaxSymNesting levels is an
/// error, so that no input overflows the parser's stack.
///
/// The expression is rebuilt through the simplifying factories, so the result is canonical.
/// lookupSymbol maps a name to its symbol (the caller decides whether to create one); a null
/// result is an error. A syntax error or an unknown name throws Diagnostic("sym", "", message),
/// the message giving the 1-based column and the offending text.
SymExpr parseSym(SymContext &ctx, std::string_view text,
                 const std::function<SymExpr(std::string_view name)> &lookupSymbol);

} // namespace braze::sym
