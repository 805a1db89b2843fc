/// Fused attention's backward on CUDA (f16/bf16, sm_80+): the device functions of the kernels
/// that CudaAttention.cpp writes for attention_grad. They read the forward's log-sum-exp and
/// recompute each tile's probabilities, as the flash-attention backward does, and use the
/// forward prelude's tensor-core helpers (mma.sync m16n8k16, ldmatrix, cp.async):
///   - braze_flash_attention_dq: per block of 64 query rows, the key tiles in turn:
///     S = Q Kᵀ, dP = dO Vᵀ, dS = P (dP - delta), dQ += dS K;
///   - braze_flash_attention_dkv: per block of 64 keys, the query tiles in turn, transposed:
///     Sᵀ = K Qᵀ, dV += Pᵀ dO, dPᵀ = V dOᵀ, dK += dSᵀ Q.
/// Like the forward, scores never reach global memory.
#include "braze/codegen/cuda/CudaAttention.h"

namespace braze::codegen {

namespace {

const char *kFlashBackwardPrelude = R"FLASH(
// ---- the backward: probabilities recomputed from the forward's log-sum-exp ----------------------

// The lse of `row` as the backward reads it: +inf past the rows, and where the forward kept no
// key (-inf), so that every probability of the row is 0.
BRAZE_FN float braze_attn_lse_at(const float* __restrict__ lse, int64_t lrs, int64_t row,
                                 int64_t sq) {
  const float x = row < sq ? lse[row * lrs] : INFINITY;
  return x == -INFINITY ? INFINITY : x;
}
// p = exp(scale s + b - lse) of a score s = q·k with bias b (0 without one); 0 unless `keep`.
BRAZE_FN float braze_attn_prob(float s, float b, float scale, float lse, bool keep) {
  return keep ? braze_attn_exp2((fmaf(s, scale, b) - lse) * 1.4426950408889634f) : 0.f;
}
// sum of a[row][c] b[row][c] over c = first, first + step.. < W (0 past n rows).
template <int W, bool BF16>
BRAZE_FN float braze_attn_dot(const uint16_t* __restrict__ a, int64_t ars,
                              const uint16_t* __restrict__ b, int64_t brs, int64_t row, int64_t n,
                              int first, int step) {
  float acc = 0.f;
  if (row < n)
    for (int c = first; c < W; c += step)
      acc += braze_attn_f<BF16>(a[row * ars + c]) * braze_attn_f<BF16>(b[row * brs + c]);
  return acc;
}
template <int N, int M>
BRAZE_FN void braze_attn_zero(float (&x)[N][M][4]) {
  #pragma unroll
  for (int i = 0; i < N; ++i)
    #pragma unroll
    for (int j = 0; j < M; ++j)
      x[i][j][0] = x[i][j][1] = x[i][j][2] = x[i][j][3] = 0.f;
}

// The operands of a gradient kernel: the forward's (q [Sq, D], k [Sk, D], v [Sk, DV], bias
// [Sq, Sk] or null), the output's gradient dout and the output o ([Sq, DV]) and its lse
// ([Sq]), each by its row stride (and the bias by its key stride too), of one batch point.
struct BrazeAttnGrad {
  const uint16_t* __restrict__ q; int64_t qrs;
  const uint16_t* __restrict__ k; int64_t krs;
  const uint16_t* __restrict__ v; int64_t vrs;
  const uint16_t* __restrict__ bias; int64_t brs, bcs;
  const uint16_t* __restrict__ dout; int64_t dors;
  const uint16_t* __restrict__ o; int64_t ors;
  const float* __restrict__ lse; int64_t lrs;
  int64_t sq, sk;
  float scale;
};

// The gradient of q for rows [i0, i0 + 64) of one batch point (4 warps of 16 rows) into dq
// (row stride dqrs). Per key tile of BN: S = Q Kᵀ and dP = dO Vᵀ,
// P = exp(scale S + bias - lse), dS = P (dP - delta) with delta = rowsum(dO ∘ O), and
// dQ += dS K; dQ · scale is stored at the end.
template <int D, int DV, int BN, bool BF16, bool CAUSAL, bool BIAS>
BRAZE_FN void braze_flash_attention_dq(const BrazeAttnGrad& a, uint16_t* __restrict__ dq,
                                       int64_t dqrs, int64_t i0) {
  const uint16_t* __restrict__ k = a.k;
  const uint16_t* __restrict__ v = a.v;
  const int64_t krs = a.krs, vrs = a.vrs, sq = a.sq, sk = a.sk;
  const float scale = a.scale;
  constexpr int DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16, BM = 64;
  constexpr int KS = DP + 8, VS = DVP + 8;
  __shared__ __align__(16) uint16_t kbuf[2][BN * KS];
  __shared__ __align__(16) uint16_t vbuf[2][BN * VS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t wrow = i0 + warp * 16;
  const int64_t rows[2] = {wrow + g, wrow + g + 8};
  uint32_t qa[1][DP / 16][4], da[1][DVP / 16][4];
  braze_attn_load_q<D, DP>(qa[0], a.q, a.qrs, rows, t, sq);
  braze_attn_load_q<DV, DVP>(da[0], a.dout, a.dors, rows, t, sq);
  float lrow[2], delta[2];
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    lrow[h] = braze_attn_lse_at(a.lse, a.lrs, rows[h], sq);
    delta[h] = braze_attn_quad_sum(
        braze_attn_dot<DV, BF16>(a.dout, a.dors, a.o, a.ors, rows[h], sq, t, 4));
  }
  float acc[1][DP / 8][4];
  braze_attn_zero(acc);
  const bool vec = D % 8 == 0 && DV % 8 == 0 && krs % 8 == 0 && vrs % 8 == 0 &&
                   (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0;
  const int64_t kend = CAUSAL ? (sk < i0 + BM ? sk : i0 + BM) : sk;
  auto stage = [&](int st, int64_t j0) {
    braze_attn_stage<BN, D, DP>(kbuf[st], k, krs, j0, sk, vec);
    braze_attn_stage<BN, DV, DVP>(vbuf[st], v, vrs, j0, sk, vec);
    asm volatile("cp.async.commit_group;");
  };
  if (kend > 0)
    stage(0, 0);
  int cur = 0;
  for (int64_t j0 = 0; j0 < kend; j0 += BN, cur ^= 1) {
    if (j0 + BN < kend)
      stage(cur ^ 1, j0 + BN);
    braze_attn_wait_tile(j0 + BN < kend);
    if (!(CAUSAL && j0 > wrow + 15)) { // some key of the tile is at or before a row of the warp
      float bv[1][BN / 8][4];
      braze_attn_zero(bv);
      if (BIAS && a.bias != nullptr)
        braze_attn_bias_load<BN, BF16>(bv[0], a.bias, a.brs, a.bcs, rows, t, j0, sq, sk);
      float s[1][BN / 8][4], dp[1][BN / 8][4];
      braze_attn_zero(s);
      braze_attn_zero(dp);
      braze_attn_mm_abt<1, BN / 8, DP, KS, BF16>(s, qa, kbuf[cur]);
      braze_attn_mm_abt<1, BN / 8, DVP, VS, BF16>(dp, da, vbuf[cur]);
      #pragma unroll
      for (int n = 0; n < BN / 8; ++n)
        #pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int64_t key = j0 + n * 8 + t * 2 + (x & 1);
          const bool keep = key < sk && (!CAUSAL || key <= rows[x >> 1]);
          const float p = braze_attn_prob(s[0][n][x], bv[0][n][x], scale, lrow[x >> 1], keep);
          s[0][n][x] = p * (dp[0][n][x] - delta[x >> 1]); // dS
        }
      braze_attn_mm_ab<1, BN / 8, DP, KS, BF16>(acc, s, kbuf[cur]);
    }
    __syncthreads();
  }
  const float mul[2] = {scale, scale};
  const bool pack = D % 2 == 0 && dqrs % 2 == 0 && ((uintptr_t)dq & 3) == 0;
  braze_attn_store_rows<D, DP, BF16>(acc[0], mul, rows, t, dq, dqrs, sq, pack);
}

// delta = rowsum(dout ∘ o) of rows [q0, q0 + R) into d[0, R) (0 past sq): 128 / R threads per
// row, adjacent lanes, each issuing all its loads (16 bytes at a time where `vec`) before the sums.
template <int R, int DV, bool BF16>
BRAZE_FN void braze_attn_deltas(float* d, const uint16_t* __restrict__ dout, int64_t dors,
                                const uint16_t* __restrict__ o, int64_t ors, int64_t q0,
                                int64_t sq, bool vec) {
  constexpr int PER = 128 / R;
  const int r = threadIdx.x / PER, part = threadIdx.x % PER;
  const int64_t row = q0 + r;
  float acc = 0.f;
  if (row < sq) {
    const uint16_t* a = dout + row * dors;
    const uint16_t* b = o + row * ors;
    if (vec) {
      #pragma unroll
      for (int c = part * 8; c < DV; c += 8 * PER) {
        const uint4 x = *reinterpret_cast<const uint4*>(a + c);
        const uint4 y = *reinterpret_cast<const uint4*>(b + c);
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(&x);
        const uint16_t* ys = reinterpret_cast<const uint16_t*>(&y);
        #pragma unroll
        for (int e = 0; e < 8; ++e)
          acc += braze_attn_f<BF16>(xs[e]) * braze_attn_f<BF16>(ys[e]);
      }
    } else {
      for (int c = part; c < DV; c += PER)
        acc += braze_attn_f<BF16>(a[c]) * braze_attn_f<BF16>(b[c]);
    }
  }
  #pragma unroll
  for (int m = PER / 2; m > 0; m /= 2)
    acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (part == 0)
    d[r] = acc;
}

// The gradients of k (WRT bit 1) into gk and of v (bit 2) into gv (row strides gks, gvs) for
// keys [j0, j0 + 64) of one batch point (4 warps of 16 keys). The block walks the query tiles
// of BM rows (staged with their lse, and for k with delta) in transposed form:
// Sᵀ = K Qᵀ, Pᵀ = exp(scale Sᵀ + biasᵀ - lse); dV += Pᵀ dO; and dPᵀ = V dOᵀ,
// dSᵀ = Pᵀ (dPᵀ - delta), dK += dSᵀ Q (times scale at the end). 128 threads.
template <int D, int DV, int BM, bool BF16, bool CAUSAL, bool BIAS, int WRT>
BRAZE_FN void braze_flash_attention_dkv(const BrazeAttnGrad& a, uint16_t* __restrict__ gk,
                                        int64_t gks, uint16_t* __restrict__ gv, int64_t gvs,
                                        int64_t j0) {
  const uint16_t* __restrict__ q = a.q;
  const uint16_t* __restrict__ dout = a.dout;
  const int64_t qrs = a.qrs, dors = a.dors, sq = a.sq, sk = a.sk;
  const float scale = a.scale;
  constexpr bool WK = (WRT & 1) != 0, WV = (WRT & 2) != 0;
  constexpr int DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16;
  constexpr int KS = DP + 8, VS = DVP + 8;
  __shared__ __align__(16) uint16_t qbuf[2][BM * KS];
  __shared__ __align__(16) uint16_t dobuf[2][BM * VS];
  __shared__ float lbuf[2][BM], dbuf[2][BM];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t wkey = j0 + warp * 16;
  const int64_t keys[2] = {wkey + g, wkey + g + 8};
  uint32_t ka[1][DP / 16][4], va[1][WK ? DVP / 16 : 1][4];
  braze_attn_load_q<D, DP>(ka[0], a.k, a.krs, keys, t, sk);
  if constexpr (WK)
    braze_attn_load_q<DV, DVP>(va[0], a.v, a.vrs, keys, t, sk);
  float acck[1][WK ? DP / 8 : 1][4], accv[1][WV ? DVP / 8 : 1][4];
  braze_attn_zero(acck);
  braze_attn_zero(accv);
  const bool vec = D % 8 == 0 && DV % 8 == 0 && qrs % 8 == 0 && dors % 8 == 0 &&
                   (uintptr_t)q % 16 == 0 && (uintptr_t)dout % 16 == 0;
  const bool ovec = vec && a.ors % 8 == 0 && (uintptr_t)a.o % 16 == 0;
  const int64_t qbegin = CAUSAL ? j0 / BM * BM : 0; // earlier queries keep none of these keys
  auto stage = [&](int st, int64_t q0) {
    braze_attn_stage<BM, D, DP>(qbuf[st], q, qrs, q0, sq, vec);
    braze_attn_stage<BM, DV, DVP>(dobuf[st], dout, dors, q0, sq, vec);
    asm volatile("cp.async.commit_group;");
    for (int r = threadIdx.x; r < BM; r += blockDim.x)
      lbuf[st][r] = braze_attn_lse_at(a.lse, a.lrs, q0 + r, sq);
    if (WK) // (nvcc takes no `if constexpr` in a lambda)
      braze_attn_deltas<BM, DV, BF16>(dbuf[st], dout, dors, a.o, a.ors, q0, sq, ovec);
  };
  if (qbegin < sq)
    stage(0, qbegin);
  int cur = 0;
  for (int64_t q0 = qbegin; q0 < sq; q0 += BM, cur ^= 1) {
    if (q0 + BM < sq)
      stage(cur ^ 1, q0 + BM);
    braze_attn_wait_tile(q0 + BM < sq);
    if (!(CAUSAL && q0 + BM - 1 < wkey)) { // some query of the tile keeps a key of the warp
      float bv[1][BM / 8][4]; // biasᵀ: the warp's keys by the tile's queries
      braze_attn_zero(bv);
      if (BIAS && a.bias != nullptr)
        braze_attn_bias_load<BM, BF16>(bv[0], a.bias, a.bcs, a.brs, keys, t, q0, sk, sq);
      float s[1][BM / 8][4], dp[1][WK ? BM / 8 : 1][4];
      braze_attn_zero(s);
      braze_attn_mm_abt<1, BM / 8, DP, KS, BF16>(s, ka, qbuf[cur]);
      if constexpr (WK) {
        braze_attn_zero(dp);
        braze_attn_mm_abt<1, BM / 8, DVP, VS, BF16>(dp, va, dobuf[cur]);
      }
      #pragma unroll
      for (int n = 0; n < BM / 8; ++n)
        #pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int qi = n * 8 + t * 2 + (x & 1);
          const int64_t key = keys[x >> 1];
          const bool keep = key < sk && (!CAUSAL || key <= q0 + qi);
          s[0][n][x] = braze_attn_prob(s[0][n][x], bv[0][n][x], scale, lbuf[cur][qi], keep);
        }
      if constexpr (WV)
        braze_attn_mm_ab<1, BM / 8, DVP, VS, BF16>(accv, s, dobuf[cur]);
      if constexpr (WK) {
        #pragma unroll
        for (int n = 0; n < BM / 8; ++n)
          #pragma unroll
          for (int x = 0; x < 4; ++x) // dSᵀ
            s[0][n][x] *= dp[0][n][x] - dbuf[cur][n * 8 + t * 2 + (x & 1)];
        braze_attn_mm_ab<1, BM / 8, DP, KS, BF16>(acck, s, qbuf[cur]);
      }
    }
    __syncthreads();
  }
  if constexpr (WK) {
    const float mul[2] = {scale, scale};
    const bool pack = D % 2 == 0 && gks % 2 == 0 && ((uintptr_t)gk & 3) == 0;
    braze_attn_store_rows<D, DP, BF16>(acck[0], mul, keys, t, gk, gks, sk, pack);
  }
  if constexpr (WV) {
    const float one[2] = {1.f, 1.f};
    const bool pack = DV % 2 == 0 && gvs % 2 == 0 && ((uintptr_t)gv & 3) == 0;
    braze_attn_store_rows<DV, DVP, BF16>(accv[0], one, keys, t, gv, gvs, sk, pack);
  }
}
)FLASH";

} // namespace

const char *cudaAttentionBackwardPrelude() { return kFlashBackwardPrelude; }

} // namespace braze::codegen
