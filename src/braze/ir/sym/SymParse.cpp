#include "braze/ir/sym/SymParse.h"

#include "braze/support/Diagnostic.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

namespace braze::sym {

namespace {

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isNameStart(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool isNameChar(char c) { return isNameStart(c) || isDigit(c); }

/// Recursive descent over the grammar in SymParse.h; pos_ is the next unread character.
class SymParser {
public:
  SymParser(SymContext &ctx, std::string_view text,
            const std::function<SymExpr(std::string_view)> &lookupSymbol)
      : ctx_(ctx), text_(text), lookupSymbol_(lookupSymbol) {}

  SymExpr parseAll() {
    SymExpr e = parseSum();
    skipSpace();
    if (pos_ != text_.size())
      failExpected(pos_, "an operator");
    return e;
  }

private:
  SymExpr parseSum() {
    SymExpr e = parseProduct();
    while (true) {
      if (accept("+"))
        e = ctx_.add(e, parseProduct());
      else if (accept("-"))
        e = ctx_.sub(e, parseProduct());
      else
        return e;
    }
  }

  SymExpr parseProduct() {
    SymExpr e = parseUnary();
    while (true) {
      if (accept("*")) {
        e = ctx_.mul(e, parseUnary());
      } else if (accept("//")) {
        skipSpace();
        size_t at = pos_;
        e = ctx_.floordiv(e, nonZero(parseUnary(), at, "//"));
      } else if (accept("%")) {
        skipSpace();
        size_t at = pos_;
        e = ctx_.mod(e, nonZero(parseUnary(), at, "%"));
      } else {
        return e;
      }
    }
  }

  SymExpr parseUnary() {
    if (!accept("-"))
      return parsePrimary();
    skipSpace();
    // A negative literal is read whole, so that the most negative int64 round-trips.
    if (pos_ < text_.size() && isDigit(text_[pos_]))
      return parseInteger(/*negative=*/true);
    Nested nested(*this, pos_);
    return ctx_.neg(parseUnary());
  }

  /// Counts one level of nesting (a parenthesis, a min/max call, a unary minus) while it is
  /// open, so that deeply nested text is an error instead of a stack overflow.
  struct Nested {
    Nested(SymParser &p, size_t at) : p(p) {
      if (++p.depth_ > kMaxSymNesting)
        p.fail(at, "expression nested deeper than " + std::to_string(kMaxSymNesting) +
                       " levels");
    }
    ~Nested() { --p.depth_; }
    SymParser &p;
  };

  SymExpr parsePrimary() {
    skipSpace();
    if (pos_ == text_.size())
      failExpected(pos_, "an expression");
    char c = text_[pos_];
    if (isDigit(c))
      return parseInteger(/*negative=*/false);
    if (c == '(') {
      Nested nested(*this, pos_);
      ++pos_;
      SymExpr e = parseSum();
      expect(")");
      return e;
    }
    if (!isNameStart(c))
      failExpected(pos_, "an expression");
    size_t start = pos_;
    while (pos_ < text_.size() && isNameChar(text_[pos_]))
      ++pos_;
    std::string_view name = text_.substr(start, pos_ - start);
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == '(') {
      if (name != "min" && name != "max")
        fail(start, "unknown function " + tokenAt(start));
      Nested nested(*this, pos_);
      ++pos_;
      SymExpr a = parseSum();
      expect(",");
      SymExpr b = parseSum();
      expect(")");
      return name == "min" ? ctx_.min(a, b) : ctx_.max(a, b);
    }
    SymExpr s = lookupSymbol_(name);
    if (!s)
      fail(start, "unknown symbol " + tokenAt(start));
    return s;
  }

  /// Reads the digits at pos_; with `negative`, the value is minus them.
  SymExpr parseInteger(bool negative) {
    size_t start = pos_;
    while (pos_ < text_.size() && isDigit(text_[pos_]))
      ++pos_;
    uint64_t magnitude = 0;
    auto [end, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, magnitude);
    uint64_t limit = uint64_t(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0);
    if (ec != std::errc() || magnitude > limit)
      fail(start, "integer literal " + tokenAt(start) + " out of range");
    int64_t v = negative ? int64_t(0 - magnitude) : int64_t(magnitude);
    return ctx_.constant(v);
  }

  /// Rejects a constant zero divisor as a user error instead of the factory's internal check.
  SymExpr nonZero(SymExpr divisor, size_t at, const char *op) {
    if (divisor->isConst(0))
      fail(at, std::string("'") + op + "' by zero");
    return divisor;
  }

  void skipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t'))
      ++pos_;
  }

  /// Consumes `token` if it comes next. `/` alone is not a token: `accept("//")` needs both.
  bool accept(std::string_view token) {
    skipSpace();
    if (text_.substr(pos_, token.size()) != token)
      return false;
    pos_ += token.size();
    return true;
  }

  void expect(std::string_view token) {
    if (!accept(token))
      failExpected(pos_, "'" + std::string(token) + "'");
  }

  /// The token starting at `at`, for error messages.
  std::string tokenAt(size_t at) const {
    if (at >= text_.size())
      return "end of input";
    size_t end = at + 1;
    if (isNameChar(text_[at]))
      while (end < text_.size() && isNameChar(text_[end]))
        ++end;
    std::string quoted = "'";
    quoted.append(text_.substr(at, end - at));
    quoted += '\'';
    return quoted;
  }

  /// Throws "column N: <what> in '<text>'"; a long text is shown as its first and last 40
  /// characters.
  [[noreturn]] void fail(size_t at, const std::string &what) const {
    std::string shown = text_.size() <= 100 ? std::string(text_)
                                            : std::string(text_.substr(0, 40)) + " ... " +
                                                  std::string(text_.substr(text_.size() - 40));
    throw Diagnostic("sym", "", "column " + std::to_string(at + 1) + ": " + what + " in '" +
                                    shown + "'");
  }

  [[noreturn]] void failExpected(size_t at, const std::string &expected) const {
    fail(at, "expected " + expected + " but found " + tokenAt(at));
  }

  SymContext &ctx_;
  std::string_view text_;
  const std::function<SymExpr(std::string_view)> &lookupSymbol_;
  size_t pos_ = 0;
  int depth_ = 0; // open nesting levels (see Nested)
};

} // namespace

SymExpr parseSym(SymContext &ctx, std::string_view text,
                 const std::function<SymExpr(std::string_view name)> &lookupSymbol) {
  return SymParser(ctx, text, lookupSymbol).parseAll();
}

} // namespace braze::sym
