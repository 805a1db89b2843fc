#pragma once
/// The fused attention a CPU module with attention kernels carries (f32).
#include "braze/codegen/cpu/CppCodegen.h"

#include <string>

namespace braze::codegen {

/// Defines
///   void braze_attention_f32(int rank, const int64_t *dims, const float *q, const int64_t *qs,
///                            const float *k, const int64_t *ks, const float *v,
///                            const int64_t *vs, const float *bias, const int64_t *bs,
///                            float *out, const int64_t *os, float scale, bool causal,
///                            bool safe, const int64_t *seed, float dropout, float *lse)
/// computing loop::AttentionSpec's function. dims = [B.., Sq, Sk, D, Dv] (rank - 2 batch dims);
/// each operand's strides are `rank` element strides of its logical dims (the last is 1 for
/// q, k and v); out has strides os; bias may be null; a seed (else null) drops probabilities
/// with p = dropout; a non-null lse gets the log-sum-exp too (as braze_attention_lse_f32's).
///   1. The work is (batch point, block of 64 query rows) tasks over the OpenMP threads that
///      PyTorch and braze's kernels share.
///   2. Each task walks the keys in blocks, with an online softmax: a running row maximum m and
///      sum l, and an accumulator rescaled by exp(m_old - m_new) when the maximum grows. Causal
///      tasks stop at the block's last query row.
///   3. Memory is a block of scores and an accumulator per thread: it never holds Sq x Sk.
/// Also the log-sum-exp and the gradients (loop::AttentionPart's Lse, GradQ, GradK, GradV):
///   void braze_attention_lse_f32(int rank, const int64_t *dims, const float *q,
///                                const int64_t *qs, const float *k, const int64_t *ks,
///                                const float *bias, const int64_t *bs, float *lse, float scale,
///                                bool causal)
///   void braze_attention_grad_f32(int wrt, int rank, const int64_t *dims, const float *dout,
///                                 const int64_t *dos, const float *q, const int64_t *qs,
///                                 const float *k, const int64_t *ks, const float *v,
///                                 const int64_t *vs, const float *o, const int64_t *os,
///                                 const float *lse, const int64_t *ls, const float *bias,
///                                 const int64_t *bs, float *grad, float scale, bool causal,
///                                 const int64_t *seed, float dropout, float *grad2)
///   - lse is row-major [B.., Sq], -inf for a row whose every key is masked; the forward's
///     tasks and key blocks, keeping only the running maximum and sum.
///   - grad is the gradient with respect to q (wrt 0), k (1) or v (2), or k's with v's in
///     grad2 from one pass (3), row-major as that operand, from dout and o ([B.., Sq, Dv]) and
///     lse (rank - 1 strides ls). With
///     p = exp(s - lse) and dS = p * (dout·vᵀ - rowsum(dout * o)): dq = scale * dS·k from
///     tasks of 64 query rows walking blocks of 256 keys; dk = scale * dSᵀ·q and dv = pᵀ·dout
///     from tasks of 64 keys walking blocks of 256 query rows (causal: from the task's first
///     key on). v and o may be null for dv. Per thread: a block of p (then dS) and of dout·vᵀ.
/// With `blas` symbols the block products are single-threaded sgemm calls; without, loops.
std::string attentionPrelude(const BlasSymbols &blas);

} // namespace braze::codegen
