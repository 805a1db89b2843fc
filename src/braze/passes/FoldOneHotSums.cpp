/// fold-one-hot-sums: the sum along a dim of a one-hot tensor (zeros with one value per line
/// scattered along that dim), or of one times a factor constant along that dim, is that value
/// (times the factor):
///   sum(scatter_dim(full(0), index, src) {dim=d}, dims=[d])     ->  src
///   sum(mul(scatter_dim(full(0), index, src) {dim=d}, w), dims=[d])
///                                                  ->  add(mul(src, w), mul(0, w))
/// with index and src of size 1 at d and of the scatter's shape elsewhere, and w of size 1 at d.
/// The line's other terms are 0 * w: zero, or NaN where w is infinite or NaN, which the second
/// product keeps (for floats). A cross-entropy gradient's log-softmax backward sums each row of
/// its one-hot tensor: folded, a pass over every logit becomes one product per row.
///
/// The scatter must stay, read by some other node: it checks that each index is within the
/// dim, and a fold that removed it would let an index outside the dim through without an error.
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/OpAttrs.h"

#include <unordered_map>
#include <vector>

namespace braze {

namespace {

/// Whether s writes one value per line along its dim into zeros: the sum along the dim is
/// src. `index` and `src` are of s's shape but 1 at the dim.
bool oneHot(const Node *s) {
  if (s->op() != OpKind::ScatterDim || !isZeros(s->operand(0)))
    return false;
  const attrs::ScatterDim a(*s);
  if (a.mode() != attrs::ScatterMode::Overwrite && a.mode() != attrs::ScatterMode::Sum)
    return false;
  int64_t d = a.dim();
  const Node *index = s->operand(1), *src = s->operand(2);
  if (src->shape() != index->shape() || src->dtype() != s->dtype() ||
      index->shape().size() != s->shape().size())
    return false;
  for (size_t i = 0; i < s->shape().size(); ++i) {
    bool atDim = static_cast<int64_t>(i) == d;
    if (atDim ? !index->shape()[i]->isConst(1) : index->shape()[i] != s->shape()[i])
      return false;
  }
  return true;
}

/// Whether w, broadcast to a tensor of rank `rank`, has size 1 at dim d.
bool constantAlong(const Node *w, size_t rank, int64_t d) {
  size_t r = w->shape().size();
  if (r > rank)
    return false;
  int64_t at = d - static_cast<int64_t>(rank - r);
  return at < 0 || w->shape()[static_cast<size_t>(at)]->isConst(1);
}

} // namespace

void foldOneHotSums(Graph &g) {
  std::vector<Node *> sums = nodesOf(g, OpKind::Sum);
  std::unordered_map<const Node *, int> readers = countReaders(g);
  GraphBuilder b(g);
  bool changed = false;
  for (Node *n : sums) {
    Node *m = n->operand(0), *s = m, *w = nullptr;
    if (m->op() == OpKind::Mul)
      for (int side = 0; side < 2; ++side)
        if (oneHot(m->operand(side))) {
          s = m->operand(side);
          w = m->operand(1 - side);
          break;
        }
    if (!oneHot(s) || n->dtype() != s->dtype() || m->dtype() != s->dtype() ||
        m->shape() != s->shape())
      continue;
    int64_t d = attrs::ScatterDim(*s).dim();
    const attrs::Sum sum(*n);
    const IntList &dims = sum.dims();
    if (dims.size() != 1 || dims[0] != d || (w && !constantAlong(w, s->shape().size(), d)))
      continue;
    bool scatterStays = readers[s] > 1 || (m != s && readers[m] > 1);
    if (!scatterStays)
      continue;
    b.setName(n->name());
    Node *r = s->operand(2);
    if (w) {
      r = b.mul(r, w);
      if (isFloating(s->dtype()))
        r = b.add(r, b.mul(b.scalar(0.0, s->dtype()), w));
    }
    if (!sum.keepdim())
      r = b.reshape(r, n->shape());
    g.replaceAllUses(n, r);
    changed = true;
  }
  if (changed) {
    sortTopologically(g);
    g.removeDeadNodes();
  }
}

} // namespace braze
