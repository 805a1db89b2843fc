// cuDNN's fused flash attention and its backward through the backend (graph) API: one
// operation graph per problem, the plan of the first engine cuDNN's heuristics offer for it.
#include "braze/runtime/CudnnImpl.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace braze::runtime {

namespace {
// The tensors of an attention plan, by unique id.
enum AttentionUid : int64_t {
  kUidQ = 1, kUidK, kUidV, kUidO, kUidScale, kUidNegInf, kUidScores, kUidScaled, kUidRow,
  kUidCol, kUidKeep, kUidMasked, kUidMax, kUidCentered, kUidExp, kUidSum, kUidProbs, kUidLogSum,
  kUidStats, kUidBias, kUidBiased,
  // the backward's
  kUidDout, kUidDq, kUidDk, kUidDv, kUidOne, kUidDoutO, kUidDoutORows, kUidSoftmaxSum,
  kUidProbsT, kUidDp, kUidDpCentered, kUidDpProbs, kUidDs, kUidDsT, kUidKRows, kUidDqAccum
};
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kOne = 1;

/// cuDNN's data type of the attention's operands.
int ioType(const AttentionProblem &p) { return p.dtype == 3 ? kBFloat16 : kHalf; }

size_t roundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// The backward's scratch at the start of the workspace: its f32 dQ accumulator
/// ([b, hq, sq, d]), then its rows' sums of dO·O ([b, hq, sq]), each 256-byte aligned. The
/// accumulator's bytes are the sums' offset.
size_t dqAccumulatorBytes(const AttentionProblem &p) {
  return roundUp256(size_t(p.b * p.hq * p.sq * p.d) * sizeof(float));
}
size_t backwardScratchBytes(const AttentionProblem &p) {
  return dqAccumulatorBytes(p) + roundUp256(size_t(p.b * p.hq * p.sq) * sizeof(float));
}
} // namespace

bool Cudnn::Impl::buildAttentionPlan(Plan &plan, const AttentionProblem &p,
                                     size_t workspaceBytes, size_t keep, int64_t until) {
  if (!backendCreate)
    return false;
  Builder b{*this, plan};
  int io = ioType(p);
  // K enters the first product transposed: [b, hk, d, skv].
  const int64_t qd[4] = {p.b, p.hq, p.sq, p.d}, kd[4] = {p.b, p.hk, p.d, p.skv},
                vd[4] = {p.b, p.hk, p.skv, p.dv}, od[4] = {p.b, p.hq, p.sq, p.dv};
  const int64_t ks[4] = {p.kStrides[0], p.kStrides[1], p.kStrides[3], p.kStrides[2]};
  void *q = b.tensor(kUidQ, io, 4, qd, p.qStrides, alignmentOf(p.q));
  void *k = b.tensor(kUidK, io, 4, kd, ks, alignmentOf(p.k));
  void *v = b.tensor(kUidV, io, 4, vd, p.vStrides, alignmentOf(p.v));
  void *o = b.tensor(kUidO, io, 4, od, p.oStrides, alignmentOf(p.o));
  const int64_t unit[4] = {1, 1, 1, 1};
  void *scale = b.tensor(kUidScale, kFloat, 4, unit, unit, 16, false, true);
  // The scores and what follows them live inside the fused kernel: virtual, row-major.
  std::vector<void *> ops;
  void *scaled = maskedScores(b, p, q, k, scale, ops);
  void *max = rowsTensor(b, p, kUidMax), *centered = scoresTensor(b, p, kUidCentered);
  void *e = scoresTensor(b, p, kUidExp), *sum = rowsTensor(b, p, kUidSum);
  void *probs = scoresTensor(b, p, kUidProbs, io);
  ops.push_back(b.reduction(kReduceMax, scaled, max));
  ops.push_back(b.pointwise(kPwSub, kFloat, scaled, max, nullptr, centered));
  ops.push_back(b.pointwise(kPwExp, kFloat, centered, nullptr, nullptr, e));
  ops.push_back(b.reduction(kReduceAdd, e, sum));
  // The rows' log-sum-exp: cuDNN recognizes the softmax by it; virtual unless asked for.
  void *logSum = rowsTensor(b, p, kUidLogSum);
  const int64_t rd[4] = {p.b, p.hq, p.sq, 1};
  void *stats = p.stats ? b.tensor(kUidStats, kFloat, 4, rd, p.statsStrides, alignmentOf(p.stats))
                        : rowsTensor(b, p, kUidStats);
  ops.push_back(b.pointwise(kPwLog, kFloat, sum, nullptr, nullptr, logSum));
  ops.push_back(b.pointwise(kPwAdd, kFloat, max, logSum, nullptr, stats));
  ops.push_back(b.pointwise(kPwDiv, kFloat, e, sum, nullptr, probs));
  ops.push_back(b.matmul(probs, v, o));
  return finishPlan(b, ops, /*narrowTypes=*/true, workspaceBytes, {kHeurA, kHeurFallback}, keep,
                    until);
}

