/// Fused attention on CUDA (f16/bf16, sm_80+): the device function every attention kernel calls
/// and the kernel around it. One block of 4 warps takes 64 query rows (128 for head dims up to
/// 64) of one batch point; each warp holds its 16 (32) rows' queries as tensor-core fragments (mma.sync m16n8k16, f32
/// accumulation), and the block walks the keys in tiles staged in shared memory:
///   1. S = Q·Kᵀ for the tile, in registers (the accumulator layout of mma);
///   2. scale, bias, causal and out-of-range masks, then an online softmax: the running row
///      maximum and sum are rescaled when the maximum grows (rows with every key masked so far
///      keep a zero sum and contribute nothing);
///   3. O += P·V, P reused from S's registers as the A operand, rounded to the operands' dtype;
///   4. at the end O / l is rounded and stored (for a row with no unmasked key: 0 when SAFE,
///      nan otherwise).
/// Scores never reach global memory: memory is O(rows × head dim).
#include "braze/codegen/cuda/CudaAttention.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/cuda/CudaHost.h"
#include "braze/support/Check.h"

namespace braze::codegen {

namespace {

const char *kFlashPrelude = R"FLASH(
// ---- fused attention (mma.sync m16n8k16; fragment layouts from the PTX ISA) -------------------
template <bool BF16> BRAZE_FN float braze_attn_f(uint16_t h) { return BF16 ? braze_bf2f(h) : braze_h2f(h); }
// Two floats as one register of two 16-bit values, `lo` in the low half.
template <bool BF16> BRAZE_FN uint32_t braze_attn_pack(float lo, float hi) {
  uint32_t r;
  if (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
BRAZE_FN uint32_t braze_attn_pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }
template <bool BF16> BRAZE_FN void braze_attn_mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if (BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 16-bit matrices from shared memory (rows addressed by lanes 8i..8i+7 for matrix i),
// as the mma operand registers: plain, or transposed (`trans`).
template <bool TRANS> BRAZE_FN void braze_attn_ldsm4(uint32_t* r, const uint16_t* row) {
  const uint32_t at = (uint32_t)__cvta_generic_to_shared(row);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}

// 16 bytes global -> shared without passing through registers; zeros when !in.
BRAZE_FN void braze_attn_cp16(uint16_t* dst, const uint16_t* src, bool in) {
  const uint32_t at = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(at), "l"(src), "r"(in ? 16 : 0));
}
// ---- one warp's tile of 16 query rows: rows[0] = row g of the tile, rows[1] = row g + 8 ----------

// The tile's queries as mma A fragments (qa[kk]: d 16kk..16kk + 15), zeros past sq and D.
template <int D, int DP>
BRAZE_FN void braze_attn_load_q(uint32_t (&qa)[DP / 16][4], const uint16_t* __restrict__ q, int64_t qrs,
                                const int64_t (&rows)[2], int t, int64_t sq) {
  #pragma unroll
  for (int kk = 0; kk < DP / 16; ++kk)
    #pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int64_t row = rows[x & 1];
      const int col = kk * 16 + t * 2 + ((x & 2) ? 8 : 0);
      const uint16_t lo = row < sq && col < D ? q[row * qrs + col] : 0;
      const uint16_t hi = row < sq && col + 1 < D ? q[row * qrs + col + 1] : 0;
      qa[kk][x] = braze_attn_pair(lo, hi);
    }
}
// The bias pairs of keys [j0, j0 + BN) a thread reads (keys j0 + 8n + 2t, + 1): -inf past the
// rows or the keys (`ninf2`: -inf's bits in both halves).
template <int BN>
BRAZE_FN void braze_attn_bias_pairs(uint32_t (&out)[BN / 8][2], const uint16_t* __restrict__ bias,
                                    int64_t brs, const int64_t (&rows)[2], int t, int64_t j0,
                                    int64_t sq, int64_t sk, uint32_t ninf2) {
  #pragma unroll
  for (int n = 0; n < BN / 8; ++n)
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = rows[h], key = j0 + n * 8 + t * 2;
      uint32_t pair = ninf2;
      if (row < sq && key < sk) {
        const uint16_t* at = bias + row * brs + key;
        pair = key + 1 < sk ? *reinterpret_cast<const uint32_t*>(at)
                            : (uint32_t)*at | (ninf2 & 0xffff0000u);
      }
      out[n][h] = pair;
    }
}
// The pairs as the scores' bias (the accumulator layout); true when every pair is -inf.
template <int BN, bool BF16>
BRAZE_FN bool braze_attn_bias_unpack(float (&bv)[BN / 8][4], const uint32_t (&pairs)[BN / 8][2],
                                     uint32_t ninf2) {
  bool all = true;
  #pragma unroll
  for (int n = 0; n < BN / 8; ++n)
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pair = pairs[n][h];
      all = all && pair == ninf2;
      bv[n][2 * h] = braze_attn_f<BF16>((uint16_t)pair);
      bv[n][2 * h + 1] = braze_attn_f<BF16>((uint16_t)(pair >> 16));
    }
  return all;
}
// The bias of keys [j0, j0 + BN) read value by value (any strides; 0 past the rows or keys).
template <int BN, bool BF16>
BRAZE_FN void braze_attn_bias_load(float (&bv)[BN / 8][4], const uint16_t* __restrict__ bias,
                                   int64_t brs, int64_t bcs, const int64_t (&rows)[2], int t,
                                   int64_t j0, int64_t sq, int64_t sk) {
  #pragma unroll
  for (int n = 0; n < BN / 8; ++n)
    #pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int64_t row = rows[x >> 1], key = j0 + n * 8 + t * 2 + (x & 1);
      bv[n][x] = row < sq && key < sk ? braze_attn_f<BF16>(bias[row * brs + key * bcs]) : 0.f;
    }
}
BRAZE_FN float braze_attn_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }

