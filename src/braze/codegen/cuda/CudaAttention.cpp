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
/// Scores never reach global memory: memory is O(rows × head dim). The same kernel writes the
/// rows' log-sum-exp (attention_lse, alone or beside the output). The gradients' kernels
/// (CudaAttentionBackward.cpp) are written here too: the dQ kernel by query rows, the dK/dV
/// kernel by keys.
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

// Four 8x8 16-bit matrices from shared memory (rows addressed by lanes 8i..8i+7 for matrix i,
// `at` in the shared window), as the mma operand registers: plain, or transposed (`trans`).
template <bool TRANS> BRAZE_FN void braze_ldsm4_at(uint32_t* r, uint32_t at) {
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}
template <bool TRANS> BRAZE_FN void braze_attn_ldsm4(uint32_t* r, const uint16_t* row) {
  braze_ldsm4_at<TRANS>(r, (uint32_t)__cvta_generic_to_shared(row));
}

// 16 bytes global -> shared without passing through registers; zeros when !in.
BRAZE_FN void braze_attn_cp16(uint16_t* dst, const uint16_t* src, bool in) {
  const uint32_t at = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(at), "l"(src), "r"(in ? 16 : 0));
}
// Double buffering: when `more`, the next tile was staged after the current one, so the current
// one is complete once at most one group is pending; then every thread's copies are visible.
BRAZE_FN void braze_attn_wait_tile(bool more) {
  if (more)
    asm volatile("cp.async.wait_group 1;");
  else
    asm volatile("cp.async.wait_group 0;");
  __syncthreads();
}
// Rows [r0, r0 + R) of a [n, W] operand (row stride rs) into a shared tile of R rows of WP + 8
// elements (padded: fragment reads hit distinct banks), zeros past n and W: 16-byte cp.async
// copies where rows are aligned (`vec`), element copies otherwise. The caller commits.
template <int R, int W, int WP>
BRAZE_FN void braze_attn_stage(uint16_t* dst, const uint16_t* __restrict__ src, int64_t rs,
                               int64_t r0, int64_t n, bool vec) {
  constexpr int S = WP + 8;
  if (vec) {
    for (int idx = threadIdx.x; idx < R * (WP / 8); idx += blockDim.x) {
      const int r = idx / (WP / 8), c = idx % (WP / 8) * 8;
      const bool in = r0 + r < n && c < W;
      braze_attn_cp16(dst + r * S + c, in ? src + (r0 + r) * rs + c : src, in);
    }
  } else {
    for (int idx = threadIdx.x; idx < R * WP; idx += blockDim.x) {
      const int r = idx / WP, c = idx % WP;
      dst[r * S + c] = r0 + r < n && c < W ? src[(r0 + r) * rs + c] : 0;
    }
  }
}
// acc[mt] += a[mt] Bᵀ over KP (a multiple of 16) where B's NT * 8 rows are rows of the shared
// tile b (row stride S): S = Q Kᵀ and its kin. One ldmatrix.x4 gives the B registers of two
// n-tiles (n, n + 1) for 16 of KP: matrix i is rows 8(n + i/2).., columns 16kk + 8(i%2)...
template <int MT, int NT, int KP, int S, bool BF16>
BRAZE_FN void braze_attn_mm_abt(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][KP / 16][4],
                                const uint16_t* b) {
  const int lane = threadIdx.x % 32, mat = lane / 8;
  #pragma unroll
  for (int n = 0; n < NT; n += 2)
    #pragma unroll
    for (int kk = 0; kk < KP / 16; ++kk) {
      uint32_t r[4];
      braze_attn_ldsm4<false>(r, b + ((n + mat / 2) * 8 + lane % 8) * S + kk * 16 + (mat % 2) * 8);
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        braze_attn_mma<BF16>(acc[mt][n], a[mt][kk], r[0], r[1]);
        braze_attn_mma<BF16>(acc[mt][n + 1], a[mt][kk], r[2], r[3]);
      }
    }
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
// acc[mt] += p[mt] B over the KT * 8 rows of the shared tile b (row stride S, WP columns):
// O += P V and its kin, p (an accumulator of KT n-tiles) rounded to the operands' dtype as the A
// operand. One ldmatrix.x4.trans: matrix i is rows 16kk + 8(i%2).., columns 8(n + i/2)...
template <int MT, int KT, int WP, int S, bool BF16>
BRAZE_FN void braze_attn_mm_ab(float (&acc)[MT][WP / 8][4], const float (&p)[MT][KT][4],
                               const uint16_t* b) {
  const int lane = threadIdx.x % 32, mat = lane / 8;
  #pragma unroll
  for (int kk = 0; kk < KT / 2; ++kk) {
    uint32_t pa[MT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      braze_attn_p_frag<BF16>(pa[mt], p[mt], kk);
    #pragma unroll
    for (int n = 0; n < WP / 8; n += 2) {
      uint32_t r[4];
      braze_attn_ldsm4<true>(r, b + (kk * 16 + (mat % 2) * 8 + lane % 8) * S + (n + mat / 2) * 8);
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        braze_attn_mma<BF16>(acc[mt][n], pa[mt], r[0], r[1]);
        braze_attn_mma<BF16>(acc[mt][n + 1], pa[mt], r[2], r[3]);
      }
    }
  }
}
// Rows `rows` of acc ([16, WP] in the accumulator layout) times mul[row], rounded and stored
// at out + row * rs (columns past W and rows past n are not). A thread's two adjacent columns go
// out as one 32-bit store where rows keep them aligned (`pack`).
template <int W, int WP, bool BF16>
BRAZE_FN void braze_attn_store_rows(const float (&acc)[WP / 8][4], const float (&mul)[2],
                                    const int64_t (&rows)[2], int t, uint16_t* __restrict__ out,
                                    int64_t rs, int64_t n, bool pack) {
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = rows[h];
    #pragma unroll
    for (int c8 = 0; c8 < WP / 8; ++c8) {
      const int col = c8 * 8 + t * 2;
      if (row >= n || col >= W)
        continue;
      uint16_t val[2];
      #pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = acc[c8][2 * h + e] * mul[h];
        val[e] = BF16 ? braze_f2bf(x) : braze_f2h(x);
      }
      uint16_t* at = out + row * rs + col;
      if (pack) {
        *reinterpret_cast<uint32_t*>(at) = (uint32_t)val[0] | ((uint32_t)val[1] << 16);
      } else {
        at[0] = val[0];
        if (col + 1 < W)
          at[1] = val[1];
      }
    }
  }
}
// A row's sum of the quad's four partial sums l.
BRAZE_FN float braze_attn_quad_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  return l + __shfl_xor_sync(0xffffffffu, l, 2);
}
// Step 4: O / l rounded and stored (a row with every key masked: 0 when SAFE, nan otherwise).
template <int DV, int DVP, bool BF16, bool SAFE>
BRAZE_FN void braze_attn_store(const float (&oacc)[DVP / 8][4], const float (&l)[2],
                               const int64_t (&rows)[2], int t, uint16_t* __restrict__ o,
                               int64_t ors, int64_t sq, bool pack) {
  float inv[2];
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lt = braze_attn_quad_sum(l[h]);
    inv[h] = lt > 0.f ? 1.f / lt : (SAFE ? 0.f : NAN);
  }
  braze_attn_store_rows<DV, DVP, BF16>(oacc, inv, rows, t, o, ors, sq, pack);
}
// Step 4 of the log-sum-exp: lse = log sum_j exp(s_j) of each row (-inf for a row with every key
// masked) from the running maximum m (in the log2 domain unless BIAS, see braze_attn_softmax)
// and the quad's partial sums l.
template <bool BIAS>
BRAZE_FN void braze_attn_store_lse(const float (&m)[2], const float (&l)[2],
                                   const int64_t (&rows)[2], int t, float* __restrict__ lse,
                                   int64_t lrs, int64_t sq) {
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float lt = braze_attn_quad_sum(l[h]);
    const float val = lt > 0.f ? (BIAS ? m[h] + logf(lt) : (m[h] + log2f(lt)) * 0.6931471805599453f)
                               : -INFINITY;
    if (t == 0 && rows[h] < sq)
      lse[rows[h] * lrs] = val;
  }
}

