/// The CUDA module prelude. NVRTC compiles without the C++ library, so the prelude supplies what
/// the shared C-family text expects: fixed-width integer types, INT64_C/INFINITY/NAN, a small
/// std:: (math overloads of CUDA's own library, min/max, numeric_limits), 16-bit float
/// conversions, then the common helpers and the CUDA-only ones: 16-byte vector loads and stores
/// and the warp shuffles used to combine reductions.
#include "braze/codegen/cuda/CudaCodegen.h"

#include "braze/codegen/CFamily.h"

namespace braze::codegen {

namespace {

const char *kCudaHeader = R"PRELUDE(typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#define INT64_C(c) c##LL
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define BRAZE_FN static __device__ __forceinline__

// The generated text names its math library std::; here that is CUDA's device library.
namespace braze_std {
using ::exp; using ::exp2; using ::expm1; using ::log; using ::log2; using ::log10; using ::log1p;
using ::sqrt; using ::sin; using ::cos; using ::tan; using ::asin; using ::acos; using ::atan;
using ::sinh; using ::cosh; using ::tanh; using ::asinh; using ::acosh; using ::atanh; using ::erf;
using ::erfc; using ::lgamma; using ::floor; using ::ceil; using ::nearbyint; using ::trunc;
using ::fabs; using ::fmod; using ::pow; using ::atan2; using ::copysign; using ::hypot;
using ::nextafter; using ::frexp;
BRAZE_FN bool isinf(float x) { return ::isinf(x); }
BRAZE_FN bool isinf(double x) { return ::isinf(x); }
template <typename T> BRAZE_FN T min(T a, T b) { return b < a ? b : a; }
template <typename T> BRAZE_FN T max(T a, T b) { return a < b ? b : a; }
template <typename T> struct numeric_limits;
#define BRAZE_LIMITS(T, lo, hi, sgn) \
  template <> struct numeric_limits<T> { \
    static constexpr bool is_signed = sgn; \
    static __device__ T lowest() { return lo; } \
    static __device__ T max() { return hi; } \
  };
BRAZE_LIMITS(bool, false, true, false)
BRAZE_LIMITS(int8_t, -128, 127, true)
BRAZE_LIMITS(uint8_t, 0, 255, false)
BRAZE_LIMITS(int16_t, -32768, 32767, true)
BRAZE_LIMITS(uint16_t, 0, 65535, false)
BRAZE_LIMITS(int32_t, -2147483647 - 1, 2147483647, true)
BRAZE_LIMITS(int64_t, -9223372036854775807LL - 1, 9223372036854775807LL, true)
#undef BRAZE_LIMITS
template <> struct numeric_limits<float> {
  static constexpr bool is_signed = true;
  static __device__ float infinity() { return __int_as_float(0x7f800000); }
  static __device__ float quiet_NaN() { return __int_as_float(0x7fffffff); }
  static __device__ float lowest() { return -3.402823466e+38f; }
  static __device__ float max() { return 3.402823466e+38f; }
};
template <> struct numeric_limits<double> {
  static constexpr bool is_signed = true;
  static __device__ double infinity() { return __longlong_as_double(0x7ff0000000000000LL); }
  static __device__ double quiet_NaN() { return __longlong_as_double(0x7ff8000000000000LL); }
  static __device__ double lowest() { return -1.7976931348623157e+308; }
  static __device__ double max() { return 1.7976931348623157e+308; }
};
} // namespace braze_std
#define std braze_std

BRAZE_FN float braze_h2f(uint16_t h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
BRAZE_FN uint16_t braze_f2h(float f) { uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
BRAZE_FN float braze_bf2f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
// The adds of an accumulating scatter (float, double, int32 and int64 elements).
BRAZE_FN void braze_atomic_add(float* p, float v) { atomicAdd(p, v); }
BRAZE_FN void braze_atomic_add(double* p, double v) { atomicAdd(p, v); }
BRAZE_FN void braze_atomic_add(int32_t* p, int32_t v) { atomicAdd((int*)p, (int)v); }
BRAZE_FN void braze_atomic_add(int64_t* p, int64_t v) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
// Round to nearest even, as PyTorch; one instruction (sm_80+). A NaN stays a NaN.
BRAZE_FN uint16_t braze_f2bf(float f) { uint16_t h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
// An accumulating scatter's adds into f16 and bf16 elements, rounded after each (as eager's
// half-precision atomics): a compare-and-swap of the aligned 32-bit word holding the element.
#define BRAZE_ATOMIC_ADD_HALF(NAME, TO_F, FROM_F)                                             \
  BRAZE_FN void NAME(uint16_t* p, float v) {                                                 \
    unsigned int* word = (unsigned int*)((size_t)p & ~(size_t)3);                            \
    unsigned int shift = ((size_t)p & 2) ? 16u : 0u, old = *word, seen;                      \
    do {                                                                                     \
      seen = old;                                                                            \
      unsigned int sum = FROM_F(TO_F((uint16_t)(seen >> shift)) + v);                        \
      old = atomicCAS(word, seen, (seen & ~(0xffffu << shift)) | (sum << shift));            \
    } while (old != seen);                                                                   \
  }
BRAZE_ATOMIC_ADD_HALF(braze_atomic_add_f16, braze_h2f, braze_f2h)
BRAZE_ATOMIC_ADD_HALF(braze_atomic_add_bf16, braze_bf2f, braze_f2bf)
#undef BRAZE_ATOMIC_ADD_HALF
// The device library's reciprocal square root (one instruction in f32, within 2 ulp), which
// PyTorch's CUDA kernels call for rsqrt and inside batch norm.
BRAZE_FN float braze_rsqrt(float x) { return ::rsqrtf(x); }
BRAZE_FN double braze_rsqrt(double x) { return ::rsqrt(x); }
// The CPU target inlines its own float exp; here the device library's is the one.
template <typename T> BRAZE_FN auto braze_exp(T x) -> decltype(std::exp(x)) { return std::exp(x); }
// Clamps of an index that provably lies in int's range (Names::pointIndex).
BRAZE_FN int braze_imin32(int a, int b) { return a < b ? a : b; }
BRAZE_FN int braze_imax32(int a, int b) { return a > b ? a : b; }
)PRELUDE";

const char *kCudaHelpers = R"PRELUDE(
// An accumulating scatter's products, maxima and minima (braze_max and braze_min keep a NaN,
// as eager's scatter_reduce, and the held value where the two are equal): a compare-and-swap of
// the element's bits until no other thread changed it in between.
template <typename T> BRAZE_FN T braze_combine_prod(T held, T v) { return held * v; }
template <typename T> BRAZE_FN T braze_combine_max(T held, T v) { return braze_max(v, held); }
template <typename T> BRAZE_FN T braze_combine_min(T held, T v) { return braze_min(v, held); }
#define BRAZE_ATOMIC_COMBINE(OP, T, W, TO_W, FROM_W)                                         \
  BRAZE_FN void braze_atomic_##OP(T* p, T v) {                                               \
    W* q = (W*)p;                                                                            \
    W old = *q, seen;                                                                        \
    do {                                                                                     \
      seen = old;                                                                            \
      old = atomicCAS(q, seen, TO_W(braze_combine_##OP(FROM_W(seen), v)));                   \
    } while (old != seen);                                                                   \
  }
#define BRAZE_ATOMIC_COMBINES(T, W, TO_W, FROM_W)                                            \
  BRAZE_ATOMIC_COMBINE(prod, T, W, TO_W, FROM_W)                                             \
  BRAZE_ATOMIC_COMBINE(max, T, W, TO_W, FROM_W)                                              \
  BRAZE_ATOMIC_COMBINE(min, T, W, TO_W, FROM_W)
BRAZE_FN unsigned long long braze_bits(double x) { return (unsigned long long)__double_as_longlong(x); }
BRAZE_FN double braze_f64(unsigned long long b) { return __longlong_as_double((long long)b); }
BRAZE_FN unsigned long long braze_bits(int64_t x) { return (unsigned long long)x; }
BRAZE_FN int64_t braze_i64(unsigned long long b) { return (int64_t)b; }
BRAZE_ATOMIC_COMBINES(float, unsigned int, __float_as_uint, __uint_as_float)
BRAZE_ATOMIC_COMBINES(double, unsigned long long, braze_bits, braze_f64)
BRAZE_ATOMIC_COMBINES(int32_t, int, (int), (int32_t))
BRAZE_ATOMIC_COMBINES(int64_t, unsigned long long, braze_bits, braze_i64)
#undef BRAZE_ATOMIC_COMBINES
#undef BRAZE_ATOMIC_COMBINE
// N elements of T moved as whole 2..16-byte words (16-byte pieces beyond that); both pointers
// are aligned to min(16, N * sizeof(T)) bytes.
template <int B> struct braze_word;
template <> struct braze_word<2> { typedef unsigned short type; };
template <> struct braze_word<4> { typedef unsigned int type; };
template <> struct braze_word<8> { typedef uint2 type; };
template <> struct braze_word<16> { typedef uint4 type; };
template <int N, typename T> BRAZE_FN void braze_vcopy(T* dst, const T* src) {
  constexpr int B = N * (int)sizeof(T);
  if constexpr (B <= 16) {
    typedef typename braze_word<B>::type W;
    *reinterpret_cast<W*>(dst) = *reinterpret_cast<const W*>(src);
  } else {
#pragma unroll
    for (int i = 0; i < B / 16; ++i) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  }
}
template <int N, typename T> BRAZE_FN bool braze_aligned(const T* p) {
  constexpr int B = N * (int)sizeof(T) < 16 ? N * (int)sizeof(T) : 16;
  return ((uintptr_t)p & (uintptr_t)(B - 1)) == 0;
}
// A value from the lane `o` places away (xor) in the warp, for any type of up to 8 bytes.
template <typename T> BRAZE_FN T braze_shfl_xor(T v, int o) {
  if constexpr (sizeof(T) == 8) {
    long long x;
    memcpy(&x, &v, 8);
    x = __shfl_xor_sync(0xffffffffu, x, o);
    memcpy(&v, &x, 8);
  } else {
    int x = 0;
    memcpy(&x, &v, sizeof(T));
    x = __shfl_xor_sync(0xffffffffu, x, o);
    memcpy(&v, &x, sizeof(T));
  }
  return v;
}
// argmax/argmin combine: does (ov, oi) replace (v, i)? NaN is the extreme; ties take the first.
template <bool MAX, typename T> BRAZE_FN bool braze_arg_takes(T v, int64_t i, T ov, int64_t oi) {
  bool vn = v != v, on = ov != ov;
  if (vn || on) return on && (!vn || oi < i);
  if (MAX ? ov > v : ov < v) return true;
  return ov == v && oi < i;
}
)PRELUDE";

} // namespace

std::string cudaPrelude() {
  return std::string(kCudaHeader) + cCommonHelpers() + kCudaHelpers;
}

} // namespace braze::codegen
