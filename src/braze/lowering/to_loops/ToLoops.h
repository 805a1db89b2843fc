#pragma once
/// LOWERING: the decomposed, realized tensor graph becomes a LoopProgram. Every node is first a
/// lazy index -> value function; a value is computed inside its readers (so pointwise chains
/// fuse by construction) unless the realize step (lowering/realize) marked it stored, or it is
/// an input, an output, a reduction, a product or a library op, each of which has a buffer.
/// Besides, to-loops copies a view into a layout its reader needs: row-major for a take, a
/// gather or a library op that cannot read it in place, channels-last for a convolution.
#include "braze/ir/graph/Graph.h"
#include "braze/ir/loop/LoopIR.h"

#include <memory>

namespace braze {

struct LoweringOptions {
  /// A product of two f16/bf16 tensors converted to f32 reads the half operands and widens each
  /// element as it loads it, so the GEMM library (cuBLASLt) takes them with an f32 result and
  /// the f32 copies are never stored. For targets whose GEMM takes half operands.
  bool widenedHalfMatMul = false;
  /// A convolution reads its input and weight as row-major buffers, copying an operand in
  /// another layout first (cuDNN's legacy API wants one layout for all three tensors).
  bool rowMajorConvolution = false;
  /// 2-d convolutions run channels-last (loop::ConvSpec::channelsLast), and 4-d values stored
  /// for them or for several readers are stored [N, H, W, C]: for a graph whose image input is
  /// channels-last, as eager keeps such a model.
  bool channelsLast = false;
  /// Channels-last convolutions read a weight with C innermost, copying one that is not
  /// (cuDNN's NHWC filter layout; oneDNN reorders the weight itself).
  bool channelsLastWeights = false;
  /// A large stored value (at least 8 MiB) whose rows of at least 64 elements are not a whole
  /// number of 16-byte words (a vocabulary of 50257 logits) gets a row pitch rounded up to 16
  /// bytes, so that the GEMMs writing and reading it run on cuBLASLt's aligned kernels. An
  /// output computed so is returned with those strides, as TorchInductor's padding does.
  bool padRows = false;
  /// A fused attention's output whose readers all view it through one permutation that keeps
  /// the last dim last (a transformer's [B, H, S, D] -> [B, S, H, D] before the output
  /// projection) is stored in the permuted order, so that the readers' view is row-major and
  /// the projection reads it in place. For targets whose attention kernel writes strided rows.
  bool permutedAttentionOutput = false;
  /// A take from a view of a stored value (experts' weights read transposed) loads through the
  /// view instead of storing a copy. For the CPU, whose caches take strided reads well; a GPU's
  /// threads would read such a view uncoalesced, over and over where many outputs share a row.
  bool takeViewsInPlace = false;
  /// The same for a take that gathers whole matrices (experts' weights picked per row of a
  /// grouped product), on every target: the product reads tiles of the view along its
  /// unit-stride dim, where storing the view would copy every expert's weights per call.
  bool takeMatrixViewsInPlace = false;
};

/// g must be realized (Graph::realized).
std::unique_ptr<loop::LoopProgram> lowerToLoops(Graph &g, const LoweringOptions &opts = {});

} // namespace braze
