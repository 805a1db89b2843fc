#pragma once
/// The lowering to loops, internal to lowering/to_loops. The Lowerer holds every node's lazy
/// value, stores the values the realize step marked, and copies views into the layouts their
/// readers need; its rules read and store each other's values through that one map.
/// ToLoops.cpp has the walk and the rules of views, elementwise ops, reductions, gathers and
/// the outputs; ToLoopsLibraryOps.cpp those of the ops kept whole for a library or a fused
/// kernel (matrix products, convolutions and their gradients, attention, accumulating
/// scatters). Index arithmetic that needs no node lives in IndexMaps.
#include "braze/lowering/to_loops/ToLoops.h"

#include "braze/ir/loop/Rewrite.h"
#include "braze/lowering/to_loops/IndexMaps.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace braze {

using loop::Buffer;
using loop::BufferKind;
using loop::Expr;
using loop::ReduceKind;
using loop::ScalarOpKind;

namespace to_loops {

/// A node's value: a function from a full index tuple (one SymExpr per dim; unit dims get 0)
/// to a scalar Expr in the node's compute type, plus the buffer it lives in once realized.
struct Value {
  std::function<const Expr *(const Index &)> load;
  Buffer *buffer = nullptr;
  /// Reads a buffer at an index affine in the loop variables (a buffer, or a permute / expand /
  /// slice / select / flip / unfold / unit-dim reshape of one): no recomputation, and a matrix
  /// product can hand it to BLAS with strides.
  bool affineView = false;
};

/// The shapes are equal once their unit dims are dropped.
inline bool onlyUnitDimsDiffer(const std::vector<SymExpr> &a, const std::vector<SymExpr> &b) {
  std::vector<SymExpr> x, y;
  for (SymExpr d : a)
    if (!d->isConst(1))
      x.push_back(d);
  for (SymExpr d : b)
    if (!d->isConst(1))
      y.push_back(d);
  return x == y;
}

inline ScalarOpKind scalarOpFor(OpKind op) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (op == OpKind::E)                                                         \
    return ScalarOpKind::E;
#include "braze/ir/types/ElementwiseOps.def"
  BRAZE_UNREACHABLE("not elementwise: " << opName(op));
}

inline ReduceKind reduceKindFor(OpKind op) {
  static const std::pair<OpKind, ReduceKind> kKinds[] = {
      {OpKind::Sum, ReduceKind::Sum}, {OpKind::Prod, ReduceKind::Prod},
      {OpKind::Amax, ReduceKind::Max}, {OpKind::Amin, ReduceKind::Min},
      {OpKind::Any, ReduceKind::Any}, {OpKind::All, ReduceKind::All},
      {OpKind::ArgMax, ReduceKind::ArgMax}, {OpKind::ArgMin, ReduceKind::ArgMin}};
  for (const auto &[k, r] : kKinds)
    if (k == op)
      return r;
  BRAZE_UNREACHABLE("not a reduction: " << opName(op));
}

class Lowerer {
public:
  Lowerer(Graph &g, const LoweringOptions &opts)
      : g_(g), opts_(opts), p_(std::make_unique<loop::LoopProgram>(g.symShared())),
        s_(g.sym()), ex_(p_->exprs()) {}

  std::unique_ptr<loop::LoopProgram> run();

private:
  /// Stores n's value, once, if the realize step marked it and it has no buffer yet.
  void storeMarked(Node *n);

  /// Fresh loop vars for the non-unit entries of `extents`; the full index has 0 elsewhere.
  std::vector<SymExpr> freshVars(const std::vector<SymExpr> &extents, const char *prefix,
                                 Index &full);

  Value bufferValue(Buffer *b);

  /// Materializes `v` (values of node n) into a new buffer: an output's strides are the graph's,
  /// an intermediate's are `strides` (empty: row-major).
  Value realize(Node *n, const Value &v, BufferKind kind, int ioIndex,
                const std::string &suffix = "", std::vector<SymExpr> strides = {});

  /// Strides with the rows padded (LoweringOptions::padRows, paddedRowStrides), or empty when a
  /// value of this shape and dtype is stored row-major.
  std::vector<SymExpr> paddedStrides(const std::vector<SymExpr> &shape, DType t) const;

  /// Stores output k, n's value, and returns the buffer that holds it.
  Buffer *realizeOutput(Node *n, int k);

  void claimAsOutput(Buffer *b, int k);

