/// Grouped matrix products on CUDA (f16/bf16, sm_80+): C[m, n] = sum_k A[m, k] B_g(m)[k, n],
/// where g(m) picks one of B's matrices per row (a mixture of experts' weights, from the offsets
/// of the rows routed to each expert) and A's rows may be gathered (tokens taken in their
/// experts' order) or masked. cuBLASLt has no grouped call whose sizes stay on the device, so
/// braze runs its own kernels: the launch shape depends on M and N alone, every row reads its
/// group on the device, and the call is captured in a CUDA graph like any other kernel.
///
/// Each block first writes its rows' group and A offset to shared memory; a tile whose rows span
/// several groups (an expert boundary) runs once per group, reading the other groups' rows as
/// zeros and storing only its own. Rows with a group or gathered row out of range set the error
/// flag and are not stored. Two kernels share that scheme:
/// - braze_grouped_wgmma (sm_90, B read K-major, as transformers' experts are): 128 x 256 tiles
///   (128 x 128 where N <= 128) of two warpgroups, Hopper's wgmma from 128-byte-swizzled stages
///   filled by cp.async, C out through shared memory. On an H200 at MoE sizes (4096 rows, 8
///   experts, bf16) it took 0.126 ms for the gate-up product (1024 -> 5632; eager's CUTLASS
///   grouped GEMM 0.121) and 0.080 ms for the down product (2816 -> 1024; eager 0.088-0.093).
/// - braze_grouped_mm (mma.sync m16n8k16, any sm_80+): 64 x 128 tiles of 4 warps; about 200
///   TFLOPs at those sizes, 0.55x of eager's, so decompositions.py uses it only with
///   BRAZE_GROUPED_GEMM=1.
#include "braze/codegen/cuda/CudaEmitter.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/cuda/CudaHost.h"
#include "braze/scheduler/Gemm.h"
#include "braze/support/Check.h"

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>

