#include "braze/codegen/cpu/AttentionPrelude.h"

namespace braze::codegen {

namespace {

/// The block products: scores s = q·kᵀ, acc += p·v and acc += pᵀ·x. Rows of each operand are
/// `ld` elements apart with unit element stride. With a BLAS, operands whose rows do not overlap
/// go to its sgemm (row-major); the loops take the rest (and empty inner products, whose
/// leading dims sgemm may reject).
std::string blockProducts(const BlasSymbols &blas) {
  std::string loops = R"(
static inline void braze_attn_scores_loops(int64_t rows, int64_t cols, int64_t d,
                                           const float* q, int64_t ldq, const float* k,
                                           int64_t ldk, float* s, int64_t lds) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      float acc = 0.f;
      #pragma omp simd reduction(+:acc)
      for (int64_t e = 0; e < d; ++e)
        acc += q[i * ldq + e] * k[j * ldk + e];
      s[i * lds + j] = acc;
    }
}

// acc += p·x (acc [rows, dv], x [cols, dv]), or with `trans` acc += pᵀ·x (acc [cols, dv],
// x [rows, dv]); p is [rows, cols].
static inline void braze_attn_accumulate_either(bool trans, int64_t rows, int64_t cols,
                                                int64_t dv, const float* p, int64_t ldp,
                                                const float* x, int64_t ldx, float* acc,
                                                int64_t ldacc) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float pij = p[i * ldp + j];
      if (pij == 0.f)
        continue;
      float* a = acc + (trans ? j : i) * ldacc;
      const float* y = x + (trans ? i : j) * ldx;
      #pragma omp simd
      for (int64_t e = 0; e < dv; ++e)
        a[e] += pij * y[e];
    }
}

static inline void braze_attn_accumulate_loops(int64_t rows, int64_t cols, int64_t dv,
                                               const float* p, int64_t ldp, const float* v,
                                               int64_t ldv, float* acc, int64_t ldacc) {
  braze_attn_accumulate_either(false, rows, cols, dv, p, ldp, v, ldv, acc, ldacc);
}

static inline void braze_attn_accumulate_t_loops(int64_t rows, int64_t cols, int64_t dv,
                                                 const float* p, int64_t ldp, const float* x,
                                                 int64_t ldx, float* acc, int64_t ldacc) {
  braze_attn_accumulate_either(true, rows, cols, dv, p, ldp, x, ldx, acc, ldacc);
}
)";
  if (blas.sgemm.empty())
    return loops + R"(
#define braze_attn_scores braze_attn_scores_loops
#define braze_attn_accumulate braze_attn_accumulate_loops
#define braze_attn_accumulate_t braze_attn_accumulate_t_loops
)";
  std::string out = loops + blasDeclarations(blas, DType::Float32) + R"(
static inline void braze_attn_scores(int64_t rows, int64_t cols, int64_t d, const float* q,
                                     int64_t ldq, const float* k, int64_t ldk, float* s,
                                     int64_t lds) {
  if (d == 0 || ldq < d || ldk < d)
    return braze_attn_scores_loops(rows, cols, d, q, ldq, k, ldk, s, lds);
  SGEMM(101, 111, 112, rows, cols, d, 1.f, q, ldq, k, ldk, 0.f, s, lds);
}

static inline void braze_attn_accumulate(int64_t rows, int64_t cols, int64_t dv,
                                         const float* p, int64_t ldp, const float* v,
                                         int64_t ldv, float* acc, int64_t ldacc) {
  if (cols == 0 || ldv < dv)
    return braze_attn_accumulate_loops(rows, cols, dv, p, ldp, v, ldv, acc, ldacc);
  SGEMM(101, 111, 111, rows, dv, cols, 1.f, p, ldp, v, ldv, 1.f, acc, ldacc);
}

