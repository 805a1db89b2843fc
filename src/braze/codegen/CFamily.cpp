#include "braze/codegen/CFamily.h"

#include "braze/support/Check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace braze::codegen {

using loop::ScalarOpKind;

std::string ctype(DType t) {
  switch (t) {
  case DType::Bool:
    return "bool";
  case DType::UInt8:
    return "uint8_t";
  case DType::Int8:
    return "int8_t";
  case DType::Int16:
    return "int16_t";
  case DType::Int32:
    return "int32_t";
  case DType::Int64:
    return "int64_t";
  case DType::Float16:
  case DType::BFloat16:
    return "uint16_t";
  case DType::Float32:
    return "float";
  case DType::Float64:
    return "double";
  }
  BRAZE_UNREACHABLE("bad dtype");
}

std::string literal(double value, int64_t ivalue, DType t) {
  if (t == DType::Bool)
    return ivalue ? "true" : "false";
  if (!isFloating(t))
    return "((" + ctype(t) + ")INT64_C(" + std::to_string(ivalue) + "))";
  if (std::isnan(value))
    return t == DType::Float64 ? "((double)NAN)" : "((float)NAN)";
  if (std::isinf(value)) {
    std::string s = t == DType::Float64 ? "((double)INFINITY)" : "((float)INFINITY)";
    return value < 0 ? "(-" + s + ")" : s;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  if (t != DType::Float64)
    s += "f";
  return "(" + s + ")";
}

std::string convert(const std::string &x, DType from, DType to) {
  if (from == to)
    return x;
  std::string v = x;
  DType cur = from;
  if (from == DType::Float16)
    v = "braze_h2f(" + x + ")", cur = DType::Float32;
  else if (from == DType::BFloat16)
    v = "braze_bf2f(" + x + ")", cur = DType::Float32;
  if (cur == to)
    return v;
  if (to == DType::Float16)
    return "braze_f2h((float)(" + v + "))";
  if (to == DType::BFloat16)
    return "braze_f2bf((float)(" + v + "))";
  if (to == DType::Bool)
    return "((" + v + ") != 0)";
  return "((" + ctype(to) + ")(" + v + "))";
}

namespace {
std::string call(const char *f, const std::vector<std::string> &a) {
  std::string s = std::string(f) + "(";
  for (size_t i = 0; i < a.size(); ++i)
    s += (i ? ", " : "") + a[i];
  return s + ")";
}
std::string wrap(DType t, const std::string &x) { return "((" + ctype(t) + ")(" + x + "))"; }
/// The C operator of a comparison, logical or bitwise op (logical xor compares truth values).
std::string infix(ScalarOpKind op) {
  switch (op) {
  case ScalarOpKind::Eq:
    return "==";
  case ScalarOpKind::Ne:
  case ScalarOpKind::LogicalXor:
    return "!=";
  case ScalarOpKind::Lt:
    return "<";
  case ScalarOpKind::Le:
    return "<=";
  case ScalarOpKind::Gt:
    return ">";
  case ScalarOpKind::Ge:
    return ">=";
  case ScalarOpKind::LogicalAnd:
    return "&&";
  case ScalarOpKind::LogicalOr:
    return "||";
  case ScalarOpKind::BitwiseAnd:
    return "&";
  case ScalarOpKind::BitwiseOr:
    return "|";
  case ScalarOpKind::BitwiseXor:
    return "^";
  default:
    BRAZE_UNREACHABLE("no infix operator for " << loop::scalarOpName(op));
  }
}
/// prefix + the op's text name, e.g. braze_sp_digamma; with `t`, the template for t's C type.
std::string named(const char *prefix, ScalarOpKind op) {
  return prefix + std::string(loop::scalarOpName(op));
}
std::string typed(const std::string &f, DType t) { return f + "<" + ctype(t) + ">"; }

/// A small constant exponent that PyTorch special-cases (x*x, x*x*x, sqrt, 1/x...).
bool constExponent(const loop::Expr *e, double &v) {
  if (!e || e->operands().size() != 2)
    return false;
  const loop::Expr *b = e->operands()[1];
  while (b->kind() == loop::ExprKind::Op && b->op() == ScalarOpKind::Cast)
    b = b->operands()[0];
  if (b->kind() != loop::ExprKind::Const)
    return false;
  v = b->floatValue();
  return true;
}
} // namespace

std::string scalarOp(ScalarOpKind op, DType t, const std::vector<std::string> &a,
                     const std::vector<DType> &at, const loop::Expr *e) {
  bool fl = isFloating(t);
  DType in = at.empty() ? t : at[0];
  bool inFloat = isFloating(in);
  const std::string &x = a[0];
  switch (op) {
  case ScalarOpKind::Neg:
    return wrap(t, "-" + x);
  case ScalarOpKind::Abs:
    return inFloat ? call("std::fabs", a) : (t == DType::Bool ? x : wrap(t, x + " < 0 ? -" + x + " : " + x));
  case ScalarOpKind::Exp:
    return call("braze_exp", a);
  case ScalarOpKind::Exp2:
    return call("std::exp2", a);
  case ScalarOpKind::Expm1:
    return call("std::expm1", a);
  case ScalarOpKind::Log:
    return call("std::log", a);
  case ScalarOpKind::Log2:
    return call("std::log2", a);
  case ScalarOpKind::Log10:
    return call("std::log10", a);
  case ScalarOpKind::Log1p:
    return call("std::log1p", a);
  case ScalarOpKind::Sqrt:
    return call("std::sqrt", a);
  case ScalarOpKind::Rsqrt: // each target's prelude defines braze_rsqrt as its eager does
    return wrap(t, "braze_rsqrt((" + ctype(t) + ")(" + x + "))");
  case ScalarOpKind::Sin:
    return call("std::sin", a);
  case ScalarOpKind::Cos:
    return call("std::cos", a);
  case ScalarOpKind::Tan:
    return call("std::tan", a);
  case ScalarOpKind::Asin:
    return call("std::asin", a);
  case ScalarOpKind::Acos:
    return call("std::acos", a);
  case ScalarOpKind::Atan:
    return call("std::atan", a);
  case ScalarOpKind::Sinh:
    return call("std::sinh", a);
  case ScalarOpKind::Cosh:
    return call("std::cosh", a);
  case ScalarOpKind::Tanh:
    return call("std::tanh", a);
  case ScalarOpKind::Asinh:
    return call("std::asinh", a);
  case ScalarOpKind::Acosh:
    return call("std::acosh", a);
  case ScalarOpKind::Atanh:
    return call("std::atanh", a);
  case ScalarOpKind::Erf:
    return call("std::erf", a);
  case ScalarOpKind::Erfc:
    return call("std::erfc", a);
  case ScalarOpKind::Lgamma:
    return call("std::lgamma", a);
  case ScalarOpKind::Sigmoid:
    return wrap(t, "1 / (1 + braze_exp(-" + x + "))");
  case ScalarOpKind::Sign:
    return t == DType::Bool ? x : wrap(t, "(" + x + " > 0) - (" + x + " < 0)");
  case ScalarOpKind::Floor:
    return inFloat ? call("std::floor", a) : x;
  case ScalarOpKind::Ceil:
    return inFloat ? call("std::ceil", a) : x;
  case ScalarOpKind::Round:
    return inFloat ? call("std::nearbyint", a) : x;
  case ScalarOpKind::Trunc:
    return inFloat ? call("std::trunc", a) : x;
  case ScalarOpKind::Reciprocal:
    return wrap(t, "1 / " + x);
  case ScalarOpKind::Relu:
    return t == DType::Bool ? x : wrap(t, x + " < 0 ? 0 : " + x);
  case ScalarOpKind::IsNan:
    return inFloat ? "(" + x + " != " + x + ")" : "false";
  case ScalarOpKind::IsInf:
    return inFloat ? call("std::isinf", a) : "false";
  case ScalarOpKind::LogicalNot:
    return "(!(" + x + "))";
  case ScalarOpKind::BitwiseNot:
    return t == DType::Bool ? "(!(" + x + "))" : wrap(t, "~" + x);
  case ScalarOpKind::Add:
    return t == DType::Bool ? "(" + x + " || " + a[1] + ")" : wrap(t, x + " + " + a[1]);
  case ScalarOpKind::Sub:
    return wrap(t, x + " - " + a[1]);
  case ScalarOpKind::Mul:
    return t == DType::Bool ? "(" + x + " && " + a[1] + ")" : wrap(t, x + " * " + a[1]);
  case ScalarOpKind::Div:
    return wrap(t, x + " / " + a[1]);
  case ScalarOpKind::FloorDiv:
    return fl ? call("braze_floordiv_float", a) : wrap(t, call("braze_floordiv_int", a));
  case ScalarOpKind::Remainder:
    return fl ? call("braze_remainder_float", a) : wrap(t, call("braze_remainder_int", a));
  case ScalarOpKind::Fmod:
    return fl ? call("std::fmod", a) : wrap(t, call("braze_fmod_int", a));
  case ScalarOpKind::Pow: {
    double v;
    if (fl && constExponent(e, v)) {
      if (v == 2)
        return wrap(t, x + " * " + x);
      if (v == 3)
        return wrap(t, x + " * " + x + " * " + x);
      if (v == 1)
        return x;
      if (v == 0.5)
        return call("std::sqrt", {x});
      if (v == -1)
        return wrap(t, "1 / " + x);
      if (v == -2)
        return wrap(t, "1 / (" + x + " * " + x + ")");
      if (v == -0.5)
        return wrap(t, "1 / std::sqrt(" + x + ")");
    }
    return fl ? wrap(t, call("std::pow", a)) : wrap(t, call("braze_pow_int", a));
  }
  case ScalarOpKind::Atan2:
    return call("std::atan2", a);
  case ScalarOpKind::CopySign:
    return call("std::copysign", a);
  case ScalarOpKind::Maximum:
    return call("braze_max", a);
  case ScalarOpKind::Minimum:
    return call("braze_min", a);
  case ScalarOpKind::Eq:
  case ScalarOpKind::Ne:
  case ScalarOpKind::Lt:
  case ScalarOpKind::Le:
  case ScalarOpKind::Gt:
  case ScalarOpKind::Ge:
    return "(" + x + " " + infix(op) + " " + a[1] + ")";
  case ScalarOpKind::LogicalAnd:
  case ScalarOpKind::LogicalOr:
  case ScalarOpKind::LogicalXor: // of the operands' truth values
    return "((" + x + " != 0) " + infix(op) + " (" + a[1] + " != 0))";
  case ScalarOpKind::BitwiseAnd:
  case ScalarOpKind::BitwiseOr:
  case ScalarOpKind::BitwiseXor:
    return wrap(t, x + " " + infix(op) + " " + a[1]);
  case ScalarOpKind::Where:
    return "(" + x + " ? " + a[1] + " : " + a[2] + ")";
  case ScalarOpKind::PhiloxUniform:
    return wrap(t, "braze_philox_uniform((uint64_t)(" + x + "), (uint64_t)(" + a[1] + "))");
  case ScalarOpKind::Cast:
    return convert(x, in, t);
  // Special functions: braze_sp_<name> from specialMathPrelude(), computed in double and
  // rounded once; polygamma, erfcx and the polynomials are templates over the result's float
  // type because parts of them round in that type, as eager does.
  case ScalarOpKind::Digamma:
  case ScalarOpKind::Zeta:
  case ScalarOpKind::Erfinv:
  case ScalarOpKind::Ndtri:
  case ScalarOpKind::BesselI0:
  case ScalarOpKind::BesselI0e:
  case ScalarOpKind::BesselI1:
  case ScalarOpKind::BesselI1e:
  case ScalarOpKind::BesselK0:
  case ScalarOpKind::BesselK0e:
  case ScalarOpKind::BesselK1:
  case ScalarOpKind::BesselK1e:
  case ScalarOpKind::BesselJ0:
  case ScalarOpKind::BesselJ1:
  case ScalarOpKind::BesselY0:
  case ScalarOpKind::BesselY1:
  case ScalarOpKind::SphericalBesselJ0:
  case ScalarOpKind::AiryAi:
  case ScalarOpKind::Igamma:
  case ScalarOpKind::Igammac:
    return wrap(t, call(named("braze_sp_", op).c_str(), a));
  case ScalarOpKind::Polygamma:
  case ScalarOpKind::Erfcx:
  case ScalarOpKind::ChebyshevT:
  case ScalarOpKind::ChebyshevU:
  case ScalarOpKind::ChebyshevV:
  case ScalarOpKind::ChebyshevW:
  case ScalarOpKind::ShiftedChebyshevT:
  case ScalarOpKind::ShiftedChebyshevU:
  case ScalarOpKind::ShiftedChebyshevV:
  case ScalarOpKind::ShiftedChebyshevW:
  case ScalarOpKind::HermiteH:
  case ScalarOpKind::HermiteHe:
  case ScalarOpKind::LaguerreL:
  case ScalarOpKind::LegendreP:
    return wrap(t, call(typed(named("braze_sp_", op), t).c_str(), a));
  // Prelude helpers for integers and float bits: templates over the result's C type.
  case ScalarOpKind::Hypot:
    return call("std::hypot", a);
  case ScalarOpKind::NextAfter:
    return call("std::nextafter", a);
  case ScalarOpKind::Gcd:
  case ScalarOpKind::Lcm:
  case ScalarOpKind::ShiftLeft:
  case ScalarOpKind::ShiftRight:
  case ScalarOpKind::FrexpMantissa:
  case ScalarOpKind::FrexpExponent:
    return wrap(t, call(typed(named("braze_", op), t).c_str(), a));
  case ScalarOpKind::NextAfterF16:
  case ScalarOpKind::NextAfterBF16:
    return call(named("braze_", op).c_str(), a);
  }
  BRAZE_UNREACHABLE("bad scalar op");
}

namespace {

/// Whether e is >= 0 by its form alone: constants >= 0, symbols (sizes, and indices within
/// their ranges), and sums, products, quotients and minima of such terms, maxima with one such
/// side, remainders by one.
bool nonNegativeForm(sym::SymExpr e) {
  using sym::SymKind;
  switch (e->kind()) {
  case SymKind::Const:
    return e->value() >= 0;
  case SymKind::Symbol:
    return true;
  case SymKind::Add:
  case SymKind::Mul:
    return std::all_of(e->operands().begin(), e->operands().end(), nonNegativeForm);
  case SymKind::FloorDiv:
  case SymKind::Min:
    return nonNegativeForm(e->lhs()) && nonNegativeForm(e->rhs());
  case SymKind::Max:
    return nonNegativeForm(e->lhs()) || nonNegativeForm(e->rhs());
  case SymKind::Mod:
    return nonNegativeForm(e->rhs());
  }
  return false;
}

} // namespace

std::optional<IndexRange> indexRange(sym::SymExpr e, const SymbolRanges &symbolRange,
                                     int64_t limit) {
  using sym::SymKind;
  // Every part's range, as it is found, must lie within +-limit (<= 2^62, so that a sum of two
  // stays within int64 and a product is checked in long double before it is taken).
  limit = std::min(limit, int64_t(1) << 62);
  auto within = [&](std::optional<IndexRange> r) -> std::optional<IndexRange> {
    if (!r || r->lo < -limit || r->hi > limit)
      return std::nullopt;
    return r;
  };
  auto part = [&](sym::SymExpr o) { return indexRange(o, symbolRange, limit); };
  switch (e->kind()) {
  case SymKind::Const:
    return within(IndexRange{e->value(), e->value()});
  case SymKind::Symbol:
    return within(symbolRange(e));
  case SymKind::Add:
  case SymKind::Mul: {
    std::optional<IndexRange> r = part(e->operands()[0]);
    for (size_t i = 1; r && i < e->operands().size(); ++i) {
      std::optional<IndexRange> x = part(e->operands()[i]);
      if (!x)
        return std::nullopt;
      if (e->kind() == SymKind::Add) {
        r = within(IndexRange{r->lo + x->lo, r->hi + x->hi});
        continue;
      }
      long double c[] = {(long double)r->lo * x->lo, (long double)r->lo * x->hi,
                         (long double)r->hi * x->lo, (long double)r->hi * x->hi};
      long double lo = *std::min_element(c, c + 4), hi = *std::max_element(c, c + 4);
      if (lo < -(long double)limit || hi > (long double)limit)
        return std::nullopt;
      r = IndexRange{int64_t(lo), int64_t(hi)};
    }
    return r;
  }
  case SymKind::FloorDiv:
  case SymKind::Mod: {
    std::optional<IndexRange> a = part(e->lhs());
    if (!a || !e->rhs()->isConst() || e->rhs()->value() <= 0)
      return std::nullopt;
    int64_t c = e->rhs()->value();
    if (e->kind() == SymKind::FloorDiv)
      return IndexRange{sym::floorDiv(a->lo, c), sym::floorDiv(a->hi, c)};
    return within(a->lo >= 0 && a->hi < c ? *a : IndexRange{0, c - 1});
  }
  case SymKind::Min:
  case SymKind::Max: {
    std::optional<IndexRange> a = part(e->lhs()), b = part(e->rhs());
    if (!a || !b)
      return std::nullopt;
    if (e->kind() == SymKind::Min)
      return IndexRange{std::min(a->lo, b->lo), std::min(a->hi, b->hi)};
    return IndexRange{std::max(a->lo, b->lo), std::max(a->hi, b->hi)};
  }
  }
  BRAZE_UNREACHABLE("bad SymKind");
}

bool fitsNarrowIndex(sym::SymExpr e, const SymbolRanges &symbolRange) {
  // Half of int's range: an index a lane or a step past its loop's end (computed, then
  // guarded) still cannot overflow.
  return indexRange(e, symbolRange, int64_t(1) << 30).has_value();
}

std::string indexExpr(sym::SymExpr e, const std::function<std::string(sym::SymExpr)> &nameOf,
                      bool narrow) {
  using sym::SymKind;
  auto sub = [&](sym::SymExpr o) { return indexExpr(o, nameOf, narrow); };
  // A quotient or remainder of a value >= 0 by a constant > 0 is C's own: the compiler turns it
  // into multiplies and shifts, and a loop whose index has it still vectorizes.
  if ((e->kind() == SymKind::FloorDiv || e->kind() == SymKind::Mod) && e->rhs()->isConst() &&
      e->rhs()->value() > 0 && nonNegativeForm(e->lhs()))
    return "(" + sub(e->lhs()) + (e->kind() == SymKind::Mod ? " % " : " / ") + sub(e->rhs()) + ")";
  switch (e->kind()) {
  case SymKind::Const:
    if (narrow)
      return e->value() < 0 ? "(" + std::to_string(e->value()) + ")" : std::to_string(e->value());
    return e->value() < 0 ? "(INT64_C(" + std::to_string(e->value()) + "))"
                          : "INT64_C(" + std::to_string(e->value()) + ")";
  case SymKind::Symbol:
    return narrow ? "(int)" + nameOf(e) : nameOf(e);
  case SymKind::Add:
  case SymKind::Mul: {
    std::string s = "(";
    for (size_t i = 0; i < e->operands().size(); ++i)
      s += (i ? (e->kind() == SymKind::Add ? " + " : " * ") : "") + sub(e->operands()[i]);
    return s + ")";
  }
  case SymKind::FloorDiv:
    return "braze_floordiv_int(" + sub(e->lhs()) + ", " + sub(e->rhs()) + ")";
  case SymKind::Mod:
    return "braze_remainder_int(" + sub(e->lhs()) + ", " + sub(e->rhs()) + ")";
  case SymKind::Min:
    return std::string(narrow ? "braze_imin32(" : "braze_imin(") + sub(e->lhs()) + ", " +
           sub(e->rhs()) + ")";
  case SymKind::Max:
    return std::string(narrow ? "braze_imax32(" : "braze_imax(") + sub(e->lhs()) + ", " +
           sub(e->rhs()) + ")";
  }
  BRAZE_UNREACHABLE("bad SymKind");
}

namespace {

/// The CPU module's header: the C++ library, libmvec declarations, 16-bit float conversions.
const char *kCpuHeader = R"PRELUDE(#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

// Vector variants of libm (glibc's libmvec) so that loops calling transcendental functions
// vectorize without -ffast-math. glibc >= 2.35 has the full set; older ones the basic four.
#if defined(__x86_64__) && defined(__GLIBC__) && defined(_OPENMP)
#define BRAZE_SIMD_MATH(name) \
  _Pragma("omp declare simd notinbranch") float name##f(float); \
  _Pragma("omp declare simd notinbranch") double name(double);
extern "C" {
BRAZE_SIMD_MATH(sin) BRAZE_SIMD_MATH(cos) BRAZE_SIMD_MATH(exp) BRAZE_SIMD_MATH(log)
#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35)
BRAZE_SIMD_MATH(tan) BRAZE_SIMD_MATH(exp2) BRAZE_SIMD_MATH(expm1) BRAZE_SIMD_MATH(log2)
BRAZE_SIMD_MATH(log10) BRAZE_SIMD_MATH(log1p) BRAZE_SIMD_MATH(sinh) BRAZE_SIMD_MATH(cosh)
BRAZE_SIMD_MATH(tanh) BRAZE_SIMD_MATH(asin) BRAZE_SIMD_MATH(acos) BRAZE_SIMD_MATH(atan)
BRAZE_SIMD_MATH(asinh) BRAZE_SIMD_MATH(acosh) BRAZE_SIMD_MATH(atanh) BRAZE_SIMD_MATH(erf)
BRAZE_SIMD_MATH(erfc)
#endif
}
#undef BRAZE_SIMD_MATH
#endif

#define BRAZE_FN static inline
static inline float braze_h2f(uint16_t h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline uint16_t braze_f2h(float f) { _Float16 v = (_Float16)f; uint16_t h; std::memcpy(&h, &v, 2); return h; }
static inline float braze_bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
// 1/sqrt(x) correctly rounded twice, as PyTorch's CPU kernels compute rsqrt.
static inline float braze_rsqrt(float x) { return 1 / std::sqrt(x); }
static inline double braze_rsqrt(double x) { return 1 / std::sqrt(x); }
static inline uint16_t braze_f2bf(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
// exp of a float, inline so that `omp simd` loops vectorize it without a call per vector:
// x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), exp(r) by a degree-7 polynomial, and
// 2^n applied as two normal factors so that subnormal results round once. Within 1.01 ulp of
// the exact exp over every float, overflow, underflow, infinities and NaN included
// (tests/cpp/ExpTest.cpp). Other types use the math library.
static inline float braze_exp(float x) {
  float c = x > 88.7228394f ? 88.7228394f : x;
  c = c < -103.972084f ? -103.972084f : c;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float t = __builtin_fmaf(c, 1.44269504088896341f, shifter);
  float n = t - shifter;
  int32_t tb; std::memcpy(&tb, &t, 4);
  int32_t ni = tb - 0x4b400000;
  float r = __builtin_fmaf(n, -0.693145751953125f, c);
  r = __builtin_fmaf(n, -1.42860682030941723212e-6f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  p = __builtin_fmaf(p, r * r, r) + 1.0f;
  int32_t n1 = ni >> 1, n2 = ni - n1;
  uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
  float s1, s2; std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  y = x > 88.7228394f ? std::numeric_limits<float>::infinity() : y;
  y = x < -103.972084f ? 0.0f : y;
  return y; // a NaN x is NaN through the clamps (their compares are false) and the arithmetic
}
template <typename T> static inline auto braze_exp(T x) -> decltype(std::exp(x)) { return std::exp(x); }
)PRELUDE";

/// Helpers shared by every C-family target; BRAZE_FN is the target's inline-function prefix and
/// std:: names the target's math library.
/// Integer floor division, remainder, min and max: what index expressions (indexExpr) call, in
/// kernels and in host code alike. min and max take values, not references (std::min's
/// reference parameters make GCC keep per-lane temporaries in memory inside `omp simd` loops,
/// which stops their vectorization).
const char *kIndexHelpers = R"PRELUDE(BRAZE_FN int64_t braze_imin(int64_t a, int64_t b) { return a < b ? a : b; }
BRAZE_FN int64_t braze_imax(int64_t a, int64_t b) { return a > b ? a : b; }
template <typename T> BRAZE_FN T braze_floordiv_int(T a, T b) {
  if (b == 0) return 0;
  T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> BRAZE_FN T braze_remainder_int(T a, T b) {
  if (b == 0) return 0;
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
)PRELUDE";

const char *kCommonHelpers = R"PRELUDE(template <typename T> BRAZE_FN T braze_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> BRAZE_FN T braze_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> BRAZE_FN T braze_fmod_int(T a, T b) { return b == 0 ? 0 : a % b; }
template <typename T> BRAZE_FN T braze_remainder_float(T a, T b) {
  T r = std::fmod(a, b);
  return (r != 0 && ((b < 0) != (r < 0))) ? r + b : r;
}
template <typename T> BRAZE_FN T braze_floordiv_float(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  if (div == 0) return std::copysign(T(0), a / b);
  T fl = std::floor(div);
  return (div - fl > T(0.5)) ? fl + 1 : fl;
}
template <typename T> BRAZE_FN T braze_pow_int(T a, T b) {
  if (b < 0) return (a == 1) ? 1 : ((a == -1) ? ((b % 2) ? -1 : 1) : 0);
  T r = 1;
  while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
  return r;
}
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): the first
// output word of the block for `counter`, keyed by `seed`, as a float in [0, 1).
BRAZE_FN float braze_philox_uniform(uint64_t seed, uint64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}
// misc family: nextafter on 16-bit float patterns: one step away from or toward zero.
BRAZE_FN uint16_t braze_nextafter_bits(uint16_t a, uint16_t b) {
  const uint16_t sign = 0x8000u;
  if (a == b) return a;
  uint16_t ma = a & 0x7fffu, mb = b & 0x7fffu;
  if (ma == 0) return mb == 0 ? b : (uint16_t)((b & sign) | 1u);
  return (ma > mb || ((a ^ b) & sign)) ? (uint16_t)(a - 1u) : (uint16_t)(a + 1u);
}
BRAZE_FN float braze_nextafter_f16(float x, float y) {
  if (x != x || y != y) return x + y;
  return braze_h2f(braze_nextafter_bits(braze_f2h(x), braze_f2h(y)));
}
BRAZE_FN float braze_nextafter_bf16(float x, float y) {
  if (x != x || y != y) return x + y;
  return braze_bf2f(braze_nextafter_bits(braze_f2bf(x), braze_f2bf(y)));
}
// misc family. gcd and lcm as PyTorch computes them (Euclid on absolute values).
template <typename T> BRAZE_FN T braze_gcd(T a, T b) {
  a = (T)(a < 0 ? -a : a); b = (T)(b < 0 ? -b : b);
  while (a != 0) { T c = a; a = (T)(b % a); b = c; }
  return b;
}
template <typename T> BRAZE_FN T braze_lcm(T a, T b) {
  T g = braze_gcd(a, b);
  if (g == 0) return 0;
  int64_t r = (int64_t)(a / g) * (int64_t)b;  // in a wide type, then wrapped, as eager does
  return (T)(r < 0 ? -r : r);
}
// Shift counts outside [0, bits) give 0 (left) or the sign fill (right), as in PyTorch.
template <typename T> BRAZE_FN T braze_shift_left(T a, T b) {
  constexpr int64_t bits = sizeof(T) * 8;
  if ((int64_t)b < 0 || (int64_t)b >= bits) return 0;
  return (T)((uint64_t)a << (int)b);
}
template <typename T> BRAZE_FN T braze_shift_right(T a, T b) {
  constexpr int64_t bits = sizeof(T) * 8 - (std::numeric_limits<T>::is_signed ? 1 : 0);
  if ((int64_t)b < 0 || (int64_t)b >= bits) return (T)(a >> bits);
  return (T)(a >> (int)b);
}
template <typename T> BRAZE_FN T braze_frexp_mantissa(T x) { int e; return std::frexp(x, &e); }
template <typename T> BRAZE_FN T braze_frexp_exponent(T x) { int e; std::frexp(x, &e); return (T)e; }
)PRELUDE";

} // namespace

std::string cPrelude() { return std::string(kCpuHeader) + kIndexHelpers + kCommonHelpers; }

std::string cCommonHelpers() { return std::string(kIndexHelpers) + kCommonHelpers; }

const char *cIndexHelpers() { return kIndexHelpers; }

} // namespace braze::codegen