namespace braze::codegen {

namespace {

const char *kGroupedPrelude = R"GROUPED(
// ---- grouped matrix products (mma.sync m16n8k16 through the attention helpers) ----------------
template <bool BF16> BRAZE_FN void braze_grouped_put(uint16_t* c, float x, float y, int64_t room) {
  const uint32_t two = braze_attn_pack<BF16>(x, y);
  if (room >= 2 && (uintptr_t)c % 4 == 0) {
    *(uint32_t*)c = two;
  } else {
    if (room >= 1) c[0] = (uint16_t)(two & 0xffff);
    if (room >= 2) c[1] = (uint16_t)(two >> 16);
  }
}
template <bool BF16> BRAZE_FN void braze_grouped_put(float* c, float x, float y, int64_t room) {
  if (room >= 2 && (uintptr_t)c % 8 == 0) {
    *(uint64_t*)c = (uint64_t)__float_as_uint(x) | (uint64_t)__float_as_uint(y) << 32;
  } else {
    if (room >= 1) c[0] = x;
    if (room >= 2) c[1] = y;
  }
}
extern __shared__ __align__(16) unsigned char braze_grouped_smem[];
// 16 bytes global -> shared (a shared-window address); zeros when !in.
BRAZE_FN void braze_grouped_cp16(uint32_t dst, const uint16_t* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(in ? 16 : 0));
}
// The block's 64 x 128 tile of C at (m0, n0), computed by 4 warps of 32 x 64 each. Row r of
// the tile belongs to group groups[r] (-1: none) and reads A at a + rows[r] + k * ka
// (rows[r] = -1: a row of zeros); group g's B is at b + g * gstride, element (k, n) at
// n * ldb + k (TB) or k * ldb + n. C's (m, n) is at c + m * ldc + n. K is walked 64 at a time
// through STAGES shared-memory stages (dynamic shared memory); within a stage each warp loads
// the next 16 of K's fragments while it multiplies the current ones. Where every row and B are
// 16-byte aligned along K (along N for B without TB), each thread copies fixed 16-byte chunks
// of A and of B per stage, its pointers set once per group; otherwise by element.
template <bool BF16, bool TB, typename OUT, int STAGES>
BRAZE_FN void braze_grouped_mm(const uint16_t* __restrict__ a, int64_t ka,
                               const uint16_t* __restrict__ b, int64_t gstride, int64_t ldb,
                               OUT* __restrict__ c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                               int64_t m0, int64_t n0, const int* groups, const int64_t* rows) {
  constexpr int BM = 64, BN = 128, BK = 64, T = 128, MT = 2, NT = 8, AS = BK + 8;
  constexpr int BR = TB ? BN : BK, BW = TB ? BK : BN, BS = BW + 8; // B's tile: BR rows of BW
  constexpr int ASTAGE = BM * AS * 2, BSTAGE = BR * BS * 2;          // bytes
  constexpr int CA = BM * BK / 8 / T, CB = BN * BK / 8 / T;          // 16-byte chunks per thread
  uint16_t* const as = (uint16_t*)braze_grouped_smem;
  uint16_t* const bs = as + STAGES * BM * AS;
  const uint32_t sa0 = (uint32_t)__cvta_generic_to_shared(as);
  const uint32_t sb0 = (uint32_t)__cvta_generic_to_shared(bs);
  __shared__ int next_group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, mat = lane / 8;
  const int wm = warp / 2 * 32, wn = warp % 2 * 64;
  const bool vec = __syncthreads_and(tid >= BM || rows[tid] < 0 || rows[tid] % 8 == 0) &&
                   ka == 1 && K % 8 == 0 && (uintptr_t)a % 16 == 0 && ldb % 8 == 0 &&
                   gstride % 8 == 0 && (TB ? K : N) % 8 == 0 && (uintptr_t)b % 16 == 0;
  // Each thread's fragment addresses within a stage (bytes), and the step of 16 along K.
  uint32_t afrag[MT], bfrag[NT / 2];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    afrag[mt] = ((wm + mt * 16 + lane % 16) * AS + lane / 16 * 8) * 2;
  #pragma unroll
  for (int p = 0; p < NT / 2; ++p)
    bfrag[p] = TB ? ((wn + (2 * p + mat / 2) * 8 + lane % 8) * BS + (mat % 2) * 8) * 2
                  : (((mat % 2) * 8 + lane % 8) * BS + wn + (2 * p + mat / 2) * 8) * 2;
  constexpr uint32_t BKK = TB ? 16 * 2 : 16 * BS * 2;
  for (int prev = -1;;) {
    // The tile's next group: the least above the last one run.
    if (tid == 0)
      next_group = 0x7fffffff;
    __syncthreads();
    if (tid < BM && groups[tid] > prev)
      atomicMin(&next_group, groups[tid]);
    __syncthreads();
    const int grp = next_group;
    __syncthreads();
    if (grp == 0x7fffffff)
      return;
    prev = grp;
    const uint16_t* bg = b + grp * gstride;
    // Chunk j of A: row ch / (BK / 8), column ch % (BK / 8) * 8 for ch = tid + j * T; of B
    // likewise over its BR rows of BW.
    const uint16_t* asrc[CA];
    const uint16_t* bsrc[CB];
    bool aok[CA], bok[CB];
    #pragma unroll
    for (int j = 0; j < CA; ++j) {
      const int ch = tid + j * T, r = ch / (BK / 8), col = ch % (BK / 8) * 8;
      aok[j] = groups[r] == grp && rows[r] >= 0;
      asrc[j] = a + (aok[j] ? rows[r] : 0) + col;
    }
    #pragma unroll
    for (int j = 0; j < CB; ++j) {
      const int ch = tid + j * T, r = ch / (BW / 8), col = ch % (BW / 8) * 8;
      const int64_t nn = TB ? n0 + r : n0 + col;
      bok[j] = nn < N;
      bsrc[j] = bg + (bok[j] ? (TB ? nn * ldb + col : (int64_t)r * ldb + nn) : 0);
    }
    auto stage = [&](int buf, int64_t k0) {
      if (vec) {
        #pragma unroll
        for (int j = 0; j < CA; ++j) {
          const int ch = tid + j * T, r = ch / (BK / 8), col = ch % (BK / 8) * 8;
          braze_grouped_cp16(sa0 + buf * ASTAGE + (r * AS + col) * 2, asrc[j] + k0,
                             aok[j] && k0 + col < K);
        }
        #pragma unroll
        for (int j = 0; j < CB; ++j) {
          const int ch = tid + j * T, r = ch / (BW / 8), col = ch % (BW / 8) * 8;
          braze_grouped_cp16(sb0 + buf * BSTAGE + (r * BS + col) * 2,
                             bsrc[j] + (TB ? k0 : k0 * ldb), bok[j] && (TB ? k0 + col : k0 + r) < K);
        }
        return;
      }
      uint16_t* sa = as + buf * BM * AS;
      uint16_t* sb = bs + buf * BR * BS;
      for (int i = tid; i < BM * BK; i += T) {
        const int r = i / BK, col = i % BK;
        sa[r * AS + col] = groups[r] == grp && rows[r] >= 0 && k0 + col < K ? a[rows[r] + (k0 + col) * ka] : (uint16_t)0;
      }
      for (int i = tid; i < BR * BW; i += T) {
        const int r = i / BW, col = i % BW;
        const int64_t kk = TB ? k0 + col : k0 + r, nn = TB ? n0 + r : n0 + col;
        sb[r * BS + col] = kk < K && nn < N ? bg[TB ? nn * ldb + kk : kk * ldb + nn] : (uint16_t)0;
      }
    };
    float acc[MT][NT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int n = 0; n < NT; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[mt][n][e] = 0.0f;
    const int tiles = (int)((K + BK - 1) / BK);
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < tiles)
        stage(s, (int64_t)s * BK);
      asm volatile("cp.async.commit_group;");
    }
    int read = 0, write = STAGES - 1;
    for (int t = 0; t < tiles; ++t) {
      // Tile t has landed once at most STAGES - 2 later groups are pending; the barrier also
      // ends every warp's reads of the stage the next copy overwrites (tile t - 1's).
      asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2));
      __syncthreads();
      if (t + STAGES - 1 < tiles)
        stage(write, (int64_t)(t + STAGES - 1) * BK);
      asm volatile("cp.async.commit_group;");
      write = write + 1 == STAGES ? 0 : write + 1;
      const uint32_t sa = sa0 + read * ASTAGE, sb = sb0 + read * BSTAGE;
      read = read + 1 == STAGES ? 0 : read + 1;
      uint32_t af[2][MT][4], bf[2][NT / 2][4];
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        braze_ldsm4_at<false>(af[0][mt], sa + afrag[mt]);
      #pragma unroll
      for (int p = 0; p < NT / 2; ++p)
        braze_ldsm4_at<!TB>(bf[0][p], sb + bfrag[p]);
      #pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const int cur = kk % 2;
        if (kk + 1 < BK / 16) {
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            braze_ldsm4_at<false>(af[cur ^ 1][mt], sa + afrag[mt] + (kk + 1) * 32);
          #pragma unroll
          for (int p = 0; p < NT / 2; ++p)
            braze_ldsm4_at<!TB>(bf[cur ^ 1][p], sb + bfrag[p] + (kk + 1) * BKK);
        }
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          #pragma unroll
          for (int p = 0; p < NT / 2; ++p) {
            braze_attn_mma<BF16>(acc[mt][2 * p], af[cur][mt], bf[cur][p][0], bf[cur][p][1]);
            braze_attn_mma<BF16>(acc[mt][2 * p + 1], af[cur][mt], bf[cur][p][2], bf[cur][p][3]);
          }
      }
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads(); // every stage is read before the next group's copies
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int n = 0; n < NT; ++n)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = wm + mt * 16 + lane / 4 + h * 8;
          const int64_t m = m0 + r, col = n0 + wn + n * 8 + 2 * (lane % 4);
          if (m < M && groups[r] == grp)
            braze_grouped_put<BF16>(c + m * ldc + col, acc[mt][n][2 * h], acc[mt][n][2 * h + 1], N - col);
        }
  }
}
)GROUPED";

