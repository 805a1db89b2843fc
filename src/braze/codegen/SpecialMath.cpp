/// The special functions of generated code (digamma, polygamma, Hurwitz zeta, the regularized
/// incomplete gamma functions, erfcx, erfinv, ndtri, Bessel and Airy functions, orthogonal
/// polynomials) as C++ text. The routines compute in double and a float, f16 or bf16 result
/// rounds that once; the few steps where PyTorch's float kernels round in float (trigamma's
/// reflection, erfcx's 2 exp(x^2), the polynomial recurrences) do so in the result's type too,
/// so that results agree where those roundings dominate. Edge cases (poles, NaN, infinities,
/// arguments outside the domain) follow PyTorch's CPU kernels.
///
/// The methods are textbook ones: power series (summed in BRAZE_SP_WIDE where they cancel),
/// asymptotic expansions past the point where their smallest term is below double precision,
/// Euler-Maclaurin summation for zeta, Halley's iteration for the inverses, Legendre's continued
/// fraction for the upper incomplete gamma, the trapezoidal rule on
/// K_nu(x) = int_0^inf exp(-x cosh t) cosh(nu t) dt (exponentially accurate for an analytic,
/// rapidly decaying integrand), and the three-term recurrences of the polynomials.
#include "braze/codegen/SpecialMath.h"

namespace braze::codegen {

namespace {

// Both targets compile one text. BRAZE_SP_WIDE is the type of the series that cancel: long
// double on the CPU; CUDA has no wider type than double, which keeps these series within the
// tolerance of f64 (their largest terms reach about 1e8 times the result).
const char *kCpuQualifiers = R"PRELUDE(
// ---- Special functions --------------------------------------------------------------------
#define BRAZE_SP_FN static inline
#define BRAZE_SP_TABLE static const
#define BRAZE_SP_WIDE long double
#define BRAZE_SP_W(x) x##L
)PRELUDE";

const char *kCudaQualifiers = R"PRELUDE(
// ---- Special functions --------------------------------------------------------------------
#define BRAZE_SP_FN static __device__
#define BRAZE_SP_TABLE const
#define BRAZE_SP_WIDE double
#define BRAZE_SP_W(x) x
)PRELUDE";

const char *kFunctions = R"PRELUDE(
static constexpr double braze_sp_pi_ = 3.14159265358979323846;
static constexpr double braze_sp_euler_ = 0.57721566490153286061;

// Digamma: reflection psi(x) = psi(1-x) - pi/tan(pi x) for x < 0, the recurrence
// psi(x) = psi(x+1) - 1/x up to x >= 10, then the asymptotic series with Bernoulli numbers.
BRAZE_SP_FN double braze_sp_digamma(double x) {
  if (x == 0) return std::copysign(INFINITY, -x);
  double acc = 0;
  if (x < 0) {
    if (x == std::floor(x)) return NAN;
    double r = x - std::nearbyint(x); // exact; tan(pi x) has period 1
    acc = -braze_sp_pi_ / std::tan(braze_sp_pi_ * r);
    x = 1 - x;
  }
  while (x < 10) { acc -= 1 / x; x += 1; }
  double z = 1 / (x * x);
  double tail = z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 -
                z * (691.0 / 32760 - z / 12))))));
  return acc + std::log(x) - 0.5 / x - tail;
}

// Trigamma: reflection psi1(x) = pi^2/sin^2(pi x) - psi1(1-x) for x < 1/2, the recurrence
// psi1(x) = psi1(x+1) + 1/x^2, then the asymptotic series at x >= 6. The reflection term is
// evaluated in T, as PyTorch does (its rounding dominates the float result for x < 0).
template <typename T> BRAZE_SP_FN double braze_sp_trigamma(T xt) {
  double sign = 1, acc = 0, x = xt;
  if (xt < (T)0.5) {
    sign = -1;
    const T pi = (T)braze_sp_pi_, s = std::sin(pi * xt);
    acc -= (double)(pi * pi / (s * s));
    x = 1 - x;
  }
  for (int i = 0; i < 6; ++i) { acc += 1 / (x * x); x += 1; }
  double z = 1 / (x * x);
  acc += (1 + 0.5 / x + z * (1.0 / 6 - z * (1.0 / 30 - z * (1.0 / 42 - z * (1.0 / 30 -
          z * (5.0 / 66 - z * (691.0 / 2730 - z * 7.0 / 6))))))) / x;
  return sign * acc;
}

