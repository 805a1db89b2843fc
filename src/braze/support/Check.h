#pragma once
/// Invariant checks. A failed BRAZE_CHECK is a bug in braze, never a user error:
/// it throws InternalError carrying the file, line, condition and streamed details.
#include <sstream>
#include <stdexcept>
#include <string>

namespace braze {

/// A broken compiler invariant. Distinct from Diagnostic (user errors).
class InternalError : public std::runtime_error {
public:
  explicit InternalError(const std::string &msg) : std::runtime_error(msg) {}
};

namespace detail {
/// Collects the streamed message; CheckThrower throws it once the statement has built it.
class CheckFailure {
public:
  CheckFailure(const char *file, int line, const char *cond) {
    os_ << "internal check failed at " << file << ":" << line << ": " << cond;
  }
  template <typename T> CheckFailure &operator<<(const T &v) {
    if (!hasDetail_) {
      os_ << ": ";
      hasDetail_ = true;
    }
    os_ << v;
    return *this;
  }
  std::string message() const { return os_.str(); }

private:
  std::ostringstream os_;
  bool hasDetail_ = false;
};

/// Throws from an operator (precedence below <<), never from a destructor.
struct CheckThrower {
  [[noreturn]] void operator&(const CheckFailure &f) const { throw InternalError(f.message()); }
};
} // namespace detail

} // namespace braze

#define BRAZE_CHECK(cond)                                                      \
  if (cond) {                                                                  \
  } else                                                                       \
    ::braze::detail::CheckThrower() & ::braze::detail::CheckFailure(__FILE__, __LINE__, #cond)

#define BRAZE_UNREACHABLE(msg)                                                 \
  ::braze::detail::CheckThrower() &                                            \
      (::braze::detail::CheckFailure(__FILE__, __LINE__, "unreachable") << msg)