const char *kWgmmaKernel = R"WGMMA(
// A shared-memory matrix descriptor: K-major rows of 128 bytes (64 halves), swizzled by 128
// bytes, groups of 8 rows 1024 bytes apart.
BRAZE_FN uint64_t braze_wgmma_desc(uint32_t at) {
  return (uint64_t)((at & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
template <bool BF16> BRAZE_FN void braze_wg_pair(unsigned char* at, float x, float y, uint16_t*) {
  *(uint32_t*)at = braze_attn_pack<BF16>(x, y);
}
template <bool BF16> BRAZE_FN void braze_wg_pair(unsigned char* at, float x, float y, float*) {
  *(float2*)at = make_float2(x, y);
}
// The block's 128 x BN tile of C at (m0, n0), as braze_grouped_mm's (the same row table and
// group loop), by two warpgroups of 64 rows each with wgmma m64nBNk16 (Hopper's asynchronous
// warpgroup products; sm_90a). B is read K-major (TB): row n of B's tile is 64 halves of K,
// as A's rows. K is walked 64 at a time through STAGES shared-memory stages in the 128-byte
// swizzle wgmma reads, filled by cp.async (16-byte copies where rows are aligned, element
// stores otherwise) STAGES - 2 tiles ahead; one group of products stays in flight. C's tile
// goes out through shared memory, 16 bytes per store.
// PAIRED (a paired epilogue, BN = 256): the tile's columns are C's [n0, n0 + 128) and
// [half + n0, half + n0 + 128), and instead of storing C the block computes
// v = epi(m, n, C[m, n], C[m, n + half]) for each of its points, with C's values rounded as
// stored, and calls sto(m, n, v) for those of the group with n < half.
template <bool BF16, typename OUT, int BN, int STAGES, bool PAIRED = false, typename EPI = int,
          typename STO = int>
BRAZE_FN void braze_grouped_wgmma(const uint16_t* __restrict__ a, int64_t ka,
                                  const uint16_t* __restrict__ b, int64_t gstride, int64_t ldb,
                                  OUT* __restrict__ c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                  int64_t m0, int64_t n0, const int* groups, const int64_t* rows,
                                  int64_t half = 0, EPI epi = EPI(), STO sto = STO()) {
  constexpr int BM = 128, BK = 64, T = 256, ASTAGE = BM * 128, STAGE = ASTAGE + BN * 128;
  constexpr int CA = BM * 8 / T, CB = BN * 8 / T, HB = BN / 2;
  static_assert(!PAIRED || BN == 256, "a paired epilogue takes 128 columns of each half");
  // B's tile row r is C's column n0 + r; paired, rows from HB on are up's: half + n0 + r - HB.
  const int64_t jump = PAIRED ? half - HB : 0, span = PAIRED ? half : N;
  // The stages start on a 1024-byte boundary (the swizzle's period), which dynamic shared
  // memory does not promise: the launch asks for 1024 bytes more.
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(braze_grouped_smem);
  const uint32_t s0 = (raw + 1023) & ~1023u;
  unsigned char* const g0 = braze_grouped_smem + (s0 - raw);
  __shared__ int next_group;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32;
  const bool vec = __syncthreads_and(tid >= BM || rows[tid] < 0 || rows[tid] % 8 == 0) &&
                   ka == 1 && K % 8 == 0 && (uintptr_t)a % 16 == 0 && ldb % 8 == 0 &&
                   gstride % 8 == 0 && (uintptr_t)b % 16 == 0;
  for (int prev = -1;;) {
    if (tid == 0)
      next_group = 0x7fffffff;
    __syncthreads();
    if (tid < BM && groups[tid] > prev)
      atomicMin(&next_group, groups[tid]);
    __syncthreads();
    const int grp = next_group;
    // Whether each warpgroup's 64 rows hold one of the group's: a warpgroup with none skips
    // its products (a tile at an expert boundary runs once per expert, and its second pass
    // then costs about half). These barriers also end the reads of next_group.
    const bool first = __syncthreads_or(tid < 64 && groups[tid] == grp);
    const bool second = __syncthreads_or(tid >= 64 && tid < BM && groups[tid] == grp);
    if (grp == 0x7fffffff)
      return;
    const bool mine = wg == 0 ? first : second;
    prev = grp;
    const uint16_t* bg = b + grp * gstride;
    // Thread tid copies the 16 bytes at column tid % 8 * 8 of rows tid / 8 + 32 j of A's and
    // B's tiles, stored at chunk (tid % 8) ^ (row % 8) of its 128-byte row (the 128-byte
    // swizzle wgmma reads); row % 8 is the same for every j.
    const int cc = tid % 8, r0 = tid / 8;
    const uint32_t soff = r0 * 128 + ((cc ^ (r0 % 8)) * 16);
    const uint16_t* asrc[CA];
    #pragma unroll
    for (int j = 0; j < CA; ++j) {
      const int r = r0 + 32 * j;
      asrc[j] = groups[r] == grp && rows[r] >= 0 ? a + rows[r] + cc * 8 : nullptr;
    }
    const uint16_t* const bsrc = bg + (n0 + r0) * ldb + cc * 8;
    auto stage = [&](int buf, int64_t k0) {
      const uint32_t sa = s0 + buf * STAGE, sb = sa + ASTAGE;
      if (vec) {
        const bool kin = k0 + cc * 8 < K;
        #pragma unroll
        for (int j = 0; j < CA; ++j)
          braze_grouped_cp16(sa + soff + j * 4096, asrc[j] ? asrc[j] + k0 : a, kin && asrc[j]);
        #pragma unroll
        for (int j = 0; j < CB; ++j) {
          const int up = PAIRED && j >= CB / 2 ? 1 : 0; // a row of up's half
          const bool in = kin && n0 + r0 + 32 * (j - up * CB / 2) < span;
          braze_grouped_cp16(sb + soff + j * 4096,
                             in ? bsrc + (j * 32 + up * jump) * ldb + k0 : b, in);
        }
        return;
      }
      unsigned char* ga = g0 + buf * STAGE;
      unsigned char* gb = ga + ASTAGE;
      for (int i = tid; i < BM * BK; i += T) {
        const int r = i / BK, col = i % BK;
        *(uint16_t*)(ga + r * 128 + ((col / 8) ^ (r % 8)) * 16 + col % 8 * 2) =
            groups[r] == grp && rows[r] >= 0 && k0 + col < K ? a[rows[r] + (k0 + col) * ka] : (uint16_t)0;
      }
      for (int i = tid; i < BN * BK; i += T) {
        const int r = i / BK, col = i % BK;
        *(uint16_t*)(gb + r * 128 + ((col / 8) ^ (r % 8)) * 16 + col % 8 * 2) =
            n0 + r % (PAIRED ? HB : BN) < span && k0 + col < K
                ? bg[(n0 + r + (PAIRED && r >= HB ? jump : 0)) * ldb + k0 + col] : (uint16_t)0;
      }
    };
    float acc[BN / 2];
    #pragma unroll
    for (int i = 0; i < BN / 2; ++i)
      acc[i] = 0.0f;
    const int tiles = (int)((K + BK - 1) / BK);
    #pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
      if (s < tiles)
        stage(s, (int64_t)s * BK);
      asm volatile("cp.async.commit_group;");
    }
    int read = 0, write = STAGES - 2;
    for (int t = 0; t < tiles; ++t) {
      // Tile t has landed once STAGES - 3 later copies are pending. One product group stays in
      // flight, so the stage written now (tile t - 2's) is free: every warpgroup waited for it
      // before this barrier.
      asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 3));
      asm volatile("fence.proxy.async.shared::cta;");
      __syncthreads();
      if (t + STAGES - 2 < tiles)
        stage(write, (int64_t)(t + STAGES - 2) * BK);
      asm volatile("cp.async.commit_group;");
      write = write + 1 == STAGES ? 0 : write + 1;
      const uint32_t sa = s0 + read * STAGE + wg * 64 * 128, sb = s0 + read * STAGE + ASTAGE;
      read = read + 1 == STAGES ? 0 : read + 1;
      if (mine) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        #pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
          braze_wgmma<BF16, BN>(acc, braze_wgmma_desc(sa + kk * 32), braze_wgmma_desc(sb + kk * 32), 1);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    // C's tile goes through shared memory (the stages' space), so that rows are stored 16
    // bytes at a time: each thread writes its accumulators' pairs at constant places, then
    // the block copies rows out.
    constexpr int W = (int)sizeof(OUT), PITCH = BN * W + 16, PER = 16 / W, CPR = BN / PER;
    #pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
      const int r = wg * 64 + warp * 16 + lane / 4 + 8 * (i / 2 % 2), col = i / 4 * 8 + 2 * (lane % 4);
      braze_wg_pair<BF16>(g0 + r * PITCH + col * W, acc[i], acc[i + 1], (OUT*)nullptr);
    }
    __syncthreads();
    if constexpr (PAIRED) {
      // Eight points per thread at once, T apart (each store instruction a row's run of
      // columns): C's values are read first, then the eight values computed, unguarded at the
      // nearest point in range (no store between them, so their loads overlap), then stored
      // where the point is the group's.
      constexpr int U = 8;
      static_assert(BM * HB % (U * T) == 0, "the tile splits into U points per thread");
      for (int base = tid; base < BM * HB; base += U * T) {
        float gv[U], uv[U];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
          const int i = base + u * T, r = i / HB, j = i % HB;
          const OUT* row = (const OUT*)(g0 + r * PITCH);
          if constexpr (sizeof(OUT) == 4) {
            gv[u] = (float)row[j];
            uv[u] = (float)row[j + HB];
          } else if constexpr (BF16) {
            gv[u] = braze_bf2f(row[j]);
            uv[u] = braze_bf2f(row[j + HB]);
          } else {
            gv[u] = braze_h2f(row[j]);
            uv[u] = braze_h2f(row[j + HB]);
          }
        }
        decltype(epi(0, 0, 0.0f, 0.0f)) vv[U];
        #pragma unroll
        for (int u = 0; u < U; ++u) {
          const int i = base + u * T, r = i / HB, j = i % HB;
          const int64_t m = m0 + r, col = n0 + j;
          vv[u] = epi(m < M ? m : M - 1, col < half ? col : half - 1, gv[u], uv[u]);
        }
        #pragma unroll
        for (int u = 0; u < U; ++u) {
          const int i = base + u * T, r = i / HB, j = i % HB;
          const int64_t m = m0 + r, col = n0 + j;
          if (m < M && groups[r] == grp && col < half)
            sto(m, col, vv[u]);
        }
      }
      __syncthreads();
      continue;
    }
    for (int i = tid; i < BM * CPR; i += T) {
      const int r = i / CPR, ch = i % CPR;
      const int64_t m = m0 + r, col = n0 + ch * PER;
      if (m >= M || groups[r] != grp || col >= N)
        continue;
      OUT* dst = c + m * ldc + col;
      const unsigned char* src = g0 + r * PITCH + ch * 16;
      if (col + PER <= N && (uintptr_t)dst % 16 == 0) {
        *(uint4*)dst = *(const uint4*)src;
      } else {
        for (int e = 0; e < PER && col + e < N; ++e)
          dst[e] = ((const OUT*)src)[e];
      }
    }
    __syncthreads(); // the tile is read before the next group's copies
  }
}
)WGMMA";