// Hurwitz zeta(x, q) = sum_{k>=0} (q+k)^-x by Euler-Maclaurin summation: direct terms up to
// a = q + N >= 9, the integral and half-term corrections, then B_2j/(2j)! x(x+1)...(x+2j-2)
// a^(1-x-2j) until a term is below double precision.
BRAZE_SP_FN double braze_sp_zeta(double x, double q) {
  BRAZE_SP_TABLE double kFactorialOverBernoulli[12] = {
      2.0 / (1.0 / 6), 24.0 / (-1.0 / 30), 720.0 / (1.0 / 42), 40320.0 / (-1.0 / 30),
      3628800.0 / (5.0 / 66), 479001600.0 / (-691.0 / 2730), 87178291200.0 / (7.0 / 6),
      20922789888000.0 / (-3617.0 / 510), 6402373705728000.0 / (43867.0 / 798),
      2432902008176640000.0 / (-174611.0 / 330), 1.1240007277776077e21 / (854513.0 / 138),
      6.2044840173323941e23 / (-236364091.0 / 2730)};
  const double eps = 1.1102230246251565e-16;
  if (x == 1) return INFINITY;
  if (x < 1) return NAN;
  if (q <= 0) {
    if (q == std::floor(q)) return INFINITY;
    if (x != std::floor(x)) return NAN; // (q+k)^-x is complex
  }
  double s = std::pow(q, -x), a = q, b = 0;
  int i = 0;
  while (i < 9 || a <= 9) {
    ++i;
    a += 1;
    b = std::pow(a, -x);
    s += b;
    if (std::fabs(b / s) < eps) return s;
  }
  double w = a;
  s += b * w / (x - 1);
  s -= 0.5 * b;
  double rising = 1, k = 0;
  for (int j = 0; j < 12; ++j) {
    rising *= x + k;
    b /= w;
    double t = rising * b / kFactorialOverBernoulli[j];
    s += t;
    if (std::fabs(t / s) < eps) return s;
    k += 1;
    rising *= x + k;
    b /= w;
    k += 1;
  }
  return s;
}

// polygamma(n, x) = (-1)^(n+1) n! zeta(n+1, x) for n >= 2.
template <typename T> BRAZE_SP_FN double braze_sp_polygamma(T n, T x) {
  if (n == 0) return braze_sp_digamma(x);
  if (n == 1) return braze_sp_trigamma<T>(x);
  double nd = n, sign = std::fmod(nd, 2.0) != 0 ? 1.0 : -1.0;
  return sign * std::exp(std::lgamma(nd + 1)) * braze_sp_zeta(nd + 1, x);
}

// erfcx(x) = exp(x^2) erfc(x): the product directly while both factors are finite and normal,
// the asymptotic series 1/(x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k for x >= 12, and
// erfcx(-x) = 2 exp(x^2) - erfcx(x).
BRAZE_SP_FN double braze_sp_erfcx_nonneg(double x) {
  if (x < 12) return std::exp(x * x) * std::erfc(x);
  double v = 0.5 / (x * x), t = 1, s = 1;
  for (int k = 1; k <= 12; ++k) { t *= -(2 * k - 1) * v; s += t; }
  return 0.56418958354775628695 / x * s;
}
// For x < 0, 2 exp(x^2) is evaluated in T as PyTorch does: in float its rounding (relative
// error ~ x^2 ulp) dominates the result.
template <typename T> BRAZE_SP_FN double braze_sp_erfcx(T x) {
  if (x < 0) {
    if (x < (T)-26.7) return INFINITY;
    return (double)((T)2 * std::exp(x * x)) - braze_sp_erfcx_nonneg(-(double)x);
  }
  return braze_sp_erfcx_nonneg(x);
}

