#pragma once
/// GraphBuilder: the one way to make graph nodes with checked types. Each method infers the
/// result type (broadcasting, PyTorch's type promotion) and raises a Diagnostic naming the op
/// and the node for bad input: a rank, dim, dtype or shape that the op rejects.
#include "braze/ir/graph/Graph.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

namespace braze {

/// fft's result shape for a signal of shape `in` (see GraphBuilder::fft), or why there is none.
std::string fftShape(const std::string &mode, const std::vector<SymExpr> &in, const IntList &dims,
                     int64_t normalization, bool flag, int64_t lastSize, sym::SymContext &ctx,
                     std::vector<SymExpr> &out);

class GraphBuilder {
public:
  explicit GraphBuilder(Graph &g) : g_(g) {}
  Graph &graph() { return g_; }
  sym::SymContext &sym() { return g_.sym(); }

  /// Name that the next node(s) get and that diagnostics print (e.g. the FX node's name).
  void setName(std::string name) { name_ = std::move(name); }

  SymExpr sizeSymbol(const std::string &hint) { return g_.newSizeSymbol(hint); }
  SymExpr dim(int64_t v) { return g_.sym().constant(v); }
  std::vector<SymExpr> dims(const std::vector<int64_t> &vs);

  Node *input(const std::string &name, DType dtype, std::vector<SymExpr> shape,
              std::vector<SymExpr> strides = {});
  /// A tensor filled with one value (rank 0 for a scalar).
  Node *full(double value, DType dtype, std::vector<SymExpr> shape = {});
  Node *scalar(double value, DType dtype) { return full(value, dtype, {}); }
  /// Tensor whose element is its index along `dim`.
  Node *iota(DType dtype, std::vector<SymExpr> shape, int64_t dim);
  /// [length] of start + i * step in `dtype` (each operation rounded in it, as prims.iota).
  Node *arange(DType dtype, SymExpr length, double start, double step);

  /// Rank-0 tensor of `dtype` holding the number of elements of x over `dims` (all if empty).
  Node *numel(Node *x, std::vector<int64_t> dims, DType dtype);

  Node *elementwise(OpKind op, std::vector<Node *> xs);
  Node *unary(OpKind op, Node *x) { return elementwise(op, {x}); }
  Node *binary(OpKind op, Node *a, Node *b) { return elementwise(op, {a, b}); }
  Node *where(Node *c, Node *a, Node *b) { return elementwise(OpKind::Where, {c, a, b}); }
  Node *add(Node *a, Node *b) { return binary(OpKind::Add, a, b); }
  Node *sub(Node *a, Node *b) { return binary(OpKind::Sub, a, b); }
  Node *mul(Node *a, Node *b) { return binary(OpKind::Mul, a, b); }
  Node *div(Node *a, Node *b) { return binary(OpKind::Div, a, b); }
  Node *convert(Node *x, DType dtype);

  /// sum/prod/amax/amin/any/all over `dims` (empty = all dims). `dtype` overrides the
  /// accumulation/result type (sum of ints defaults to i64, as in PyTorch).
  Node *reduce(OpKind op, Node *x, std::vector<int64_t> dims, bool keepdim,
               std::optional<DType> dtype = std::nullopt);