// acc[cols x dv] += pᵀ·x for p [rows x cols] and x [rows x dv].
static inline void braze_attn_accumulate_t(int64_t rows, int64_t cols, int64_t dv,
                                           const float* p, int64_t ldp, const float* x,
                                           int64_t ldx, float* acc, int64_t ldacc) {
  if (rows == 0 || cols == 0 || dv == 0 || ldp < cols || ldx < dv || ldacc < dv)
    return braze_attn_accumulate_t_loops(rows, cols, dv, p, ldp, x, ldx, acc, ldacc);
  SGEMM(101, 112, 111, cols, dv, rows, 1.f, p, ldp, x, ldx, 1.f, acc, ldacc);
}
)";
  for (size_t at; (at = out.find("SGEMM(")) != std::string::npos;)
    out.replace(at, 5, blas.sgemm);
  return out;
}

const char *kAttention = R"(
// exp(x) for the softmax's x <= 0 (scores minus their maximum), vectorizable: Cody-Waite
// reduction x = n ln 2 + r and Cephes' degree-6 polynomial (about 1 ulp); 0 below -87.
static inline float braze_attn_exp(float x) {
  const float c = x < -87.f ? -87.f : x;
  const float n = __builtin_floorf(c * 1.44269504088896341f + 0.5f);
  const float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.f ? 0.f : p * scale;
}

// The `seen` scores of one row scaled, plus the row's bias (elements `step` apart) when `bi`
// is not null, in place; returns their maximum and `mx`.
static inline float braze_attn_scale_row(float* si, int64_t seen, float scale, const float* bi,
                                         int64_t step, float mx) {
  if (bi) {
    #pragma omp simd reduction(max:mx)
    for (int64_t j = 0; j < seen; ++j) {
      const float x = si[j] * scale + bi[j * step];
      si[j] = x;
      mx = x > mx ? x : mx;
    }
  } else {
    #pragma omp simd reduction(max:mx)
    for (int64_t j = 0; j < seen; ++j) {
      const float x = si[j] * scale;
      si[j] = x;
      mx = x > mx ? x : mx;
    }
  }
  return mx;
}

// Dropout over `n` probabilities of one row whose first is at row-major position `at` of the
// scores [B.., Sq, Sk]: each dropped where Philox's draw there is below p (the graph's
// random draws), the rest scaled by 1 / (1 - p). The forward and every gradient draw alike.
static inline void braze_attn_drop(float* x, int64_t n, const int64_t* seed, int64_t at,
                                   float p) {
  const float keep = (float)(1.0 / (1.0 - (double)p));
  const uint64_t key = (uint64_t)*seed;
  #pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    x[j] = braze_philox_uniform(key, (uint64_t)(at + j)) >= p ? x[j] * keep : 0.f;
}

// A row's log-sum-exp from its running maximum m and sum l: -inf where no key was kept.
static inline float braze_attn_lse(float m, float l) {
  return l > 0.f ? m + std::log(l) : -INFINITY;
}

// The element offset of batch point b (row-major over dims[0..nb)) in an operand of strides st.
static inline int64_t braze_attn_offset(int nb, const int64_t* dims, const int64_t* st,
                                        int64_t b) {
  int64_t off = 0;
  for (int x = nb - 1; x >= 0; --x) {
    off += (b % dims[x]) * st[x];
    b /= dims[x];
  }
  return off;
}