// Starting points for the inverses: M. Giles' single-precision approximation of erfinv in
// w = -log((1-x)(1+x)) ("Approximating the erfinv function", GPU Computing Gems, 2011).
BRAZE_SP_FN double braze_sp_erfinv_guess(double x, double w) {
  double p;
  if (w < 5) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w; p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3;
    p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w; p = 2.83297682 + p * w;
  }
  return p * x;
}
static constexpr double braze_sp_two_over_sqrt_pi_ = 1.12837916709551257390;
// y with erf(y) = x, |x| <= 1/2: Halley's iteration on erf(y) - x.
BRAZE_SP_FN double braze_sp_erfinv_center(double x) {
  double y = braze_sp_erfinv_guess(x, -std::log((1 - x) * (1 + x)));
  for (int i = 0; i < 2; ++i) {
    double f = std::erf(y) - x;
    y -= f / (braze_sp_two_over_sqrt_pi_ * std::exp(-y * y) + y * f);
  }
  return y;
}
// y > 0 with erfc(y) = z, 0 < z <= 1/2: Halley's iteration on (erfc(y) - z) exp(y^2), which
// stays representable where erfc(y) underflows.
BRAZE_SP_FN double braze_sp_erfcinv_tail(double z) {
  double w = -std::log(z * (2 - z)), y;
  if (w < 25) {
    y = braze_sp_erfinv_guess(1 - z, w);
  } else { // erfc(y) ~ exp(-y^2) / (y sqrt(pi))
    double l = -std::log(z);
    y = std::sqrt(l);
    for (int i = 0; i < 2; ++i) y = std::sqrt(l - std::log(y * 1.77245385090551602730));
  }
  double logz = std::log(z);
  for (int i = 0; i < 3; ++i) {
    double f = braze_sp_erfcx_nonneg(y) - std::exp(y * y + logz);
    y -= f / (-braze_sp_two_over_sqrt_pi_ + y * f);
  }
  return y;
}
BRAZE_SP_FN double braze_sp_erfinv(double x) {
  if (!(std::fabs(x) <= 1)) return NAN;
  if (std::fabs(x) == 1) return std::copysign(INFINITY, x);
  if (std::fabs(x) <= 0.5) return braze_sp_erfinv_center(x);
  return std::copysign(braze_sp_erfcinv_tail(1 - std::fabs(x)), x);
}
// ndtri(p) = sqrt(2) erfinv(2p - 1), computed through erfc's inverse in the tails.
BRAZE_SP_FN double braze_sp_ndtri(double p) {
  const double sqrt2 = 1.41421356237309504880;
  if (!(p >= 0 && p <= 1)) return NAN;
  if (p == 0) return -INFINITY;
  if (p == 1) return INFINITY;
  if (p < 0.25) return -sqrt2 * braze_sp_erfcinv_tail(2 * p);
  if (p > 0.75) return sqrt2 * braze_sp_erfcinv_tail(2 * (1 - p));
  return sqrt2 * braze_sp_erfinv_center(2 * p - 1);
}

// ---- Modified Bessel functions of the first kind ----
// I_nu(x) ~ e^x / sqrt(2 pi x) sum_k (-1)^k a_k(nu) / x^k, a_k = a_{k-1} (4nu^2 - (2k-1)^2)/(8k):
// the sum, for x >= 20 where its smallest term is below double precision.
BRAZE_SP_FN double braze_sp_i_asymptotic_sum(double nu, double x) {
  double mu = 4 * nu * nu, t = 1, s = 1;
  for (int k = 1; k < 60; ++k) {
    double next = -t * (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k * x);
    if (std::fabs(next) >= std::fabs(t)) break;
    t = next;
    s += t;
    if (std::fabs(t) < 1e-17 * std::fabs(s)) break;
  }
  return s / std::sqrt(2 * braze_sp_pi_ * x);
}
// sum_k (x^2/4)^k / (k! (k+nu)!) for nu = 0, 1 (all terms positive).
BRAZE_SP_FN double braze_sp_i_series(int nu, double x) {
  double q = 0.25 * x * x, t = 1, s = 1;
  for (int k = 1; k < 500; ++k) {
    t *= q / ((double)k * (k + nu));
    s += t;
    if (t < 1e-17 * s) break;
  }
  return s;
}
BRAZE_SP_FN double braze_sp_bessel_i0(double x) {
  double ax = std::fabs(x);
  if (std::isinf(x)) return NAN;
  if (ax < 20) return braze_sp_i_series(0, x);
  return std::exp(ax) * braze_sp_i_asymptotic_sum(0, ax);
}
BRAZE_SP_FN double braze_sp_bessel_i0e(double x) {
  double ax = std::fabs(x);
  if (std::isinf(x)) return 0;
  if (ax < 20) return std::exp(-ax) * braze_sp_i_series(0, x);
  return braze_sp_i_asymptotic_sum(0, ax);
}
BRAZE_SP_FN double braze_sp_bessel_i1(double x) {
  double ax = std::fabs(x);
  if (std::isinf(x)) return NAN;
  if (ax < 20) return 0.5 * x * braze_sp_i_series(1, x);
  return std::copysign(std::exp(ax) * braze_sp_i_asymptotic_sum(1, ax), x);
}
BRAZE_SP_FN double braze_sp_bessel_i1e(double x) {
  double ax = std::fabs(x);
  if (std::isinf(x)) return std::copysign(0.0, x);
  if (ax < 20) return std::exp(-ax) * 0.5 * x * braze_sp_i_series(1, x);
  return std::copysign(braze_sp_i_asymptotic_sum(1, ax), x);
}