// Step 2 of a key tile: scale, bias and masks (only a tile past the keys' end, or reaching the
// causal diagonal, `edge`, needs the masks), then the online softmax: s becomes p, the running
// maximum m and sum l are updated, and o is rescaled where the maximum grew.
// Scores are kept in the log2 domain (scaled by log2 e once, p = 2^(s - m)), or with a bias
// in the natural one, s = scale q·k + bias in one FMA and p = 2^((s - m) log2 e): a finite
// bias stays finite there (the lowest bf16, a common mask value, times log2 e would overflow
// to -inf, and a row masked whole by it must average every key as eager does). `sl` is the
// scale in the scores' domain.
template <int BN, int DVP, bool CAUSAL, bool BIAS>
BRAZE_FN void braze_attn_softmax(float (&s)[BN / 8][4], const float (&bv)[BN / 8][4],
                                 bool hasBias, float sl, bool edge, const int64_t (&rows)[2],
                                 int t, int64_t j0, int64_t sk, float (&m)[2], float (&l)[2],
                                 float (&o)[DVP / 8][4]) {
  constexpr float L2E = 1.4426950408889634f;
  float mx[2] = {m[0], m[1]};
  // Key j0 + 2t + i of row h is masked when i >= lim[h]: past the keys, or with CAUSAL past
  // the row's diagonal.
  int lim[2];
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    int64_t e = sk - j0 - 2 * t;
    if (CAUSAL && rows[h] + 1 - j0 - 2 * t < e)
      e = rows[h] + 1 - j0 - 2 * t;
    lim[h] = e < 0 ? 0 : e > BN ? BN : (int)e;
  }
  #pragma unroll
  for (int n = 0; n < BN / 8; ++n)
    #pragma unroll
    for (int x = 0; x < 4; ++x) {
      float val = BIAS && hasBias ? fmaf(s[n][x], sl, bv[n][x]) : s[n][x] * sl;
      if (edge && n * 8 + (x & 1) >= lim[x >> 1])
        val = -INFINITY;
      s[n][x] = val;
      mx[x >> 1] = fmaxf(mx[x >> 1], val);
    }
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float base = mx[h] == -INFINITY ? 0.f : mx[h];
    const float alpha = braze_attn_exp2(BIAS ? (m[h] - base) * L2E : m[h] - base);
    m[h] = mx[h];
    float sum = 0.f;
    #pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
      #pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float d = s[n][2 * h + e] - base;
        s[n][2 * h + e] = braze_attn_exp2(BIAS ? d * L2E : d);
      }
      sum += s[n][2 * h] + s[n][2 * h + 1];
    }
    l[h] = l[h] * alpha + sum;
    #pragma unroll
    for (int n = 0; n < DVP / 8; ++n) {
      o[n][2 * h] *= alpha;
      o[n][2 * h + 1] *= alpha;
    }
  }
}
// P (step 2's s) as the A fragment of O += P V for keys 16kk..16kk + 15, rounded to the
// operands' dtype.
template <bool BF16, int N>
BRAZE_FN void braze_attn_p_frag(uint32_t (&pa)[4], const float (&s)[N][4], int kk) {
  pa[0] = braze_attn_pack<BF16>(s[2 * kk][0], s[2 * kk][1]);
  pa[1] = braze_attn_pack<BF16>(s[2 * kk][2], s[2 * kk][3]);
  pa[2] = braze_attn_pack<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  pa[3] = braze_attn_pack<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
// Step 4: O / l rounded and stored (a row with every key masked: 0 when SAFE, nan otherwise). A
// thread's two adjacent columns go out as one 32-bit store where rows keep them aligned (`pack`).
template <int DV, int DVP, bool BF16, bool SAFE>
BRAZE_FN void braze_attn_store(const float (&oacc)[DVP / 8][4], const float (&l)[2],
                               const int64_t (&rows)[2], int t, uint16_t* __restrict__ o,
                               int64_t ors, int64_t sq, bool pack) {
  const float none = SAFE ? 0.f : NAN;
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lt = l[h];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float inv = lt > 0.f ? 1.f / lt : none;
    const int64_t row = rows[h];
    #pragma unroll
    for (int n = 0; n < DVP / 8; ++n) {
      const int col = n * 8 + t * 2;
      if (row >= sq || col >= DV)
        continue;
      uint16_t out[2];
      #pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float val = oacc[n][2 * h + e] * inv;
        out[e] = BF16 ? braze_f2bf(val) : braze_f2h(val);
      }
      uint16_t* at = o + row * ors + col;
      if (pack) {
        *reinterpret_cast<uint32_t*>(at) = (uint32_t)out[0] | ((uint32_t)out[1] << 16);
      } else {
        at[0] = out[0];
        if (col + 1 < DV)
          at[1] = out[1];
      }
    }
  }
}

