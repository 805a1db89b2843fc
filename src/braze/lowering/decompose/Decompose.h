#pragma once
/// DECOMPOSE: composite ops (softmax, log_softmax, mean, var, layer_norm, gelu, silu) become
/// braze primitives. One file per op family registers its rules; `decompose` applies them until
/// no composite op is left, then sorts, removes dead nodes and merges common subexpressions
/// (so that, e.g., the mean inside var and the mean a user asked for become one node).
#include "braze/ir/graph/Builder.h"

namespace braze {

struct DecomposeOptions {
  /// A library (oneDNN on the CPU, cuDNN on CUDA) takes f32 convolutions: they stay whole, and
  /// to_loops lowers each to a direct-form reduction that the scheduler hands to the library
  /// (loop::ConvSpec).
  bool convolutionLibrary = false;
  /// The library takes f16 and bf16 convolutions too (cuDNN).
  bool halfConvolutions = false;
  /// The library computes weight and input gradients (conv_weight_grad, conv_input_grad)
  /// itself, in the dtypes it takes convolutions in (cuDNN's backward-filter and
  /// backward-data convolutions, oneDNN's backward-weights and backward-data ones).
  bool gradientLibrary = false;
  /// The target runs attention as one fused kernel (loop::AttentionSpec) for these operand
  /// dtypes, with head dims (of query and value) up to `fusedAttentionMaxHeadDim`; other
  /// attention ops decompose into matmul + softmax + matmul.
  std::vector<DType> fusedAttentionDtypes;
  /// Likewise for attention_lse and attention_grad (the forward's saved value and the backward).
  std::vector<DType> fusedAttentionBackwardDtypes;
  int64_t fusedAttentionMaxHeadDim = 0;
  /// The fused kernels drop probabilities too (attention and attention_grad with dropout);
  /// without, those decompose.
  bool fusedAttentionDropout = false;
  int64_t fusedAttentionBackwardMaxHeadDim = 0; ///< of attention_lse and attention_grad
  /// The target is the CPU, whose eager kernels round half precision as they go: a transposed
  /// convolution rounds after each kernel tap (eager's gemm + col2im kernel) unless eager runs
  /// it through oneDNN, for the dtypes in `oneDnnHalf` with an output padding below the
  /// stride, which rounds once, as CUDA (cuDNN) does.
  bool cpuHalfRounding = false;
  std::vector<DType> oneDnnHalf;
  /// Softmax scales each exponential by 1 / sum rather than dividing it by the sum, as eager's
  /// CPU kernel does (one division per row, not per element).
  bool softmaxReciprocal = false;
  /// Large column means and variances (a batch norm's statistics) sum in f64, the variance in
  /// one pass (Norms.cpp): the CPU, and GPUs with full-rate f64 (sm_60, 70, 80, 90, 100). On
  /// the others (sm_75, 86, 89, 120: f64 at 1/32 to 1/64 of f32) they keep the two f32 passes.
  bool wideStatistics = false;
};

void decompose(Graph &g, const DecomposeOptions &opts = {});

/// Checks that each composite op of g declares the type its decomposition gives, as decompose
/// would: a graph parsed from text declares every node's type, which the graph verifier cannot
/// check for composites. Decomposes a copy of g with nothing kept whole; throws decompose's
/// user error naming the node and both types.
void checkCompositeTypes(const Graph &g);


namespace decomp {
/// A rule builds the replacement of `n` with `b` (whose name is set to n's) and returns it;
/// a rule whose result depends on the target takes the DecomposeOptions too.
using Rule = Node *(*)(GraphBuilder &b, Node *n, const DecomposeOptions &opts);
Node *decomposeSoftmax(GraphBuilder &b, Node *n, const DecomposeOptions &opts);
Node *decomposeLogSoftmax(GraphBuilder &b, Node *n);
Node *decomposeMean(GraphBuilder &b, Node *n, const DecomposeOptions &opts);
Node *decomposeVar(GraphBuilder &b, Node *n, const DecomposeOptions &opts);
Node *decomposeLayerNorm(GraphBuilder &b, Node *n);
Node *decomposeGelu(GraphBuilder &b, Node *n);
Node *decomposeSilu(GraphBuilder &b, Node *n);
Node *decomposeConvolution(GraphBuilder &b, Node *n);
Node *decomposeConvTranspose(GraphBuilder &b, Node *n, const DecomposeOptions &opts);
Node *decomposeConvWeightGrad(GraphBuilder &b, Node *n);
Node *decomposeConvInputGrad(GraphBuilder &b, Node *n);
/// Whether a conv_transpose node rounds after each kernel tap under `opts` (eager's CPU gemm +
/// col2im kernel), which its decomposition does for up to GraphBuilder::kMaxRoundedTaps taps.
bool convTransposeRoundsPerTap(const Node *n, const DecomposeOptions &opts);
int64_t convTransposeTaps(const Node *n);
Node *decomposeAttention(GraphBuilder &b, Node *n);
Node *decomposeAttentionLse(GraphBuilder &b, Node *n);
Node *decomposeAttentionGrad(GraphBuilder &b, Node *n);
Node *decomposeMaxPool(GraphBuilder &b, Node *n);
Node *decomposeMaxPoolIndices(GraphBuilder &b, Node *n);
Node *decomposeArgsort(GraphBuilder &b, Node *n);
Node *decomposeSort(GraphBuilder &b, Node *n);
Node *decomposeMedian(GraphBuilder &b, Node *n);
Node *decomposeMedianIndex(GraphBuilder &b, Node *n);
Node *decomposeMode(GraphBuilder &b, Node *n);
Node *decomposeModeIndex(GraphBuilder &b, Node *n);
Node *decomposeCdist(GraphBuilder &b, Node *n);
Node *decomposePdist(GraphBuilder &b, Node *n);
Node *decomposeCross(GraphBuilder &b, Node *n);
Node *decomposeFMax(GraphBuilder &b, Node *n);
inline Node *decomposeFMin(GraphBuilder &b, Node *n) { return decomposeFMax(b, n); }
Node *decomposeTruncDiv(GraphBuilder &b, Node *n);
Node *decomposeComplex(GraphBuilder &b, Node *n);
Node *decomposeConj(GraphBuilder &b, Node *n);
Node *decomposeSoftMarginLoss(GraphBuilder &b, Node *n);
Node *decomposeRoundDecimals(GraphBuilder &b, Node *n);
Node *decomposeEmbeddingBag(GraphBuilder &b, Node *n);
Node *decomposeFft(GraphBuilder &b, Node *n);
Node *decomposeScan(GraphBuilder &b, Node *n);
inline Node *decomposeCumSum(GraphBuilder &b, Node *n) { return decomposeScan(b, n); }
inline Node *decomposeCumProd(GraphBuilder &b, Node *n) { return decomposeScan(b, n); }
inline Node *decomposeLogCumSumExp(GraphBuilder &b, Node *n) { return decomposeScan(b, n); }
Node *decomposeCumExtreme(GraphBuilder &b, Node *n);
Node *decomposeCumExtremeIndex(GraphBuilder &b, Node *n);
Node *decomposeSearchSorted(GraphBuilder &b, Node *n);
Node *decomposeHistogram(GraphBuilder &b, Node *n);
Node *decomposeAvgPool(GraphBuilder &b, Node *n);
Node *decomposeMaxPoolGrad(GraphBuilder &b, Node *n);
Node *decomposeAdaptiveMaxPool(GraphBuilder &b, Node *n);
Node *decomposeAdaptiveMaxPoolIndices(GraphBuilder &b, Node *n);
Node *decomposeAdaptiveAvgPool(GraphBuilder &b, Node *n);
Node *decomposeAdaptiveAvgPoolGrad(GraphBuilder &b, Node *n);
Node *decomposeAdaptiveMaxPoolGrad(GraphBuilder &b, Node *n);
Node *decomposeGridSample(GraphBuilder &b, Node *n, const DecomposeOptions &opts);
Node *decomposeRandom(GraphBuilder &b, Node *n);
// scatter family
Node *decomposeScatter(GraphBuilder &b, Node *n);
Node *decomposeScatterDim(GraphBuilder &b, Node *n);
Node *decomposeIndexReduce(GraphBuilder &b, Node *n);
Node *decomposePut(GraphBuilder &b, Node *n);
Node *decomposeDiagonalScatter(GraphBuilder &b, Node *n);
Node *decomposeIndexPut(GraphBuilder &b, Node *n);
Node *decomposeSignbit(GraphBuilder &b, Node *n);
Node *decomposeAddMatMul(GraphBuilder &b, Node *n);
Node *decomposeTrilinear(GraphBuilder &b, Node *n);
Node *decomposeRandomDraw(GraphBuilder &b, Node *n);
Node *decomposeLdexp(GraphBuilder &b, Node *n);
Node *decomposeAngle(GraphBuilder &b, Node *n);
Node *decomposeMaskPut(GraphBuilder &b, Node *n);
Node *decomposeMaskedScatter(GraphBuilder &b, Node *n);
Node *decomposeAsStridedScatter(GraphBuilder &b, Node *n);
Node *decomposeNonzeroStatic(GraphBuilder &b, Node *n);
Node *decomposeAsStrided(GraphBuilder &b, Node *n);

/// Half-precision inputs are upcast to f32 for the math and the result cast back.
Node *upcast(GraphBuilder &b, Node *x);
/// An i64 scalar constant (indices, counts and window bounds).
Node *i64(GraphBuilder &b, int64_t v);
Node *downcastLike(GraphBuilder &b, Node *x, DType dtype);
/// The row-major position of every element of a tensor of `shape`, as i64.
Node *flatPosition(GraphBuilder &b, const std::vector<SymExpr> &shape);
} // namespace decomp

} // namespace braze