// ---- Modified Bessel functions of the second kind ----
// e^x K_nu(x) = int_0^inf exp(-2x sinh^2(t/2)) cosh(nu t) dt by the trapezoidal rule; the step
// keeps the rule's error below double precision for an integrand of width ~ 1/sqrt(x).
BRAZE_SP_FN double braze_sp_k_scaled_integral(double nu, double x) {
  double h = 0.6 / std::sqrt(x);
  if (h > 0.25) h = 0.25;
  double s = 0.5;
  for (int j = 1; j < 2000; ++j) {
    double t = j * h, sh = std::sinh(0.5 * t);
    double f = std::exp(-2 * x * sh * sh) * std::cosh(nu * t);
    s += f;
    if (f < 1e-18 * s) break;
  }
  return s * h;
}
// K0 and K1 for 0 < x <= 2 from the series of A&S 9.6.13 and 9.6.11 (harmonic numbers H_k):
// K0 = -(log(x/2) + gamma) I0(x) + sum_{k>=1} H_k (x^2/4)^k / (k!)^2,
// K1 = 1/x + log(x/2) I1(x) - x/4 sum_{k>=0} (H_k + H_{k+1} - 2 gamma) (x^2/4)^k / (k!(k+1)!).
BRAZE_SP_FN double braze_sp_k0_series(double x) {
  double q = 0.25 * x * x, t = 1, i0 = 1, hs = 0, h = 0;
  for (int k = 1; k < 100; ++k) {
    t *= q / ((double)k * k);
    h += 1.0 / k;
    i0 += t;
    hs += h * t;
    if (t < 1e-18 * i0) break;
  }
  return -(std::log(0.5 * x) + braze_sp_euler_) * i0 + hs;
}
BRAZE_SP_FN double braze_sp_k1_series(double x) {
  double q = 0.25 * x * x, t = 1, i1 = 1, h = 0, hs = 1 - 2 * braze_sp_euler_; // k = 0 term
  for (int k = 1; k < 100; ++k) {
    t *= q / ((double)k * (k + 1));
    double hk = h + 1.0 / k;
    h = hk;
    i1 += t;
    hs += (hk + hk + 1.0 / (k + 1) - 2 * braze_sp_euler_) * t;
    if (t < 1e-18 * i1) break;
  }
  return 1 / x + 0.5 * x * (std::log(0.5 * x) * i1 - 0.5 * hs);
}
BRAZE_SP_FN double braze_sp_bessel_k0(double x) {
  if (!(x >= 0)) return NAN;
  if (x == 0) return INFINITY;
  if (x <= 2) return braze_sp_k0_series(x);
  if (std::isinf(x)) return 0;
  return std::exp(-x) * braze_sp_k_scaled_integral(0, x);
}
BRAZE_SP_FN double braze_sp_bessel_k0e(double x) {
  if (!(x >= 0)) return NAN;
  if (x == 0) return INFINITY;
  if (x <= 2) return std::exp(x) * braze_sp_k0_series(x);
  if (std::isinf(x)) return 0;
  return braze_sp_k_scaled_integral(0, x);
}
BRAZE_SP_FN double braze_sp_bessel_k1(double x) {
  if (!(x >= 0)) return NAN;
  if (x == 0) return INFINITY;
  if (x <= 2) return braze_sp_k1_series(x);
  if (std::isinf(x)) return 0;
  return std::exp(-x) * braze_sp_k_scaled_integral(1, x);
}
BRAZE_SP_FN double braze_sp_bessel_k1e(double x) {
  if (!(x >= 0)) return NAN;
  if (x == 0) return INFINITY;
  if (x <= 2) return std::exp(x) * braze_sp_k1_series(x);
  if (std::isinf(x)) return 0;
  return braze_sp_k_scaled_integral(1, x);
}