// Rows [i0, i0 + 64 * MT) of one batch point: q [Sq, D] (row stride qrs), k [Sk, D],
// v [Sk, DV], bias [Sq, Sk] (strides brs, bcs) or null, o [Sq, DV] (row stride ors). 128 threads; warp
// w holds MT tiles of 16 rows, rows i0 + 16 (MT w + mt) .., so each K/V fragment serves MT rows
// tiles. With BIAS, a bias whose keys are contiguous (and whose rows keep 4-byte alignment) is
// read as pairs of values, a thread's two adjacent keys, one key tile ahead; a warp skips a key
// tile its bias masks whole (-inf), so a causal or padding mask given as a tensor costs about
// what the keys it keeps cost. WRITES: 1 the output, 2 the rows' log-sum-exp to lse (row stride
// lrs; without the output, v and o are not read or written), 3 both.
template <int D, int DV, int BN, int MT, bool BF16, bool CAUSAL, bool SAFE, bool BIAS, int WRITES>
BRAZE_FN void braze_flash_attention(const uint16_t* __restrict__ q, int64_t qrs,
                                    const uint16_t* __restrict__ k, int64_t krs,
                                    const uint16_t* __restrict__ v, int64_t vrs,
                                    const uint16_t* __restrict__ bias, int64_t brs, int64_t bcs,
                                    uint16_t* __restrict__ o, int64_t ors, int64_t sq, int64_t sk, int64_t i0,
                                    float scale, float* __restrict__ lse, int64_t lrs) {
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
  constexpr bool WO = (WRITES & 1) != 0, WL = (WRITES & 2) != 0;
  const bool vec = D % 8 == 0 && DV % 8 == 0 && krs % 8 == 0 && (!WO || vrs % 8 == 0) &&
                   (uintptr_t)k % 16 == 0 && (!WO || (uintptr_t)v % 16 == 0);
  const int64_t kend = CAUSAL ? (sk < i0 + BM ? sk : i0 + BM) : sk;
  const uint32_t ninf2 = BF16 ? 0xFF80FF80u : 0xFC00FC00u; // two -inf, as a pair of keys
  const bool pairs = BIAS && bias != nullptr && bcs == 1 && brs % 2 == 0 && (uintptr_t)bias % 4 == 0;
  uint32_t bnext[BIAS ? MT : 1][BIAS ? BN / 8 : 1][2]; // the next key tile's bias pairs
  // Stages K/V keys [j0, j0 + BN) into stage `st` (zeros past the end).
  auto stage = [&](int st, int64_t j0) {
    braze_attn_stage<BN, D, DP>(kbuf[st], k, krs, j0, sk, vec);
    if (WO)
      braze_attn_stage<BN, DV, DVP>(vbuf[st], v, vrs, j0, sk, vec);
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
    if (j0 + BN < kend)
      stage(cur ^ 1, j0 + BN); // the next tile loads while this one computes
    braze_attn_wait_tile(j0 + BN < kend);
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
      // 1. S = Q K^T: B[d][key] = K[key][d].
      float s[MT][BN / 8][4];
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int n = 0; n < BN / 8; ++n)
          s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
      braze_attn_mm_abt<MT, BN / 8, DP, KS, BF16>(s, qa, ksm);
      // 2. Masks and the online softmax.
      const bool edge = j0 + BN > sk || (CAUSAL && j0 + BN - 1 > wrow);
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        braze_attn_softmax<BN, DVP, CAUSAL, BIAS>(s[mt], bv[mt], bias != nullptr, sl, edge,
                                                  rows[mt], t, j0, sk, m[mt], l[mt], oacc[mt]);
      // 3. O += P V: P's A fragment is S's accumulator pair of n-tiles; B[key][c] = V[key][c].
      if constexpr (WO)
        braze_attn_mm_ab<MT, BN / 8, DVP, VS, BF16>(oacc, s, vsm);
    }
    __syncthreads(); // the next iteration stages into this tile's buffers
  }
  // 4. Normalize and store.
  if constexpr (WL)
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      braze_attn_store_lse<BIAS>(m[mt], l[mt], rows[mt], t, lse, lrs, sq);
  if constexpr (!WO)
    return;
  const bool pack = DV % 2 == 0 && ors % 2 == 0 && ((uintptr_t)o & 3) == 0;
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    braze_attn_store<DV, DVP, BF16, SAFE>(oacc[mt], l[mt], rows[mt], t, o, ors, sq, pack);
}
)FLASH";

} // namespace

