/// unroll-short-sums: a sum over a few elements that lie apart in memory is written out as adds
/// of its slices:
///   sum(x, dims=[1]) : [T, 2, H]  ->  (0 + select(x, 1, 0)) + select(x, 1, 1) : [T, H]
/// A mixture of experts' combine (each token's top-k expert outputs, weighted) is such a sum.
/// As a reduction it is a row kernel whose rows are k elements long, one thread's, so each
/// thread computes one of the T x H results, with the gather chain that finds the token's rows
/// (four dependent loads) per result: on an H200, 18.6 us a layer for [2048, 2, 1024] f32. As
/// adds it is pointwise over [T, H]: its threads take a vector of neighbouring results each and
/// share the token's chain among them, and it fuses into the residual add and norm after it.
///
/// When it fires: a sum whose reduced dims have constant sizes of at most kMaxTerms elements
/// together, followed by kept dims of at least kMinRun elements together (constant sizes): runs
/// of results whose neighbours are the operand's, which a pointwise kernel reads and stores a
/// vector at a time. A sum over the last dim reads its terms side by side, which a row kernel
/// does well; a short run leaves the vectors nothing to take.
/// The adds are those of the reduction the sum would be, in its order: from a zero accumulator,
/// in the accumulator's dtype (f32 for half-precision values, which round once at the end).
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>
#include <vector>

namespace braze {

namespace {

constexpr int64_t kMaxTerms = 8;
constexpr int64_t kMinRun = 32;

/// A sum the rewrite applies to: the dims it reduces, sorted, and how many terms it adds.
struct ShortSum {
  std::vector<int64_t> dims; ///< empty: the rewrite does not apply
  int64_t terms = 0;
};

ShortSum shortSum(const Node *n) {
  const Node *x = n->operand(0);
  if (x->rank() < 2)
    return {};
  std::vector<int64_t> dims = attrs::Sum(*n).dims();
  for (int64_t &d : dims)
    d = d < 0 ? d + x->rank() : d;
  std::sort(dims.begin(), dims.end());
  if (dims.empty() || dims.back() == x->rank() - 1)
    return {};
  int64_t terms = 1;
  for (int64_t d : dims) {
    SymExpr size = x->shape()[d];
    if (!size->isConst())
      return {};
    terms *= size->value();
    if (terms > kMaxTerms || terms == 0) // an empty sum stays a reduction (of no terms)
      return {};
  }
  int64_t run = 1; // the results side by side: the elements of the dims after the last reduced
  for (int64_t d = dims.back() + 1; d < x->rank(); ++d) {
    SymExpr size = x->shape()[d];
    if (!size->isConst())
      return {};
    run *= size->value();
  }
  if (run < kMinRun)
    return {};
  return {std::move(dims), terms};
}

} // namespace

void unrollShortSums(Graph &g) {
  GraphBuilder b(g);
  bool changed = false;
  for (Node *n : nodesOf(g, OpKind::Sum)) {
    const auto [dims, terms] = shortSum(n);
    if (dims.empty())
      continue;
    Node *x = n->operand(0);
    const DType acc = isHalf(n->dtype()) ? DType::Float32 : n->dtype();
    b.setName(n->name());
    Node *total = b.scalar(0.0, acc);
    // Term t takes index (t / stride_d) % size_d along each reduced dim d, the last dim
    // fastest, as the reduction's loop over them runs. Selects go from the highest dim down,
    // so each leaves the lower dims' positions as they were.
    for (int64_t t = 0; t < terms; ++t) {
      Node *term = x;
      int64_t rest = t;
      for (size_t i = dims.size(); i-- > 0;) {
        const int64_t size = x->shape()[dims[i]]->value();
        term = b.select(term, dims[i], rest % size);
        rest /= size;
      }
      if (term->dtype() != acc)
        term = b.convert(term, acc);
      total = b.add(total, term);
    }
    if (total->dtype() != n->dtype())
      total = b.convert(total, n->dtype());
    if (total->shape() != n->shape())
      total = b.reshape(total, n->shape());
    g.replaceAllUses(n, total);
    changed = true;
  }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