/// braze_wgmma<BF16, N>(d, descA, descB, scale): d (N / 2 f32 per thread) += A B, or = A B
/// where scale is 0, for N of 128 and 256: one function per shape and type, whose operand lists
/// are written out here, and the template that picks one.
std::string wgmmaWrappers() {
  std::string out;
  for (int n : {128, 256})
    for (bool bf16 : {true, false}) {
      const int regs = n / 2;
      const std::string ty = bf16 ? "bf16" : "f16";
      std::string list, operands;
      for (int i = 0; i < regs; ++i) {
        list += (i ? ", %" : "%") + std::to_string(i);
        operands += std::string(i ? ", " : "") + "\"+f\"(d[" + std::to_string(i) + "])";
      }
      out += "BRAZE_FN void braze_wgmma_" + ty + "_n" + std::to_string(n) +
             "(float* d, uint64_t da, uint64_t db, int scale) {\n"
             "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" +
             std::to_string(regs + 2) + ", 0;\\nwgmma.mma_async.sync.aligned.m64n" +
             std::to_string(n) + "k16.f32." + ty + "." + ty + " {" + list + "}, %" +
             std::to_string(regs) + ", %" + std::to_string(regs + 1) +
             ", p, 1, 1, 0, 0;\\n}\\n\"\n               : " + operands +
             "\n               : \"l\"(da), \"l\"(db), \"r\"(scale));\n}\n";
    }
  return out + R"(template <bool BF16, int N>
BRAZE_FN void braze_wgmma(float* d, uint64_t da, uint64_t db, int scale) {
  static_assert(N == 128 || N == 256, "wgmma wrappers exist for N of 128 and 256");
  if constexpr (N == 128) {
    if constexpr (BF16) braze_wgmma_bf16_n128(d, da, db, scale); else braze_wgmma_f16_n128(d, da, db, scale);
  } else {
    if constexpr (BF16) braze_wgmma_bf16_n256(d, da, db, scale); else braze_wgmma_f16_n256(d, da, db, scale);
  }
}
)";
}