static void braze_attention_f32(int rank, const int64_t* dims, const float* q,
                                const int64_t* qs, const float* k, const int64_t* ks,
                                const float* v, const int64_t* vs, const float* bias,
                                const int64_t* bs, float* out, const int64_t* os,
                                float scale, bool causal, bool safe, const int64_t* seed,
                                float dropout, float* lse) {
  const int nb = rank - 2;
  int64_t batch = 1;
  for (int i = 0; i < nb; ++i)
    batch *= dims[i];
  const int64_t sq = dims[nb], sk = dims[nb + 1], d = dims[nb + 2], dv = dims[nb + 3];
  if (batch == 0 || sq == 0 || (dv == 0 && !lse))
    return;
  if (sk == 0) { // no keys: the product with an empty value is zero
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < sq; ++i)
        std::fill_n(out + braze_attn_offset(nb, dims, os, b) + i * os[nb], dv, 0.f);
    if (lse)
      std::fill(lse, lse + batch * sq, -INFINITY);
    return;
  }
  const int64_t bq = 64, bk = 256, blocks = (sq + bq - 1) / bq, tasks = batch * blocks;
  const double work = (double)batch * sq * sk * (d + dv);
  const int threads = work < 2.0e5 ? 1 : omp_get_max_threads();
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* s = (float*)std::malloc(sizeof(float) * (bq * bk + bq * dv + 2 * bq));
    float* acc = s + bq * bk;
    float* m = acc + bq * dv;
    float* l = m + bq;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / blocks, i0 = (t % blocks) * bq, rows = std::min(bq, sq - i0);
      int64_t qo = 0, ko = 0, vo = 0, bo = 0, rest = b;
      for (int x = nb - 1; x >= 0; --x) {
        const int64_t at = rest % dims[x];
        rest /= dims[x];
        qo += at * qs[x];
        ko += at * ks[x];
        vo += at * vs[x];
        if (bias)
          bo += at * bs[x];
      }
      for (int64_t i = 0; i < rows; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
      }
      for (int64_t i = 0; i < rows * dv; ++i)
        acc[i] = 0.f;
      const float* qb = q + qo + i0 * qs[nb];
      const int64_t kend = causal ? std::min(sk, i0 + rows) : sk;
      for (int64_t j0 = 0; j0 < kend; j0 += bk) {
        const int64_t cols = std::min(bk, kend - j0);
        braze_attn_scores(rows, cols, d, qb, qs[nb], k + ko + j0 * ks[nb], ks[nb], s, bk);
        for (int64_t i = 0; i < rows; ++i) {
          float* si = s + i * bk;
          const int64_t seen = causal ? std::max<int64_t>(0, std::min(cols, i0 + i + 1 - j0))
                                      : cols;
          const float* bi = bias ? bias + bo + (i0 + i) * bs[nb] + j0 * bs[nb + 1] : nullptr;
          const float mx = braze_attn_scale_row(si, seen, scale, bi, bias ? bs[nb + 1] : 0, m[i]);
          if (mx == -INFINITY) { // every key so far is masked: nothing to add
            for (int64_t j = 0; j < cols; ++j)
              si[j] = 0.f;
            continue;
          }
          float sum = 0.f;
          #pragma omp simd reduction(+:sum)
          for (int64_t j = 0; j < seen; ++j) {
            const float p = braze_attn_exp(si[j] - mx);
            si[j] = p;
            sum += p;
          }
          for (int64_t j = seen; j < cols; ++j)
            si[j] = 0.f;
          if (seed) // dropped after the row's sum, which keeps every probability
            braze_attn_drop(si, seen, seed, (b * sq + i0 + i) * sk + j0, dropout);
          const float alpha = braze_attn_exp(m[i] - mx);
          l[i] = l[i] * alpha + sum;
          m[i] = mx;
          if (alpha != 1.f)
            for (int64_t e = 0; e < dv; ++e)
              acc[i * dv + e] *= alpha;
        }
        braze_attn_accumulate(rows, cols, dv, s, bk, v + vo + j0 * vs[nb], vs[nb], acc, dv);
      }
      float* ob = out + braze_attn_offset(nb, dims, os, b) + i0 * os[nb];
      for (int64_t i = 0; i < rows; ++i) {
        // every key masked: 0 (PyTorch's attention ops) or nan (a softmax written out)
        const float inv = l[i] > 0.f ? 1.f / l[i] : safe ? 0.f : NAN;
        for (int64_t e = 0; e < dv; ++e)
          ob[i * os[nb] + e] = acc[i * dv + e] * inv;
      }
      if (lse) // as braze_attention_lse_f32 gives it, from the same maxima and sums
        for (int64_t i = 0; i < rows; ++i)
          lse[b * sq + i0 + i] = braze_attn_lse(m[i], l[i]);
    }
    std::free(s);
  }
}
)";

/// The forward's log-sum-exp and the three gradients, over the same blocks as the forward.
const char *kAttentionBackward = R"(

