#include "braze/ir/types/DType.h"

#include "braze/support/Check.h"

#include <limits>

namespace braze {

std::string_view dtypeName(DType t) {
  switch (t) {
#define BRAZE_DTYPE(E, text, size, cat, ctype)                                 \
  case DType::E:                                                               \
    return text;
#include "braze/ir/types/DTypes.def"
  }
  BRAZE_UNREACHABLE("bad DType");
}

std::optional<DType> parseDType(std::string_view name) {
#define BRAZE_DTYPE(E, text, size, cat, ctype)                                 \
  if (name == text)                                                            \
    return DType::E;
#include "braze/ir/types/DTypes.def"
  return std::nullopt;
}

int dtypeSize(DType t) {
  switch (t) {
#define BRAZE_DTYPE(E, text, size, cat, ctype)                                 \
  case DType::E:                                                               \
    return size;
#include "braze/ir/types/DTypes.def"
  }
  BRAZE_UNREACHABLE("bad DType");
}

static char category(DType t) {
  switch (t) {
#define BRAZE_DTYPE(E, text, size, cat, ctype)                                 \
  case DType::E:                                                               \
    return #cat[0];
#include "braze/ir/types/DTypes.def"
  }
  BRAZE_UNREACHABLE("bad DType");
}

bool isFloating(DType t) { return category(t) == 'f'; }
bool isHalf(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
bool isIntegral(DType t) { return category(t) == 'i' || category(t) == 'u'; }
bool isSigned(DType t) { return category(t) == 'i' || category(t) == 'f'; }

DType promoteTypes(DType a, DType b) {
  if (a == b)
    return a;
  char ca = category(a), cb = category(b);
  auto rank = [](char c) { return c == 'b' ? 0 : (c == 'f' ? 2 : 1); };
  if (rank(ca) != rank(cb))
    return rank(ca) > rank(cb) ? a : b;
  if (ca == 'f') {
    // f16 with bf16 promotes to f32; otherwise the wider one.
    if ((a == DType::Float16 && b == DType::BFloat16) ||
        (a == DType::BFloat16 && b == DType::Float16))
      return DType::Float32;
    return dtypeSize(a) >= dtypeSize(b) ? a : b;
  }
  // Integers: u8 with a signed type needs a signed type wider than 8 bits.
  if (a == DType::UInt8 || b == DType::UInt8) {
    DType other = a == DType::UInt8 ? b : a;
    return dtypeSize(other) > 1 ? other : DType::Int16;
  }
  return dtypeSize(a) >= dtypeSize(b) ? a : b;
}

DType computeType(DType t) {
  return (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
}

double lowestValue(DType t) {
  switch (t) {
  case DType::Bool:
  case DType::UInt8:
    return 0;
  case DType::Int8:
    return std::numeric_limits<int8_t>::min();
  case DType::Int16:
    return std::numeric_limits<int16_t>::min();
  case DType::Int32:
    return std::numeric_limits<int32_t>::min();
  case DType::Int64:
    return static_cast<double>(std::numeric_limits<int64_t>::min());
  case DType::Float16:
  case DType::BFloat16:
  case DType::Float32:
  case DType::Float64:
    return -std::numeric_limits<double>::infinity();
  }
  return -std::numeric_limits<double>::infinity();
}

} // namespace braze