  Node *reshape(Node *x, std::vector<SymExpr> shape);
  Node *permute(Node *x, std::vector<int64_t> dims);
  Node *expand(Node *x, std::vector<SymExpr> shape);
  Node *slice(Node *x, int64_t dim, int64_t start, int64_t end, int64_t step);
  /// `length` elements of dim `dim` from `start` (>= 0) every `step`: a slice whose end is
  /// symbolic (x[:, :n - 1]). The caller knows the elements lie inside x (PyTorch's meta value
  /// gives `length`); the builder checks what it can: a constant length against a constant
  /// size.
  Node *sliceLength(Node *x, int64_t dim, int64_t start, SymExpr length, int64_t step);
  Node *select(Node *x, int64_t dim, int64_t index);
  Node *unsqueeze(Node *x, int64_t dim);
  Node *squeeze(Node *x, std::vector<int64_t> dims);
  Node *gather(Node *x, int64_t dim, Node *index);
  /// x indexed along `dim` by an integer tensor (negative entries count from the end):
  /// the result has shape x[:dim] + index.shape + x[dim+1:] (index_select, embedding, x[idx]).
  Node *take(Node *x, int64_t dim, Node *index);
  /// x indexed along dims dim .. dim+k-1 by k integer tensors that broadcast together (each
  /// bounds-checked against its own dim): the result has shape
  /// x[:dim] + broadcast(index shapes) + x[dim+k:] (advanced indexing x[i0, i1, ...]).
  Node *take(Node *x, int64_t dim, std::vector<Node *> indices);
  /// x[..] indexed in the given dims (`dims` ascending) by integer tensors that broadcast
  /// together, with numpy's placement rule (torch.Tensor.__getitem__, aten.index): the
  /// broadcast index dims replace adjacent indexed dims in place, else they come first.
  Node *advancedIndex(Node *x, std::vector<int64_t> dims, std::vector<Node *> indices);
  /// Batched matrix product: a [B.., M, K] x b [B.., K, N] -> [B.., M, N]; batch dims
  /// broadcast, 1-d operands are promoted as in torch.matmul.
  Node *matmul(Node *a, Node *b);
  /// Sliding windows along `dim` (a view): dim becomes the window count
  /// (n - dilation*(size-1) - 1) / step + 1 and a new last dim of `size` indexes the window.
  /// A scalar (dim 0 or -1) unfolds as one element: [1] for size 1, [0] for size 0.
  Node *unfold(Node *x, int64_t dim, int64_t size, int64_t step, int64_t dilation);
  /// Pads `dim` with `lo` / `hi` copies of `value` (negative amounts trim).
  Node *pad(Node *x, int64_t dim, int64_t lo, int64_t hi, double value);
  /// Pads (or trims) x's trailing dims as torch.nn.functional.pad's constant mode: `pads` holds
  /// (low, high) for the last dim, then for the one before it, and so on.
  Node *constantPad(Node *x, IntList pads, double value);
  /// N-d convolution (1-d, 2-d or 3-d spatial), x [N, C, *spatial], w [O, C/groups, *kernel].
  Node *convolution(Node *x, Node *w, Node *bias, IntList stride, IntList padding,
                    IntList dilation, int64_t groups);
  /// N-d transposed convolution (1 to 3 spatial dims): x [N, Cin, *s], w [Cin, Cout/groups, *k]
  /// -> [N, Cout, *o], o = (s - 1) * stride - 2 * padding + dilation * (k - 1) + outputPadding + 1,
  /// with static spatial and kernel sizes. Half-precision operands round as eager's kernel on
  /// the target does (DecomposeOptions::cpuHalfRounding): once, or after the product and after
  /// each kernel tap's addition (up to kMaxRoundedTaps taps; braze::supports refuses more).
  Node *convTranspose(Node *x, Node *w, Node *bias, IntList stride, IntList padding,
                      IntList dilation, IntList outputPadding, int64_t groups);
  /// Each tap is a few graph ops; 64 takes a 7x7 stem's and a 4x4x4 kernel's gradients.
  static constexpr int64_t kMaxRoundedTaps = 64;
  /// The weight gradient of y = convolution(x, w) from gradOut (y's gradient): x [N, C, *S],
  /// gradOut [N, O, *P] -> [O, C / groups, *kernel], where P is what the windows of `kernel`
  /// give over S. Static channel, spatial and kernel sizes. A library (cuDNN) takes it whole;
  /// elsewhere it decomposes (decomp::decomposeConvWeightGrad).
  Node *convWeightGrad(Node *x, Node *gradOut, IntList kernel, IntList stride, IntList padding,
                       IntList dilation, int64_t groups);
  /// The input gradient of y = convolution(x, w) from gradOut: gradOut [N, O, *P], w
  /// [O, C / groups, *K] -> [N, C, *inputSizes], where P is what the windows of K give over
  /// inputSizes. Static sizes. A library (cuDNN, oneDNN) takes it whole; elsewhere it is the
  /// transposed convolution of gradOut by w (decomp::decomposeConvInputGrad).
  Node *convInputGrad(Node *gradOut, Node *w, IntList inputSizes, IntList stride,
                      IntList padding, IntList dilation, int64_t groups);
  /// The gradients of y = convolution(x, w) (conv_transpose(x, w) when `transposed`) from
  /// gradOut, dy/d{x, w, bias}, each where `mask` asks for it (else nullptr):
  ///   - the input's: conv_input_grad(gradOut, w) (of a transposed one: the plain
  ///     convolution);
  ///   - the weight's: conv_weight_grad(x, gradOut); of a transposed one, the same with x and
  ///     gradOut exchanged;
  ///   - the bias's: gradOut summed over all dims but the channels.
  /// Static spatial, kernel and channel sizes. A transposed convolution's output padding is
  /// read from the sizes of x and gradOut.
  std::array<Node *, 3> convolutionBackward(Node *gradOut, Node *x, Node *w, IntList stride,
                                            IntList padding, IntList dilation, bool transposed,
                                            int64_t groups, std::array<bool, 3> mask);
  /// A transposed convolution's output size along one spatial dim of `in` elements.
  static constexpr int64_t convTransposeSize(int64_t in, int64_t stride, int64_t padding,
                                             int64_t dilation, int64_t kernel,
                                             int64_t outputPadding) {
    return (in - 1) * stride - 2 * padding + dilation * (kernel - 1) + outputPadding + 1;
  }
  /// Scaled dot-product attention: softmax(scale * q·kᵀ + bias, masked causally) · v over
  /// q [B.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv] -> [B.., Sq, Dv] in q's dtype. Under
  /// grouped-query attention k and v have fewer heads (dim -3) than q, a static divisor of q's:
  /// query head h reads key head h / (H / Hk) (here and in attentionLse and attentionGrad,
  /// whose k and v gradients sum over the query heads that read each key head). `bias` (or
  /// nullptr) is added to the scores and broadcasts to [B.., Sq, Sk]; a bool bias is a mask
  /// (false: -inf). `causal` keeps key j for query i when j <= i (top-left aligned, as
  /// PyTorch's is_causal). A row whose every key is masked is 0 when `safe` (PyTorch's attention
  /// ops) and nan otherwise (a softmax written out). A `dropout` p in (0, 1) drops each
  /// probability of [B.., Sq, Sk] (row-major position n) where philox_uniform(seed, n) < p and
  /// scales the rest by 1 / (1 - p), as the sum over the keys is taken before the drop; `seed`
  /// is an i64 scalar.
  Node *attention(Node *q, Node *k, Node *v, Node *bias, double scale, bool causal,
                  bool safe = true, double dropout = 0, Node *seed = nullptr);
  /// An attention's or its gradient's dropout p (0 without its optional attribute).
  static double attentionDropout(const Node *n) {
    return n->attrs().has("dropout") ? n->attrs().getFloat("dropout") : 0;
  }
  /// The log-sum-exp of attention's scores over the kept keys: [B.., Sq] in the compute type
  /// (f32 for half operands); -inf for a row whose every key is masked. The forward's saved
  /// value for attentionGrad.
  Node *attentionLse(Node *q, Node *k, Node *bias, double scale, bool causal);
  /// attentionLse's [B.., Sq] in the layout a PyTorch fused attention kernel returns it with:
  /// `shape` is [B.., Sq] (itself), [B.., Sq, 1] (cuDNN's trailing unit dim) or [B.., P] for a
  /// static P above a static Sq (memory-efficient attention pads the rows to a multiple of 32;
  /// the padding, 0 here, is never read). Another shape is an error.
  Node *lseInLayout(Node *lse, std::vector<SymExpr> shape);
  /// The inverse of lseInLayout: a kernel's saved log-sum-exp in one of those layouts as the
  /// [B.., Sq] attentionGrad reads, for query q [B.., Sq, D].
  Node *lseFromLayout(Node *saved, Node *q);
  /// The gradient of the attention `out` (safe, with log-sum-exp `lse`) with respect to `wrt`
  /// ("q", "k" or "v"), given the output's gradient `dout` [B.., Sq, Dv]: shaped and typed as
  /// that operand. A bias is a constant (it gets no gradient). `dropout` and `seed` are the
  /// forward's: its dropped probabilities regenerated.
  Node *attentionGrad(const std::string &wrt, Node *dout, Node *q, Node *k, Node *v, Node *out,
                      Node *lse, Node *bias, double scale, bool causal, double dropout = 0,
                      Node *seed = nullptr);
  /// Max pooling over the last `spatial` (1 to 3) dims of a [C, ...] or [N, C, ...] input:
  /// the values and each maximum's flat position in its pooled plane (row-major over the
  /// pooled dims). Per-dim parameters may be given once; an empty stride is the kernel.
  std::pair<Node *, Node *> maxPool(Node *x, int64_t spatial, IntList kernel, IntList stride,
                                    IntList padding, IntList dilation, bool ceilMode);
  /// Average pooling (dilation 1) of a floating-point or i64 input: a window's sum divided by
  /// `divisor`, or when that is 0 by the number of window positions inside the input (and
  /// inside the declared padding with `countIncludePad`). Half precision sums and divides in
  /// f32 and rounds once; i64 divides rounding toward zero (eager's kernels).
  Node *avgPool(Node *x, int64_t spatial, IntList kernel, IntList stride, IntList padding,
                bool ceilMode, bool countIncludePad, int64_t divisor);
  /// The gradient of max pooling (kernel.size() pooled dims) for its input x: each position
  /// receives the sum of `grad` over the windows whose maximum (`indices`, as maxPool gives
  /// them) it was. Shaped as x, typed as grad.
  Node *maxPoolGrad(Node *grad, Node *x, Node *indices, IntList kernel, IntList stride,
                    IntList padding, IntList dilation, bool ceilMode);
  /// Adaptive pooling of the last outputSize.size() (1 to 3) dims of a floating-point input
  /// to `outputSize`: output j of a dim of n elements pools [floor(j n / o), ceil((j + 1) n / o)).
  /// Max gives values and flat plane positions, as maxPool.
  std::pair<Node *, Node *> adaptiveMaxPool(Node *x, IntList outputSize);
  Node *adaptiveAvgPool(Node *x, IntList outputSize);
  /// The gradients of adaptive pooling of the last `spatial` dims for its input x, given the
  /// output's gradient `grad`: average pooling spreads each output's gradient over
  /// its window divided by the window's size; max pooling gives each input position the sum
  /// of the gradients whose `indices` (as adaptiveMaxPool gives them) name it, which compares
  /// each position of a pooled plane with each output (at most kMaxComparisons pairs).
  Node *adaptiveAvgPoolGrad(Node *grad, Node *x, int64_t spatial);
  Node *adaptiveMaxPoolGrad(Node *grad, Node *x, Node *indices, int64_t spatial);
  static constexpr int64_t kMaxAdaptiveSize = int64_t(1) << 20;
  /// PyTorch's pooled size of a dim of n elements; the window-parameter error ("" if none).
  static int64_t pooledSize(int64_t n, int64_t kernel, int64_t stride, int64_t padding,
                            int64_t dilation, bool ceilMode);
  static std::string poolWindowError(int64_t kernel, int64_t stride, int64_t padding,
                                     int64_t dilation);
  /// Grid sampling (PyTorch's grid_sample) of x [N, C, *S] (2 or 3 spatial dims, static and
  /// non-empty) at the points of grid [N, *O, s] (static O) -> [N, C, *O]. A point's entries
  /// (x, y[, z]) address the input's last dim first, -1 and 1 being its ends: the corner
  /// elements' centers with `alignCorners`, else their outer edges. mode: "bilinear"
  /// (trilinear in 3-d), "nearest" or "bicubic" (2-d only); paddingMode: what a tap outside
  /// the input reads, "zeros", "border" (the nearest edge) or "reflection" (reflected off the
  /// edges). Half precision rounds as eager's kernels on the target do
  /// (DecomposeOptions::cpuHalfRounding): after every operation on the CPU, else computed in
  /// f32 and rounded once.
  Node *gridSample(Node *x, Node *grid, const std::string &mode, const std::string &paddingMode,
                   bool alignCorners);
  /// gridSample's result shape for x and grid, or why there is none ("" when `shape` is set).
  static std::string gridSampleShape(const Node *x, const Node *grid, const std::string &mode,
                                     const std::string &paddingMode, std::vector<SymExpr> &shape);
  /// Distances ||a_i - b_j||_p over the last dim between the rows of a [.., P, M] and
  /// b [.., R, M] (batch dims broadcast) -> [.., P, R]; p >= 0 or inf (0 counts differing
  /// features). `matmulForm` (p = 2) computes sqrt(max(|a|^2 - 2ab + |b|^2, 0)) through one
  /// matrix product, as eager does for many rows.
  Node *cdist(Node *a, Node *b, double p, bool matmulForm);
  /// The upper triangle (row-major, diagonal excluded) of x's pairwise row distances:
  /// x [N, M] -> [N (N - 1) / 2], N static and at most kMaxPdistRows.
  Node *pdist(Node *x, double p);
  /// The cross product of a and b (dtypes promoted, shapes broadcast) along `dim`, of size 3.
  Node *cross(Node *a, Node *b, int64_t dim);
  /// The larger (`max`) or smaller of a and b (dtypes promoted, shapes broadcast), taking the
  /// other operand where one is NaN (fmax / fmin; maximum / minimum propagate NaN).
  Node *fmax(Node *a, Node *b, bool max);
  /// x + alpha * y, or x - alpha * y when `subtract` (torch.add / torch.sub with alpha; alpha
  /// nullptr: 1), dtypes promoted and shapes broadcast at each step.
  Node *addScaled(Node *x, Node *y, Node *alpha, bool subtract);
  /// src converted to like's dtype and broadcast to its shape (a functional copy into like).
  Node *copyLike(Node *src, Node *like);
  /// x (floating point) as mantissa * 2^exponent: the mantissa in x's dtype, 0.5 <= |m| < 1
  /// (0, inf and NaN as they are), and the exponent as i32 (torch.frexp).
  std::pair<Node *, Node *> frexp(Node *x);
  /// x bounded below by lo and above by hi (either nullptr: unbounded on that side; dtypes
  /// promoted, shapes broadcast), NaN propagated, hi winning where lo > hi (torch.clamp).
  Node *clamp(Node *x, Node *lo, Node *hi);
  /// a / b rounded toward zero (dtypes promoted, shapes broadcast; numbers, not bools), as
  /// torch.div(..., rounding_mode="trunc"): floating point truncates the true quotient,
  /// integers are exact.
  Node *truncDiv(Node *a, Node *b);
  /// log1p(exp(-x * y)) per element, op by op in x's floating-point dtype as eager's kernel
  /// rounds (x and y of one dtype, shapes broadcast); `reduction` "none" keeps it per element,
  /// "mean" and "sum" reduce it over every dim to a scalar.
  Node *softMarginLoss(Node *x, Node *y, const std::string &reduction);
  static bool isLossReduction(const std::string &r) {
    return r == "none" || r == "mean" || r == "sum";
  }
  /// x (floating point) rounded half to even at `decimals` decimal places (negative: tens,
  /// hundreds...), at most kMaxDecimals either way.
  Node *roundDecimals(Node *x, int64_t decimals);
  /// Whether x's sign bit is set (-0.0 and negative NaNs included), as bool.
  Node *signbit(Node *x);
  /// x * 2^e, as eager composes it: pow of the constant 2 in e's float dtype (f32 for integer
  /// exponents), then a product with x promoted.
  Node *ldexp(Node *x, Node *e);
  /// The argument of a real number: pi for negatives, 0 otherwise, NaN kept (floating x).
  Node *angle(Node *x);
  /// ldexp's result dtype for operand dtypes x and e.
  static DType ldexpType(DType x, DType e);
  /// beta * bias + alpha * (a @ b) for a [.., M, K] and b [.., K, N] of one rank >= 2 and
  /// batch (addmm, baddbmm), or with `batchSum` the product summed over the batch dim of 3-d
  /// operands (addbmm); bias broadcasts to the result. beta == 0 ignores bias (NaNs too); for
  /// integers the scalars are truncated first, as eager does. A half-precision addbmm adds one
  /// product per batch, each in f32 and rounded, as eager, up to kMaxUnrolledBatches batches.
  Node *addMatMul(Node *bias, Node *a, Node *b, double beta, double alpha, bool batchSum);
  static constexpr int64_t kMaxUnrolledBatches = 64;
  /// The product of x1, x2, x3, each unsqueezed at its expand dims, summed over sumdim (those
  /// dims removed), as aten._trilinear: x1 * x2 summed first over the sum dims x3 is expanded
  /// in, then times x3 summed over the rest; half precision accumulates in f32.
  Node *trilinear(Node *x1, Node *x2, Node *x3, IntList expand1, IntList expand2,
                  IntList expand3, IntList sumdim);
  /// Why an add_matmul or trilinear node's operands and attributes are not taken ("" if they
  /// are; then `type` is the result's type).
  static std::string productError(OpKind op, const std::vector<const Node *> &operands,
                                  const AttrMap &attrs, sym::SymContext &ctx, TensorType &type);
  static constexpr int64_t kMaxDecimals = 300; ///< 10^decimals stays a finite double
  /// Embedding bags: rows of weight [R, D] gathered by integer `indices` and reduced per bag
  /// by `mode` ("sum", "mean" or "max"; an empty bag gives zeros) -> [B, D]. With 1-d
  /// indices [L], bag b holds positions offsets[b] <= i < offsets[b + 1] (the last to the end,
  /// or, with `includeLastOffset`, to the last offset, which then closes the last of B =
  /// len(offsets) - 1 bags); 2-d indices [B, P] (no offsets) hold a bag per row. Rows equal to
  /// `paddingIdx` (a row, or -1: none) are left out; per-sample `weights` (mode sum) scale the
  /// rows.
  Node *embeddingBag(Node *weight, Node *indices, Node *offsets, Node *weights,
                     const std::string &mode, int64_t paddingIdx, bool includeLastOffset);
  /// Why embeddingBag's operands are not taken ("" if they are; then `bags` is B).
  static std::string embeddingBagError(const Node *weight, const Node *indices,
                                       const Node *offsets, const Node *weights,
                                       const std::string &mode, int64_t paddingIdx,
                                       bool includeLastOffset, int64_t &bags);
  static constexpr int64_t kMaxPdistRows = 128; ///< a row is a slice; rows are concatenated
  /// A discrete Fourier transform over `dims` of a complex signal held as pairs ([.., 2]: real,
  /// imaginary) or a real one, computed in f64 and rounded to x's dtype once:
  ///   - "c2c": pairs to pairs, forward when `flag` (else the inverse, unscaled);
  ///   - "r2c": real to pairs, one-sided (the last dim n/2 + 1 long) when `flag`;
  ///   - "c2r": pairs (a one-sided spectrum along the last dim) to a real signal whose last dim
  ///     is `lastSize` long.
  /// normalization: 0 none, 1 1/sqrt(n), 2 1/n. Sizes are static; each transformed one is
  /// 1 to kMaxDft long (the transform is quadratic in it).
  Node *fft(Node *x, const std::string &mode, IntList dims, int64_t normalization, bool flag,
            int64_t lastSize);
  static constexpr int64_t kMaxDft = 4096;
  /// The complex value re + i·im held as pairs ([.., 2]: real, imaginary, as fft's), of re's
  /// and im's floating-point dtype (promoted) and broadcast shape; im nullptr: zeros.
  Node *complex(Node *re, Node *im);
  /// The complex conjugate of pairs x [.., 2] (the imaginary parts negated).
  Node *conj(Node *x);
  /// Whether x holds complex values as pairs: floating point, a last dim of 2.
  static bool isPairs(const Node *x) {
    return isFloating(x->dtype()) && x->rank() > 0 && x->shape().back()->isConst(2);
  }
  /// The i64 indices that sort x along `dim` (ascending, or `descending`), stably: equal
  /// values keep their order; NaN is the largest value.
  Node *argsort(Node *x, int64_t dim, bool descending);
  /// The index (i64, `dim` kept as 1) of the lower median along `dim` in that stable order;
  /// where a row holds a NaN, its first NaN's, unless `ignoreNan` (then the lower median of
  /// the row's other values; a row of only NaNs gives its first index).
  Node *medianIndex(Node *x, int64_t dim, bool ignoreNan);
  /// The most frequent value along `dim` of an integer or bool x (the smallest of equally
  /// frequent ones) and its last index, both with `dim` kept as 1.
  /// A scalar is its own mode (index 0); without `keepdim` the dim is removed.
  std::pair<Node *, Node *> mode(Node *x, int64_t dim, bool keepdim = true);
  /// x sorted along `dim` (ascending, or `descending`; stably, NaN the largest value) and the
  /// indices that sort it (argsort). A scalar, a dim of at most one element and an empty tensor
  /// are their own sort, with indices 0.
  std::pair<Node *, Node *> sort(Node *x, int64_t dim, bool descending);
  /// The lower median along `dim` (medianIndex's element) and its index, with `dim` kept as 1
  /// or, without `keepdim`, removed. With no dim: the median of all of x's elements, a scalar,
  /// and its row-major position. A scalar is its own median (index 0).
  std::pair<Node *, Node *> median(Node *x, std::optional<int64_t> dim, bool keepdim,
                                   bool ignoreNan);
  /// Sorts are quadratic in the sorted length: static sizes, at most kMaxSortDim long and
  /// kMaxSortWork comparisons. The reason a shape is past that ("" if none).
  static constexpr int64_t kMaxSortDim = 16384, kMaxSortWork = int64_t(1) << 28;
  static std::string sortLimitError(const std::vector<SymExpr> &shape, int64_t dim);
  /// Inclusive scan along `dim`: op is CumSum, CumProd or LogCumSumExp. Integer and bool
  /// inputs of cumsum/cumprod accumulate in i64 (PyTorch's rule) unless `dtype` is given.
  Node *scan(OpKind op, Node *x, int64_t dim, std::optional<DType> dtype = std::nullopt);
  /// The running max (`max`) or min along `dim` and, for each position, the last index at or
  /// before it holding that value (the last NaN once a NaN is seen), as eager's running update
  /// with >= (<=) gives.
  std::pair<Node *, Node *> cumExtreme(Node *x, int64_t dim, bool max);
  /// Scans are quadratic in the scanned length: a static dim of at most kMaxScan elements.
  static constexpr int64_t kMaxScan = 4096;
  static std::string scanLimitError(const std::vector<SymExpr> &shape, int64_t dim);
  /// For each of `values`, the index binary search returns in the sorted `seq` (along its last
  /// dim; an N-d seq pairs its rows with the values' leading dims): the count of boundaries
  /// b < v, or b <= v with `right`. `sorter` (optional) orders an unsorted seq. Indices are
  /// `out` (i64 or i32); seq and values promote to one dtype.
  Node *searchSorted(Node *seq, Node *values, Node *sorter, bool right, DType out);
  /// Counts of x's elements in `bins` equal parts of [lo, hi] (elements outside are not
  /// counted; hi falls in the last bin), in x's dtype. An element's bin is
  /// trunc((e - lo) * bins / (hi - lo)) computed in x's floating-point dtype, or for integers
  /// (eager's CUDA kernel takes them) in i64 with lo and hi truncated to integers, as eager's
  /// kernels do.
  Node *histogram(Node *x, int64_t bins, double lo, double hi);
  /// Search and histogram compare every value with every boundary: at most kMaxComparisons.
  static constexpr int64_t kMaxComparisons = int64_t(1) << 24;
  /// Why searchSorted's or histogram's operands are not taken ("" if they are).
  static std::string searchShape(const Node *seq, const Node *values);
  static std::string histogramError(const Node *x, int64_t bins, double lo, double hi);
  /// Random numbers from a counter-based generator keyed by `seed` (an i64 scalar tensor):
  /// distribution "uniform" ([0, 1)) or "normal" (mean 0, variance 1). Each random node of a
  /// graph draws from its own stream, so two calls in one graph are independent.
  Node *random(const std::string &distribution, DType dtype, std::vector<SymExpr> shape, Node *seed);
  /// The same draw from a given stream (a decomposition reusing its node's streams).
  Node *random(const std::string &distribution, DType dtype, std::vector<SymExpr> shape,
               Node *seed, int64_t stream);
  /// Draws of PyTorch's distributions (random_draw nodes), as eager defines them, from
  /// braze's streams: uniform in [low, high) (float dtypes; half precision computes in f32),
  /// normal with tensor `mean` and `std` (broadcast to `shape`), an integer in [low, high)
  /// (any numeric dtype; 48 random bits from two streams; |low|, |high| <= 2^53),
  /// geometric(p) (trials up to the first success, 0 < p < 1; computed in f64) and
  /// bernoulli(p) (1 with probability p, else 0, in any dtype; 0 <= p <= 1).
  Node *randomUniform(DType dtype, std::vector<SymExpr> shape, Node *seed, double low, double high);
  Node *randomNormal(DType dtype, std::vector<SymExpr> shape, Node *seed, Node *mean, Node *std);
  Node *randomInteger(DType dtype, std::vector<SymExpr> shape, Node *seed, int64_t low,
                      int64_t high);
  Node *randomGeometric(DType dtype, std::vector<SymExpr> shape, Node *seed, double p);
  Node *randomBernoulli(DType dtype, std::vector<SymExpr> shape, Node *seed, double p);
  /// Why a random_draw node's operands and attributes are not taken ("" if they are).
  static std::string randomDrawError(const TensorType &type,
                                     const std::vector<const Node *> &operands,
                                     const AttrMap &attrs);
  /// The diagonal of dims d1 and d2 shifted by `offset` (a view): both dims are removed and
  /// a last dim of the diagonal's length is appended.
  Node *diagonal(Node *x, int64_t offset, int64_t d1, int64_t d2);
  /// Reverses the listed dims (a view).
  Node *flip(Node *x, std::vector<int64_t> dims);
  /// Joins tensors along `dim`; all other dims must agree. Dtypes promote as in torch.cat.
  Node *concat(std::vector<Node *> xs, int64_t dim);