// lse[b.., i] = log sum_j exp(s[b.., i, j]) over the kept keys, row-major [B.., Sq]; -inf for a
// row with none. Tasks and blocks as the forward's, with its running maximum and sum only.
static void braze_attention_lse_f32(int rank, const int64_t* dims, const float* q,
                                    const int64_t* qs, const float* k, const int64_t* ks,
                                    const float* bias, const int64_t* bs, float* lse,
                                    float scale, bool causal) {
  const int nb = rank - 2;
  int64_t batch = 1;
  for (int i = 0; i < nb; ++i)
    batch *= dims[i];
  const int64_t sq = dims[nb], sk = dims[nb + 1], d = dims[nb + 2];
  if (batch == 0 || sq == 0)
    return;
  if (sk == 0) {
    std::fill(lse, lse + batch * sq, -INFINITY);
    return;
  }
  const int64_t bq = 64, bk = 256, blocks = (sq + bq - 1) / bq, tasks = batch * blocks;
  const double work = (double)batch * sq * sk * (d + 1);
  const int threads = work < 2.0e5 ? 1 : omp_get_max_threads();
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* s = (float*)std::malloc(sizeof(float) * (bq * bk + 2 * bq));
    float* m = s + bq * bk;
    float* l = m + bq;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / blocks, i0 = (t % blocks) * bq, rows = std::min(bq, sq - i0);
      const float* qb = q + braze_attn_offset(nb, dims, qs, b) + i0 * qs[nb];
      const float* kb = k + braze_attn_offset(nb, dims, ks, b);
      const float* bb = bias ? bias + braze_attn_offset(nb, dims, bs, b) : nullptr;
      for (int64_t i = 0; i < rows; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
      }
      const int64_t kend = causal ? std::min(sk, i0 + rows) : sk;
      for (int64_t j0 = 0; j0 < kend; j0 += bk) {
        const int64_t cols = std::min(bk, kend - j0);
        braze_attn_scores(rows, cols, d, qb, qs[nb], kb + j0 * ks[nb], ks[nb], s, bk);
        for (int64_t i = 0; i < rows; ++i) {
          float* si = s + i * bk;
          const int64_t seen = causal ? std::max<int64_t>(0, std::min(cols, i0 + i + 1 - j0))
                                      : cols;
          const float* bi = bb ? bb + (i0 + i) * bs[nb] + j0 * bs[nb + 1] : nullptr;
          const float mx = braze_attn_scale_row(si, seen, scale, bi, bb ? bs[nb + 1] : 0, m[i]);
          if (mx == -INFINITY) // every key so far is masked
            continue;
          float sum = 0.f;
          #pragma omp simd reduction(+:sum)
          for (int64_t j = 0; j < seen; ++j)
            sum += braze_attn_exp(si[j] - mx);
          l[i] = l[i] * braze_attn_exp(m[i] - mx) + sum;
          m[i] = mx;
        }
      }
      float* lb = lse + b * sq + i0;
      for (int64_t i = 0; i < rows; ++i)
        lb[i] = braze_attn_lse(m[i], l[i]);
    }
    std::free(s);
  }
}

