#include "braze/lowering/split/SplitReductions.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"
#include "braze/passes/PassManager.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>
#include <vector>

namespace braze {

namespace {

bool associative(OpKind k) {
  return k == OpKind::Sum || k == OpKind::Prod || k == OpKind::Amax || k == OpKind::Amin ||
         k == OpKind::Any || k == OpKind::All;
}

/// How one reduction splits: the operand reshaped to `shape` (one dim cut in two, or none),
/// reduced over `first` keeping dims, then the partials over every dim of `shape` the
/// reduction covers (`reduced`: `first`, whose sizes are now ones, and the outer ones).
struct Split {
  std::vector<int64_t> shape;
  IntList perm; ///< empty, or the permutation of `shape` the first stage reduces
  IntList first, reduced;
};

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The divisor of n from 2 to `most` nearest `want` by ratio (n itself unless another is
/// nearer; divisors above 8 x want are not looked at); 1 when none is at most `most`.
int64_t nearestDivisor(int64_t n, int64_t want, int64_t most) {
  int64_t best = 1;
  double bestGap = 0;
  auto consider = [&](int64_t c) {
    double gap = std::fabs(std::log(double(c) / double(want)));
    if (best == 1 || gap < bestGap) {
      best = c;
      bestGap = gap;
    }
  };
  if (n <= most)
    consider(n);
  for (int64_t c = 2; c < n && c <= most && c <= 8 * want; ++c)
    if (n % c == 0)
      consider(c);
  return best;
}

/// Whether a reshape from `in` to `out` keeps runs of the last dim together: the last sizes are
/// equal, or one divides the other and both are at least a warp's 32 (a ViT's [197, 384, 64]
/// attention gradient viewed as [197, 32, 768] merges heads into its last dim, 64 elements a
/// run; [.., 3, 768] viewed as [.., 2304]).
bool keepsLastRuns(const std::vector<SymExpr> &in, const std::vector<SymExpr> &out) {
  if (in.empty() || out.empty())
    return false;
  if (in.back() == out.back())
    return true;
  if (!in.back()->isConst() || !out.back()->isConst())
    return false;
  int64_t a = in.back()->value(), b = out.back()->value();
  return std::min(a, b) >= 32 && (a % b == 0 || b % a == 0);
}

/// The innermost dim in memory of a value of x's shape that x reads: the stride-1 dim of the
/// first graph input of x's shape found through elementwise ops and casts (the operands a
/// fused reduction loads), else C of an image stored channels-last, else the last dim, a
/// guess (`known` false): x may read a permuted view of a value stored otherwise.
/// Past a reshape that keeps runs of the last dim together (keepsLastRuns), an expand of the
/// other dims, or a permute that keeps the last dim last, only x's last dim can be told
/// innermost: by an input of the walk's shape whose last dim has stride 1 (a ViT's bias
/// gradients sum a [6304, 768] view of a [32, 197, 768] gradient), or by an attention's
/// result, whose head dim has stride 1 in every layout braze gives it (the ViT's in-projection
/// bias gradient sums a [197, 32, 2304] view of the three attention gradients). A permute that
/// moves the last dim ends the walk there (a transposed view, `known` false).
int64_t innermostDim(const Node *x, const SplitReductionOptions &o, bool &known) {
  known = true;
  struct Item {
    const Node *node;
    bool reshaped; ///< a reshape or permute lies between x and it
  };
  std::vector<Item> work{{x, false}};
  std::unordered_set<const Node *> seen{x};
  auto follow = [&](const Node *a, bool reshaped) {
    if (seen.insert(a).second)
      work.push_back({a, reshaped});
  };
  // The dim with stride 1 (not of size 1), searched from the last; -1 if none.
  auto strideOneDim = [](const TensorType &t) -> int64_t {
    for (size_t d = t.strides.size(); d-- > 0;)
      if (t.strides[d]->isConst(1) && !t.shape[d]->isConst(1))
        return static_cast<int64_t>(d);
    return -1;
  };
  for (size_t i = 0; i < work.size() && i < 64; ++i) {
    const auto [n, reshaped] = work[i];
    const TensorType &t = n->type();
    if (n->op() == OpKind::Input) {
      int64_t d = strideOneDim(t);
      if (reshaped && d >= 0 && d == n->rank() - 1)
        return x->rank() - 1;
      if (!reshaped && d >= 0 && n->shape() == x->shape())
        return d;
      continue;
    }
    if (n->op() == OpKind::Attention || n->op() == OpKind::AttentionGrad) {
      if (reshaped || n->shape() == x->shape())
        return x->rank() - 1;
      continue;
    }
    OpCategoryKind c = opCategory(n->op());
    if (c == OpCategoryKind::Elementwise || c == OpCategoryKind::Cast) {
      for (const Node *a : n->operands())
        if (!reshaped || a->shape() == n->shape()) // broadcast operands tell nothing of n's
          follow(a, reshaped);
      continue;
    }
    if (n->rank() == 0 || (n->op() != OpKind::Reshape && n->op() != OpKind::Expand &&
                           n->op() != OpKind::Permute))
      continue;
    const Node *a = n->operand(0);
    bool keeps = false;
    if (n->op() == OpKind::Reshape)
      keeps = keepsLastRuns(a->shape(), n->shape());
    else if (n->op() == OpKind::Expand) // a broadcast last dim reads one element over and over
      keeps = a->rank() > 0 && a->shape().back() == n->shape().back();
    else if (n->op() == OpKind::Permute)
      keeps = attrs::Permute(*n).dims().back() == n->rank() - 1;
    if (keeps)
      follow(a, true);
  }
  if (o.channelsLast && x->rank() == 4)
    return 1;
  known = false;
  return x->rank() - 1;
}

/// A column-like split's partials keep the innermost dim in memory (`inner`, a result dim)
/// last among the first stage's results, so that its kernel reads neighbouring columns side by
/// side. A channels-last batch norm's sums over [32, 64, 112, 112] cut H in 4: the partials
/// [32, 64, 4] would have each block walk a channel's 3,136 values 64 apart, one value per
/// 32-byte sector; permuted to [32, 4, 64], neighbouring threads read neighbouring channels.
/// The permutation moves `inner` past the dims the second stage reduces, never past another
/// result dim, so the result's dims keep their order.
void keepColumnsInnermost(Split &s, int64_t inner) {
  auto has = [](const IntList &l, int64_t d) {
    return std::find(l.begin(), l.end(), d) != l.end();
  };
  int64_t rank = static_cast<int64_t>(s.shape.size()), last = inner;
  for (int64_t d = inner + 1; d < rank; ++d) {
    if (has(s.first, d) || s.shape[d] == 1)
      continue;
    if (!has(s.reduced, d))
      return; // another result dim
    last = d;
  }
  if (last == inner)
    return;
  for (int64_t d = 0; d < rank; ++d)
    if (d != inner)
      s.perm.push_back(d);
  s.perm.insert(s.perm.begin() + last, inner);
  std::vector<int64_t> shape, at(rank);
  for (int64_t i = 0; i < rank; ++i) {
    shape.push_back(s.shape[s.perm[i]]);
    at[s.perm[i]] = i;
  }
  s.shape = shape;
  for (int64_t &d : s.first)
    d = at[d];
  for (int64_t &d : s.reduced)
    d = at[d];
}

std::optional<Split> planSplit(const Node *n, const SplitReductionOptions &o) {
  const Node *x = n->operand(0);
  int64_t rank = x->rank();
  IntList dims = attrs::Sum(*n).dims(); // any reduction
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d)
      dims.push_back(d);
  for (int64_t &d : dims)
    d = d < 0 ? d + rank : d;
  std::sort(dims.begin(), dims.end());
  std::vector<int64_t> sizes;
  for (const SymExpr &e : x->shape()) {
    if (!e->isConst())
      return std::nullopt;
    sizes.push_back(e->value());
  }
  int64_t results = 1, length = 1;
  for (int64_t d = 0; d < rank; ++d)
    (std::binary_search(dims.begin(), dims.end(), d) ? length : results) *= sizes[d];
  if (length <= 1 || results * length < o.minElements)
    return std::nullopt;
  bool known = true;
  int64_t innermost = innermostDim(x, o, known);
  bool rowLike = std::binary_search(dims.begin(), dims.end(), innermost);
  int64_t m = o.multiprocessors;
  int64_t resultBytes = results * static_cast<int64_t>(dtypeSize(x->dtype()));
  if (rowLike ? results >= m : resultBytes >= o.columnResultBytesPerCore * m)
    return std::nullopt;
  // Short column partials only where the columns are known to be neighbours in memory: a
  // BERT layer's bias gradient over a transposed view ([2048, 768] read 2,048 apart) split
  // in 8 partials of 256 shared its first stage's loop space with 50 column sums, and the
  // kernel they fused into read rows and columns both (337 us a step on an H200, where the
  // unsplit row sum took 21).
  int64_t minLength = rowLike || !known ? o.minPartialLength : o.columnMinPartialLength;
  int64_t want = ceilDiv((rowLike ? o.rowPartialsPerCore : o.columnPartialsPerCore) * m, results);
  want = std::min(want, length / minLength);
  if (want < 2)
    return std::nullopt;
  // The outermost reduced dims go to the second stage whole while they fit `want`; the next
  // one is cut at the divisor of its size nearest what is still wanted, among those that
  // leave each partial `minLength` elements (rounding up to the nearest divisor must
  // not make the partials too short: a batch norm's 64 sums over [32, 64, 56, 56] take the
  // 32 images whole, and then a cut of 2 would leave 1,568 elements a partial).
  int64_t most = length / minLength;
  IntList whole;
  int64_t cutDim = -1, cut = 1, partials = 1, need = want;
  for (int64_t d : dims) {
    if (sizes[d] == 1)
      continue;
    if (sizes[d] <= need) {
      whole.push_back(d);
      partials *= sizes[d];
      need = ceilDiv(need, sizes[d]);
      if (need <= 1)
        break;
      continue;
    }
    cut = nearestDivisor(sizes[d], need, most / partials);
    if (cut == 1) {
      // No divisor: this dim stays whole in the first stage, and the next one is cut (a ViT's
      // bias gradients over [197, 32, C]: 197 is prime, the 32 images are cut).
      continue;
    }
    if (cut == sizes[d])
      whole.push_back(d);
    else
      cutDim = d;
    partials *= cut;
    break;
  }
  if (partials < 2 || length / partials < minLength)
    return std::nullopt;
  Split s;
  auto moved = [&](int64_t d) { return cutDim >= 0 && d > cutDim ? d + 1 : d; };
  for (int64_t d = 0; d < rank; ++d) {
    if (d == cutDim) {
      s.shape.push_back(cut);
      s.shape.push_back(sizes[d] / cut);
    } else {
      s.shape.push_back(sizes[d]);
    }
  }
  for (int64_t d : dims) {
    s.reduced.push_back(moved(d));
    if (std::find(whole.begin(), whole.end(), d) == whole.end() && d != cutDim)
      s.first.push_back(moved(d));
  }
  if (cutDim >= 0) {
    s.reduced.push_back(cutDim + 1);
    s.first.push_back(cutDim + 1);
  }
  if (!rowLike)
    keepColumnsInnermost(s, moved(innermost));
  std::sort(s.first.begin(), s.first.end());
  std::sort(s.reduced.begin(), s.reduced.end());
  return s;
}

/// A half-precision sum or product keeps an f32 accumulator across both stages; an integer one
/// keeps its own dtype (the builder's default for integers is i64: an argsort's i32 counts
/// would take two adds a step, and wrap the same way).
std::optional<DType> accumulator(const Node *n) {
  if (n->op() != OpKind::Sum && n->op() != OpKind::Prod)
    return std::nullopt;
  if (n->dtype() == DType::Float16 || n->dtype() == DType::BFloat16)
    return DType::Float32;
  if (!isFloating(n->dtype()))
    return n->dtype();
  return std::nullopt;
}

} // namespace

void splitReductions(Graph &g, const SplitReductionOptions &opts) {
  if (opts.multiprocessors <= 0)
    return;
  std::vector<Node *> candidates;
  for (const auto &n : g.nodes())
    if (associative(n->op()))
      candidates.push_back(n.get());
  // Every first stage is made before any second one: fusion takes computations in program
  // order, so first stages over one space (a batch norm's two sums) stay side by side and
  // share a kernel, as the single reductions did.
  GraphBuilder b(g);
  struct Staged {
    Node *n, *partials;
    IntList reduced;
  };
  std::vector<Staged> staged;
  for (Node *n : candidates) {
    std::optional<Split> s = planSplit(n, opts);
    if (!s)
      continue;
    b.setName(n->name());
    Node *x = n->operand(0);
    std::vector<int64_t> cutShape = s->shape;
    if (!s->perm.empty())
      for (size_t i = 0; i < s->perm.size(); ++i)
        cutShape[s->perm[i]] = s->shape[i];
    x = b.reshape(x, b.dims(cutShape));
    if (!s->perm.empty())
      x = b.permute(x, s->perm);
    staged.push_back({n, b.reduce(n->op(), x, s->first, true, accumulator(n)), s->reduced});
  }
  for (const auto &[n, partials, reduced] : staged) {
    b.setName(n->name());
    // The second stage reduces the first's dims of ones too, so that its result has n's
    // shape without keepdim: a scalar is computed as one, not viewed from a buffer of ones.
    Node *r = b.reduce(n->op(), partials, reduced, false, accumulator(n));
    if (attrs::Sum(*n).keepdim())
      r = b.reshape(r, n->shape());
    if (r->dtype() != n->dtype())
      r = b.convert(r, n->dtype());
    g.replaceAllUses(n, r);
  }
  if (!staged.empty()) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
