#pragma once
/// The fused attention a CPU module with attention kernels carries (f32).
#include "braze/codegen/cpu/CppCodegen.h"

#include <string>

namespace braze::codegen {

/// Defines
///   void braze_attention_f32(int rank, const int64_t *dims, const float *q, const int64_t *qs,
///                            const float *k, const int64_t *ks, const float *v,
///                            const int64_t *vs, const float *bias, const int64_t *bs,
///                            float *out, float scale, bool causal, bool safe)
/// computing loop::AttentionSpec's function. dims = [B.., Sq, Sk, D, Dv] (rank - 2 batch dims);
/// each operand's strides are `rank` element strides of its logical dims (the last is 1 for
/// q, k and v); out is row-major [B.., Sq, Dv]; bias may be null.
///   1. The work is (batch point, block of 64 query rows) tasks over the OpenMP threads that
///      PyTorch and braze's kernels share.
///   2. Each task walks the keys in blocks, with an online softmax: a running row maximum m and
///      sum l, and an accumulator rescaled by exp(m_old - m_new) when the maximum grows. Causal
///      tasks stop at the block's last query row.
///   3. Memory is a block of scores and an accumulator per thread: it never holds Sq x Sk.
/// With `blas` symbols the two block products are single-threaded sgemm calls; without, loops.
std::string attentionPrelude(const BlasSymbols &blas);

} // namespace braze::codegen