  /// The stored intermediate that v, n's value, reads as it is at every index when n is laid
  /// out with `strides`: the same elements, both layouts dense; or nullptr.
  Buffer *viewedInLayout(Node *n, const Value &v, const std::vector<SymExpr> &strides);

  /// The program's own, mutable, buffer b.
  Buffer *ownBuffer(const Buffer *b);

  /// v, n's value, at fresh indices `full` (over `vars`, n's non-unit dims) when it only reads
  /// one buffer of n's dtype (a view of it, a half value maybe widened to f32): that load, with
  /// no indirection. nullptr when v computes anything.
  const Expr *plainLoad(Node *n, const Value &v, Index &full, std::vector<SymExpr> &vars);

  bool isGraphOutput(const Node *n) const;

  /// The buffer of n's shape and dtype that v, n's value, reads at every index as it is (a
  /// chain of views that changes nothing), or nullptr.
  Buffer *viewedAsItIs(Node *n, const Value &v);

  const Value &operandValue(Node *n, size_t i) { return values_.at(n->operand(i)); }

  Value lazy(std::function<const Expr *(const Index &)> f) { return Value{std::move(f), nullptr}; }

  /// n's value v stored once: [N, H, W, C] in channels-last mode, else intermediateStrides.
  /// A 4-d value read only as convolutions' weight (the flipped weight of an input gradient)
  /// is stored as they read it (channelsLastWeight, or row-major), not [N, H, W, C] and then
  /// copied again for them.
  Value storeIntermediate(Node *n, const Value &v);

  bool onlyConvolutionWeight(const Node *n) const;

  /// Whether u reads n as a convolution's weight (of a convolution or an input gradient).
  static bool readsAsWeight(const Node *u, const Node *n);

  /// A stored intermediate's strides (empty: row-major). In channels-last mode a value of rank
  /// above 4 keeps dim 1 innermost: the channels of a value derived from a channels-last
  /// image, such as a pooling's [N, C, OH, W, kh] windows, so its kernels run along them.
  /// Else a graph output the caller takes in another dense layout with the last dim innermost
  /// (a saved residual [B, S, E] with strides {E, B*E, 1}, which attention's transposes
  /// made) is stored in that layout where only pointwise ops and reductions read it: the one
  /// buffer is the output, where row-major it would be stored twice (the copy for the caller).
  std::vector<SymExpr> intermediateStrides(Node *n);
  /// Whether every reader of n, through views, is pointwise, a reduction or a numel.
  bool readByPointsOnly(const Node *n) const;

  /// Dense strides with dim 1 innermost and the others row-major ({HWC, 1, WC, C} for
  /// [N, C, H, W]).
  std::vector<SymExpr> channelsLastStrides(const std::vector<SymExpr> &shape);

  // ---- Channels-last mode (LoweringOptions::channelsLast) ------------------------------------
  // A 4-d value stored for a convolution, or because several ops read it, lives in a buffer
  // shaped [N, H, W, C], so the kernels that write and read it run along C; a stored value of
  // higher rank keeps dim 1 innermost (intermediateStrides).

  static Index toNhwc(const Index &i) { return {i[0], i[2], i[3], i[1]}; }
  static Index fromNhwc(const Index &f) { return {f[0], f[3], f[1], f[2]}; }

  Value nhwcValue(Buffer *b);

  /// In channels-last mode: a 4-d input laid out channels-last and dense ({HWC, 1, WC, C}),
  /// other than a convolution's weight (channelsLastWeight reads those).
  bool channelsLastInput(Node *n);

  /// n's values in a [N, H, W, C] buffer (made once per node).
  Buffer *realizeNhwc(Node *n, const Value &v);

  /// A convolution weight [O, C, kh, kw] stored with C innermost (cuDNN's NHWC filter layout),
  /// copying it (once, for every convolution that reads it) if it is not.
  Buffer *channelsLastWeight(Node *n);

  Value lower(Node *n);

  Value lowerElementwise(Node *n);

  Value lowerReduction(Node *n);

  Value lowerView(Node *n);

  /// out = operand k at (i - offset_k) where offset_k <= i < offset_k+1. Every operand is read
  /// at a clamped index (always in bounds) and a chain of `where` picks the right one.
  Value lowerConcat(Node *n);

  /// The buffer holding node n's values, realizing them first if they are computed lazily
  /// (an indirect load needs memory to read from).
  Buffer *inMemory(Node *n);

