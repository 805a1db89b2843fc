/// Complex values held as pairs ([.., 2]: real, imaginary; fft's layout):
///   complex(re, im) = concat([re[.., None], im[.., None]], -1)
///   conj(x)         = concat([x[.., 0:1], -x[.., 1:2]], -1)
#include "braze/lowering/decompose/Decompose.h"

namespace braze::decomp {

namespace {
/// re and im, each given a trailing unit dim, joined along it.
Node *pairOf(GraphBuilder &b, Node *re, Node *im) {
  int64_t r = re->rank();
  Node *reCol = b.unsqueeze(re, r);
  Node *imCol = b.unsqueeze(im, r);
  return b.concat({reCol, imCol}, r);
}
} // namespace

Node *decomposeComplex(GraphBuilder &b, Node *n) {
  return pairOf(b, n->operand(0), n->operand(1));
}

Node *decomposeConj(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  int64_t last = x->rank() - 1;
  Node *re = b.squeeze(b.slice(x, last, 0, 1, 1), {last});
  Node *im = b.squeeze(b.slice(x, last, 1, 2, 1), {last});
  return pairOf(b, re, b.unary(OpKind::Neg, im));
}

} // namespace braze::decomp