void *Cudnn::Impl::maskedScores(Builder &b, const AttentionProblem &p, void *q, void *kT,
                                void *scale, std::vector<void *> &ops) {
  const int64_t unit[4] = {1, 1, 1, 1};
  auto scores = [&](int64_t uid, int type = kFloat) { return scoresTensor(b, p, uid, type); };
  void *s = scores(kUidScores), *scaled = scores(kUidScaled);
  ops.push_back(b.matmul(q, kT, s));
  ops.push_back(b.pointwise(kPwMul, kFloat, s, scale, nullptr, scaled));
  if (p.bias) {
    void *bias = b.tensor(kUidBias, ioType(p), 4, p.biasDims, p.biasStrides, alignmentOf(p.bias));
    void *biased = scores(kUidBiased);
    ops.push_back(b.pointwise(kPwAdd, kFloat, scaled, bias, nullptr, biased));
    scaled = biased;
  }
  if (p.causal) {
    // keep key j of row i where i >= j; the others become -inf
    void *negInf = b.tensor(kUidNegInf, kFloat, 4, unit, unit, 16, false, true);
    void *row = scores(kUidRow, kInt32), *col = scores(kUidCol, kInt32);
    void *keep = scores(kUidKeep, kBoolean), *masked = scores(kUidMasked);
    ops.push_back(b.pointwise(kPwGenIndex, kFloat, scaled, nullptr, nullptr, row, 2));
    ops.push_back(b.pointwise(kPwGenIndex, kFloat, scaled, nullptr, nullptr, col, 3));
    ops.push_back(b.pointwise(kPwCmpGe, kBoolean, row, col, nullptr, keep));
    ops.push_back(b.pointwise(kPwBinarySelect, kFloat, scaled, negInf, keep, masked));
    scaled = masked;
  }
  return scaled;
}

void *Cudnn::Impl::scoresTensor(Builder &b, const AttentionProblem &p, int64_t uid, int type) {
  const int64_t sd[4] = {p.b, p.hq, p.sq, p.skv},
                ss[4] = {p.hq * p.sq * p.skv, p.sq * p.skv, p.skv, 1};
  return b.tensor(uid, type, 4, sd, ss, 16, true);
}

void *Cudnn::Impl::rowsTensor(Builder &b, const AttentionProblem &p, int64_t uid,
                              bool isVirtual) {
  const int64_t rd[4] = {p.b, p.hq, p.sq, 1}, rs[4] = {p.hq * p.sq, p.sq, 1, 1};
  return b.tensor(uid, kFloat, 4, rd, rs, 16, isVirtual);
}

