#pragma once
/// Recognizes a matrix product in the loop IR: a sum over one reduction index k of
/// load(A, ..m..k..) * load(B, ..k..n..) stored at ..m..n.., with every index affine in m, n and
/// k. Such a computation runs as a BLAS call per batch point instead of a loop nest.
#include "braze/ir/loop/LoopIR.h"

#include <map>
#include <set>
#include <optional>

namespace braze::sched {

struct GemmCall {
  const loop::Buffer *a = nullptr, *b = nullptr, *c = nullptr;
  DType dtype = DType::Float32; ///< of A and B (f16/bf16 products accumulate in f32)
  /// Of C: dtype, or Float32 for f16/bf16 operands widened to f32 before the product (the
  /// product of two halves is exact in f32, so this is the f32 product of the widened values).
  DType outDtype = DType::Float32;
  sym::SymExpr m = nullptr, n = nullptr, k = nullptr; ///< extents
  bool transA = false, transB = false;
  sym::SymExpr lda = nullptr, ldb = nullptr, ldc = nullptr;
  /// Element offsets of the [0, 0] entries; they depend only on the batch variables.
  sym::SymExpr offA = nullptr, offB = nullptr, offC = nullptr;
  std::vector<sym::SymExpr> batchVars; ///< the computation's other output variables
  /// A vector added along n before C is rounded and stored (a GEMM epilogue; CUDA only).
  const loop::Buffer *bias = nullptr;
  /// A grouped product (CPU only): B differs per row of A. Row m reads B at offB +
  /// group(m) * groupStride, where `group` is an integer Expr of `mVar` alone (an expert's id,
  /// from the offsets of the rows routed to it) and lies in [0, groupSym's extent). Each run of
  /// rows with one group is one library call; the loop nest computes the same function.
  const loop::Expr *group = nullptr;
  sym::SymExpr groupSym = nullptr, groupStride = nullptr, mVar = nullptr;
  /// A grouped product whose rows of A are gathered (tokens taken in their experts' order):
  /// row m of A is row rowOf(m) (an integer Expr of mVar alone, in [0, rowSym's extent)) of
  /// the buffer a, at offA + rowOf(m) * rowStride + k * rowStep. The emitter copies a run's rows
  /// together before its call, so A is then dense: transA false and lda = k.
  const loop::Expr *rowOf = nullptr;
  sym::SymExpr rowSym = nullptr, rowStride = nullptr, rowStep = nullptr;
  /// A grouped product whose A has rows of zeros (masked_fills of rows routed nowhere, and the
  /// rows past the last offset): row m of A is all zeros where any mask holds, a mask holding
  /// where its integer Expr `cond` of mVar alone is nonzero (zeroIfTrue) or zero (!zeroIfTrue).
  /// Its rows of C are still A's row times B.
  struct RowMask {
    const loop::Expr *cond = nullptr;
    bool zeroIfTrue = true;
  };
  std::vector<RowMask> rowZero;
  /// A paired epilogue (pairGemmEpilogues): the product's one reader, a pointwise computation
  /// over [m, n) for n < half that reads C only at (m, n) and (m, n + half) (a gated MLP's
  /// act(gate) * up over a product of [gate | up] columns). The kernel computes it from each
  /// tile, whose columns are gate's and up's alike, and never stores C. Its member in the
  /// kernel is over `epilogueVars` (its row and column).
  const loop::Computation *epilogue = nullptr;
  std::vector<sym::SymExpr> epilogueVars;
  /// half: the extent of the epilogue's column.
  sym::SymExpr epilogueHalf() const { return epilogueVars[1]->extent(); }
};

/// The batch points of a product as strided runs: the loop over batchVars[0, outer) stays, and
/// each of its points makes one library call over `count` matrices, each stride{A,B,C} elements
/// after the one before (0: every matrix reads the same operand, as an expanded K/V does).
/// off{A,B,C} are the first matrix's offsets; they depend only on the outer variables.
struct StridedBatch {
  size_t outer = 0;
  sym::SymExpr count = nullptr;
  sym::SymExpr strideA = nullptr, strideB = nullptr, strideC = nullptr;
  sym::SymExpr offA = nullptr, offB = nullptr, offC = nullptr;
};

/// The longest innermost run of g's batch variables whose offsets are affine in them and which
/// collapse into one stride per operand (outer stride == inner stride * inner extent, for A, B
/// and C alike). With no such run (no batch variable, or offsets that are not affine) every
/// point is its own call: outer = batchVars.size(), count = 1.
StridedBatch stridedBatch(sym::SymContext &s, const GemmCall &g);

/// The GEMM form of `c`, or nothing if it is not one (then the loop nest computes it). With
/// `grouped`, also a product whose B is picked per row of A by one data-dependent index that
/// moves with m alone (GemmCall::group), without batch dims.
std::optional<GemmCall> matchGemm(loop::LoopProgram &p, const loop::Computation &c,
                                  bool grouped = false);

/// Bias epilogues (the Linear pattern): where every reader of a matrix product C computes
/// round(C + bias[n]) with one bias vector along n, and C's layout is fixed at compile time
/// (so the GEMM library, never the loop nest, computes it), C takes the bias: its buffer then
/// holds round(A·B + bias) and the readers load it directly — one rounding, as PyTorch's addmm.
/// Returns each absorbed product's bias, by computation id.
std::map<int, const loop::Buffer *> absorbGemmBias(loop::LoopProgram &p);

/// Rounded products: where a product of two half operands is summed in f32 (GemmCall::outDtype
/// f32, an intermediate) and every reader loads it only to round it to that half dtype, the
/// product stores the rounded value (its buffer takes the half dtype, and the readers load it
/// as is): the same values, one kernel's f32 writes and reads fewer. Grouped products included.
void absorbGemmRounding(loop::LoopProgram &p);

/// Whether CUDA's Hopper grouped kernel (wgmma, on sm_90 with B read K-major) computes g, a
/// grouped product of half operands, on a GPU of `computeCapability` (90 for sm_90).
bool wgmmaGrouped(const GemmCall &g, int computeCapability);

/// Paired epilogues: where the one reader of a grouped product C of [M, 2H] (computed by the
/// Hopper kernel, rounded to its half dtype, an intermediate) is a pointwise computation D over
/// [M, H] that loads C only at (m, n) and (m, n + H) (directly, and in no other load's index),
/// D joins the product's kernel (GemmCall::epilogue): each tile of the kernel then computes
/// gate's and up's columns together and D from them, and C is never written. No computation
/// between the two may write what D reads, or touch D's buffer. Returns D by the product's
/// computation id.
std::map<int, const loop::Computation *> pairGemmEpilogues(loop::LoopProgram &p,
                                                           int computeCapability);

/// Copies of products: where the only reader of a product C (an intermediate the GEMM library
/// computes, as absorbGemmBias requires) stores C unchanged into a buffer D of the same shape
/// and dtype (what a Linear's bias add is once the bias is absorbed), the product writes D
/// itself when D's layout still suits the library. Returns the ids of the copies, which
/// compute nothing any more.
/// Grouped products too (GemmCall::group), which braze's own kernel computes.
std::set<int> forwardGemmCopies(loop::LoopProgram &p);

} // namespace braze::sched
