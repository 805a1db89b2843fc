/// Grouped matrix products on CUDA (f16/bf16, sm_80+): C[m, n] = sum_k A[m, k] B_g(m)[k, n],
/// where g(m) picks one of B's matrices per row (a mixture of experts' weights, from the offsets
/// of the rows routed to each expert) and A's rows may be gathered (tokens taken in their
/// experts' order). cuBLASLt has no grouped call whose sizes stay on the device, so braze runs
/// its own kernel: the launch shape depends on M and N alone, every row reads its group on the
/// device, and the call is captured in a CUDA graph like any other kernel.
///
/// One block of 4 warps takes a 64 x 128 tile of C; each warp holds 32 x 64 of it in mma.sync
/// m16n8k16 accumulators (f32). K is walked 64 at a time through four shared-memory stages
/// (104-108 KiB of dynamic shared memory) filled by cp.async (16-byte copies where rows are
/// aligned, element copies otherwise). Before the main loop the block writes each of its rows'
/// group and A offset to shared memory; a tile whose rows span several groups (an expert
/// boundary) runs once per group, reading the other groups' rows as zeros and storing only its
/// own. Rows with a group or gathered row out of range set the error flag and are not stored.
///
/// On an H200 this shape measured best of twelve tried (tiles of 64-256 rows and columns, 32 or
/// 64 of K, 3-6 stages): about 200 TFLOPs at MoE sizes, where eager's grouped GEMM (CUTLASS
/// with wgmma) reaches 260-350, so decompositions.py uses it only with BRAZE_GROUPED_GEMM=1.
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

constexpr int kGroupedRows = 64;    ///< rows of C per block
constexpr int kGroupedCols = 128;   ///< columns of C per block
constexpr int kGroupedThreads = 128;
constexpr int kGroupedStages = 4;   ///< K steps of 64 in flight

/// The dynamic shared memory of braze_grouped_mm's stages: A's 64 rows of 64 (+8 padding) and
/// B's tile, 128 rows of 64 + 8 (TB) or 64 rows of 128 + 8, in 16-bit elements.
int groupedSharedBytes(bool transB) {
  int b = transB ? kGroupedCols * (64 + 8) : 64 * (kGroupedCols + 8);
  return kGroupedStages * (kGroupedRows * (64 + 8) + b) * 2;
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
  std::string rowsPer = std::to_string(kGroupedRows), cols = std::to_string(kGroupedCols);
  std::string body;
  Writer w(body, 1);
  w.line("__shared__ int groups[" + rowsPer + "];");
  w.line("__shared__ int64_t rows[" + rowsPer + "];");
  w.line("const int64_t M = " + ix(g.m) + ", N = " + ix(g.n) + ", K = " + ix(g.k) + ";");
  w.line("const int64_t tiles_n = (N + " + cols + " - 1) / " + cols + ";");
  w.line("const int64_t m0 = (int64_t)(blockIdx.x / tiles_n) * " + rowsPer +
         ", n0 = (int64_t)(blockIdx.x % tiles_n) * " + cols + ";");
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
  auto tiles = [&](SymExpr e, int per) {
    std::string t = std::to_string(per);
    return "((" + names_.index(e) + " + " + t + " - 1) / " + t + ")";
  };
  return launchBlocks(s_, names_, k, index, kGroupedThreads,
                      tiles(g.m, kGroupedRows) + " * " + tiles(g.n, kGroupedCols),
                      groupedSharedBytes(g.transB));
}

} // namespace cuda

} // namespace braze::codegen
