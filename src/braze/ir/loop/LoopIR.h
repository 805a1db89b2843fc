#pragma once
/// The loop-level IR. A LoopProgram is a list of buffers and a list of Computations in
/// execution order. A Computation realizes one buffer: for every index tuple of its iteration
/// space it evaluates a scalar Expr (pointwise) or folds the Expr over reduction indices
/// (reduction) and stores the result at the row-major position of its outer indices.
/// Exprs are immutable and hash-consed in the program's ExprContext.
#include "braze/ir/types/DType.h"
#include "braze/ir/sym/SymExpr.h"

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace braze::loop {

using sym::SymExpr;

enum class ScalarOpKind : uint16_t {
#define BRAZE_ELEMENTWISE(E, arity, text, result) E,
#include "braze/ir/types/ElementwiseOps.def"
  Cast, ///< convert the operand to the Expr's dtype
};
std::string_view scalarOpName(ScalarOpKind k);
bool parseScalarOp(std::string_view name, ScalarOpKind &out);
int scalarOpArity(ScalarOpKind k);

enum class BufferKind { Input, Output, Intermediate };
std::string_view bufferKindName(BufferKind k);

struct Buffer {
  int id = 0;
  std::string name;
  DType dtype = DType::Float32;
  std::vector<SymExpr> shape;
  std::vector<SymExpr> strides; ///< in elements; row-major unless an input says otherwise
  BufferKind kind = BufferKind::Intermediate;
  int ioIndex = -1; ///< position among the graph's inputs or outputs
  /// An input or output the caller sees in another shape over the same memory: a saved
  /// activation returned transposed ([N, M] with strides {1, N} over the [M, N] row-major
  /// buffer that computed it), or a channels-last image passed in ([N, C, H, W] with strides
  /// {HWC, 1, WC, C} over an [N, H, W, C] buffer). That shape and its strides; empty: the
  /// caller sees shape and strides.
  std::vector<SymExpr> callerShape, callerStrides;
  const std::vector<SymExpr> &seenShape() const { return callerShape.empty() ? shape : callerShape; }
  const std::vector<SymExpr> &seenStrides() const {
    return callerShape.empty() ? strides : callerStrides;
  }
};

/// Whether strides lay shape out densely: in some order of its dims, each stride is the product
/// of the sizes inside it, so the elements fill [0, numel) once (unit dims may have any stride).
bool denseLayout(sym::SymContext &ctx, const std::vector<SymExpr> &shape,
                 const std::vector<SymExpr> &strides);

enum class ExprKind { Const, IndexValue, Load, Op };

class Expr;
/// Data-dependent index: the symbol stands for the (int64) value of the Expr inside a Load's index.
using IndirectBinding = std::pair<SymExpr, const Expr *>;

class Expr {
public:
  ExprKind kind() const { return kind_; }
  DType dtype() const { return dtype_; }
  /// Const: the value (integers are exact up to 2^53; ints are also kept in intValue()).
  double floatValue() const { return fvalue_; }
  int64_t intValue() const { return ivalue_; }
  /// IndexValue and Load: the index expression.
  SymExpr index() const { return index_; }
  /// Load: the buffer read.
  const Buffer *buffer() const { return buffer_; }
  /// Load: bindings of the indirect symbols used in index().
  const std::vector<IndirectBinding> &indirect() const { return indirect_; }
  /// Op: the scalar operation and its operands.
  ScalarOpKind op() const { return op_; }
  const std::vector<const Expr *> &operands() const { return operands_; }

private:
  friend class ExprContext;
  ExprKind kind_ = ExprKind::Const;
  DType dtype_ = DType::Float32;
  double fvalue_ = 0;
  int64_t ivalue_ = 0;
  SymExpr index_ = nullptr;
  const Buffer *buffer_ = nullptr;
  std::vector<IndirectBinding> indirect_;
  ScalarOpKind op_ = ScalarOpKind::Add;
  std::vector<const Expr *> operands_;
};

/// Interns Exprs: equal structure is the same pointer.
class ExprContext {
public:
  const Expr *constant(double value, DType dtype);
  const Expr *indexValue(SymExpr index, DType dtype);
  const Expr *load(const Buffer *buf, SymExpr index, std::vector<IndirectBinding> indirect = {});
  /// An elementwise op or Cast; the result dtype is given by the caller.
  const Expr *op(ScalarOpKind op, std::vector<const Expr *> operands, DType dtype);
  const Expr *cast(const Expr *x, DType dtype) {
    return x->dtype() == dtype ? x : op(ScalarOpKind::Cast, {x}, dtype);
  }

private:
  const Expr *intern(Expr &&e);
  struct Hash {
    size_t operator()(const Expr *e) const;
  };
  struct Eq {
    bool operator()(const Expr *a, const Expr *b) const;
  };
  std::deque<Expr> storage_;
  std::unordered_map<const Expr *, const Expr *, Hash, Eq> table_;
};

/// ArgMax/ArgMin give the row-major position (int64) of the first extreme value over the
/// reduced dims; a NaN counts as the extreme, as in PyTorch.
enum class ReduceKind { None, Sum, Prod, Max, Min, Any, All, ArgMax, ArgMin };
std::string_view reduceKindName(ReduceKind k);
/// An accumulating scatter's combine as printed after `scatter`: add, prod, max or min.
std::string_view scatterCombineName(ReduceKind k);
bool parseReduceKind(std::string_view name, ReduceKind &out);

/// What a convolution Computation computes of y = conv(x, w): y itself, the gradient of w
/// from x and y's gradient (a library's backward-filter convolution), or the gradient of x
/// from y's gradient and w (backward-data). The values are the direction codes the runtimes'
/// convolution calls take (runtime::ConvProblem::direction).
enum class ConvDirectionKind { Forward = 0, WeightGrad = 1, InputGrad = 2 };

/// A convolution computed by a Computation (lowered from the graph's convolution or
/// conv_weight_grad op when a convolution library takes it). Forward:
///   out[n, o, p..] = sum over [c, k..] of x[n, (o / (O/groups))*(C/groups) + c,
///                    p*stride + k*dilation - padding] (zero outside) times weight[o, c, k..];
/// WeightGrad (out has the weight's shape):
///   out[o, c, k..] = sum over [n, p..] of gradOut[n, o, p..] times the same x element;
/// InputGrad (out has x's shape): out[n, c, s..] = sum over the group's [o, k..] of
///   gradOut[n, o, p..] times weight[o, c mod (C/groups), k..], where p*stride + k*dilation -
///   padding = s (the terms with no such window position p are zero).
/// The Computation's value is exactly that direct form, so the loop nest computes the same
/// function when the library cannot; the spec lets the scheduler hand the whole computation to
/// the library. x, w and y have rank 2 + spatial dims, and each list has one entry per spatial
/// dim.
struct ConvSpec {
  ConvDirectionKind direction = ConvDirectionKind::Forward;
  /// The buffers the computation reads: x and w (Forward), x and y's gradient (WeightGrad),
  /// y's gradient and w (InputGrad).
  const Buffer *input = nullptr, *weight = nullptr, *gradOut = nullptr;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  /// 2-d only: x and y are stored [N, H, W, C] (their buffers' shapes); w keeps its logical
  /// shape, in the layout its strides say.
  bool channelsLast = false;

  /// The convolution's x, w and y, given the Computation's result `out`.
  const Buffer *x(const Buffer *out) const {
    return direction == ConvDirectionKind::InputGrad ? out : input;
  }
  const Buffer *w(const Buffer *out) const {
    return direction == ConvDirectionKind::WeightGrad ? out : weight;
  }
  const Buffer *y(const Buffer *out) const {
    return direction == ConvDirectionKind::Forward ? out : gradOut;
  }
  /// The computation's name in loop IR text: conv, conv_weight_grad or conv_input_grad.
  const char *name() const {
    return direction == ConvDirectionKind::Forward      ? "conv"
           : direction == ConvDirectionKind::WeightGrad ? "conv_weight_grad"
                                                        : "conv_input_grad";
  }
  /// The two buffers the computation reads, in its text's order.
  std::array<const Buffer *, 2> operands() const {
    switch (direction) {
    case ConvDirectionKind::Forward:
      return {input, weight};
    case ConvDirectionKind::WeightGrad:
      return {input, gradOut};
    case ConvDirectionKind::InputGrad:
      return {gradOut, weight};
    }
    return {nullptr, nullptr};
  }

  /// The sizes or strides of the input or the result buffer in logical order [N, C, spatial..].
  std::vector<SymExpr> logical(const std::vector<SymExpr> &xs) const {
    return channelsLast ? std::vector<SymExpr>{xs[0], xs[3], xs[1], xs[2]} : xs;
  }
};

/// One operand of a fused attention, as it lies in memory: element [b.., i, j] of the logical
/// operand (of `shape`) is at `offset + sum(index * strides)` of `buffer`, one stride per
/// logical dim (0 along a broadcast dim). The last dim of q, k and v has stride 1.
struct AttentionOperand {
  const Buffer *buffer = nullptr;
  SymExpr offset = nullptr;
  std::vector<SymExpr> shape, strides;
};

/// What a fused attention Computation writes: the attention itself, the log-sum-exp of its
/// scores (the forward's saved value), or the gradient with respect to q, k or v.
enum class AttentionPart { Output, Lse, GradQ, GradK, GradV };

/// Scaled dot-product attention computed by a Computation as one fused kernel:
/// out[b.., i, :] = sum_j p[b.., i, j] * v[b.., j, :] with
/// p = softmax_j(scale * q[b.., i, :]·k[b.., j, :] + bias[b.., i, j]), where `causal` drops the
/// keys j > i; a row whose every key is masked is 0 when `safe`, nan otherwise. q is
/// [B.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv]; the output buffer is row-major:
///   - Output: [B.., Sq, Dv];
///   - Lse: lse[b.., i] = log sum_j exp(s[b.., i, j]) over the kept keys, [B.., Sq] (v unused,
///     with no buffer);
///   - GradQ, GradK, GradV: the gradient of Output with respect to q, k or v (shaped as it),
///     given the output's gradient `dout` and the output `out` ([B.., Sq, Dv]) and `lse`
///     ([B.., Sq], one stride per dim).
/// Such a Computation has no value: the kernel is the library's (or the one codegen writes),
/// and no loop nest is its fallback. Lowering keeps attention whole only for targets that run
/// it (DecomposeOptions::fusedAttentionDtypes, fusedAttentionBackwardDtypes).
struct AttentionSpec {
  AttentionPart part = AttentionPart::Output;
  AttentionOperand q, k, v;
  std::optional<AttentionOperand> bias;
  std::optional<AttentionOperand> dout, out, lse;
  /// Dropout (the output and the gradients): probabilities dropped where
  /// philox_uniform(*seed, n) < dropout at their row-major position n in [B.., Sq, Sk], the
  /// rest scaled by 1 / (1 - dropout); `seed` is an i64 scalar.
  std::optional<AttentionOperand> seed;
  double dropout = 0;
  double scale = 1;
  bool causal = false;
  bool safe = true;

  /// The operands the part reads, in the order dout, q, k, v, out, lse, seed, bias.
  std::vector<const AttentionOperand *> operands() const {
    std::vector<const AttentionOperand *> xs;
    if (dout)
      xs.push_back(&*dout);
    xs.push_back(&q);
    xs.push_back(&k);
    if (v.buffer)
      xs.push_back(&v);
    for (const std::optional<AttentionOperand> *o : {&out, &lse, &seed, &bias})
      if (*o)
        xs.push_back(&**o);
    return xs;
  }
};

/// The text name of a part ("attention", "attention_lse", "attention_grad_q", ..).
const char *attentionPartName(AttentionPart p);

/// An accumulating scatter: for every point of the computation's space (the source's), its
/// `value` is combined into out at the flat element `at` (an integer Expr), which must lie in
/// out, by `combine` (Sum, Prod, Max or Min; Max and Min propagate NaN; a Sum into f16 or bf16
/// computes in f32 and rounds after each value). out holds its initial values from an earlier
/// computation; the values may land in any order (atomic on CUDA). Not a reduction.
struct ScatterSpec {
  const Expr *at = nullptr;
  ReduceKind combine = ReduceKind::Sum;
};

/// The extern family of loop IR: a computation that a library call or a kernel of its own
/// computes (the scheduler gives it a kernel alone, sched::ExternCall): a convolution, a fused
/// attention or an accumulating scatter; monostate for any other. (A matrix product is a plain
/// reduction the scheduler recognizes.)
using ExternSpec = std::variant<std::monostate, ConvSpec, AttentionSpec, ScatterSpec>;

/// A Computation's vars stand, in order, for the dims of its output buffer whose size is not the
/// constant 1 (unit dims are always index 0 and get no loop); rvars likewise for the reduced
/// dims of its input. The store position is therefore implied: see storeIndex().
struct Computation {
  int id = 0;
  Buffer *out = nullptr;
  std::vector<SymExpr> vars;    ///< index symbols of the output iteration space
  std::vector<SymExpr> rvars;   ///< reduction index symbols (empty for pointwise)
  ReduceKind reduce = ReduceKind::None;
  const Expr *value = nullptr;  ///< in terms of vars and rvars
  /// What makes the computation one of the extern family, if anything (ExternSpec): a
  /// convolution, a fused attention (then `value` is null and vars/rvars are the output's dims
  /// and nothing) or an accumulating scatter.
  ExternSpec ext;

  const ConvSpec *conv() const { return std::get_if<ConvSpec>(&ext); }
  ConvSpec *conv() { return std::get_if<ConvSpec>(&ext); }
  const AttentionSpec *attention() const { return std::get_if<AttentionSpec>(&ext); }
  AttentionSpec *attention() { return std::get_if<AttentionSpec>(&ext); }
  const ScatterSpec *scatter() const { return std::get_if<ScatterSpec>(&ext); }
  ScatterSpec *scatter() { return std::get_if<ScatterSpec>(&ext); }
  /// A scatter's position (null for any other computation) and combine.
  const Expr *scatterAt() const { return scatter() ? scatter()->at : nullptr; }
  ReduceKind scatterCombine() const { return scatter() ? scatter()->combine : ReduceKind::Sum; }

  bool isReduction() const { return reduce != ReduceKind::None; }
  std::vector<SymExpr> extents() const;
  std::vector<SymExpr> rextents() const;
};

class LoopProgram {
public:
  explicit LoopProgram(std::shared_ptr<sym::SymContext> sym) : sym_(std::move(sym)) {}
  sym::SymContext &sym() { return *sym_; }
  std::shared_ptr<sym::SymContext> symShared() const { return sym_; }
  ExprContext &exprs() { return exprs_; }

  Buffer *addBuffer(std::string name, DType dtype, std::vector<SymExpr> shape,
                    BufferKind kind, int ioIndex = -1, std::vector<SymExpr> strides = {});
  Computation *addComputation(Buffer *out, std::vector<SymExpr> vars, std::vector<SymExpr> rvars,
                              ReduceKind reduce, const Expr *value);

  const std::vector<std::unique_ptr<Buffer>> &buffers() const { return buffers_; }
  const std::vector<std::unique_ptr<Computation>> &computations() const { return comps_; }
  std::vector<Buffer *> inputs() const;
  std::vector<Buffer *> outputs() const; ///< by ioIndex; each output slot has its own buffer
  /// Size symbols bound at run time, in binding order.
  std::vector<SymExpr> &sizeSymbols() { return sizeSymbols_; }
  const std::vector<SymExpr> &sizeSymbols() const { return sizeSymbols_; }

private:
  std::shared_ptr<sym::SymContext> sym_;
  ExprContext exprs_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<std::unique_ptr<Computation>> comps_;
  std::vector<SymExpr> sizeSymbols_;
};

/// Row-major position that `c` stores to: sum of vars times the strides of the non-unit dims.
SymExpr storeIndex(sym::SymContext &ctx, const Computation &c);
/// Indices of the buffer dims that are not the constant 1.
std::vector<size_t> nonUnitDims(const Buffer &b);

/// Text form (printer in Printer.cpp, parser in Parser.cpp); parse(print(p)) prints the same.
std::string printProgram(const LoopProgram &p);
std::string printExpr(const Expr *e);
/// Checks the invariants; returns an empty string or a description of the first violation.
std::string verifyProgram(const LoopProgram &p);

} // namespace braze::loop