  Node *softmax(Node *x, int64_t dim);
  Node *logSoftmax(Node *x, int64_t dim);
  Node *mean(Node *x, std::vector<int64_t> dims, bool keepdim);
  Node *var(Node *x, std::vector<int64_t> dims, double correction, bool keepdim);
  /// Normalizes over the dims from `axis` to the last; weight and bias may be null.
  Node *layerNorm(Node *x, int64_t axis, Node *weight, Node *bias, double eps);
  /// native_layer_norm's saved statistics: mean and 1/sqrt(var + eps) over the dims from `axis`,
  /// keeping those dims as size 1.
  std::pair<Node *, Node *> layerNormStats(Node *x, int64_t axis, double eps);
  Node *gelu(Node *x, const std::string &approximate);
  Node *silu(Node *x);

  // scatter family
  /// out = self with the flat positions `target` (an integer tensor of src's shape) combined
  /// with src: mode "overwrite" (the last src in source order wins), "sum", "prod", "mean",
  /// "amax" or "amin"; `includeSelf` false leaves self out of the reduction at the positions
  /// src reaches. Targets outside [0, numel(self)) are a run-time error. The work is
  /// numel(self) x numel(src), which must be constant and at most kMaxScatterPairs unless
  /// the scatter combines in place (scatterCombinesInPlace).
  /// `maxHits` > 0 promises that at most that many source elements share a target: a
  /// half-precision sum/prod/mean then combines them one at a time in source order, rounding
  /// after each as eager's kernels do (maxHits more reductions for a prod or mean, at most
  /// kMaxScatterHits; a sum above that many, or above the pairs limit, adds in place).
  Node *scatter(Node *self, Node *target, Node *src, const std::string &mode, bool includeSelf,
                int64_t maxHits = 0);
  static constexpr int64_t kMaxScatterPairs = int64_t{1} << 26;
  /// The most `maxHits` a half-precision prod or mean may promise (each is one more reduction
  /// over the pairs).
  static constexpr int64_t kMaxScatterHits = 16;
  /// A scatter mode: overwrite, sum, prod, mean, amax or amin.
  static bool isScatterMode(const std::string &mode);
  /// Whether eager rounds a `mode` scatter into `t` after each value in source order (a
  /// half-precision sum, prod or mean), which braze follows for up to kMaxScatterHits values.
  static bool scatterRoundsInOrder(DType t, const std::string &mode);
  /// Whether a `mode` scatter into `t` may combine its values in place and so has no pairs
  /// limit: an overwrite of any dtype (the last source aimed at a position, found by an
  /// accumulating maximum of source indices, wins); a sum, prod, mean, amax or amin of f32,
  /// f64, i32 or i64, or of f16 or bf16 where
  /// eager accumulates in f32 and rounds once (`inOrder` false; where eager rounds after each
  /// value, `inOrder`, a sum, rounded after each value in source order on the CPU, and amax
  /// and amin), self included or not. Above the limit
  /// decompose builds it from accumulating scatters (scatterIsAccumulating) and elementwise
  /// ops: the positions reached, counted by one, take the mode's identity where self is left
  /// out; a mean divides a sum by that count; half precision combines in f32.
  static bool scatterCombinesInPlace(DType t, const std::string &mode, bool inOrder);
  /// Whether a scatter is one that to_loops lowers itself, combining each source value into
  /// a copy of self in place (atomics on CUDA; on the CPU each thread owns a range of
  /// positions and combines the values aimed at it in source order): a sum, prod, amax or
  /// amin of f32, f64, i32 or i64 that includes self, or a half-precision sum rounded after
  /// each value (`inOrder`) that includes self.
  static bool scatterIsAccumulating(DType t, const std::string &mode, bool includeSelf,
                                    bool inOrder = false);
  /// Whether numel(self) x `sources` element pairs exceed `limit` (kMaxScatterPairs).
  static bool exceedsScatterPairs(int64_t self, int64_t sources,
                                  int64_t limit = kMaxScatterPairs) {
    return sources != 0 && self > limit / sources;
  }
  /// Whether combining in place gives exactly what the reductions over the pairs give, in
  /// any order: an overwrite (the largest source index wins), amax and amin, and integer sums
  /// and products.
  static bool scatterInPlaceIsExact(DType t, const std::string &mode);
  /// Pairs above which a scatter that combines in place exactly (scatterInPlaceIsExact) does:
  /// its work is then linear in the sources, where the reductions compare every position with
  /// every source (a router's inverse permutation of 4,096 tokens is 2^24 pairs).
  static constexpr int64_t kMaxExactScatterPairs = int64_t{1} << 20;
  /// Whether such a scatter combines in place (scatterCombinesInPlace) because it has more
  /// pairs than the reductions take: kMaxScatterPairs, or kMaxExactScatterPairs where the
  /// result is the same either way.
  static bool scatterAccumulates(DType t, const std::string &mode, bool inOrder, int64_t self,
                                 int64_t sources) {
    if (!scatterCombinesInPlace(t, mode, inOrder))
      return false;
    return exceedsScatterPairs(self, sources,
                               scatterInPlaceIsExact(t, mode) ? kMaxExactScatterPairs
                                                              : kMaxScatterPairs);
  }
  /// self.scatter(dim, index, src) (scatter, scatter_add, scatter_reduce): self[.., index[j..]
  /// at dim, ..] combined with src[j..] for every j in index's shape, which fits in self's
  /// (but at dim) and in src's. Indices outside the dim, negative ones included, are a run-time
  /// error. Half precision accumulates in f32 and rounds once (eager's scatter kernels). One
  /// index per line along dim with "overwrite" (a one-hot gradient) is one comparison per
  /// element at any size; otherwise a scatter of numel(self) x numel(index) pairs.
  Node *scatterDim(Node *self, int64_t dim, Node *index, Node *src, const std::string &mode,
                   bool includeSelf);
  /// self.index_reduce(dim, index, source): source's slice j along dim is combined into self's
  /// slice index[j] (index 1-d; outside the dim, negative included, a run-time error). Half
  /// precision rounds after each value in source order, as eager, up to kMaxScatterHits values.
  Node *indexReduce(Node *self, int64_t dim, Node *index, Node *source, const std::string &mode,
                    bool includeSelf);
  /// self.put(index, source, accumulate): flat positions of self (negative ones wrap) set or
  /// added from source, of index's element count.
  Node *put(Node *self, Node *index, Node *source, bool accumulate);
  /// self with its diagonal (offset, dim1, dim2; as diagonal()) replaced by src.
  Node *diagonalScatter(Node *self, Node *src, int64_t offset, int64_t dim1, int64_t dim2);
  /// self[i0, i1, ...] = values (or += with `accumulate`): integer `indices` for self's dims
  /// `dims` (increasing), which broadcast together and place their dims as advanced indexing
  /// does (in place when `dims` are adjacent, else first); values broadcast to that shape.
  /// Negative indices wrap; others outside a dim are a run-time error. A half-precision sum
  /// rounds after each value in source order, as eager, up to kMaxScatterHits values.
  Node *indexPut(Node *self, std::vector<int64_t> dims, std::vector<Node *> indices,
                 Node *values, bool accumulate);
  /// self[mask] = values (or +=), for a bool or u8 mask of self's leading dims: values that
  /// broadcast over the dims after the mask fill every masked element; values with a leading
  /// dim of the number of trues (a run-time check) are taken in order.
  Node *maskPut(Node *self, Node *mask, Node *values, bool accumulate);
  /// masked_scatter: where the (broadcast) mask is true, the next element of source in order
  /// (too few is a run-time error), else self; the result has the broadcast shape.
  Node *maskedScatter(Node *self, Node *mask, Node *source);
  /// self (contiguous values) with the view as_strided(size, stride, offset) replaced by src;
  /// the view must not overlap itself or leave self. A dense view (one block of self's flat
  /// positions, in some order of its dims) may have any size; others are scattered, up to
  /// kMaxScan elements.
  Node *asStridedScatter(Node *self, Node *src, IntList size, IntList stride, int64_t offset);
  /// The view's dims from the largest stride to the smallest when the view of `size` and
  /// `stride` fills one block of flat positions densely (each stride the product of the sizes
  /// after it in that order; unit dims anywhere); empty otherwise.
  static IntList denseViewOrder(const IntList &size, const IntList &stride);
  /// i64 [size, rank(x)]: the coordinates of x's nonzero elements in C order, the rows past
  /// their count filled with `fill`.
  Node *nonzeroStatic(Node *x, int64_t size, int64_t fill);
  /// The view as_strided(size, stride, offset) of x's elements in row-major order (x's storage
  /// when x is contiguous), as a copy: element i of the result is flat x[offset + sum_d i_d *
  /// stride_d]; every element it reads must lie inside x (negative strides allowed).
  Node *asStrided(Node *x, IntList size, IntList stride, int64_t offset);
  /// Why a scatter-like node's (scatter_dim, index_reduce, put, diagonal_scatter, index_put,
  /// mask_put, masked_scatter, as_strided_scatter, nonzero_static, as_strided) operands and
  /// attributes are not taken ("" if they are); the builder and the verifier both ask.
  static std::string scatterLikeError(OpKind op, const std::vector<const Node *> &operands,
                                      const AttrMap &attrs);
  /// The result type of a scatter-like node whose scatterLikeError is "".
  static TensorType scatterLikeType(OpKind op, const std::vector<const Node *> &operands,
                                    const AttrMap &attrs, sym::SymContext &ctx);