const char *cudaAttentionPrelude() { return kFlashPrelude; }

namespace {

bool keyMajor(loop::AttentionPart p) {
  return p == loop::AttentionPart::GradK || p == loop::AttentionPart::GradV;
}

/// The head dims of spec `a`: of q and of v (of the log-sum-exp, which reads no v: 8).
std::pair<int64_t, int64_t> headDims(const loop::AttentionSpec &a) {
  size_t rank = a.q.shape.size();
  return {a.q.shape[rank - 1]->value(),
          a.part == loop::AttentionPart::Lse ? 8 : a.v.shape[rank - 1]->value()};
}

} // namespace

AttentionPlan planAttention(const sched::Kernel &k, const Target &target) {
  const loop::AttentionSpec &a = *k.attention()->attention();
  size_t rank = a.q.shape.size();
  auto [d, dv] = headDims(a);
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
  // Two stages of tiles (K and V rows; for a key-major gradient Q and dO rows with a float
  // lse and delta each) within 48 KiB of static shared memory.
  auto tile = [](int64_t rowBytes) {
    for (int bn : {64, 32})
      if (2 * bn * rowBytes <= 48 * 1024)
        return bn;
    return 16;
  };
  // Rows padded by 8 elements. Two row tiles per warp halve the K/V traffic per row,
  // but also the blocks: keep them only where at least four blocks per multiprocessor remain,
  // and not for heads wider than 64 (their registers would spill). The gradients keep one.
  p.keyTile = tile((padded(d) + 8 + padded(dv) + 8) * 2 + (keyMajor(a.part) ? 8 : 0));
  bool forward = a.part == loop::AttentionPart::Output || a.part == loop::AttentionPart::Lse;
  p.units = forward && std::max(d, dv) <= 64 && blocks(128) >= 4 * int64_t(target.cores) ? 2 : 1;
  p.threads = 128;
  p.rowsPerBlock = 64 * p.units;
  return p;
}

