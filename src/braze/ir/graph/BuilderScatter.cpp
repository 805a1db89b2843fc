// GraphBuilder: scatter, the composite op behind scatter/scatter_reduce/index_put/put (the
// frontend turns each op's index arguments into flat target positions).
#include "braze/ir/graph/Builder.h"

#include "braze/support/Diagnostic.h"

namespace braze {

namespace {
/// The element count of `shape` if every dim is constant.
std::optional<int64_t> constNumel(const std::vector<SymExpr> &shape) {
  int64_t n = 1;
  for (SymExpr d : shape) {
    if (!d->isConst())
      return std::nullopt;
    n *= d->value();
  }
  return n;
}
} // namespace

Node *GraphBuilder::scatter(Node *self, Node *target, Node *src, const std::string &mode,
                            bool includeSelf, int64_t maxHits) {
  if (maxHits < 0 || maxHits > kMaxScatterHits)
    BRAZE_USER_ERROR("scatter", name_) << "max_hits must be from 0 to " << kMaxScatterHits
                                       << ", got " << maxHits;
  if (mode != "overwrite" && mode != "sum" && mode != "prod" && mode != "mean" &&
      mode != "amax" && mode != "amin")
    BRAZE_USER_ERROR("scatter", name_) << "mode must be overwrite, sum, prod, mean, amax or amin, "
                                       << "got '" << mode << "'";
  if (!isIntegral(target->dtype()))
    BRAZE_USER_ERROR("scatter", name_) << "target must be an integer tensor, got "
                                       << dtypeName(target->dtype());
  if (target->shape() != src->shape())
    BRAZE_USER_ERROR("scatter", name_) << "target and source shapes differ";
  if (mode == "mean" && self->dtype() == DType::Bool)
    BRAZE_USER_ERROR("scatter", name_) << "mean of a bool tensor";
  std::optional<int64_t> n = constNumel(self->shape()), m = constNumel(src->shape());
  if (!n || !m)
    BRAZE_USER_ERROR("scatter", name_) << "needs constant shapes";
  if (*m != 0 && *n > kMaxScatterPairs / *m)
    BRAZE_USER_ERROR("scatter", name_) << *n << " x " << *m << " element pairs exceed the limit of "
                                       << kMaxScatterPairs;
  if (src->dtype() != self->dtype())
    src = convert(src, self->dtype());
  AttrMap attrs;
  attrs.set("mode", mode);
  attrs.set("include_self", includeSelf);
  if (maxHits > 0)
    attrs.set("max_hits", maxHits);
  return make(OpKind::Scatter, {self, target, src}, std::move(attrs),
              TensorType{self->dtype(), self->shape(), {}});
}

} // namespace braze