  void output(std::vector<Node *> outs) { g_.setOutputs(std::move(outs)); }

  /// Broadcast shape of two shapes; raises a Diagnostic for `op` if they do not broadcast.
  std::vector<SymExpr> broadcastShapes(std::string_view op, const std::vector<SymExpr> &a,
                                       const std::vector<SymExpr> &b);
  /// Normalizes a possibly negative dim for a tensor of `rank`; raises a Diagnostic.
  int64_t normalizeDim(std::string_view op, int64_t dim, int64_t rank);
  /// Like normalizeDim, for ops that index the dim's size: a rank-0 tensor is a Diagnostic.
  int64_t normalizeSizedDim(std::string_view op, int64_t dim, int64_t rank);

  /// Whether index_put's `dims` are increasing and adjacent (the indexed dims stay in place).
  static bool adjacentDims(const std::vector<int64_t> &dims) {
    return !dims.empty() && std::is_sorted(dims.begin(), dims.end()) &&
           dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  }
  /// Size n as a 0-d i64 tensor (a symbolic one computed from its symbol where it is read).
  Node *sizeScalar(SymExpr n);
  /// index_put without accumulate into the consecutive dims [first, first + indices.size()):
  /// each position of those dims (a row of a KV cache) takes the values of the last index
  /// entry naming it, found by comparing every position with every entry, and the others keep
  /// self's. Indices wrap negatives and are checked against their dims at run time. Any sizes,
  /// symbolic too; index_put builds it directly over symbolic sizes, and decomposition for
  /// constant ones.
  Node *indexPutLastWrite(Node *self, int64_t first, const std::vector<Node *> &indices,
                          Node *values);

private:

