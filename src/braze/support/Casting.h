#pragma once
/// isa / cast / dyn_cast on a kind field. Each class T provides `static bool classof(const Base *)`.
#include "braze/support/Check.h"

namespace braze {

template <typename T, typename U> bool isa(const U *v) { return v && T::classof(v); }

template <typename T, typename U> const T *cast(const U *v) {
  BRAZE_CHECK(isa<T>(v)) << "bad cast";
  return static_cast<const T *>(v);
}

template <typename T, typename U> const T *dyn_cast(const U *v) {
  return isa<T>(v) ? static_cast<const T *>(v) : nullptr;
}

} // namespace braze