  /// out[a.., j.., b..] = x[a.., index0[j..], index1[j..], .., b..]; negative indices wrap
  /// once. Each index binds its own indirect symbol, so every component is bounds-checked
  /// against its own dim (a bad component cannot alias another valid flat position).
  Value lowerTake(Node *n);

  /// Whether v, n's value, is a plain load (plainLoad) at an index affine in n's indices with a
  /// unit step along one of the last two dims (a reshape of a permuted buffer whose layout
  /// makes it row-major): a matrix product can read it in place.
  bool readsInPlace(Node *n, const Value &v);

  /// out[b.., m, n] = sum_k a[b.., m, k] * b[b.., k, n]: a reduction whose operands are always
  /// in memory (a computed operand is realized first, so nothing is recomputed per output),
  /// which the scheduler hands to BLAS when the layouts allow.
  /// With opts_.widenedHalfMatMul, an f32 product of two f16/bf16 tensors converted to f32 reads
  /// the half operands and widens each element as it loads it (the product of two widened halves
  /// is exact in f32).
  Value lowerMatMul(Node *n);

  /// A scatter decompose kept whole combines in place (GraphBuilder::scatterIsAccumulating):
  /// self is copied into a row-major buffer, then one computation over src's space combines
  /// each source value at its flat position (loop::Computation::scatterAt), which codegen
  /// checks, by the mode's combine.
  Value lowerAccumulatingScatter(Node *n);

  /// A convolution the decomposer kept (a library takes it): one sum reduction in the direct
  /// form ConvSpec describes, over the input and weight in memory, with the spec attached.
  /// Window positions in the padding read the clamped edge and are zeroed by a `where`. The
  /// bias, if any, is a pointwise add after it that fuses into the consumer.
  /// A convolution's (or weight gradient's) attributes, and its layout in this program.
  loop::ConvSpec convSpec(Node *n);

  /// A convolution's image operand (its input, or a weight gradient's output gradient) in
  /// memory: an [N, H, W, C] buffer in channels-last mode, else where it is, copied row-major
  /// when the library needs rows.
  Buffer *convImage(Node *n, const loop::ConvSpec &spec);

  /// 0 <= at < size, as a bool Expr.
  const Expr *inRange(SymExpr at, SymExpr size);

  /// a && b, where a null `a` is true.
  const Expr *conjoin(const Expr *a, const Expr *b);

  /// x[batch, channel, pos * stride + tap * dilation - padding] in type t: the input element
  /// under kernel tap `taps` of the window at output position `pos`; zero in the padding
  /// (where the load reads the clamped edge).
  const Expr *windowElement(const loop::ConvSpec &spec, Buffer *x, const std::vector<SymExpr> &xs,
                            SymExpr batch, SymExpr channel, const Index &pos, const Index &taps,
                            DType t);

  /// [first, shape's spatial dims..]: a convolution's reduction extents (a channel count, then
  /// the kernel's or the output gradient's positions).
  static std::vector<SymExpr> withSpatial(SymExpr first, const std::vector<SymExpr> &shape);

  /// The input channel that output channel `o` reads at its group's channel `c`.
  SymExpr groupChannel(const loop::ConvSpec &spec, SymExpr o, SymExpr c, SymExpr outChannels,
                       SymExpr perGroupIn);

  /// A convolution's weight in memory: cuDNN's NHWC filter layout in channels-last mode on
  /// CUDA, else where it is (row-major where the library needs rows).
  Buffer *convWeight(Node *wn, const loop::ConvSpec &spec);

  Value lowerConvolution(Node *n);
  /// A weight gradient the decomposer kept (cuDNN's backward-filter convolution): one sum
  /// reduction over the batch and the output positions in the direct form ConvSpec describes,
  /// with the spec attached. In channels-last mode the result has the NHWC filter layout of
  /// the forward's weights (channelsLastWeight).
  Value lowerConvWeightGrad(Node *n);
  /// An input gradient the decomposer kept (cuDNN's or oneDNN's backward-data convolution):
  /// one sum reduction per input element over its group's output channels and the kernel
  /// taps, each term the output gradient at the window position p with p*stride + k*dilation
  /// - padding = s, where there is one (else zero), with the spec attached. In channels-last
  /// mode the result is an [N, H, W, C] buffer, like a convolution's.
  Value lowerConvInputGrad(Node *n);



  /// n's values as a strided view of a buffer (one stride per dim, 0 along unit dims): read in
  /// place when n is a buffer, or a view of one at an index affine in n's indices (a permuted
  /// or sliced projection), with a unit last stride when `unitLast`; otherwise realized
  /// row-major first.
  loop::AttentionOperand stridedOperand(Node *n, bool unitLast);

