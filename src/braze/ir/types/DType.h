#pragma once
/// Element types, listed once in DTypes.def.
#include <cstdint>
#include <optional>
#include <string_view>

namespace braze {

enum class DType : uint8_t {
#define BRAZE_DTYPE(E, text, size, cat, ctype) E,
#include "braze/ir/types/DTypes.def"
};

std::string_view dtypeName(DType t);
std::optional<DType> parseDType(std::string_view name);
int dtypeSize(DType t);
bool isFloating(DType t);
/// f16 or bf16: 16-bit floats, which kernels widen to f32 (computeType) to compute.
bool isHalf(DType t);
bool isIntegral(DType t); ///< signed or unsigned integers, not bool
bool isSigned(DType t);
/// PyTorch's promotion of two tensor dtypes (both "dimensioned" operands).
DType promoteTypes(DType a, DType b);
/// The type arithmetic in a kernel is done in: f16/bf16 compute in f32, everything else in itself.
DType computeType(DType t);
/// The lowest value of `t` (-inf for floats, 0 for bool and u8), exact as a double.
double lowestValue(DType t);

} // namespace braze
