#pragma once
/// Fused attention on CUDA (internal to codegen/cuda); see CudaAttention.cpp.
#include "braze/codegen/KernelBody.h"

#include <string>

namespace braze::codegen {

/// The device functions every attention kernel calls (braze_flash_attention<...>).
const char *cudaAttentionPrelude();

/// The device functions of the gradient kernels (braze_flash_attention_dq, _dkv), which need
/// cudaAttentionPrelude() before them (CudaAttentionBackward.cpp).
const char *cudaAttentionBackwardPrelude();

/// How attention kernel k runs on `target`.
struct AttentionPlan {
  int keyTile = 64;        ///< keys (of dK and dV: queries) per shared-memory tile
  int units = 1;           ///< 16-row tiles per warp
  int threads = 128;       ///< per block
  int rowsPerBlock = 64;   ///< query rows (of dK and dV: keys) per block
};
AttentionPlan planAttention(const sched::Kernel &k, const Target &target);

/// The __global__ kernel for k (an attention kernel) with parameter list `params`: one block per
/// planAttention's rows of each batch point.
std::string emitCudaAttentionKernel(const Names &names, const sched::Kernel &k,
                                    const std::string &params, const Target &target);

/// braze_run's launch of that kernel (index `index`), whose parameters are those of kernel
/// `params` (k itself, or the schedule kernel whose second function k is: q's gradient beside
/// k's and v's).
std::string cudaAttentionLaunch(const sched::Schedule &s, const Names &names,
                                const sched::Kernel &k, const sched::Kernel &params, int index);

/// The function of q's gradient in kernel k (one with attentionGradQ): k's parameters, named
/// k's name with `_dq`.
sched::Kernel gradQKernel(const sched::Kernel &k);

} // namespace braze::codegen
