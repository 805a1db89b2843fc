#pragma once
/// REALIZE: which values of the decomposed graph are stored in buffers. to-loops computes every
/// other value inside its readers (a pointwise chain fuses by construction), so this step is
/// where the graph trades recomputation against memory traffic. It marks each value it stores
/// (Node::storage): `stored` for a shared value, stored where it is computed; `stored_at_use`
/// for a value a reader needs in memory, stored where it is first read. to-loops follows the
/// marks. Always stored, so never marked: inputs, reductions, products, convolutions without a
/// bias, attention, scatters, and the graph's outputs once computed. The step stores, besides:
///   - a value with several readers whose body costs more than `inlineCostLimit` ops or reads
///     more than `maxSharedReads` buffers at least its size (each reader would read them all
///     again: a transformer's residual stream, left unstored, is summed from every layer's
///     output by every later layer's norm, which keeps all those outputs alive), or any value
///     whose body grows past `maxInlineOps` ops;
///   - what a reader needs in memory: the source of a take, of a gather that cannot compute
///     its gathered elements in place (a costly value, or one read elsewhere too), a
///     convolution's input and weight, and the computed operands of a matrix product or an
///     attention (views of stored values are read in place; to-loops copies those whose
///     layout the library cannot take);
///   - a value broadcast to `storedBroadcast` or more times its size whose body calls a library
///     function (the cos and sin tables of rotary embeddings; a division or root in f64, as in
///     a batch norm's one-pass statistics), so the function runs once per element of the
///     value, not of its reader; or that is a graph output, itself or through views (a batch
///     norm's saved mean and inverse deviation), so in memory anyway;
///   - a costly value read through overlapping windows (unfold), so it is not recomputed per
///     window;
///   - the value a matrix product reads through reshapes when others read it too, so the
///     product reads it in place.
/// A value stored for one reader is stored for all of them: the step repeats its walk with the
/// stores it found until no reader asks for more.
#include "braze/ir/graph/Graph.h"

#include <array>

namespace braze {

struct RealizeOptions {
  int inlineCostLimit = 16;
  int maxSharedReads = 1;
  int maxInlineOps = 64;
  int64_t storedBroadcast = 16;
  /// LoweringOptions::widenedHalfMatMul: a product reads the half operands of its f32 converts.
  bool widenedHalfMatMul = false;
  /// LoweringOptions::channelsLast: a 2-d convolution copies its input channels-last itself.
  bool channelsLast = false;
  /// LoweringOptions::takeViewsInPlace.
  bool takeViewsInPlace = false;
  /// LoweringOptions::takeMatrixViewsInPlace.
  bool takeMatrixViewsInPlace = false;
};

/// Marks the values of g to store (clearing earlier marks) and records that g is realized.
void realize(Graph &g, const RealizeOptions &opts = {});

/// The two tensors matrix product n reads: its operands, or with `widenedHalfMatMul` the
/// f16/bf16 values that both operands convert to f32 (the product widens them as it loads).
std::array<Node *, 2> matMulSources(Node *n, bool widenedHalfMatMul);

} // namespace braze
