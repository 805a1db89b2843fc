/// Grouped matrix products on CUDA (f16/bf16, sm_80+): C[m, n] = sum_k A[m, k] B_g(m)[k, n],
/// where g(m) picks one of B's matrices per row (a mixture of experts' weights, from the offsets
/// of the rows routed to each expert) and A's rows may be gathered (tokens taken in their
/// experts' order). cuBLASLt has no grouped call whose sizes stay on the device, so braze runs
/// its own kernel: the launch shape depends on M and N alone, every row reads its group on the
/// device, and the call is captured in a CUDA graph like any other kernel.
///
/// One block of 8 warps takes a 128 x 128 tile of C; each warp holds 64 x 32 of it in mma.sync
/// m16n8k16 accumulators (f32). K is walked 32 at a time through four shared-memory stages
/// (80 KiB of dynamic shared memory) filled by cp.async (16-byte copies where rows are aligned,
/// element copies otherwise). Before the
/// main loop the block writes each of its rows' group and A offset to shared memory; a tile
/// whose rows span several groups (an expert boundary) runs once per group, reading the other
/// groups' rows as zeros and storing only its own. Rows with a group or gathered row out of
/// range set the error flag and are not stored.
#include "braze/codegen/cuda/CudaEmitter.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/cuda/CudaHost.h"

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
  if (room >= 1) c[0] = x;
  if (room >= 2) c[1] = y;
}
extern __shared__ __align__(16) unsigned char braze_grouped_smem[];
// The block's 128 x 128 tile of C at (m0, n0). Row r of the tile belongs to group groups[r]
// (-1: none) and reads A at a + rows[r] + k * ka (rows[r] = -1: a row of zeros); group g's B is at b + g * gstride, element
// (k, n) at n * ldb + k (TB) or k * ldb + n. C's (m, n) is at c + m * ldc + n. K is walked 32
// at a time through STAGES shared-memory stages (dynamic shared memory, braze_grouped_bytes).
template <bool BF16, bool TB, typename OUT, int STAGES>
BRAZE_FN void braze_grouped_mm(const uint16_t* __restrict__ a, int64_t ka,
                               const uint16_t* __restrict__ b, int64_t gstride, int64_t ldb,
                               OUT* __restrict__ c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                               int64_t m0, int64_t n0, const int* groups, const int64_t* rows) {
  constexpr int BM = 128, BN = 128, BK = 32, AS = BK + 8;
  constexpr int BR = TB ? BN : BK, BW = TB ? BK : BN, BS = BW + 8; // B's tile: BR rows of BW
  uint16_t* const as = (uint16_t*)braze_grouped_smem;
  uint16_t* const bs = as + STAGES * BM * AS;
  __shared__ int next_group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, mat = lane / 8;
  const int wm = warp / 4 * 64, wn = warp % 4 * 32;
  const bool avec = __syncthreads_and(threadIdx.x >= BM || rows[threadIdx.x] < 0 || rows[threadIdx.x] % 8 == 0) &&
                    ka == 1 && K % 8 == 0 && (uintptr_t)a % 16 == 0;
  const bool bvec = ldb % 8 == 0 && gstride % 8 == 0 && (TB ? K : N) % 8 == 0 &&
                    (uintptr_t)b % 16 == 0;
  auto stage = [&](int buf, int64_t k0, int grp) {
    uint16_t* sa = as + buf * BM * AS;
    uint16_t* sb = bs + buf * BR * BS;
    const uint16_t* bg = b + grp * gstride;
    if (avec) {
      for (int i = threadIdx.x; i < BM * (BK / 8); i += blockDim.x) {
        const int r = i / (BK / 8), col = i % (BK / 8) * 8;
        const bool in = groups[r] == grp && rows[r] >= 0 && k0 + col < K;
        braze_attn_cp16(sa + r * AS + col, in ? a + rows[r] + k0 + col : a, in);
      }
    } else {
      for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
        const int r = i / BK, col = i % BK;
        sa[r * AS + col] = groups[r] == grp && rows[r] >= 0 && k0 + col < K ? a[rows[r] + (k0 + col) * ka] : (uint16_t)0;
      }
    }
    const int step = bvec ? 8 : 1;
    for (int i = threadIdx.x; i < BR * (BW / step); i += blockDim.x) {
      const int r = i / (BW / step), col = i % (BW / step) * step;
      const int64_t kk = TB ? k0 + col : k0 + r, nn = TB ? n0 + r : n0 + col;
      const bool in = kk < K && nn < N;
      const uint16_t* src = bg + (TB ? nn * ldb + kk : kk * ldb + nn);
      if (bvec)
        braze_attn_cp16(sb + r * BS + col, in ? src : b, in);
      else
        sb[r * BS + col] = in ? *src : (uint16_t)0;
    }
  };
  for (int prev = -1;;) {
    // The tile's next group: the least above the last one run.
    if (threadIdx.x == 0)
      next_group = 0x7fffffff;
    __syncthreads();
    if (threadIdx.x < BM && groups[threadIdx.x] > prev)
      atomicMin(&next_group, groups[threadIdx.x]);
    __syncthreads();
    const int grp = next_group;
    __syncthreads();
    if (grp == 0x7fffffff)
      return;
    prev = grp;
    float acc[4][4][4];
    #pragma unroll
    for (int mt = 0; mt < 4; ++mt)
      #pragma unroll
      for (int n = 0; n < 4; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[mt][n][e] = 0.0f;
    const int64_t tiles = (K + BK - 1) / BK;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < tiles)
        stage(s, s * BK, grp);
      asm volatile("cp.async.commit_group;");
    }
    for (int64_t t = 0; t < tiles; ++t) {
      // Tile t has landed once at most STAGES - 2 later groups are pending; the barrier also
      // ends every warp's reads of the stage the next copy overwrites (tile t - 1's).
      asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2));
      __syncthreads();
      if (t + STAGES - 1 < tiles)
        stage((t + STAGES - 1) % STAGES, (t + STAGES - 1) * BK, grp);
      asm volatile("cp.async.commit_group;");
      const uint16_t* sa = as + (t % STAGES) * BM * AS;
      const uint16_t* sb = bs + (t % STAGES) * BR * BS;
      #pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t af[4][4];
        #pragma unroll
        for (int mt = 0; mt < 4; ++mt)
          braze_attn_ldsm4<false>(af[mt], sa + (wm + mt * 16 + lane % 16) * AS + kk * 16 + lane / 16 * 8);
        #pragma unroll
        for (int n = 0; n < 4; n += 2) {
          uint32_t r[4];
          if (TB)
            braze_attn_ldsm4<false>(r, sb + (wn + (n + mat / 2) * 8 + lane % 8) * BS + kk * 16 + (mat % 2) * 8);
          else
            braze_attn_ldsm4<true>(r, sb + (kk * 16 + (mat % 2) * 8 + lane % 8) * BS + wn + (n + mat / 2) * 8);
          #pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            braze_attn_mma<BF16>(acc[mt][n], af[mt], r[0], r[1]);
            braze_attn_mma<BF16>(acc[mt][n + 1], af[mt], r[2], r[3]);
          }
        }
      }
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads(); // every stage is read before the next group's copies
    #pragma unroll
    for (int mt = 0; mt < 4; ++mt)
      #pragma unroll
      for (int n = 0; n < 4; ++n)
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

