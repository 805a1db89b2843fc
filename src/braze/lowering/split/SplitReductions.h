#pragma once
/// SPLIT REDUCTIONS (CUDA): a long reduction with few results runs in two stages, so that
/// its first stage has enough independent partial results to fill the device:
///   r = reduce(x, D)  ->  p = reduce(reshape(x), D1, keepdim)      (partials, many)
///                          r = reduce(p, D1 + D2)                     (few, short)
/// where D2 holds the outermost reduced dims (the last of them split in two by the reshape when
/// a divisor of its size gives about the wanted number of partials) and D1 the rest. A reduced
/// dim with no such divisor (a prime) stays in D1, and the next reduced dim is considered.
///
/// Why: a CUDA reduction kernel gives each result one block, or (a sum per column, the
/// reduced elements apart in memory) 8 to 32 results one block. A batch norm's per-channel
/// sums over a [32, 256, 56, 56] activation are 256 results of 100,352 elements each: 32
/// blocks on 132 multiprocessors, each summing 800k elements (the H200 ResNet-50 training
/// step spent about a third of its braze kernel time in such sums). Split over the batch,
/// the first stage has 8,192 partials (256 blocks), and the second sums 32 values each.
///
/// When it fires, on a reduction with static sizes of O results of R elements each:
///   - O x R >= `minElements` (a small reduction is one fast block either way; a decode
///     step's softmax over a vocabulary stays one kernel);
///   - column-like (the reduced dims exclude the operand's innermost dim in memory: its last,
///     or C of a channels-last image): O results of the operand's dtype take fewer than
///     `columnResultBytesPerCore` bytes per multiprocessor, aiming for
///     `columnPartialsPerCore` partials per multiprocessor; row-like: O < multiprocessors,
///     aiming for `rowPartialsPerCore` per multiprocessor;
///   - each partial still reduces at least `minPartialLength` elements (column-like:
///     `columnMinPartialLength`): the cut is the divisor nearest what is wanted among those
///     that keep partials that long, or no cut.
/// The column-like figures are an H200's: a sweep of the first stage of a channels-last batch
/// norm's statistics over ResNet-50's twelve shapes (partials, column groups and threads; one
/// kernel per form, CUDA graphs of 20 launches) was fastest with about 8,192 to 16,384
/// partial results (64 to 128 per multiprocessor) for every shape, even where that left 196
/// elements a partial ([32, 256, 14, 14]: 3.4 us in 32 partials, 9.6 in the 2 that 32 per
/// multiprocessor and at least 2,048 elements allowed; [32, 64, 56, 56]: 6.8 us in 128, 19.8
/// in 32).
/// Unsplit, a column kernel reads a warp's rows in 128-byte lines (8 groups of 16-byte vectors)
/// only where that still gives two blocks per multiprocessor, O x bytes >= 2 x 128 x
/// multiprocessors (`columnResultBytesPerCore`); with fewer, its warps read 32-byte pieces of
/// 16 rows in blocks of up to 1,024 threads, at under half the memory's bandwidth. A ViT-B/16
/// step's bias gradients on an H200 (f32 sums of bf16 values; benchmarks/gpu_bias_sweep.py,
/// both stages timed): [6304, 3072] took 22.2 us unsplit and 9.8 in 4 partials; [6304, 2304]
/// 22.2 and 9.2; a BERT-base f32 [2048, 3072] 8.1 and 6.6. The limit was 8 results per
/// multiprocessor of any dtype, which left those unsplit.
/// A column-like split keeps the innermost dim last among the partials' dims (a permute after
/// the reshape, where the cut would come after it), so that the first stage is a column sum
/// too: a channels-last [32, 64, 112, 112] cut in H gives partials [32, 4, 64], not [32, 64, 4].
/// Sum, prod, amax, amin, any and all split (they are associative); argmax and argmin keep
/// their order and do not. A sum or product of half-precision values keeps its f32
/// accumulator across the stages and rounds once at the end, as the single reduction does.
/// The CPU's kernels split long reductions themselves, so the step runs for CUDA only
/// (`multiprocessors` > 0).
#include "braze/ir/graph/Graph.h"

namespace braze {

struct SplitReductionOptions {
  int64_t multiprocessors = 0; ///< 0: the step does nothing
  /// LoweringOptions::channelsLast: 4-d values are stored [N, H, W, C].
  bool channelsLast = false;
  int64_t minElements = int64_t(1) << 20;
  int64_t minPartialLength = 2048;
  int64_t columnMinPartialLength = 256;
  int64_t columnResultBytesPerCore = 256;
  int64_t columnPartialsPerCore = 64;
  int64_t rowPartialsPerCore = 4;
};

void splitReductions(Graph &g, const SplitReductionOptions &opts);

} // namespace braze