/// The launch shape of a grouped product's kernel.
struct GroupedShape {
  bool wgmma;      ///< braze_grouped_wgmma (sm_90a, B read K-major), else braze_grouped_mm
  int rows, cols;  ///< C's tile per block
  int threads, stages;
  int sharedBytes; ///< dynamic shared memory
};

/// mma.sync: 64 x 128 tiles of 4 warps, four stages of 64 of K: A's 64 rows of 64 (+8
/// padding) and B's tile, 128 rows of 64 + 8 (TB) or 64 rows of 128 + 8, in 16-bit elements.
/// wgmma (sm_90 and B K-major): 128 x 256 tiles (128 x 128 where N <= 128) of 2 warpgroups,
/// four stages of A's 128 and B's 256 rows of 128 bytes, or C's tile where that is larger, and
/// 1024 bytes to align them. On an H200 at MoE sizes 128 x 256 took 0.127 ms (gate-up, 4096 x
/// 1024 -> 5632, 8 experts) and 0.084 ms (down, 2816 -> 1024), against 0.150-0.154 and
/// 0.087-0.089 ms for 128 x 128 in 4-6 stages.
GroupedShape groupedShape(int computeCapability, const sched::GemmCall &g) {
  if (sched::wgmmaGrouped(g, computeCapability)) {
    const int cols = g.n->isConst() && g.n->value() <= 128 && !g.epilogue ? 128 : 256;
    const int stages = 4;
    const int out = g.outDtype == DType::Float32 ? 4 : 2;
    const int bytes = std::max(stages * (128 + cols) * 128, 128 * (cols * out + 16)) + 1024;
    return {true, 128, cols, 256, stages, bytes};
  }
  const int b = g.transB ? 128 * (64 + 8) : 64 * (128 + 8);
  return {false, 64, 128, 128, 4, 4 * (64 * (64 + 8) + b) * 2};
}