bool Cudnn::Impl::buildAttentionBackwardPlan(Plan &plan, const AttentionProblem &p,
                                             size_t workspaceBytes, size_t keep,
                                             int64_t until) {
  if (!backendCreate)
    return false;
  if (version < 90600) {
    // Before 9.6 the caller zeroes the dQ accumulator, which this runtime has no call for.
    plan.declined = "cuDNN " + std::to_string(version) + " is older than 9.6, the first whose "
                    "fused attention backward zeroes its own dQ accumulator";
    return false;
  }
  plan.scratch = backwardScratchBytes(p);
  if (plan.scratch >= workspaceBytes) {
    plan.declined = "its f32 scratch (" + std::to_string(plan.scratch) +
                    " bytes) does not fit the workspace";
    return false;
  }
  Builder b{*this, plan};
  int io = ioType(p);
  // K and V enter transposed, [b, hk, d, skv], as in the forward.
  const int64_t qd[4] = {p.b, p.hq, p.sq, p.d}, kd[4] = {p.b, p.hk, p.d, p.skv},
                vd[4] = {p.b, p.hk, p.dv, p.skv}, od[4] = {p.b, p.hq, p.sq, p.dv},
                dkd[4] = {p.b, p.hg, p.skv, p.d}, dvd[4] = {p.b, p.hg, p.skv, p.dv};
  const int64_t ks[4] = {p.kStrides[0], p.kStrides[1], p.kStrides[3], p.kStrides[2]},
                vs[4] = {p.vStrides[0], p.vStrides[1], p.vStrides[3], p.vStrides[2]};
  const int64_t rd[4] = {p.b, p.hq, p.sq, 1};
  void *q = b.tensor(kUidQ, io, 4, qd, p.qStrides, alignmentOf(p.q));
  void *kT = b.tensor(kUidK, io, 4, kd, ks, alignmentOf(p.k));
  void *vT = b.tensor(kUidV, io, 4, vd, vs, alignmentOf(p.v));
  void *o = b.tensor(kUidO, io, 4, od, p.oStrides, alignmentOf(p.o));
  void *dout = b.tensor(kUidDout, io, 4, od, p.gradOutStrides, alignmentOf(p.gradOut));
  void *stats = b.tensor(kUidStats, kFloat, 4, rd, p.statsStrides, alignmentOf(p.stats));
  void *dq = b.tensor(kUidDq, io, 4, qd, p.gradQStrides, alignmentOf(p.gradQ));
  void *dk = b.tensor(kUidDk, io, 4, dkd, p.gradKStrides, alignmentOf(p.gradK));
  void *dv = b.tensor(kUidDv, io, 4, dvd, p.gradVStrides, alignmentOf(p.gradV));
  const int64_t unit[4] = {1, 1, 1, 1};
  void *scale = b.tensor(kUidScale, kFloat, 4, unit, unit, 16, false, true);
  void *one = b.tensor(kUidOne, kFloat, 4, unit, unit, 16, false, true);
  // The scores transposed for the products that give dK and dV: [b, hq, skv, sq].
  const int64_t td[4] = {p.b, p.hq, p.skv, p.sq}, ts[4] = {p.hq * p.sq * p.skv, p.sq * p.skv, 1,
                                                           p.skv};
  auto scores = [&](int64_t uid) { return scoresTensor(b, p, uid); };
  std::vector<void *> ops;
  // softmax_sum = sum over dv of dO * O per row: f32, in the workspace.
  const int64_t dood[4] = {p.b, p.hq, p.sq, p.dv},
                doos[4] = {p.hq * p.sq * p.dv, p.sq * p.dv, p.hq * p.dv, 1};
  void *doutO = b.tensor(kUidDoutO, kFloat, 4, dood, doos, 16, true);
  void *doutORows = rowsTensor(b, p, kUidDoutORows);
  void *softmaxSum = rowsTensor(b, p, kUidSoftmaxSum, false);
  ops.push_back(b.pointwise(kPwMul, kFloat, dout, o, nullptr, doutO));
  ops.push_back(b.reduction(kReduceAdd, doutO, doutORows));
  ops.push_back(b.pointwise(kPwMul, kFloat, doutORows, one, nullptr, softmaxSum));
  // P = exp(scores - stats); dV = Pᵀ dO.
  void *scaled = maskedScores(b, p, q, kT, scale, ops);
  void *centered = scores(kUidCentered), *probs = scores(kUidExp);
  ops.push_back(b.pointwise(kPwSub, kFloat, scaled, stats, nullptr, centered));
  ops.push_back(b.pointwise(kPwExp, kFloat, centered, nullptr, nullptr, probs));
  void *probsT = b.tensor(kUidProbsT, io, 4, td, ts, 16, true);
  ops.push_back(b.reshape(probs, probsT));
  ops.push_back(b.matmul(probsT, dout, dv));
  // dS = P * (dO Vᵀ - softmax_sum) * scale; dK = dSᵀ Q; dQ = dS K (accumulated in f32).
  void *dp = scores(kUidDp), *dpCentered = scores(kUidDpCentered);
  void *dpProbs = scores(kUidDpProbs), *ds = scores(kUidDs);
  ops.push_back(b.matmul(dout, vT, dp));
  ops.push_back(b.pointwise(kPwSub, kFloat, dp, softmaxSum, nullptr, dpCentered));
  ops.push_back(b.pointwise(kPwMul, kFloat, dpCentered, probs, nullptr, dpProbs));
  ops.push_back(b.pointwise(kPwMul, kFloat, dpProbs, scale, nullptr, ds));
  void *dsT = b.tensor(kUidDsT, io, 4, td, ts, 16, true);
  ops.push_back(b.reshape(ds, dsT));
  ops.push_back(b.matmul(dsT, q, dk));
  const int64_t kr[4] = {p.b, p.hk, p.skv, p.d};
  void *kRows = b.tensor(kUidKRows, io, 4, kr, p.kStrides, alignmentOf(p.k), true);
  ops.push_back(b.reshape(kT, kRows));
  const int64_t qs[4] = {p.hq * p.sq * p.d, p.sq * p.d, p.d, 1};
  void *dqAccum = b.tensor(kUidDqAccum, kFloat, 4, qd, qs, 16);
  ops.push_back(b.matmul(ds, kRows, dqAccum));
  ops.push_back(b.pointwise(kPwIdentity, kFloat, dqAccum, nullptr, nullptr, dq));
  return finishPlan(b, ops, /*narrowTypes=*/true, workspaceBytes - plan.scratch,
                    {kHeurA, kHeurFallback}, keep, until);
}

