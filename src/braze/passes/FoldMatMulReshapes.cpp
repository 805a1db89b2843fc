/// fold-matmul-reshapes: a matrix product on flattened rows, as AOTAutograd traces a linear
/// layer of a batched input, becomes a product of the batched input:
///   reshape(matmul(reshape(x, [B*S, K]), w), [B, S, N])           ->  matmul(x, w)
///   reshape(add(matmul(reshape(x, [B*S, K]), w), bias), [B, S, N])  ->  add(matmul(x, w), bias)
/// with x [B.., S, K], w [K, N] (it broadcasts over x's batch dims) and a bias of rank 0 or 1.
/// The flattened values are never stored: the product reads x in place (one GEMM with the batch
/// folded into its rows) and writes its result in the shape its readers see, so a graph output
/// that is such a product (a model's logits) is written where it is returned, with no copy.
/// The product (and the addition) must have that one reader, the reshape back.
#include "braze/passes/PassManager.h"

#include "braze/ir/graph/Builder.h"

#include <unordered_map>
#include <vector>

namespace braze {

namespace {

class MatMulReshapeFolder {
public:
  explicit MatMulReshapeFolder(Graph &g) : g_(g), b_(g), users_(countReaders(g)) {}

  /// Rewrites the pattern ending at reshape `r`, if it is one; true when it did.
  bool tryRewrite(Node *r) {
    if (r->op() != OpKind::Reshape)
      return false;
    Node *m = r->operand(0), *add = nullptr, *bias = nullptr;
    if (m->op() == OpKind::Add && users_[m] == 1) {
      for (int side = 0; side < 2 && !bias; ++side)
        if (m->operand(side)->op() == OpKind::MatMul && m->operand(1 - side)->rank() <= 1) {
          add = m;
          bias = m->operand(1 - side);
          m = m->operand(side);
        }
    }
    if (m->op() != OpKind::MatMul || m->rank() != 2 || users_[m] != 1)
      return false;
    Node *flat = m->operand(0), *w = m->operand(1);
    if (flat->op() != OpKind::Reshape || w->rank() != 2)
      return false;
    Node *x = flat->operand(0);
    const std::vector<SymExpr> &xs = x->shape();
    if (x->rank() < 3 || x->dtype() != flat->dtype() || xs.back() != flat->shape()[1])
      return false;
    // [B.., S, K] flattened to [B*..*S, K] (K is kept, so the rows hold x's leading dims), and
    // the result unflattened to [B.., S, N].
    std::vector<SymExpr> want(xs.begin(), xs.end() - 1);
    want.push_back(w->shape()[1]);
    if (r->shape() != want)
      return false;
    b_.setName(r->name());
    Node *product = b_.matmul(x, w);
    Node *result = add ? b_.add(product, bias) : product;
    if (result->shape() != r->shape() || result->dtype() != r->dtype())
      return false; // the nodes built are unread; foldMatMulReshapes removes them
    g_.replaceAllUses(r, result);
    return true;
  }

private:
  Graph &g_;
  GraphBuilder b_;
  std::unordered_map<const Node *, int> users_;
};

} // namespace

void foldMatMulReshapes(Graph &g) {
  std::vector<Node *> reshapes = nodesOf(g, OpKind::Reshape);
  MatMulReshapeFolder folder(g);
  size_t before = g.nodes().size();
  bool changed = false;
  // A rewrite leaves the reshape, its product and its addition unread (they had no other
  // reader), and adds readers only to values no other candidate counts as single-use.
  for (Node *r : reshapes)
    changed = folder.tryRewrite(r) || changed;
  if (changed)
    sortTopologically(g);
  // A rewrite that built nodes and then gave up leaves them unread: removed here too.
  if (changed || g.nodes().size() != before)
    g.removeDeadNodes();
}

} // namespace braze