  /// LoweringOptions::permutedAttentionOutput: the strides that make the one permutation all
  /// of n's readers apply to it row-major; for a graph output, the dense strides with a unit
  /// last stride the caller takes it in (memory-efficient attention returns [B, M, H, K]
  /// memory), written in place rather than copied; else empty (row-major).
  std::vector<SymExpr> attentionOutputStrides(Node *n);

  /// The nodes that read n, once each, in graph order.
  std::vector<Node *> readersOf(const Node *n) const;

  /// Whether `to` is `from` with dims h and h + 1 merged into one.
  bool mergesDims(const std::vector<SymExpr> &from, const std::vector<SymExpr> &to, size_t h);

  /// An attention-family op the target fuses: one Computation with the spec and no value,
  /// writing a row-major buffer; the bias broadcasts by zero strides (dims it lacks or has as 1).
  Value lowerAttention(Node *n);

  /// e with the indirect binding {t, i} on every load whose index uses t, and inside the
  /// bindings of e's own indirect loads (a take of a take); nullptr when t is used outside
  /// load indices (an index value), where a binding cannot reach it.
  const Expr *bindIndirect(const Expr *e, SymExpr t, const Expr *i,
                           std::unordered_map<const Expr *, const Expr *> &done);
  /// Whether a load of e is bound to t: the one place a gathered or taken index is checked
  /// against its dim (a value that does not read at t, in place, would never check it).
  static bool bindsIndex(const Expr *e, SymExpr t);

  /// A gather from a value the realize step did not store (a cheap value computed nowhere else,
  /// log_softmax feeding nll_loss, or a view of a stored one) reads the value's inputs at the
  /// gathered positions instead of realizing the whole value; nullopt when the value's body
  /// cannot take the gathered index (bindIndirect).
  std::optional<Value> gatherInPlace(Node *n, const Value &xv, const Value &index, size_t dim,
                                     SymExpr extent);
  /// Take n of a computed value xv (one index tensor; realize's computedAtTaken) reads the
  /// value's inputs at the taken positions; nullopt when its body cannot take the index.
  std::optional<Value> takeInPlace(Node *n, const Value &xv);
  /// A take's index i (i64) into a dim of `extent`, a negative one counted from the end.
  const Expr *wrapIndex(const Expr *i, SymExpr extent);
  /// The symbols a take or gather binds (one per index tensor), shared by its reads within one
  /// iteration space: two reads at one position are then one load, computed once (a mask taken
  /// through a permutation, read by a masked_fill at each of its uses). A new space (freshVars)
  /// makes new ones, so that its index sums list its own variables first, as before.
  struct BoundSymbols {
    uint64_t epoch = ~uint64_t(0);
    std::vector<SymExpr> syms;
  };
  SymExpr boundSymbol(BoundSymbols &b, size_t j, SymExpr extent);
  /// v (computed in `compute`) rounded to `storage` and widened back, as a half-precision op's
  /// result is: v itself where it already holds a value of `storage` (holdsValueOf).
  const Expr *roundTo(const Expr *v, DType storage, DType compute);
  /// For an element of n (its index) and the symbol t of the position read along the source's
  /// dim: that position's value and the source element's index, which holds t there.
  using PositionAt = std::function<std::pair<const Expr *, Index>(const Index &, SymExpr)>;
  /// n's value as xv's computed where n reads it (gatherInPlace, takeInPlace): xv's loads
  /// bind t to the position; nullopt when its body cannot take it (bindIndirect) or none of
  /// its loads would check it (bindsIndex).
  std::optional<Value> boundInPlace(Node *n, const Value &xv, SymExpr extent,
                                    const PositionAt &position);

  Value lowerGather(Node *n);

  Graph &g_;
  LoweringOptions opts_;
  std::unique_ptr<loop::LoopProgram> p_;
  sym::SymContext &s_;
  uint64_t varsEpoch_ = 0; ///< freshVars calls so far (BoundSymbols)
  loop::ExprContext &ex_;
  std::unordered_map<const Node *, Value> values_;
  std::unordered_map<const Node *, Buffer *> nhwc_; ///< channels-last copies, by node
  std::unordered_map<const Node *, Buffer *> filters_; ///< convolution weights, NHWC filters
};

} // namespace to_loops

} // namespace braze