DnnStatus Cudnn::attention(const AttentionProblem &p, void *stream, void *workspace,
                           size_t workspaceBytes, std::string &error) {
  Impl &im = *impl_;
  if ((p.dtype != 2 && p.dtype != 3) || p.hk <= 0 || p.hq % p.hk != 0 || p.d % 8 != 0 ||
      p.dv % 8 != 0 || p.d > 256 || p.dv > 256) {
    error = "dtype code " + std::to_string(p.dtype) + ", heads " + std::to_string(p.hq) + "/" +
            std::to_string(p.hk) + " or head dims " + std::to_string(p.d) + "/" +
            std::to_string(p.dv) + " are not ones cuDNN's fused attention takes";
    return DnnStatus::Declined;
  }
  if (p.bias && (p.biasStrides[3] != 1 || p.biasDims[3] != p.skv)) {
    error = "a bias whose keys are not contiguous is not one cuDNN's fused attention takes";
    return DnnStatus::Declined;
  }
  if (p.grad && (!p.stats || !p.gradOut || !p.gradQ || !p.gradK || !p.gradV ||
                 (p.hg != p.hk && p.hg != p.hq))) {
    error = "an attention backward needs the saved statistics, the output's gradient, and "
            "gradients of k and v with " + std::to_string(p.hk) + " or " +
            std::to_string(p.hq) + " heads (got " + std::to_string(p.hg) + ")";
    return DnnStatus::Declined;
  }
  if (p.grad && p.bias && p.biasDims[2] == 1 && p.sq > 1) {
    // Measured on cuDNN 9.19 (H200): such a backward runs, but its gradients are wrong.
    error = "cuDNN's fused attention backward takes a bias of every query row, not one "
            "broadcast over them";
    return DnnStatus::Declined;
  }
  std::vector<int64_t> key{p.grad ? -2 : -1, p.dtype, p.causal, p.b, p.hq, p.hk, p.sq, p.skv,
                           p.d, p.dv, alignmentOf(p.q), alignmentOf(p.k), alignmentOf(p.v),
                           alignmentOf(p.o), p.bias ? alignmentOf(p.bias) : -1,
                           p.stats ? alignmentOf(p.stats) : -1};
  for (const int64_t *a : {p.qStrides, p.kStrides, p.vStrides, p.oStrides})
    key.insert(key.end(), a, a + 4);
  if (p.bias)
    for (const int64_t *a : {p.biasDims, p.biasStrides})
      key.insert(key.end(), a, a + 4);
  if (p.stats)
    key.insert(key.end(), p.statsStrides, p.statsStrides + 4);
  if (p.grad) {
    key.insert(key.end(), {p.hg, alignmentOf(p.gradOut), alignmentOf(p.gradQ), alignmentOf(p.gradK),
                           alignmentOf(p.gradV)});
    for (const int64_t *a : {p.gradOutStrides, p.gradQStrides, p.gradKStrides, p.gradVStrides})
      key.insert(key.end(), a, a + 4);
  }
  std::lock_guard<std::mutex> lock(im.mu);
  // (Not a structured binding: clang 14 does not let the lambda below capture one.)
  auto emplaced = im.plans.try_emplace(key);
  Plan &plan = emplaced.first->second;
  // Builds the plan with up to `keep` engine configs; the plan says why not where it fails.
  auto build = [&](size_t keep, int64_t until) {
    for (void *d : plan.descriptors)
      im.backendDestroy(d);
    plan = Plan{};
    if (!(p.grad ? im.buildAttentionBackwardPlan(plan, p, workspaceBytes, keep, until)
                 : im.buildAttentionPlan(plan, p, workspaceBytes, keep, until))) {
      for (void *d : plan.descriptors)
        im.backendDestroy(d);
      plan.descriptors.clear();
      if (!im.backendCreate)
        plan.declined = "this cuDNN has no backend API";
    }
    return true;
  };
  if (emplaced.second)
    build(1, -1);
  if (!plan.graphPlan) {
    error = plan.declined;
    return DnnStatus::Declined;
  }
  int64_t uids[16] = {kUidQ, kUidK, kUidV, kUidO, kUidScale};
  const void *pointers[16] = {p.q, p.k, p.v, p.o, &p.scale};
  int64_t n = 5;
  if (p.causal)
    uids[n] = kUidNegInf, pointers[n++] = &kNegInf;
  if (p.bias)
    uids[n] = kUidBias, pointers[n++] = p.bias;
  if (p.stats)
    uids[n] = kUidStats, pointers[n++] = p.stats;
  if (p.grad) {
    // The scratch leads the workspace: the dQ accumulator, then the rows' sums.
    char *scratch = static_cast<char *>(workspace);
    const std::pair<int64_t, const void *> grads[] = {
        {kUidDout, p.gradOut}, {kUidDq, p.gradQ},       {kUidDk, p.gradK},
        {kUidDv, p.gradV},     {kUidOne, &kOne},         {kUidDqAccum, scratch},
        {kUidSoftmaxSum, scratch + dqAccumulatorBytes(p)}};
    for (auto [uid, pointer] : grads)
      uids[n] = uid, pointers[n++] = pointer;
  }
  // The engine's own workspace follows the plan's scratch (none for a forward).
  void *engineSpace = static_cast<char *>(workspace) + plan.scratch;
  const size_t engineBytes = workspaceBytes - plan.scratch;
  // The engine the autotuner or a tuned module chooses, once per plan.
  if (!plan.tuned && plan.checked != im.choices && im.mayChoose(LibraryKind::Attention)) {
    const int64_t elementBytes = 2;
    Impl::EngineCall call{LibraryKind::Attention, n, uids, pointers, {}};
    if (p.grad) {
      const int64_t qd[4] = {p.b, p.hq, p.sq, p.d}, dkd[4] = {p.b, p.hg, p.skv, p.d},
                    dvd[4] = {p.b, p.hg, p.skv, p.dv};
      call.results = {{p.gradQ, spanBytes(4, qd, p.gradQStrides, elementBytes), p.dtype},
                      {p.gradK, spanBytes(4, dkd, p.gradKStrides, elementBytes), p.dtype},
                      {p.gradV, spanBytes(4, dvd, p.gradVStrides, elementBytes), p.dtype}};
    } else {
      const int64_t od[4] = {p.b, p.hq, p.sq, p.dv}, rd[4] = {p.b, p.hq, p.sq, 1};
      call.results = {{p.o, spanBytes(4, od, p.oStrides, elementBytes), p.dtype}};
      if (p.stats)
        call.results.push_back({p.stats, spanBytes(4, rd, p.statsStrides, 4), 0});
    }
    im.chooseEngine(plan, keyText(key), call, stream, engineSpace, engineBytes, {}, build);
    if (!plan.graphPlan) {
      error = plan.declined;
      return DnnStatus::Declined;
    }
  }
  if (Status s = im.setStream(im.handle, stream); s != 0) {
    error = im.failed("cudnnSetStream", s);
    return DnnStatus::Failed;
  }
  return im.execute(plan, n, uids, pointers, engineSpace, error);
}

} // namespace braze::runtime
