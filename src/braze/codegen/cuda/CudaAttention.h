#pragma once
/// Fused attention on CUDA (internal to codegen/cuda); see CudaAttention.cpp.
#include "braze/codegen/KernelBody.h"

#include <string>

namespace braze::codegen {

/// The device functions every attention kernel calls (braze_flash_attention<...>).
const char *cudaAttentionPrelude();

/// Keys per shared-memory tile for query and value head dims d and dv.
int attentionKeyTile(int64_t d, int64_t dv);

/// Tiles of 16 query rows each warp of attention kernel k takes on a device of
/// `multiprocessors` SMs (1 or 2).
int attentionRowTiles(const sched::Kernel &k, int multiprocessors);

/// The __global__ kernel for k (an attention kernel) with parameter list `params`: one block of
/// 128 threads per 64 query rows of each batch point.
std::string emitCudaAttentionKernel(const Names &names, const sched::Kernel &k,
                                    const std::string &params, int multiprocessors);

/// braze_run's launch of that kernel (index `index`).
std::string cudaAttentionLaunch(const sched::Schedule &s, const Names &names,
                                const sched::Kernel &k, int index);

} // namespace braze::codegen