// ---- Bessel functions of the first and second kind ----
// Hankel's expansions for x >= 20 (DLMF 10.17.3): with a_k(nu) as above,
// P = sum (-1)^k a_2k / x^2k, Q = sum (-1)^k a_2k+1 / x^2k+1, and
// J_nu = sqrt(2/(pi x)) (P cos chi - Q sin chi), Y_nu = sqrt(2/(pi x)) (P sin chi + Q cos chi),
// chi = x - (nu/2 + 1/4) pi; cos chi and sin chi come from cos x and sin x.
BRAZE_SP_FN void braze_sp_hankel_pq(double nu, double x, double &p, double &q) {
  double mu = 4 * nu * nu, t = 1, prev = INFINITY;
  p = 1;
  q = 0;
  for (int k = 1; k < 80; ++k) {
    t *= (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (8.0 * k * x);
    if (std::fabs(t) >= prev && k > 2) break;
    prev = std::fabs(t);
    int r = k % 4; // the sign of a_k in P or Q alternates every other k
    if (r == 1) q += t; else if (r == 2) p -= t; else if (r == 3) q -= t; else p += t;
    if (std::fabs(t) < 1e-17) break;
  }
}
BRAZE_SP_FN void braze_sp_jy_large(int n, double x, double &j, double &y) {
  double p, q;
  braze_sp_hankel_pq(n, x, p, q);
  double c = std::cos(x), s = std::sin(x), r = std::sqrt(2 / (braze_sp_pi_ * x)) * 0.70710678118654752440;
  double cchi, schi;
  if (n == 0) { cchi = c + s; schi = s - c; } // chi = x - pi/4, times sqrt(2)
  else { cchi = s - c; schi = -(c + s); }    // chi = x - 3pi/4, times sqrt(2)
  j = r * (p * cchi - q * schi);
  y = r * (p * schi + q * cchi);
}
// Power series of J0, J1, Y0, Y1 (A&S 9.1.10, 9.1.11), summed in BRAZE_SP_WIDE: for x < 20 the
// alternating terms reach e^x/(2 pi x) times the result.
BRAZE_SP_FN void braze_sp_jy_series(int n, double xd, double &j, double &y) {
  BRAZE_SP_WIDE x = xd, q = -BRAZE_SP_W(0.25) * x * x, t = 1, sj = 1, h = 0, sh = 0;
  const BRAZE_SP_WIDE gamma = BRAZE_SP_W(0.577215664901532860606512090082402431);
  const BRAZE_SP_WIDE pi = BRAZE_SP_W(3.14159265358979323846264338327950288);
  if (n == 0) {
    for (int k = 1; k < 200; ++k) {
      t *= q / ((BRAZE_SP_WIDE)k * k);
      h += BRAZE_SP_W(1.0) / k;
      sj += t;
      sh += h * t;
      if (std::fabs((double)t) < 1e-22) break;
    }
    j = (double)sj;
    y = (double)(2 / pi * ((std::log(x / 2) + gamma) * sj - sh));
  } else {
    sh = 1 - 2 * gamma;
    for (int k = 1; k < 200; ++k) {
      t *= q / ((BRAZE_SP_WIDE)k * (k + 1));
      BRAZE_SP_WIDE hk = h + BRAZE_SP_W(1.0) / k;
      h = hk;
      sj += t;
      sh += (hk + hk + BRAZE_SP_W(1.0) / (k + 1) - 2 * gamma) * t;
      if (std::fabs((double)t) < 1e-22) break;
    }
    j = (double)(x / 2 * sj);
    y = (double)(-2 / (pi * x) + 2 / pi * std::log(x / 2) * (x / 2 * sj) - x / (2 * pi) * sh);
  }
}
BRAZE_SP_FN double braze_sp_bessel_j0(double x) {
  double ax = std::fabs(x), j, y;
  if (std::isinf(x)) return NAN;
  if (ax < 20) braze_sp_jy_series(0, ax, j, y); else braze_sp_jy_large(0, ax, j, y);
  return j;
}
BRAZE_SP_FN double braze_sp_bessel_j1(double x) {
  double ax = std::fabs(x), j, y;
  if (std::isinf(x)) return NAN;
  if (ax == 0) return x;
  if (ax < 20) braze_sp_jy_series(1, ax, j, y); else braze_sp_jy_large(1, ax, j, y);
  return x < 0 ? -j : j;
}
BRAZE_SP_FN double braze_sp_bessel_y0(double x) {
  double j, y;
  if (!(x >= 0) || std::isinf(x)) return NAN;
  if (x == 0) return -INFINITY;
  if (x < 20) braze_sp_jy_series(0, x, j, y); else braze_sp_jy_large(0, x, j, y);
  return y;
}
BRAZE_SP_FN double braze_sp_bessel_y1(double x) {
  double j, y;
  if (!(x >= 0) || std::isinf(x)) return NAN;
  if (x == 0) return -INFINITY;
  if (x < 20) braze_sp_jy_series(1, x, j, y); else braze_sp_jy_large(1, x, j, y);
  return y;
}
BRAZE_SP_FN double braze_sp_spherical_bessel_j0(double x) {
  if (std::isinf(x)) return 0;
  if (std::fabs(x) < 0.5) {
    double z = x * x; // sin(x)/x = sum (-z)^k / (2k+1)!
    return 1 - z / 6 * (1 - z / 20 * (1 - z / 42 * (1 - z / 72 * (1 - z / 110 * (1 - z / 156)))));
  }
  return std::sin(x) / x;
}

// ---- Airy function Ai ----
// |x| moderate: Ai = c1 f - c2 g with the Maclaurin series f, g (DLMF 9.4.1) in BRAZE_SP_WIDE;
// x >= 2: Ai(x) = sqrt(x/3)/pi K_{1/3}(zeta), zeta = 2/3 x^{3/2}; x <= -8: the oscillatory
// expansion (DLMF 9.7.9) in u_k = u_{k-1} (6k-5)(6k-3)(6k-1) / ((2k-1) 216 k).
BRAZE_SP_FN double braze_sp_airy_ai(double x) {
  if (std::isinf(x)) return NAN;
  if (x >= 2) {
    double zeta = 2.0 / 3 * x * std::sqrt(x);
    return std::sqrt(x / 3) / braze_sp_pi_ * std::exp(-zeta) *
           braze_sp_k_scaled_integral(1.0 / 3, zeta);
  }
  if (x > -8) {
    BRAZE_SP_WIDE xl = x, x3 = xl * xl * xl, f = 1, g = xl, tf = 1, tg = xl;
    for (int k = 1; k < 200; ++k) {
      tf *= x3 / ((BRAZE_SP_W(3.0) * k - 1) * (BRAZE_SP_W(3.0) * k));
      tg *= x3 / ((BRAZE_SP_W(3.0) * k) * (BRAZE_SP_W(3.0) * k + 1));
      f += tf;
      g += tg;
      if (std::fabs((double)tf) + std::fabs((double)tg) < 1e-22) break;
    }
    const BRAZE_SP_WIDE c1 = BRAZE_SP_W(0.355028053887817239260063186004183176);
    const BRAZE_SP_WIDE c2 = BRAZE_SP_W(0.258819403792806798405183560189203963);
    return (double)(c1 * f - c2 * g);
  }
  double z = -x, zeta = 2.0 / 3 * z * std::sqrt(z), u = 1, p = 1, q = 0, prev = INFINITY;
  for (int k = 1; k < 80; ++k) {
    u *= (6.0 * k - 5) * (6.0 * k - 3) * (6.0 * k - 1) / ((2.0 * k - 1) * 216.0 * k) / zeta;
    if (std::fabs(u) >= prev && k > 2) break;
    prev = std::fabs(u);
    int r = k % 4;
    if (r == 1) q += u; else if (r == 2) p -= u; else if (r == 3) q -= u; else p += u;
    if (std::fabs(u) < 1e-17) break;
  }
  double phase = zeta - braze_sp_pi_ / 4;
  return (std::cos(phase) * p + std::sin(phase) * q) / (std::sqrt(braze_sp_pi_) * std::sqrt(std::sqrt(z)));
}

// ---- Regularized incomplete gamma functions P(a, x) and Q(a, x) = 1 - P(a, x) ----
// log(x^a e^-x / Gamma(a)); for a > 10 through Stirling's series and log1p, so that the large
// terms a log x, x and lgamma(a) cancel exactly.
BRAZE_SP_FN double braze_sp_log_gamma_prefactor(double a, double x) {
  if (a <= 10) return a * std::log(x) - x - std::lgamma(a);
  double t = (x - a) / a, ia = 1 / a, ia2 = ia * ia;
  double stirling = ia * (1.0 / 12 - ia2 * (1.0 / 360 - ia2 * (1.0 / 1260 - ia2 / 1680)));
  return 0.5 * std::log(a) - 0.91893853320467274178 - stirling + a * (std::log1p(t) - t);
}
// P by its series x^a e^-x / Gamma(a) sum_n x^n / (a (a+1) ... (a+n)), for x < a + 1.
BRAZE_SP_FN double braze_sp_igamma_series(double a, double x) {
  double term = 1 / a, sum = term, ap = a;
  for (int n = 1; n < 2000000; ++n) {
    ap += 1;
    term *= x / ap;
    sum += term;
    if (term < sum * 1e-17) break;
  }
  return sum * std::exp(braze_sp_log_gamma_prefactor(a, x));
}
// Q by Legendre's continued fraction x^a e^-x / Gamma(a) / (x + 1 - a - 1(1-a)/(x + 3 - a - ...)),
// evaluated by the modified Lentz method, for x >= a + 1.
BRAZE_SP_FN double braze_sp_igammac_fraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 2000000; ++i) {
    double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    double step = d * c;
    h *= step;
    if (std::fabs(step - 1) < 1e-16) break;
  }
  return h * std::exp(braze_sp_log_gamma_prefactor(a, x));
}
// log Gamma(1 + a), keeping its relative accuracy for small a (Taylor series in zeta values).
BRAZE_SP_FN double braze_sp_lgamma1p(double a) {
  if (std::fabs(a) >= 1e-3) return std::lgamma(1 + a);
  const double z2 = 1.64493406684822643647, z3 = 1.20205690315959428540, z4 = 1.08232323371113819152;
  return a * (-braze_sp_euler_ + a * (z2 / 2 - a * (z3 / 3 - a * z4 / 4)));
}
// Q for a < 1 and x < a + 1, where 1 - P would cancel: from the series of the lower function,
// Q = -expm1(a log x - lgamma(1+a)) - x^a / Gamma(a) sum_{n>=1} (-x)^n / (n! (a+n)).
BRAZE_SP_FN double braze_sp_igammac_small_a(double a, double x) {
  double sum = 0, term = 1;
  for (int n = 1; n < 200; ++n) {
    term *= -x / n;
    double t = term / (a + n);
    sum += t;
    if (std::fabs(t) < 1e-17 * std::fabs(sum)) break;
  }
  double lx = a * std::log(x);
  return -std::expm1(lx - braze_sp_lgamma1p(a)) - std::exp(lx - std::lgamma(a)) * sum;
}
// Edge cases as in PyTorch: a or x negative -> NaN; a = 0 -> P = 1 for x > 0 (else NaN);
// x = 0 -> P = 0; a = inf -> P = 0 (NaN when x = inf too); x = inf -> P = 1.
BRAZE_SP_FN double braze_sp_igamma(double a, double x) {
  if (x < 0 || a < 0) return NAN;
  if (a == 0) return x > 0 ? 1 : NAN;
  if (x == 0) return 0;
  if (std::isinf(a)) return std::isinf(x) ? NAN : 0;
  if (std::isinf(x)) return 1;
  if (x < a + 1) return braze_sp_igamma_series(a, x);
  return 1 - braze_sp_igammac_fraction(a, x);
}
BRAZE_SP_FN double braze_sp_igammac(double a, double x) {
  if (x < 0 || a < 0) return NAN;
  if (a == 0) return x > 0 ? 0 : NAN;
  if (x == 0) return 1;
  if (std::isinf(a)) return std::isinf(x) ? NAN : 1;
  if (std::isinf(x)) return 0;
  if (x < a + 1) return a < 1 ? braze_sp_igammac_small_a(a, x) : 1 - braze_sp_igamma_series(a, x);
  return braze_sp_igammac_fraction(a, x);
}

