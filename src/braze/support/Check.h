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
/// Collects the streamed message and throws when destroyed at the end of the statement.
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
  [[noreturn]] ~CheckFailure() noexcept(false) { throw InternalError(os_.str()); }

private:
  std::ostringstream os_;
  bool hasDetail_ = false;
};
} // namespace detail

} // namespace braze

#define BRAZE_CHECK(cond)                                                      \
  if (cond) {                                                                  \
  } else                                                                       \
    ::braze::detail::CheckFailure(__FILE__, __LINE__, #cond)

#define BRAZE_UNREACHABLE(msg)                                                 \
  ::braze::detail::CheckFailure(__FILE__, __LINE__, "unreachable") << msg