std::string emitCudaAttentionKernel(const Names &names, const sched::Kernel &k,
                                    const std::string &params, const Target &target) {
  const loop::Computation &c = *k.attention();
  const loop::AttentionSpec &a = *c.attention();
  DType t = a.q.buffer->dtype;
  BRAZE_CHECK(t == DType::Float16 || t == DType::BFloat16) << "CUDA attention is f16/bf16 only";
  size_t nb = a.q.shape.size() - 2;
  auto [d, dv] = headDims(a);
  auto ix = [&](sym::SymExpr e) { return names.index(e); };
  std::string body;
  Writer w(body, 1);
  w.line("const int64_t sq = " + ix(a.q.shape[nb]) + ", sk = " + ix(a.k.shape[nb]) + ";");
  AttentionPlan plan = planAttention(k, target);
  std::string bm = std::to_string(plan.rowsPerBlock);
  // Blocks over the batch points and the rows (of keys for dK and dV, queries otherwise).
  w.line("const int64_t blocks = (" + std::string(keyMajor(a.part) ? "sk" : "sq") + " + " + bm +
         " - 1) / " + bm + ";");
  w.line("int64_t rest = (int64_t)blockIdx.x / blocks;");
  w.line("const int64_t i0 = ((int64_t)blockIdx.x % blocks) * " + bm + ";");
  // Each operand's offset (named by its role) and the result's.
  std::vector<std::pair<const loop::AttentionOperand *, std::string>> ops{
      {&a.q, "qo"}, {&a.k, "ko"}};
  if (a.v.buffer)
    ops.push_back({&a.v, "vo"});
  for (auto [o, name] : {std::pair{&a.bias, "bo"}, {&a.dout, "go"}, {&a.out, "oo"},
                         {&a.lse, "lo"}})
    if (*o)
      ops.push_back({&**o, name});
  for (auto &[o, name] : ops)
    w.line("int64_t " + name + " = " + ix(o->offset) + ";");
  w.line("int64_t ro = 0, rv = 0;"); // the result's offset (and the v gradient's beside it)
  for (size_t x = nb; x-- > 0;) {
    w.line("{");
    w.line("  const int64_t at = rest % " + ix(a.q.shape[x]) + ";");
    w.line("  rest /= " + ix(a.q.shape[x]) + ";");
    for (auto &[o, name] : ops)
      w.line("  " + name + " += at * " + ix(o->strides[x]) + ";");
    w.line("  ro += at * " + ix(c.out->strides[x]) + ";");
    if (k.attentionPair())
      w.line("  rv += at * " + ix(k.attentionPair()->out->strides[x]) + ";");
    w.line("}");
  }
  w.line("(void)rest; (void)rv;");
  auto operand = [&](const loop::AttentionOperand &o, const std::string &off) {
    return names.buffer(*o.buffer) + " + " + off + ", " + ix(o.strides[nb]);
  };
  std::string bias = a.bias ? operand(*a.bias, "bo") + ", " + ix(a.bias->strides[nb + 1])
                            : "nullptr, 0, 0";
  // A part's result at offset `off`, and its row stride: the last stride of a log-sum-exp
  // ([B.., Sq]), the one before it otherwise.
  auto resultOf = [&](const loop::Computation &r, const std::string &off) {
    const std::vector<sym::SymExpr> &st = r.out->strides;
    bool lse = r.attention()->part == loop::AttentionPart::Lse;
    return names.buffer(*r.out) + " + " + off + ", " + ix(st[st.size() - (lse ? 1 : 2)]);
  };
  std::string result = resultOf(c, "ro");
  // The part the kernel writes too: a v gradient beside k's, or the log-sum-exp beside the
  // output.
  std::string resultV = k.attentionPair() ? resultOf(*k.attentionPair(), "rv") : "nullptr, 0";
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  std::string common = std::to_string(d) + ", " + std::to_string(dv) + ", " +
                       std::to_string(plan.keyTile);
  std::string qk = operand(a.q, "qo") + ", " + operand(a.k, "ko") + ", ";
  std::string scale = literal(a.scale, 0, DType::Float32);
  std::string bf16 = flag(t == DType::BFloat16), causal = flag(a.causal),
              hasBias = flag(a.bias.has_value());
  switch (a.part) {
  case loop::AttentionPart::Output:
  case loop::AttentionPart::Lse: {
    bool lse = a.part == loop::AttentionPart::Lse;
    std::string v = lse ? "nullptr, 0, " : operand(a.v, "vo") + ", ";
    std::string out = lse ? "nullptr, 0" : result;
    std::string lseOut = lse ? result : resultV;
    int writes = lse ? 2 : k.attentionPair() ? 3 : 1;
    w.line("braze_flash_attention<" + common + ", " + std::to_string(plan.units) + ", " + bf16 +
           ", " + causal + ", " + flag(a.safe) + ", " + hasBias + ", " + std::to_string(writes) +
           ">(" + qk + v + bias + ", " + out + ", sq, sk, i0, " + scale + ", " +
           (writes > 1 ? "(float*)" : "") + lseOut + ");");
    break;
  }
  default: {
    w.line("const BrazeAttnGrad a = {" + qk + operand(a.v, "vo") + ", " + bias + ", " +
           operand(*a.dout, "go") + ", " + operand(*a.out, "oo") + ", " +
           operand(*a.lse, "lo") + ", sq, sk, " + scale + "};");
    if (a.part == loop::AttentionPart::GradQ) {
      w.line("braze_flash_attention_dq<" + common + ", " + bf16 + ", " + causal + ", " + hasBias +
             ">(a, " + result + ", i0);");
    } else {
      bool wrtK = a.part == loop::AttentionPart::GradK;
      int wrt = wrtK ? (k.attentionPair() ? 3 : 1) : 2;
      w.line("braze_flash_attention_dkv<" + common + ", " + bf16 + ", " + causal + ", " +
             hasBias + ", " + std::to_string(wrt) + ">(a, " +
             (wrtK ? result + ", " + resultV : "nullptr, 0, " + result) + ", i0);");
    }
  }
  }
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(plan.threads) +
         ") " + k.name + "(" + params + ") {\n" + body + "}\n\n";
}

sched::Kernel gradQKernel(const sched::Kernel &k) {
  sched::Kernel q = k;
  q.name += "_dq";
  q.ext = sched::AttentionCall{k.attentionGradQ()};
  return q;
}

std::string cudaAttentionLaunch(const sched::Schedule &s, const Names &names,
                                const sched::Kernel &k, const sched::Kernel &params, int index) {
  const loop::AttentionSpec &a = *k.attention()->attention();
  size_t rank = a.q.shape.size();
  AttentionPlan plan = planAttention(k, s.target);
  std::string bm = std::to_string(plan.rowsPerBlock);
  std::string blocks = "INT64_C(1)";
  for (size_t i = 0; i + 2 < rank; ++i)
    blocks += " * " + names.index(a.q.shape[i]);
  const loop::AttentionOperand &rows = keyMajor(a.part) ? a.k : a.q;
  blocks += " * ((" + names.index(rows.shape[rank - 2]) + " + " + bm + " - 1) / " + bm + ")";
  return launchBlocks(s, names, params, index, plan.threads, blocks);
}

} // namespace braze::codegen