// The gradient of the forward's output with respect to q (wrt 0), k (1) or v (2), or those
// of k and v in one pass (3: k's into grad, v's into grad2), row-major as those operands,
// given the output's gradient dout, the output o and its lse (rank - 1 strides ls over
// [B.., Sq]). With p = exp(s - lse), dP = dout·vᵀ and Delta_i = sum_e dout[i, e] * o[i, e],
// dS = p * (dP - Delta):
//   dq = scale * dS·k (tasks of 64 query rows, walking blocks of 256 keys);
//   dk = scale * dSᵀ·q and dv = pᵀ·dout (tasks of 64 keys, walking blocks of 256 query rows;
//   causal: from the task's first key on); together, each block's p serves both.
// v and o are unused (may be null) for dv alone. Per thread: p (then dS), dP, Delta and, for
// k and v with dropout, the dropped p of a block.
// With dropout (a seed), the forward's dropped probabilities: dv = (p * keep)ᵀ·dout and
// dS = p * (dP * keep - Delta), keep being braze_attn_drop's factor.
static void braze_attention_grad_f32(int wrt, int rank, const int64_t* dims, const float* dout,
                                     const int64_t* dos, const float* q, const int64_t* qs,
                                     const float* k, const int64_t* ks, const float* v,
                                     const int64_t* vs, const float* o, const int64_t* os,
                                     const float* lse, const int64_t* ls, const float* bias,
                                     const int64_t* bs, float* grad, float scale, bool causal,
                                     const int64_t* seed, float dropout, float* grad2) {
  const int nb = rank - 2;
  int64_t batch = 1;
  for (int i = 0; i < nb; ++i)
    batch *= dims[i];
  const int64_t sq = dims[nb], sk = dims[nb + 1], d = dims[nb + 2], dv = dims[nb + 3];
  const int64_t n = wrt == 0 ? sq : sk, width = wrt == 2 ? dv : d; // grad is [B.., n, width]
  if (batch == 0 || n == 0 || (width == 0 && (wrt != 3 || dv == 0)))
    return;
  if ((wrt == 0 ? sk : sq) == 0) { // nothing reaches the operand
    std::fill(grad, grad + batch * n * width, 0.f);
    if (wrt == 3)
      std::fill(grad2, grad2 + batch * n * dv, 0.f);
    return;
  }
  const int64_t rq = wrt == 0 ? 64 : 256, ck = wrt == 0 ? 256 : 64, tb = wrt == 0 ? rq : ck;
  const int64_t blocks = (n + tb - 1) / tb, tasks = batch * blocks;
  const double work = (double)batch * sq * sk * (d + dv);
  const int threads = work < 2.0e5 ? 1 : omp_get_max_threads();
  #pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* s = (float*)std::malloc(sizeof(float) * (3 * rq * ck + rq));
    float* dp = s + rq * ck;
    float* dropped = dp + rq * ck;
    float* delta = dropped + rq * ck;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / blocks, t0 = (t % blocks) * tb, tn = std::min(tb, n - t0);
      const float* qb = q + braze_attn_offset(nb, dims, qs, b);
      const float* kb = k + braze_attn_offset(nb, dims, ks, b);
      const float* dob = dout + braze_attn_offset(nb, dims, dos, b);
      const float* lb = lse + braze_attn_offset(nb, dims, ls, b);
      const float* vb = wrt != 2 ? v + braze_attn_offset(nb, dims, vs, b) : nullptr;
      const float* ob = wrt != 2 ? o + braze_attn_offset(nb, dims, os, b) : nullptr;
      const float* bb = bias ? bias + braze_attn_offset(nb, dims, bs, b) : nullptr;
      float* g = grad + (b * n + t0) * width;
      std::fill(g, g + tn * width, 0.f);
      float* g2 = wrt == 3 ? grad2 + (b * n + t0) * dv : nullptr;
      if (g2)
        std::fill(g2, g2 + tn * dv, 0.f);
      // Delta of query rows [i0, i0 + rows).
      auto deltas = [&](int64_t i0, int64_t rows) {
        for (int64_t i = 0; i < rows; ++i) {
          const float* di = dob + (i0 + i) * dos[nb];
          const float* oi = ob + (i0 + i) * os[nb];
          float acc = 0.f;
          #pragma omp simd reduction(+:acc)
          for (int64_t e = 0; e < dv; ++e)
            acc += di[e] * oi[e];
          delta[i] = acc;
        }
      };
      // The keys of query row i (of the block at i0, j0) that are not masked: none where lse
      // is -inf, the first `cols` else, fewer under the causal mask.
      auto seenOf = [&](int64_t i0, int64_t i, int64_t j0, int64_t cols) -> int64_t {
        if (lb[(i0 + i) * ls[nb]] == -INFINITY) // every key is masked: p = 0
          return 0;
        return causal ? std::max<int64_t>(0, std::min(cols, i0 + i + 1 - j0)) : cols;
      };
      // The block of query rows [i0, i0 + rows) and keys [j0, j0 + cols): p into s (for v's
      // gradient with dropout, as dropped; with k's too, the dropped p into `dropped`), and
      // for any gradient but v's, dP (as dropped) into dp; 0 at masked keys.
      auto block = [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
        braze_attn_scores(rows, cols, d, qb + i0 * qs[nb], qs[nb], kb + j0 * ks[nb], ks[nb], s,
                          ck);
        if (wrt != 2)
          braze_attn_scores(rows, cols, dv, dob + i0 * dos[nb], dos[nb], vb + j0 * vs[nb],
                            vs[nb], dp, ck);
        for (int64_t i = 0; i < rows; ++i) {
          float* si = s + i * ck;
          const float li = lb[(i0 + i) * ls[nb]];
          const int64_t seen = seenOf(i0, i, j0, cols);
          if (bb) {
            const float* bi = bb + (i0 + i) * bs[nb] + j0 * bs[nb + 1];
            const int64_t step = bs[nb + 1];
            #pragma omp simd
            for (int64_t j = 0; j < seen; ++j)
              si[j] = si[j] * scale + bi[j * step];
          } else {
            #pragma omp simd
            for (int64_t j = 0; j < seen; ++j)
              si[j] *= scale;
          }
          // s - lse is <= 0 up to rounding
          #pragma omp simd
          for (int64_t j = 0; j < seen; ++j)
            si[j] = braze_attn_exp(std::min(si[j] - li, 0.f));
          for (int64_t j = seen; j < cols; ++j)
            si[j] = 0.f;
          const int64_t at = (b * sq + i0 + i) * sk + j0; // the row's first score
          if (wrt == 3 && seed) {
            float* pi = dropped + i * ck;
            std::copy(si, si + cols, pi);
            braze_attn_drop(pi, seen, seed, at, dropout);
          } else if (wrt == 2 && seed) {
            braze_attn_drop(si, seen, seed, at, dropout);
          }
          if (wrt != 2 && seed)
            braze_attn_drop(dp + i * ck, seen, seed, at, dropout);
        }
      };
      // scale * dS in place of the block's p (after v's gradient has read p, for k and v);
      // masked keys keep their 0.
      auto gradientScores = [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
        for (int64_t i = 0; i < rows; ++i) {
          float* si = s + i * ck;
          const float* dpi = dp + i * ck;
          const float di = delta[i];
          const int64_t seen = seenOf(i0, i, j0, cols);
          #pragma omp simd
          for (int64_t j = 0; j < seen; ++j)
            si[j] = scale * si[j] * (dpi[j] - di);
        }
      };
      if (wrt == 0) {
        const int64_t i0 = t0, rows = tn, kend = causal ? std::min(sk, i0 + rows) : sk;
        deltas(i0, rows);
        for (int64_t j0 = 0; j0 < kend; j0 += ck) {
          const int64_t cols = std::min(ck, kend - j0);
          block(i0, rows, j0, cols);
          gradientScores(i0, rows, j0, cols);
          braze_attn_accumulate(rows, cols, d, s, ck, kb + j0 * ks[nb], ks[nb], g, d);
        }
      } else {
        const int64_t j0 = t0, cols = tn;
        for (int64_t i0 = causal ? j0 : 0; i0 < sq; i0 += rq) {
          const int64_t rows = std::min(rq, sq - i0);
          if (wrt != 2)
            deltas(i0, rows);
          block(i0, rows, j0, cols);
          if (wrt == 3)
            braze_attn_accumulate_t(rows, cols, dv, seed ? dropped : s, ck, dob + i0 * dos[nb],
                                    dos[nb], g2, dv);
          if (wrt != 2) {
            gradientScores(i0, rows, j0, cols);
            braze_attn_accumulate_t(rows, cols, d, s, ck, qb + i0 * qs[nb], qs[nb], g, d);
          } else {
            braze_attn_accumulate_t(rows, cols, dv, s, ck, dob + i0 * dos[nb], dos[nb], g, dv);
          }
        }
      }
    }
    std::free(s);
  }
}
)";

} // namespace

std::string attentionPrelude(const BlasSymbols &blas) {
  return "#include <cmath>\n#include <cstdlib>\n#include <cstring>\n#include <algorithm>\n" +
         blockProducts(blas) + kAttention + kAttentionBackward;
}

} // namespace braze::codegen
