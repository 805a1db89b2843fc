#pragma once
/// User errors: bad input, unsupported op, wrong rank or dtype. A Diagnostic names the op
/// and the node it came from and shows the offending values.
#include <sstream>
#include <stdexcept>
#include <string>

namespace braze {

class Diagnostic : public std::runtime_error {
public:
  Diagnostic(std::string op, std::string node, const std::string &message)
      : std::runtime_error(format(op, node, message)), op_(std::move(op)),
        node_(std::move(node)), message_(message) {}

  const std::string &op() const { return op_; }
  const std::string &node() const { return node_; }
  /// The message without the op/node prefix.
  const std::string &message() const { return message_; }

private:
  static std::string format(const std::string &op, const std::string &node,
                            const std::string &message) {
    std::string s = op;
    if (!node.empty())
      s += " (node '" + node + "')";
    return s + ": " + message;
  }
  std::string op_, node_, message_;
};

/// Builds a Diagnostic from streamed parts: `throw diag("reshape", n) << 6 << " elements..."`
/// is spelled `BRAZE_USER_ERROR(op, node) << ...;`.
class DiagnosticBuilder {
public:
  DiagnosticBuilder(std::string op, std::string node)
      : op_(std::move(op)), node_(std::move(node)) {}
  template <typename T> DiagnosticBuilder &operator<<(const T &v) {
    os_ << v;
    return *this;
  }
  Diagnostic build() const { return Diagnostic(op_, node_, os_.str()); }

private:
  std::string op_, node_;
  std::ostringstream os_;
};

namespace detail {
/// Throws the built Diagnostic. An operator of lower precedence than << so that the whole
/// streamed message is built first; throwing from here, not from a destructor, keeps unwinding
/// ordinary on every compiler.
struct DiagnosticThrower {
  [[noreturn]] void operator&(const DiagnosticBuilder &b) const { throw b.build(); }
};
} // namespace detail

} // namespace braze

#define BRAZE_USER_ERROR(op, node)                                             \
  ::braze::detail::DiagnosticThrower() & ::braze::DiagnosticBuilder((op), (node))