// ---- Orthogonal polynomials p_n(x) ----
// Templates over the float type: an f32 result is computed in float arithmetic, as PyTorch
// does, so that overflow in the recurrence matches. n is a float holding an integer
// (truncated like a C cast); n < 0 gives 0. |x| < 1 with large
// n uses the trigonometric forms, otherwise the three-term recurrence, as PyTorch does.
template <typename T> BRAZE_SP_FN bool braze_sp_degree(T n, int64_t &k) {
  if (!(n > -9.2e18 && n < 9.2e18)) return false;
  k = (int64_t)n;
  return k >= 0;
}
template <typename T> BRAZE_SP_FN T braze_sp_chebyshev_t(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (std::fabs(x) == 1) return (x > 0 || n % 2 == 0) ? 1 : -1;
  if (n > 6 && std::fabs(x) < 1) return std::cos((T)n * std::acos(x));
  if (n == 0) return 1;
  if (n == 1) return x;
  T p = 1, q = x, r = 0;
  for (int64_t k = 2; k <= n; ++k) { r = (x + x) * q - p; p = q; q = r; }
  return r;
}
template <typename T> BRAZE_SP_FN T braze_sp_chebyshev_u(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (std::fabs(x) == 1) return (x > 0 || n % 2 == 0) ? n + 1 : -(n + 1);
  if (n > 8 && std::fabs(x) < 1) {
    T t = std::acos(x);
    if (std::sin(t) != 0) return std::sin((T)(n + 1) * t) / std::sin(t);
    return (T)(n + 1) * std::cos((T)(n + 1) * t) * x;
  }
  if (n == 0) return 1;
  if (n == 1) return x + x;
  T p = 1, q = x + x, r = 0;
  for (int64_t k = 2; k <= n; ++k) { r = (x + x) * q - p; p = q; q = r; }
  return r;
}
template <typename T> BRAZE_SP_FN T braze_sp_chebyshev_v(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (std::fabs(x) == 1) {
    if (x > 0) return 1;
    return n % 2 == 0 ? n + n + 1 : -(n + n + 1);
  }
  if (n > 8 && std::fabs(x) < 1) {
    T t = std::acos(x);
    if (std::sin(t / 2) != 1) return std::cos((T)(n + 0.5) * t) / std::cos(t / 2);
    return n % 2 == 0 ? n + n + 1 : -(n + n + 1);
  }
  if (n == 0) return 1;
  if (n == 1) return x + x - 1;
  T p = 1, q = x + x - 1, r = 0;
  for (int64_t k = 2; k <= n; ++k) { r = (x + x) * q - p; p = q; q = r; }
  return r;
}
template <typename T> BRAZE_SP_FN T braze_sp_chebyshev_w(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (std::fabs(x) == 1) {
    if (x > 0) return n + n + 1;
    return n % 2 == 0 ? 1 : -1;
  }
  if (n > 8 && std::fabs(x) < 1) {
    T t = std::acos(x);
    if (std::cos(t / 2) != 1) return std::sin((T)(n + 0.5) * t) / std::sin(t / 2);
    if (x > 0) return n + n + 1;
    return n % 2 == 0 ? 1 : -1;
  }
  if (n == 0) return 1;
  if (n == 1) return x + x + 1;
  T p = 1, q = x + x + 1, r = 0;
  for (int64_t k = 2; k <= n; ++k) { r = (x + x) * q - p; p = q; q = r; }
  return r;
}
// The shifted polynomials are the unshifted ones at 2x - 1.
template <typename T> BRAZE_SP_FN T braze_sp_shifted_chebyshev_t(T x, T n) { return braze_sp_chebyshev_t(x + x - 1, n); }
template <typename T> BRAZE_SP_FN T braze_sp_shifted_chebyshev_u(T x, T n) { return braze_sp_chebyshev_u(x + x - 1, n); }
template <typename T> BRAZE_SP_FN T braze_sp_shifted_chebyshev_v(T x, T n) { return braze_sp_chebyshev_v(x + x - 1, n); }
template <typename T> BRAZE_SP_FN T braze_sp_shifted_chebyshev_w(T x, T n) { return braze_sp_chebyshev_w(x + x - 1, n); }
// Physicists' Hermite: H_{k+1} = 2x H_k - 2k H_{k-1}.
template <typename T> BRAZE_SP_FN T braze_sp_hermite_h(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (n == 0) return 1;
  if (n == 1) return x + x;
  T p = 1, q = x + x, r = 0;
  for (int64_t k = 2; k < n + n; k += 2) { r = (x + x) * q - (T)k * p; p = q; q = r; }
  return r;
}
// Probabilists' Hermite: He_{k+1} = x He_k - k He_{k-1}.
template <typename T> BRAZE_SP_FN T braze_sp_hermite_he(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (n == 0) return 1;
  if (n == 1) return x;
  T p = 1, q = x, r = 0;
  for (int64_t k = 1; k < n; ++k) { r = x * q - (T)k * p; p = q; q = r; }
  return r;
}
// Laguerre: (k+1) L_{k+1} = (2k+1-x) L_k - k L_{k-1}.
template <typename T> BRAZE_SP_FN T braze_sp_laguerre_l(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (std::fabs(x) == 0) return 1;
  if (n == 0) return 1;
  if (n == 1) return 1 - x;
  T p = 1, q = 1 - x, r = 0;
  for (int64_t k = 1; k < n; ++k) { r = (((T)(k + k) + (1 - x)) * q - (T)k * p) / (T)(k + 1); p = q; q = r; }
  return r;
}
// Legendre: (k+1) P_{k+1} = (2k+1) x P_k - k P_{k-1}.
template <typename T> BRAZE_SP_FN T braze_sp_legendre_p(T x, T nf) {
  int64_t n;
  if (!braze_sp_degree(nf, n)) return 0;
  if (std::fabs(x) == 1) return (x > 0 || n % 2 == 0) ? 1 : -1;
  if (n == 0) return 1;
  if (n == 1) return x;
  T p = 1, q = x, r = 0;
  for (int64_t k = 1; k < n; ++k) { r = ((T)(k + k + 1) * x * q - (T)k * p) / (T)(k + 1); p = q; q = r; }
  return r;
}
)PRELUDE";

} // namespace

std::string specialMathPrelude(bool cuda) {
  return std::string(cuda ? kCudaQualifiers : kCpuQualifiers) + kFunctions;
}

} // namespace braze::codegen