// Rows [i0, i0 + 64 * MT) of one batch point: q [Sq, D] (row stride qrs), k [Sk, D],
// v [Sk, DV], bias [Sq, Sk] (strides brs, bcs) or null, o [Sq, DV] (row stride ors). 128 threads; warp
// w holds MT tiles of 16 rows, rows i0 + 16 (MT w + mt) .., so each K/V fragment serves MT rows
// tiles. With BIAS, a bias whose keys are contiguous (and whose rows keep 4-byte alignment) is
// read as pairs of values, a thread's two adjacent keys, one key tile ahead; a warp skips a key
// tile its bias masks whole (-inf), so a causal or padding mask given as a tensor costs about
// what the keys it keeps cost.
template <int D, int DV, int BN, int MT, bool BF16, bool CAUSAL, bool SAFE, bool BIAS>
BRAZE_FN void braze_flash_attention(const uint16_t* __restrict__ q, int64_t qrs,
                                    const uint16_t* __restrict__ k, int64_t krs,
                                    const uint16_t* __restrict__ v, int64_t vrs,
                                    const uint16_t* __restrict__ bias, int64_t brs, int64_t bcs,
                                    uint16_t* __restrict__ o, int64_t ors, int64_t sq, int64_t sk, int64_t i0,
                                    float scale) {
  constexpr int DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16, BM = 64 * MT;
  constexpr int KS = DP + 8, VS = DVP + 8; // padded rows: fragment reads hit distinct banks
  __shared__ __align__(16) uint16_t kbuf[2][BN * KS]; // two stages: one loads, one computes
  __shared__ __align__(16) uint16_t vbuf[2][BN * VS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t wrow = i0 + warp * 16 * MT; // the warp's first row
  int64_t rows[MT][2];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    rows[mt][0] = wrow + mt * 16 + g;
    rows[mt][1] = rows[mt][0] + 8;
  }
  uint32_t qa[MT][DP / 16][4];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    braze_attn_load_q<D, DP>(qa[mt], q, qrs, rows[mt], t, sq);
  float oacc[MT][DVP / 8][4];
  float m[MT][2], l[MT][2];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    #pragma unroll
    for (int n = 0; n < DVP / 8; ++n)
      oacc[mt][n][0] = oacc[mt][n][1] = oacc[mt][n][2] = oacc[mt][n][3] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  const bool vec = D % 8 == 0 && DV % 8 == 0 && krs % 8 == 0 && vrs % 8 == 0 &&
                   (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0;
  const int64_t kend = CAUSAL ? (sk < i0 + BM ? sk : i0 + BM) : sk;
  const uint32_t ninf2 = BF16 ? 0xFF80FF80u : 0xFC00FC00u; // two -inf, as a pair of keys
  const bool pairs = BIAS && bias != nullptr && bcs == 1 && brs % 2 == 0 && (uintptr_t)bias % 4 == 0;
  uint32_t bnext[BIAS ? MT : 1][BIAS ? BN / 8 : 1][2]; // the next key tile's bias pairs
  // Stages K/V keys [j0, j0 + BN) into stage `st` (zeros past the end): 16-byte cp.async
  // copies when the rows are aligned, element copies otherwise.
  auto stage = [&](int st, int64_t j0) {
    uint16_t* ks = kbuf[st];
    uint16_t* vs = vbuf[st];
    if (vec) {
      for (int idx = threadIdx.x; idx < BN * (DP / 8); idx += blockDim.x) {
        const int key = idx / (DP / 8), c = idx % (DP / 8) * 8;
        const bool in = j0 + key < sk && c < D;
        braze_attn_cp16(ks + key * KS + c, in ? k + (j0 + key) * krs + c : k, in);
      }
      for (int idx = threadIdx.x; idx < BN * (DVP / 8); idx += blockDim.x) {
        const int key = idx / (DVP / 8), c = idx % (DVP / 8) * 8;
        const bool in = j0 + key < sk && c < DV;
        braze_attn_cp16(vs + key * VS + c, in ? v + (j0 + key) * vrs + c : v, in);
      }
    } else {
      for (int idx = threadIdx.x; idx < BN * DP; idx += blockDim.x) {
        const int key = idx / DP, c = idx % DP;
        ks[key * KS + c] = j0 + key < sk && c < D ? k[(j0 + key) * krs + c] : 0;
      }
      for (int idx = threadIdx.x; idx < BN * DVP; idx += blockDim.x) {
        const int key = idx / DVP, c = idx % DVP;
        vs[key * VS + c] = j0 + key < sk && c < DV ? v[(j0 + key) * vrs + c] : 0;
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  const float sl = BIAS ? scale : scale * 1.4426950408889634f; // see braze_attn_softmax
  if (kend > 0)
    stage(0, 0);
  if constexpr (BIAS)
    if (pairs && kend > 0)
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        braze_attn_bias_pairs<BN>(bnext[mt], bias, brs, rows[mt], t, 0, sq, sk, ninf2);
  int cur = 0;
  for (int64_t j0 = 0; j0 < kend; j0 += BN, cur ^= 1) {
    if (j0 + BN < kend) {
      stage(cur ^ 1, j0 + BN); // the next tile loads while this one computes
      asm volatile("cp.async.wait_group 1;");
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();
    const uint16_t* ksm = kbuf[cur];
    const uint16_t* vsm = vbuf[cur];
    // The tile's bias: the pairs loaded one tile ago (the next tile's load overlaps this one),
    // or values loaded now, before the product, so that the loads overlap it.
    float bv[MT][BN / 8][4];
    bool dead = false;
    if (pairs) {
      if constexpr (BIAS) {
        bool all = true;
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          all = braze_attn_bias_unpack<BN, BF16>(bv[mt], bnext[mt], ninf2) && all;
        if (j0 + BN < kend)
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            braze_attn_bias_pairs<BN>(bnext[mt], bias, brs, rows[mt], t, j0 + BN, sq, sk, ninf2);
        dead = __all_sync(0xffffffffu, all);
      }
    } else if (bias != nullptr) {
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        braze_attn_bias_load<BN, BF16>(bv[mt], bias, brs, bcs, rows[mt], t, j0, sq, sk);
    }
    if (!dead) { // the warp's rows keep some key of the tile
      // 1. S = Q K^T: B[d][key] = K[key][d]. One ldmatrix.x4 gives the B registers of two
      //    key tiles (n, n + 1) for one step of 16 d: matrix i is keys 8(n + i/2).., d 8(i%2)...
      float s[MT][BN / 8][4];
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int n = 0; n < BN / 8; ++n)
          s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
      #pragma unroll
      for (int n = 0; n < BN / 8; n += 2)
        #pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk) {
          uint32_t b[4];
          const int mat = lane / 8;
          braze_attn_ldsm4<false>(b, ksm + ((n + mat / 2) * 8 + lane % 8) * KS + kk * 16 + (mat % 2) * 8);
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            braze_attn_mma<BF16>(s[mt][n], qa[mt][kk], b[0], b[1]);
            braze_attn_mma<BF16>(s[mt][n + 1], qa[mt][kk], b[2], b[3]);
          }
        }
      // 2. Masks and the online softmax.
      const bool edge = j0 + BN > sk || (CAUSAL && j0 + BN - 1 > wrow);
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        braze_attn_softmax<BN, DVP, CAUSAL, BIAS>(s[mt], bv[mt], bias != nullptr, sl, edge,
                                                  rows[mt], t, j0, sk, m[mt], l[mt], oacc[mt]);
      // 3. O += P V: P's A fragment is S's accumulator pair of n-tiles; B[key][c] = V[key][c].
      #pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          braze_attn_p_frag<BF16>(pa[mt], s[mt], kk);
        // One ldmatrix.x4.trans: matrix i is keys 16kk + 8(i%2).., columns 8(n + i/2)...
        #pragma unroll
        for (int n = 0; n < DVP / 8; n += 2) {
          uint32_t b[4];
          const int mat = lane / 8;
          braze_attn_ldsm4<true>(b, vsm + (kk * 16 + (mat % 2) * 8 + lane % 8) * VS + (n + mat / 2) * 8);
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            braze_attn_mma<BF16>(oacc[mt][n], pa[mt], b[0], b[1]);
            braze_attn_mma<BF16>(oacc[mt][n + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads(); // the next iteration stages into this tile's buffers
  }
  // 4. Normalize and store.
  const bool pack = DV % 2 == 0 && ors % 2 == 0 && ((uintptr_t)o & 3) == 0;
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    braze_attn_store<DV, DVP, BF16, SAFE>(oacc[mt], l[mt], rows[mt], t, o, ors, sq, pack);
}
)FLASH";

} // namespace

const char *cudaAttentionPrelude() { return kFlashPrelude; }

AttentionPlan planAttention(const sched::Kernel &k, const Target &target) {
  const loop::AttentionSpec &a = *k.attention->attention;
  size_t rank = a.q.shape.size();
  const int64_t d = a.q.shape[rank - 1]->value(), dv = a.v.shape[rank - 1]->value();
  auto padded = [](int64_t x) { return (x + 15) / 16 * 16; };
  // Blocks of `rows` query rows over the batch points (symbolic sizes count as large).
  auto blocks = [&](int64_t rows) {
    int64_t n = 1;
    for (size_t i = 0; i + 1 < rank; ++i) {
      sym::SymExpr e = a.q.shape[i];
      int64_t x = e->isConst() ? e->value() : int64_t(1) << 20;
      x = i + 2 == rank ? (x + rows - 1) / rows : x;
      n = std::min<int64_t>(n * x, int64_t(1) << 40);
    }
    return n;
  };
  AttentionPlan p;
  // Two stages of K and V tiles within 48 KiB of static shared memory.
  auto keyTile = [](int64_t rowBytes) {
    for (int bn : {64, 32})
      if (2 * bn * rowBytes <= 48 * 1024)
        return bn;
    return 16;
  };
  // Rows padded by 8 elements. Two row tiles per warp halve the K/V traffic per row,
  // but also the blocks: keep them only where at least four blocks per multiprocessor remain,
  // and not for heads wider than 64 (their registers would spill).
  p.keyTile = keyTile((padded(d) + 8 + padded(dv) + 8) * 2);
  p.units = std::max(d, dv) <= 64 && blocks(128) >= 4 * int64_t(target.cores) ? 2 : 1;
  p.threads = 128;
  p.rowsPerBlock = 64 * p.units;
  return p;
}

std::string emitCudaAttentionKernel(const Names &names, const sched::Kernel &k,
                                    const std::string &params, const Target &target) {
  const loop::Computation &c = *k.attention;
  const loop::AttentionSpec &a = *c.attention;
  DType t = c.out->dtype;
  BRAZE_CHECK(t == DType::Float16 || t == DType::BFloat16) << "CUDA attention is f16/bf16 only";
  BRAZE_CHECK(a.part == loop::AttentionPart::Output)
      << "CUDA fuses the attention output only (its log-sum-exp and gradients decompose)";
  size_t rank = c.out->shape.size(), nb = rank - 2;
  int64_t d = a.q.shape[rank - 1]->value(), dv = a.v.shape[rank - 1]->value();
  auto ix = [&](sym::SymExpr e) { return names.index(e); };
  std::string body;
  Writer w(body, 1);
  w.line("const int64_t sq = " + ix(a.q.shape[rank - 2]) + ", sk = " + ix(a.k.shape[rank - 2]) +
         ";");
  AttentionPlan plan = planAttention(k, target);
  std::string bm = std::to_string(plan.rowsPerBlock);
  w.line("const int64_t blocks = (sq + " + bm + " - 1) / " + bm + ";");
  w.line("int64_t rest = (int64_t)blockIdx.x / blocks;");
  w.line("const int64_t i0 = ((int64_t)blockIdx.x % blocks) * " + bm + ";");
  std::vector<const loop::AttentionOperand *> ops = a.operands();
  const char *off[] = {"qo", "ko", "vo", "bo"};
  for (size_t i = 0; i < ops.size(); ++i)
    w.line("int64_t " + std::string(off[i]) + " = " + ix(ops[i]->offset) + ";");
  w.line("int64_t oo = 0;");
  for (size_t x = nb; x-- > 0;) {
    w.line("{");
    w.line("  const int64_t at = rest % " + ix(a.q.shape[x]) + ";");
    w.line("  rest /= " + ix(a.q.shape[x]) + ";");
    for (size_t i = 0; i < ops.size(); ++i)
      w.line("  " + std::string(off[i]) + " += at * " + ix(ops[i]->strides[x]) + ";");
    w.line("  oo += at * " + ix(c.out->strides[x]) + ";");
    w.line("}");
  }
  w.line("(void)rest;");
  auto buf = [&](const loop::AttentionOperand &o) { return names.buffer(*o.buffer); };
  std::string bias = a.bias ? buf(*a.bias) + " + bo, " + ix(a.bias->strides[nb]) + ", " +
                                  ix(a.bias->strides[nb + 1])
                            : "nullptr, 0, 0";
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  w.line("braze_flash_attention<" + std::to_string(d) + ", " + std::to_string(dv) + ", " + std::to_string(plan.keyTile) +
         ", " + std::to_string(plan.units) + ", " +
         flag(t == DType::BFloat16) + ", " + flag(a.causal) + ", " + flag(a.safe) + ", " +
         flag(a.bias.has_value()) + ">(" +
         buf(a.q) + " + qo, " + ix(a.q.strides[nb]) + ", " + buf(a.k) + " + ko, " +
         ix(a.k.strides[nb]) + ", " + buf(a.v) + " + vo, " + ix(a.v.strides[nb]) + ", " + bias +
         ", " + names.buffer(*c.out) + " + oo, " + ix(c.out->strides[nb]) + ", sq, sk, i0, " +
         literal(a.scale, 0, DType::Float32) + ");");
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(plan.threads) +
         ") " + k.name + "(" + params + ") {\n" + body + "}\n\n";
}

std::string cudaAttentionLaunch(const sched::Schedule &s, const Names &names,
                                const sched::Kernel &k, int index) {
  const loop::AttentionSpec &a = *k.attention->attention;
  size_t rank = a.q.shape.size();
  AttentionPlan plan = planAttention(k, s.target);
  std::string bm = std::to_string(plan.rowsPerBlock);
  std::string blocks = "INT64_C(1)";
  for (size_t i = 0; i + 2 < rank; ++i)
    blocks += " * " + names.index(a.q.shape[i]);
  blocks += " * ((" + names.index(a.q.shape[rank - 2]) + " + " + bm + " - 1) / " + bm + ")";
  return launchBlocks(s, names, k, index, plan.threads, blocks);
}

} // namespace braze::codegen