/// The largest subexpressions of `value` that read memory and do not depend on `col` (values of
/// a paired epilogue's row alone), each once.
std::vector<const loop::Expr *> rowOnlyValues(const loop::Expr *value, SymExpr col) {
  std::unordered_map<const loop::Expr *, bool> moves, loads;
  std::function<bool(const loop::Expr *)> onColumn = [&](const loop::Expr *e) {
    if (auto it = moves.find(e); it != moves.end())
      return it->second;
    bool m = e->index() && mentionsAny(e->index(), {col});
    for (const loop::Expr *o : e->operands())
      m = onColumn(o) || m;
    for (const auto &b : e->indirect())
      m = onColumn(b.second) || m;
    return moves[e] = m;
  };
  std::function<bool(const loop::Expr *)> reads = [&](const loop::Expr *e) {
    if (auto it = loads.find(e); it != loads.end())
      return it->second;
    bool r = e->kind() == loop::ExprKind::Load;
    for (const loop::Expr *o : e->operands())
      r = reads(o) || r;
    return loads[e] = r;
  };
  std::vector<const loop::Expr *> out;
  std::set<const loop::Expr *> seen;
  std::function<void(const loop::Expr *)> hoist = [&](const loop::Expr *e) {
    if (!seen.insert(e).second)
      return;
    if (!onColumn(e) && reads(e)) {
      out.push_back(e);
      return;
    }
    for (const loop::Expr *o : e->operands())
      hoist(o);
  };
  hoist(value);
  return out;
}

} // namespace

const char *cudaGroupedGemmPrelude() { return kGroupedPrelude; }

const std::string &cudaGroupedWgmmaPrelude() {
  static const std::string text =
      "\n// ---- grouped matrix products on sm_90a (wgmma) "
      "---------------------------------------------\n#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n" +
      wgmmaWrappers() + kWgmmaKernel + "#endif\n";
  return text;
}

