#pragma once
/// The host side of a CUDA module (internal to codegen/cuda): the statements of braze_run that
/// launch kernels and call cuBLASLt through the runtime's callbacks, and the module's host
/// source around them.
#include "braze/codegen/KernelBody.h"

#include <string>
#include <vector>

namespace braze::codegen {

/// "INT64_C(1) * e0 * e1 ...": the number of points of `vars`, as C.
std::string extentProduct(const Names &names, const std::vector<sym::SymExpr> &vars);

/// Launches kernel `index` (k's __global__) with `threads` per block and enough blocks for k's
/// outer space at `pointsPerBlock` (C text) each, that many for each of `groups` member groups
/// (CudaLaunch::groups); sets `err`.
std::string launchStatement(const sched::Schedule &s, const Names &names, const sched::Kernel &k,
                            int index, int threads, const std::string &pointsPerBlock,
                            int groups = 1);
/// Launches kernel `index` with `threads` per block and `blocks` (C text) blocks, and
/// `sharedBytes` of dynamic shared memory where not 0; sets `err`.
std::string launchBlocks(const sched::Schedule &s, const Names &names, const sched::Kernel &k,
                         int index, int threads, const std::string &blocks, int sharedBytes = 0);

/// The cuBLASLt calls for a matrix-product kernel: one strided-batched call per point of the
/// batch variables that do not collapse into one run (sched::stridedBatch), or `fallback` (the
/// loop kernel's launch) when the layout is not one cuBLASLt takes.
/// `tf32`: f32 products may round their inputs to TF32.
std::string gemmStatement(sym::SymContext &s, const Names &names, const sched::Kernel &k,
                          const std::string &fallback, bool tf32);

/// The cuDNN call for a convolution kernel, or `fallback` (the loop kernel's launch) where
/// cuDNN declines it. `tf32`: f32 convolutions may use TF32.
std::string convStatement(const Names &names, const sched::Kernel &k, const std::string &fallback,
                          bool tf32);

/// The cuDNN call for attention kernel k (its output, f16/bf16, with its log-sum-exp where
/// the kernel writes it), or `fallback` (the launch of braze's attention kernel) where its
/// operands do not map to cuDNN's or cuDNN declines it.
std::string attentionStatement(const Names &names, const sched::Kernel &k,
                               const std::string &fallback);

/// The cuDNN backward for attention kernel k (k's gradient, with v's and q's beside it: the
/// kernel's attentionPair and attentionGradQ), or `fallback` (the launches of braze's two
/// gradient kernels) where the operands do not map to cuDNN's or cuDNN declines it.
std::string attentionGradStatement(const Names &names, const sched::Kernel &k,
                                   const std::string &fallback);

/// The module's host source: the callback types, then the module ABI with `calls` in braze_run.
std::string hostSource(const sched::Schedule &s, Names &names,
                       const std::vector<std::string> &calls);

} // namespace braze::codegen