  /// The Slice node of `length` elements of dim d from `start` every `step`, unchecked.
  Node *sliceNode(Node *x, int64_t d, int64_t start, SymExpr length, int64_t step);

  Node *make(OpKind op, std::vector<Node *> operands, AttrMap attrs, TensorType type);
  /// A convolution or transposed convolution node of result `shape` (checked operands): its
  /// window is stride, padding, dilation and the transposed one's output padding; a bias has
  /// the result's channels and is converted to x's dtype.
  Node *windowedProduct(OpKind op, Node *x, Node *w, Node *bias, std::array<IntList, 4> window,
                        int64_t groups, std::vector<SymExpr> shape);
  int64_t sortedDim(const char *op, Node *x, int64_t dim);
  Node *scatterLike(OpKind op, const char *text, std::vector<Node *> operands, AttrMap attrs);
  Node *randomDraw(std::vector<Node *> operands, AttrMap attrs, TensorType type);
  AttrMap poolAttrs(const std::string &op, Node *x, int64_t spatial, IntList kernel,
                    IntList stride, IntList padding, IntList dilation, bool ceilMode,
                    std::vector<SymExpr> &shape);
  AttrMap reductionAttrs(std::string_view op, Node *x, std::vector<int64_t> &dims, bool keepdim,
                         std::vector<SymExpr> &shape);
  std::vector<int64_t> normalizeDims(std::string_view op, std::vector<int64_t> dims, int64_t rank);
  /// An attention bias checked to broadcast to the scores [B.., Sq, Sk], a bool mask made
  /// additive (false: -inf), in q's dtype.
  Node *attentionBias(const char *op, Node *bias, Node *q, Node *k);
  /// Key or value x [B.., Hk, S, D] with its heads repeated to q's H (grouped-query attention:
  /// query head h reads key head h / (H / Hk)), a view; x as it is when the head counts match
  /// or q has rank below 3. Hk must divide H, both static.
  Node *repeatHeads(const char *op, Node *x, Node *q);
  Graph &g_;
  std::string name_;
  int64_t nextRandomStream_ = 0;
};

} // namespace braze