constexpr int kGroupedTile = 128;   ///< rows and columns of C per block
constexpr int kGroupedThreads = 256;
constexpr int kGroupedStages = 4;   ///< K steps of 32 in flight

/// The dynamic shared memory of braze_grouped_mm's stages: A's 128 rows of 32 (+8 padding)
/// and B's tile, 128 rows of 32 + 8 (TB) or 32 rows of 128 + 8, in 16-bit elements.
int groupedSharedBytes(bool transB) {
  int b = transB ? kGroupedTile * (32 + 8) : 32 * (kGroupedTile + 8);
  return kGroupedStages * (kGroupedTile * (32 + 8) + b) * 2;
}

} // namespace

const char *cudaGroupedGemmPrelude() { return kGroupedPrelude; }

namespace cuda {

bool CudaEmitter::tensorCoreGroupedGemm(const Kernel &k) const {
  const sched::GemmCall &g = *k.gemm;
  return g.group && s_.target.computeCapability >= 80 && isHalf(g.dtype) &&
         (g.outDtype == g.dtype || g.outDtype == DType::Float32);
}

std::string CudaEmitter::emitGroupedGemmKernel(const Kernel &k) {
  next_ = 0;
  kernel_ = &k;
  const sched::GemmCall &g = *k.gemm;
  auto ix = [&](SymExpr e) { return names_.index(e); };
  std::string tile = std::to_string(kGroupedTile);
  std::string body;
  Writer w(body, 1);
  w.line("__shared__ int groups[" + tile + "];");
  w.line("__shared__ int64_t rows[" + tile + "];");
  w.line("const int64_t M = " + ix(g.m) + ", N = " + ix(g.n) + ", K = " + ix(g.k) + ";");
  w.line("const int64_t tiles_n = (N + " + tile + " - 1) / " + tile + ";");
  w.line("const int64_t m0 = (int64_t)(blockIdx.x / tiles_n) * " + tile +
         ", n0 = (int64_t)(blockIdx.x % tiles_n) * " + tile + ";");
  w.line("if (threadIdx.x < " + tile + ") {");
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
  if (g.rowZero) // a row of zeros reads nothing (-1), but is stored
    w.line("const bool zero = (" + ex.emit(g.rowZero) + ") " + (g.rowZeroIfTrue ? "!=" : "==") +
           " 0;");
  w.line("if (" + bad + ") {");
  w.line("  *err = 1;");
  w.line("} else {");
  w.line("  group = (int)t;");
  w.line("  row = " + std::string(g.rowZero ? "zero ? INT64_C(-1) : " : "") + rowStart + ";");
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
  w.line("braze_grouped_mm<" + std::string(g.dtype == DType::BFloat16 ? "true" : "false") + ", " +
         (g.transB ? "true" : "false") + ", " + out + ", " + std::to_string(kGroupedStages) +
         ">((const uint16_t*)" +
         names_.buffer(*g.a) + ", " + kStep + ", (const uint16_t*)" + names_.buffer(*g.b) +
         " + " + ix(g.offB) + ", " + ix(g.groupStride) + ", " + ix(g.ldb) + ", (" + out + "*)" +
         names_.buffer(*g.c) + " + " + ix(g.offC) + ", " + ix(g.ldc) +
         ", M, N, K, m0, n0, groups, rows);");
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kGroupedThreads) +
         ", 2) " + k.name + "(" + params(k) + ") {\n" + body + "}\n\n";
}

std::string CudaEmitter::groupedGemmLaunch(const Kernel &k, int index) {
  const sched::GemmCall &g = *k.gemm;
  std::string tile = std::to_string(kGroupedTile);
  auto tiles = [&](SymExpr e) { return "((" + names_.index(e) + " + " + tile + " - 1) / " + tile + ")"; };
  return launchBlocks(s_, names_, k, index, kGroupedThreads, tiles(g.m) + " * " + tiles(g.n),
                      groupedSharedBytes(g.transB));
}

} // namespace cuda

} // namespace braze::codegen