namespace cuda {

bool CudaEmitter::tensorCoreGroupedGemm(const Kernel &k) const {
  const sched::GemmCall &g = *k.gemm();
  return g.group && s_.target.computeCapability >= 80 && isHalf(g.dtype) &&
         (g.outDtype == g.dtype || g.outDtype == DType::Float32);
}

std::string CudaEmitter::emitGroupedGemmKernel(const Kernel &k) {
  next_ = 0;
  kernel_ = &k;
  const sched::GemmCall &g = *k.gemm();
  const GroupedShape shape = groupedShape(s_.target.computeCapability, g);
  auto ix = [&](SymExpr e) { return names_.index(e); };
  std::string rowsPer = std::to_string(shape.rows), cols = std::to_string(shape.cols);
  std::string body;
  Writer w(body, 1);
  w.line("__shared__ int groups[" + rowsPer + "];");
  w.line("__shared__ int64_t rows[" + rowsPer + "];");
  w.line("const int64_t M = " + ix(g.m) + ", N = " + ix(g.n) + ", K = " + ix(g.k) + ";");
  // A paired epilogue's tile is 128 columns of each half of C.
  const std::string tileCols = g.epilogue ? std::to_string(shape.cols / 2) : cols;
  const std::string spanN = g.epilogue ? ix(g.epilogueHalf()) : "N";
  w.line("const int64_t tiles_n = (" + spanN + " + " + tileCols + " - 1) / " + tileCols + ";");
  w.line("const int64_t m0 = (int64_t)(blockIdx.x / tiles_n) * " + rowsPer +
         ", n0 = (int64_t)(blockIdx.x % tiles_n) * " + tileCols + ";");
  w.line("if (threadIdx.x < " + rowsPer + ") {");
  w.indent();
  w.line("int group = -1;");
  w.line("int64_t row = 0;");
  std::string m = ix(g.mVar);
  w.line("const int64_t " + m + " = m0 + threadIdx.x;");
  w.line("if (" + m + " < M) {");
  w.indent();
  Scope scope(nullptr);
  ExprWriter ex(w, scope, names_, next_);
  ex.setErrorStatement("*err = 1;");
  w.line("const int64_t t = (int64_t)(" + ex.emit(g.group) + ");");
  std::string bad = "t < 0 || t >= " + ix(g.groupSym->extent());
  std::string rowStart = ix(g.offA) + " + " + m + " * " + (g.transA ? "INT64_C(1)" : ix(g.lda));
  if (g.rowOf) {
    w.line("const int64_t src = (int64_t)(" + ex.emit(g.rowOf) + ");");
    bad += " || src < 0 || src >= " + ix(g.rowSym->extent());
    rowStart = ix(g.offA) + " + src * " + ix(g.rowStride);
  }
  if (!g.rowZero.empty()) { // a row of zeros reads nothing (-1), but is stored
    std::string zero;
    for (const sched::GemmCall::RowMask &mask : g.rowZero)
      zero += std::string(zero.empty() ? "" : " || ") + "(" + ex.emit(mask.cond) + ") " +
              (mask.zeroIfTrue ? "!=" : "==") + " 0";
    w.line("const bool zero = " + zero + ";");
  }
  w.line("if (" + bad + ") {");
  w.line("  *err = 1;");
  w.line("} else {");
  w.line("  group = (int)t;");
  w.line("  row = " + std::string(g.rowZero.empty() ? "" : "zero ? INT64_C(-1) : ") + rowStart +
         ";");
  w.line("}");
  w.dedent();
  w.line("}");
  w.line("groups[threadIdx.x] = group;");
  w.line("rows[threadIdx.x] = row;");
  w.dedent();
  w.line("}");
  w.line("__syncthreads();");
  std::string kStep = g.rowOf ? ix(g.rowStep) : g.transA ? ix(g.lda) : "INT64_C(1)";
  std::string out = g.outDtype == DType::Float32 ? "float" : "uint16_t";
  std::string bf16 = g.dtype == DType::BFloat16 ? "true" : "false";
  std::string stages = std::to_string(shape.stages);
  std::string args = "((const uint16_t*)" + names_.buffer(*g.a) + ", " + kStep +
                     ", (const uint16_t*)" + names_.buffer(*g.b) + " + " + ix(g.offB) + ", " +
                     ix(g.groupStride) + ", " + ix(g.ldb) + ", (" + out + "*)" +
                     (g.epilogue ? std::string("nullptr")
                                 : names_.buffer(*g.c) + " + " + ix(g.offC)) +
                     ", " + ix(g.ldc) + ", M, N, K, m0, n0, groups, rows" +
                     (g.epilogue
                          ? ", " + ix(g.epilogueHalf()) + ", epilogue_value, epilogue_store);"
                          : ");");
  if (g.epilogue) {
    BRAZE_CHECK(shape.wgmma) << "a paired epilogue needs the wgmma grouped kernel";
    emitPairedEpilogue(w, k);
    w.line("braze_grouped_wgmma<" + bf16 + ", " + out + ", " + cols + ", " + stages +
           ", true>" + args);
  } else if (shape.wgmma)
    w.line("braze_grouped_wgmma<" + bf16 + ", " + out + ", " + cols + ", " + stages + ">" + args);
  else
    w.line("braze_grouped_mm<" + bf16 + ", " + (g.transB ? "true" : "false") + ", " + out + ", " +
           stages + ">" + args);
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(shape.threads) +
         (shape.wgmma ? ", 1) " : ", 2) ") + k.name + "(" + params(k) + ") {\n" + body + "}\n\n";
}

std::string CudaEmitter::groupedGemmLaunch(const Kernel &k, int index) {
  const sched::GemmCall &g = *k.gemm();
  auto tiles = [&](SymExpr e, int per) {
    std::string t = std::to_string(per);
    return "((" + names_.index(e) + " + " + t + " - 1) / " + t + ")";
  };
  const GroupedShape shape = groupedShape(s_.target.computeCapability, g);
  const std::string across =
      g.epilogue ? tiles(g.epilogueHalf(), shape.cols / 2) : tiles(g.n, shape.cols);
  return launchBlocks(s_, names_, k, index, shape.threads,
                      tiles(g.m, shape.rows) + " * " + across, shape.sharedBytes);
}

void CudaEmitter::emitPairedEpilogue(Writer &w, const Kernel &k) {
  const sched::GemmCall &g = *k.gemm();
  const Member *member = nullptr;
  for (const Member &m : k.steps[0].members)
    if (m.comp == g.epilogue)
      member = &m;
  BRAZE_CHECK(member) << k.name << ": the paired epilogue has no member";
  // The member's loads of C, at (row, column) and (row, column + half), are the lambda's two
  // values: locals in C's compute type, as a pointwise reader's locals are.
  const SymExpr row = g.epilogueVars[0], col = g.epilogueVars[1];
  sym::SymContext &sy = s_.program->sym();
  const SymExpr at = sy.add(sy.mul(row, g.ldc), col);
  Scope scope(nullptr);
  forEachExpr(member->value, [&](const loop::Expr *e) {
    if (e->kind() != loop::ExprKind::Load || e->buffer() != g.c)
      return;
    const SymExpr off = sy.sub(e->index(), at);
    BRAZE_CHECK(off->isConst(0) || sy.sub(off, col->extent())->isConst(0))
        << k.name << ": a paired epilogue reads C at " << sym::toString(e->index());
    scope.addLocal(g.c, off->isConst(0) ? "gate" : "up", e->index());
  });
  // Values of the row alone (a sentinel mask read through the sort's permutation): computed
  // once per row of the tile, before the product, into shared memory, where the points read
  // them. At each point they would be global loads behind one another (an index check's error
  // store keeps later loads behind it), with one block of 8 warps per SM to hide them.
  const std::vector<const loop::Expr *> rowValues = rowOnlyValues(member->value, col);
  if (!rowValues.empty()) {
    for (size_t i = 0; i < rowValues.size(); ++i)
      w.line("__shared__ " + ctype(rowValues[i]->dtype()) + " row" + std::to_string(i) + "[128];");
    w.line("if (threadIdx.x < 128) {");
    w.indent();
    w.line("const int64_t " + names_.index(row) +
           " = m0 + threadIdx.x < M ? m0 + threadIdx.x : M - 1;");
    Scope rowScope(nullptr);
    ExprWriter rx(w, rowScope, names_, next_);
    rx.setErrorStatement("*err = 1;");
    for (size_t i = 0; i < rowValues.size(); ++i)
      w.line("row" + std::to_string(i) + "[threadIdx.x] = " + rx.emit(rowValues[i]) + ";");
    w.dedent();
    w.line("}");
    w.line("__syncthreads();");
    for (size_t i = 0; i < rowValues.size(); ++i)
      scope.remember(rowValues[i],
                     "row" + std::to_string(i) + "[" + names_.index(row) + " - m0]");
  }
  // The value, then its store: two lambdas, so that the kernel computes several values before
  // any store (a store through a captured pointer would keep later loads behind it).
  const std::string point =
      "const int64_t " + names_.index(row) + ", const int64_t " + names_.index(col);
  const std::string type = ctype(member->value->dtype());
  w.line("auto epilogue_value = [&](" + point + ", const float gate, const float up) -> " +
         type + " {");
  w.indent();
  ExprWriter ex(w, scope, names_, next_);
  ex.setErrorStatement("*err = 1;");
  w.line("return " + ex.emit(member->value) + ";");
  w.dedent();
  w.line("};");
  w.line("auto epilogue_store = [&](" + point + ", const " + type + " v) {");
  w.line("  " + names_.buffer(*g.epilogue->out) + "[" + names_.index(member->storeIndex) +
         "] = " + convert("v", member->value->dtype(), g.epilogue->out->dtype) + ";");
  w.line("};");
}

} // namespace cuda

} // namespace braze::codegen
