/// (This file is over 800 lines: one verifier class holds every op's checks, in the state it
/// shares across them (the node, the symbol context, the message). Splitting it by op family,
/// as lowering/decompose is split, needs that class in a header of its own.)
#include "braze/ir/graph/GraphText.h"

#include "braze/ir/graph/Builder.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace braze {

namespace {

/// Checks one node at a time; the first violation is kept in error_ and stops the walk.
class GraphVerifier {
public:
  explicit GraphVerifier(const Graph &g) : g_(g), ctx_(*g.symShared()) {}

  std::string run() {
    if (!checkSizeSymbols())
      return error_;
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      const Node *in = g_.inputs()[i];
      const AttrValue *index = in->attrs().has("index") ? &in->attrs().get("index") : nullptr;
      if (!index || !std::holds_alternative<int64_t>(*index) ||
          std::get<int64_t>(*index) != static_cast<int64_t>(i))
        return "input %" + in->name() + " is input " + std::to_string(i) +
               " but its \"index\" attribute is " + (index ? attrToString(*index) : "missing");
    }
    for (const auto &n : g_.nodes()) {
      node_ = n.get();
      if (!checkOperandsDefined() || !checkType() || !checkSchema() || !checkNode())
        return error_;
      defined_.insert(n.get());
    }
    if (g_.outputs().empty())
      return "the graph has no outputs";
    for (size_t i = 0; i < g_.outputs().size(); ++i) {
      if (!defined_.count(g_.outputs()[i]))
        return "output " + std::to_string(i) + " is not a node of the graph";
      if (!isDenseLayout(g_.outputs()[i]->shape(), g_.outputStrides(i)))
        return "output " + std::to_string(i) + " has a layout that is not dense";
    }
    return "";
  }

  /// Empty, or strides of a permutation of the dims laid out row-major (unit dims free).
  bool isDenseLayout(const std::vector<SymExpr> &shape, const std::vector<SymExpr> &strides) {
    if (strides.empty())
      return true;
    if (strides.size() != shape.size())
      return false;
    std::vector<bool> used(shape.size(), false);
    SymExpr expected = ctx_.constant(1);
    for (size_t placed = 0; placed < shape.size(); ++placed) {
      size_t pick = shape.size();
      for (size_t d = 0; d < shape.size() && pick == shape.size(); ++d)
        if (!used[d] && !shape[d]->isConst(1) && strides[d] == expected)
          pick = d;
      if (pick == shape.size())
        break;
      used[pick] = true;
      expected = ctx_.mul(expected, shape[pick]);
    }
    for (size_t d = 0; d < shape.size(); ++d)
      if (!used[d] && !shape[d]->isConst(1))
        return false;
    return true;
  }

private:
  /// Starts a message about the current node; returns false so that checks can `return fail()`.
  bool fail(const std::string &message) {
    error_ = "node %" + node_->name() + " (" + std::string(opName(node_->op())) + "): " + message;
    return false;
  }

  bool checkSizeSymbols() {
    std::unordered_set<std::string> hints;
    for (SymExpr s : g_.sizeSymbols()) {
      if (!s->isSymbol() || s->role() != sym::SymbolRoleKind::Size) {
        error_ = "size symbol " + sym::toString(s) + " is not a size symbol";
        return false;
      }
      if (!hints.insert(s->name()).second) {
        error_ = "two size symbols are named '" + s->name() + "'";
        return false;
      }
    }
    return true;
  }

  bool checkOperandsDefined() {
    for (size_t i = 0; i < node_->operands().size(); ++i) {
      const Node *o = node_->operand(i);
      if (!o)
        return fail("operand " + std::to_string(i) + " is null");
      if (!defined_.count(o))
        return fail("operand " + std::to_string(i) + " %" + o->name() +
                    " is used before it is defined");
    }
    return true;
  }

  bool checkType() {
    const TensorType &t = node_->type();
    if (t.strides.size() != t.shape.size())
      return fail("rank " + std::to_string(t.rank()) + " but " +
                  std::to_string(t.strides.size()) + " strides");
    std::vector<SymExpr> syms;
    for (SymExpr e : t.shape)
      sym::collectSymbols(e, syms);
    for (SymExpr e : t.strides)
      sym::collectSymbols(e, syms);
    const auto &sizes = g_.sizeSymbols();
    for (SymExpr s : syms)
      if (std::find(sizes.begin(), sizes.end(), s) == sizes.end())
        return fail("type uses '" + s->name() + "', which is not a size symbol of the graph");
    return true;
  }

  /// The operand count and the attributes Ops.def gives the op: each required attribute
  /// present, each present one of its type, and no other.
  bool checkSchema() {
    const OpSchema &schema = opSchema(node_->op());
    size_t n = node_->operands().size(), lo = static_cast<size_t>(schema.minOperands);
    if (n < lo || (schema.maxOperands >= 0 && n > static_cast<size_t>(schema.maxOperands))) {
      std::string want = schema.maxOperands < 0 ? "at least " + std::to_string(lo)
                         : schema.maxOperands == schema.minOperands
                             ? std::to_string(lo)
                             : std::to_string(lo) + " to " + std::to_string(schema.maxOperands);
      return fail("takes " + want + " operands, got " + std::to_string(n));
    }
    const AttrMap &attrs = node_->attrs();
    for (const AttrSpec &spec : schema.attrs) {
      if (!attrs.has(spec.name)) {
        if (spec.optional)
          continue;
        return fail("needs " + std::string(attrKindText(spec.kind)) + " attribute '" +
                    spec.name + "'");
      }
      const AttrValue &v = attrs.get(spec.name);
      bool ok = spec.kind == AttrKind::Bool     ? std::holds_alternative<bool>(v)
                : spec.kind == AttrKind::Int    ? std::holds_alternative<int64_t>(v)
                : spec.kind == AttrKind::Number ? std::holds_alternative<int64_t>(v) ||
                                                      std::holds_alternative<double>(v)
                : spec.kind == AttrKind::String ? std::holds_alternative<std::string>(v)
                                                : std::holds_alternative<IntList>(v);
      if (!ok)
        return fail("attribute '" + spec.name + "' must be " +
                    std::string(attrKindText(spec.kind)));
    }
    for (const auto &attr : attrs.all())
      if (std::none_of(schema.attrs.begin(), schema.attrs.end(),
                       [&](const AttrSpec &spec) { return spec.name == attr.first; }))
        return fail("has no attribute '" + attr.first + "'");
    return true;
  }

  /// An int attribute, or a failure naming it.
  std::optional<int64_t> intAttr(const std::string &name) {
    const AttrMap &a = node_->attrs();
    if (!a.has(name) || !std::holds_alternative<int64_t>(a.get(name))) {
      fail("needs an integer attribute '" + name + "'");
      return std::nullopt;
    }
    return a.getInt(name);
  }

  bool checkDim(const std::string &attr, int64_t rank) {
    std::optional<int64_t> d = intAttr(attr);
    if (!d)
      return false;
    if (*d < 0 || *d >= std::max<int64_t>(rank, 1))
      return fail(attr + " " + std::to_string(*d) + " is out of range for rank " +
                  std::to_string(rank));
    return true;
  }

  /// `dims` is a strictly increasing list of dims of the operand; with `keepdim` (when
  /// `hasKeepdim`) the result keeps them as size 1.
  bool checkReduction(bool hasKeepdim) {
    const AttrMap &a = node_->attrs();
    const IntList &dims = a.getInts("dims");
    int64_t rank = node_->operand(0)->rank();
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] < 0 || dims[i] >= std::max<int64_t>(rank, 1))
        return fail("dim " + std::to_string(dims[i]) + " is out of range for rank " +
                    std::to_string(rank));
      if (i > 0 && dims[i] <= dims[i - 1])
        return fail("dims " + attrToString(dims) + " are not strictly increasing");
    }
    if (!hasKeepdim)
      return node_->rank() == 0 ? true : fail("result must have rank 0");
    bool keep = a.getBool("keepdim");
    int64_t reduced = rank == 0 ? 0 : static_cast<int64_t>(dims.size());
    int64_t want = keep ? rank : rank - reduced;
    if (node_->rank() != want)
      return fail("result rank " + std::to_string(node_->rank()) + " is not " +
                  std::to_string(want) + " (operand rank " + std::to_string(rank) +
                  ", keepdim=" + (keep ? "true" : "false") + ")");
    return true;
  }

  bool checkElementwise() {
    std::vector<SymExpr> shape;
    for (const Node *o : node_->operands()) {
      const std::vector<SymExpr> &b = o->shape();
      std::vector<SymExpr> out;
      size_t bad = 0;
      if (!broadcastShape(shape, b, out, bad))
        return fail("operand shapes do not broadcast: " + shapeText(shape) + " and " +
                    shapeText(b));
      shape = std::move(out);
    }
    if (shape != node_->shape())
      return fail("operands broadcast to " + shapeText(shape) + " but the result shape is " +
                  shapeText(node_->shape()));
    if (node_->op() == OpKind::Where && node_->operand(0)->dtype() != DType::Bool)
      return fail("condition must be bool, got " +
                  std::string(dtypeName(node_->operand(0)->dtype())));
    std::vector<std::pair<DType, bool>> operands;
    for (const Node *o : node_->operands())
      operands.push_back({o->dtype(), o->rank() == 0});
    DType promoted = elementwisePromotedType(node_->op(), operands);
    DType want = elementwiseResultType(node_->op(), promoted);
    if (node_->dtype() != want)
      return fail("result is " + std::string(dtypeName(node_->dtype())) + " but its operands give " +
                  std::string(dtypeName(want)));
    DType each = elementwiseOperandType(node_->op(), promoted);
    for (size_t i = node_->op() == OpKind::Where ? 1 : 0; i < operands.size(); ++i)
      if (operands[i].first != each)
        return fail("operand " + std::to_string(i) + " is " +
                    std::string(dtypeName(operands[i].first)) + "; the operands must be " +
                    std::string(dtypeName(each)) + " (convert them first)");
    return true;
  }

  bool checkView() {
    const Node *x = node_->operand(0);
    OpKind op = node_->op();
    if (op == OpKind::Reshape) {
      SymExpr a = ctx_.product(x->shape()), b = ctx_.product(node_->shape());
      if (a != b)
        return fail(sym::toString(a) + " elements cannot become " + shapeText(node_->shape()));
      return true;
    }
    if (op == OpKind::Permute) {
      const IntList &dims = node_->attrs().getInts("dims");
      IntList sorted = dims;
      std::sort(sorted.begin(), sorted.end());
      bool permutation = sorted.size() == static_cast<size_t>(x->rank());
      for (size_t i = 0; permutation && i < sorted.size(); ++i)
        permutation = sorted[i] == static_cast<int64_t>(i);
      if (!permutation)
        return fail("dims " + attrToString(dims) + " are not a permutation of " +
                    std::to_string(x->rank()) + " dims");
      std::vector<SymExpr> permuted;
      for (int64_t d : dims)
        permuted.push_back(x->shape()[d]);
      if (permuted != node_->shape())
        return fail("result shape " + shapeText(node_->shape()) + " is not " +
                    shapeText(permuted));
      return true;
    }
    if (op == OpKind::Expand) {
      size_t r = node_->shape().size(), xr = x->shape().size();
      bool ok = r >= xr;
      for (size_t i = 0; ok && i < xr; ++i)
        ok = x->shape()[i] == node_->shape()[r - xr + i] || x->shape()[i]->isConst(1);
      return ok ? true
                : fail("cannot expand " + shapeText(x->shape()) + " to " +
                       shapeText(node_->shape()));
    }
    if (op == OpKind::Slice) {
      if (!checkDim("dim", x->rank()) || !intAttr("start"))
        return false;
      std::optional<int64_t> step = intAttr("step");
      if (!step)
        return false;
      if (*step <= 0)
        return fail("step must be positive, got " + std::to_string(*step));
      return node_->rank() == x->rank() ? true : fail("slice must keep the rank");
    }
    if (op == OpKind::Select) {
      if (!checkDim("dim", x->rank()) || !intAttr("index"))
        return false;
      return node_->rank() == x->rank() - 1 ? true : fail("select must drop one dim");
    }
    if (op == OpKind::Diagonal) {
      if (!checkDim("dim1", x->rank()) || !checkDim("dim2", x->rank()) || !intAttr("offset"))
        return false;
      return node_->rank() == x->rank() - 1 ? true : fail("diagonal must drop one dim");
    }
    if (op == OpKind::Unfold) {
      if (!checkDim("dim", x->rank()))
        return false;
      return node_->rank() == x->rank() + 1 ? true : fail("unfold must add one dim");
    }
    if (op == OpKind::Flip) {
      for (int64_t d : node_->attrs().getInts("dims"))
        if (d < 0 || d >= x->rank())
          return fail("dim " + std::to_string(d) + " is out of range for rank " +
                      std::to_string(x->rank()));
      return node_->shape() == x->shape() ? true : fail("flip must keep the shape");
    }
    return fail("unknown view op");
  }

  bool checkNode() {
    switch (opCategory(node_->op())) {
    case OpCategoryKind::Input:
      return true;
    case OpCategoryKind::Full: {
      const AttrMap &a = node_->attrs();
      // Floating results are filled from a float, the others from an integer (true is 1).
      bool floating = isFloating(node_->dtype());
      if (floating ? !std::holds_alternative<double>(a.get("value"))
                   : !std::holds_alternative<int64_t>(a.get("value")))
        return fail(std::string("'value' must be ") + (floating ? "a float" : "an integer") +
                    " for a " + std::string(dtypeName(node_->dtype())) + " result");
      return true;
    }
    case OpCategoryKind::Iota:
      return checkDim("dim", node_->rank());
    case OpCategoryKind::Elementwise:
      return checkElementwise();
    case OpCategoryKind::Cast:
      if (node_->shape() != node_->operand(0)->shape())
        return fail("shape " + shapeText(node_->shape()) + " differs from the operand's " +
                    shapeText(node_->operand(0)->shape()));
      return true;
    case OpCategoryKind::Reduce:
      return checkReduction(true);
    case OpCategoryKind::Numel:
      return checkReduction(false);
    case OpCategoryKind::View:
      return checkView();
    case OpCategoryKind::Gather: {
      const Node *x = node_->operand(0), *index = node_->operand(1);
      if (!isIntegral(index->dtype()))
        return fail("index must be an integer tensor, got " +
                    std::string(dtypeName(index->dtype())));
      if (node_->op() == OpKind::Take) {
        int64_t k = static_cast<int64_t>(node_->operands().size()) - 1;
        for (int64_t j = 1; j <= k; ++j) {
          const Node *other = node_->operand(j);
          if (!isIntegral(other->dtype()))
            return fail("index must be an integer tensor, got " +
                        std::string(dtypeName(other->dtype())));
          if (other->shape() != index->shape())
            return fail("take's index tensors must have one shape");
        }
        if (!checkDim("dim", x->rank()))
          return false;
        if (node_->attrs().getInt("dim") + k > x->rank())
          return fail("take's " + std::to_string(k) + " index tensors do not fit rank " +
                      std::to_string(x->rank()));
        if (node_->rank() != x->rank() - k + index->rank())
          return fail("take's rank must be the input's minus the index count plus the index's");
        // result = x.shape[:dim] + index.shape + x.shape[dim + k:]
        size_t dim = static_cast<size_t>(node_->attrs().getInt("dim"));
        std::vector<SymExpr> want(x->shape().begin(), x->shape().begin() + dim);
        want.insert(want.end(), index->shape().begin(), index->shape().end());
        want.insert(want.end(), x->shape().begin() + dim + k, x->shape().end());
        return node_->shape() == want ? true
                                      : fail("shape " + shapeText(node_->shape()) +
                                             " is not the input's with the indexed dims "
                                             "replaced by the index's: " + shapeText(want));
      }
      if (index->rank() != x->rank())
        return fail("index rank " + std::to_string(index->rank()) + " differs from rank " +
                    std::to_string(x->rank()));
      if (node_->shape() != index->shape())
        return fail("shape " + shapeText(node_->shape()) + " differs from the index's " +
                    shapeText(index->shape()));
      return checkDim("dim", x->rank());
    }
    case OpCategoryKind::Composite:
      return checkComposite();
    case OpCategoryKind::Concat:
      return checkConcat();
    case OpCategoryKind::MatMul: {
      const Node *a = node_->operand(0), *b = node_->operand(1);
      int r = node_->rank();
      if (r < 2 || a->rank() != r || b->rank() != r)
        return fail("operands and result must share a rank of at least 2");
      if (a->dtype() != b->dtype() || node_->dtype() != a->dtype())
        return fail("operands and result must share one dtype, got " +
                    std::string(dtypeName(a->dtype())) + ", " + std::string(dtypeName(b->dtype())) +
                    " and " + std::string(dtypeName(node_->dtype())));
      bool ok = a->shape()[r - 1] == b->shape()[r - 2] && a->shape()[r - 2] == node_->shape()[r - 2] &&
                b->shape()[r - 1] == node_->shape()[r - 1];
      for (int i = 0; ok && i < r - 2; ++i)
        ok = a->shape()[i] == node_->shape()[i] && b->shape()[i] == node_->shape()[i];
      return ok ? true
                : fail("shapes " + shapeText(a->shape()) + " x " + shapeText(b->shape()) +
                       " do not give " + shapeText(node_->shape()));
    }
    }
    return fail("unknown op category");
  }

  /// Operands agree outside `dim`; the result's `dim` is the sum of theirs.
  bool checkConcat() {
    const Node *first = node_->operand(0);
    if (!checkDim("dim", first->rank()))
      return false;
    size_t d = static_cast<size_t>(node_->attrs().getInt("dim"));
    SymExpr total = ctx_.constant(0);
    for (const Node *x : node_->operands()) {
      if (x->rank() != first->rank() || x->dtype() != node_->dtype())
        return fail("operands must share rank and dtype");
      for (size_t k = 0; k < x->shape().size(); ++k)
        if (k != d && x->shape()[k] != node_->shape()[k])
          return fail("operand shape " + shapeText(x->shape()) + " does not match " +
                      shapeText(node_->shape()) + " outside dim " + std::to_string(d));
      total = ctx_.add(total, x->shape()[d]);
    }
    return total == node_->shape()[d] ? true
                                      : fail("dim " + std::to_string(d) + " is not the sum of the operands'");
  }

  /// Ranks, per-spatial-dim attribute lengths and ranges, channel counts and the result's
  /// rank of a convolution (input [N, C, *S], weight [O, C / groups, *K], bias [O]).
  bool checkConvolution() {
    const AttrMap &a = node_->attrs();
    const Node *x = node_->operand(0), *w = node_->operand(1);
    size_t rank = x->rank();
    if (rank < 3 || rank > 5)
      return fail("input must have rank 3 to 5 (batch, channels, 1-3 spatial dims), not " +
                  std::to_string(rank));
    if (w->rank() != rank || node_->rank() != rank)
      return fail("weight and result must have the input's rank " + std::to_string(rank) +
                  ", not " + std::to_string(w->rank()) + " and " +
                  std::to_string(node_->rank()));
    size_t spatial = rank - 2;
    if (!sharesNumericDtype())
      return false;
    for (const char *name : {"stride", "padding", "dilation"}) {
      const IntList &v = a.getInts(name);
      if (v.size() != spatial)
        return fail(std::string("'") + name + "' needs " + std::to_string(spatial) +
                    " entries (one per spatial dim), not " + std::to_string(v.size()));
      int64_t least = std::string(name) == "padding" ? 0 : 1;
      for (int64_t e : v)
        if (e < least || e > (int64_t(1) << 40))
          return fail(std::string("'") + name + "' entry " + std::to_string(e) +
                      " is out of range (at least " + std::to_string(least) + ")");
    }
    int64_t groups = a.getInt("groups");
    if (groups < 1)
      return fail("'groups' must be at least 1, not " + std::to_string(groups));
    if (node_->operands().size() == 3 && node_->operand(2)->rank() != 1)
      return fail("bias must have rank 1");
    SymExpr c = x->shape()[1], wc = w->shape()[1], o = w->shape()[0];
    if (!c->isConst() || !wc->isConst())
      return fail("input and weight channels must be static, got " + shapeText(x->shape()) +
                  " and " + shapeText(w->shape()));
    if (c->value() != wc->value() * groups)
      return fail("input has " + std::to_string(c->value()) + " channels but weight takes " +
                  std::to_string(wc->value()) + " per group x " + std::to_string(groups) +
                  " groups");
    if (o->isConst() && o->value() % groups != 0)
      return fail("weight has " + std::to_string(o->value()) + " output channels, not a "
                  "multiple of groups " + std::to_string(groups));
    if (o->isConst(0))
      return fail("weight has no output channels");
    if (node_->operands().size() == 3 && node_->operand(2)->shape()[0] != o)
      return fail("bias has " + sym::toString(node_->operand(2)->shape()[0]) +
                  " entries for " + sym::toString(o) + " output channels");
    if (node_->shape()[0] != x->shape()[0] || node_->shape()[1] != o)
      return fail("result " + shapeText(node_->shape()) + " must have the input's batch " +
                  sym::toString(x->shape()[0]) + " and the weight's " + sym::toString(o) +
                  " output channels");
    // Each spatial size is what the window gives: (in + 2p - d(k-1) - 1) / s + 1.
    const IntList &st = a.getInts("stride"), &pad = a.getInts("padding"),
                  &dil = a.getInts("dilation");
    for (size_t i = 0; i < spatial; ++i) {
      SymExpr in = x->shape()[2 + i], k = w->shape()[2 + i], out = node_->shape()[2 + i];
      if (!k->isConst())
        return fail("kernel sizes must be static, got weight " + shapeText(w->shape()));
      if (!in->isConst() || !out->isConst()) {
        // A symbolic size must be the window arithmetic's expression, as the builder gives it.
        SymExpr padded = ctx_.add(in, ctx_.constant(2 * pad[i]));
        SymExpr span = ctx_.constant(dil[i] * (k->value() - 1) + 1);
        if (!ctx_.provablyNonNegative(ctx_.sub(padded, span)))
          return fail("spatial dim " + std::to_string(i) + ": the kernel may be larger than the "
                      "padded input " + sym::toString(padded));
        SymExpr want = ctx_.add(ctx_.floordiv(ctx_.sub(padded, span), ctx_.constant(st[i])),
                                ctx_.constant(1));
        if (out != want)
          return fail("spatial dim " + std::to_string(i) + " of the result is " +
                      sym::toString(out) + ", but the window gives " + sym::toString(want));
        continue;
      }
      int64_t room = in->value() + 2 * pad[i] - dil[i] * (k->value() - 1) - 1;
      int64_t want = room < 0 ? -1 : room / st[i] + 1;
      if (want != out->value())
        return fail("spatial dim " + std::to_string(i) + " of the result is " +
                    std::to_string(out->value()) + ", but the window gives " +
                    (want < 0 ? std::string("none (the kernel is larger than the padded input)")
                              : std::to_string(want)));
    }
    return true;
  }

  /// A convolution's operands (input, weight, bias) and result: one numeric, non-bool dtype.
  bool sharesNumericDtype() {
    DType t = node_->dtype();
    bool ok = t != DType::Bool;
    for (const Node *o : node_->operands())
      ok &= o->dtype() == t;
    return ok ? true
              : fail("input, weight, bias and result must share one numeric (non-bool) dtype");
  }

  /// A transposed convolution (input [N, Cin, *S], weight [Cin, Cout / groups, *K], bias
  /// [Cout]): attribute lengths and ranges, static sizes, and the result
  /// [N, Cout, (S - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1].
  bool checkConvTranspose() {
    const AttrMap &a = node_->attrs();
    const Node *x = node_->operand(0), *w = node_->operand(1);
    int rank = x->rank();
    if (rank < 3 || rank > 5 || w->rank() != rank || node_->rank() != rank)
      return fail("input, weight and result must share a rank of 3 to 5");
    size_t spatial = static_cast<size_t>(rank - 2);
    if (!sharesNumericDtype())
      return false;
    for (const char *name : {"stride", "padding", "dilation", "output_padding"}) {
      const IntList &v = a.getInts(name);
      if (v.size() != spatial)
        return fail(std::string("'") + name + "' needs " + std::to_string(spatial) +
                    " entries (one per spatial dim), not " + std::to_string(v.size()));
      int64_t least = name[0] == 's' || name[0] == 'd' ? 1 : 0;
      for (int64_t e : v)
        if (e < least || e > (int64_t(1) << 40))
          return fail(std::string("'") + name + "' entry " + std::to_string(e) +
                      " is out of range (at least " + std::to_string(least) + ")");
    }
    int64_t groups = a.getInt("groups");
    std::vector<int64_t> ws;
    for (SymExpr d : w->shape()) {
      if (!d->isConst())
        return fail("the weight's sizes must be static");
      ws.push_back(d->value());
    }
    if (groups < 1 || ws[0] % groups || x->shape()[1] != w->shape()[0])
      return fail("input channels must equal the weight's first dim, a multiple of groups");
    if (node_->operands().size() != 2u + a.getBool("bias"))
      return fail("operand count does not match the 'bias' attribute");
    std::vector<SymExpr> want{x->shape()[0], ctx_.constant(groups * ws[1])};
    const IntList &st = a.getInts("stride"), &pad = a.getInts("padding"),
                  &dil = a.getInts("dilation"), &extra = a.getInts("output_padding");
    for (size_t i = 0; i < spatial; ++i) {
      SymExpr in = x->shape()[2 + i];
      if (!in->isConst() || extra[i] >= std::max(st[i], dil[i]))
        return fail("needs static spatial sizes and output padding below the stride or the "
                    "dilation");
      want.push_back(ctx_.constant(GraphBuilder::convTransposeSize(in->value(), st[i], pad[i],
                                                                   dil[i], ws[2 + i], extra[i])));
    }
    if (a.getBool("bias") && node_->operand(2)->shape() != std::vector<SymExpr>{want[1]})
      return fail("bias must have shape [" + sym::toString(want[1]) + "]");
    return node_->shape() == want ? true : fail("result must be " + shapeText(want));
  }

  /// Pooling over the last kernel.size() (1 to 3) dims: every window list of that length, each
  /// window in range (GraphBuilder::poolWindowError), constant pooled dims, and a pooled shape
  /// (the result's, or max_pool_grad's gradient and indices) whose leading dims are the
  /// input's and whose pooled dims the window arithmetic gives (rounded down, or up in ceil
  /// mode). Dtypes: max pools numbers, avg_pool floats and i64, max_pool_grad float gradients.
  bool checkPooling() {
    const AttrMap &a = node_->attrs();
    const IntList &k = a.getInts("kernel"), &st = a.getInts("stride"), &p = a.getInts("padding"),
                  &d = a.getInts("dilation");
    size_t spatial = k.size();
    if (spatial < 1 || spatial > 3 || st.size() != spatial || p.size() != spatial ||
        d.size() != spatial)
      return fail("needs kernel, stride, padding and dilation lists of one length from 1 to 3");
    bool grad = node_->op() == OpKind::MaxPoolGrad;
    const Node *x = node_->operand(grad ? 1 : 0), *pooled = grad ? node_->operand(0) : node_;
    DType t = x->dtype();
    if (grad) {
      if (!isFloating(pooled->dtype()) || node_->dtype() != pooled->dtype() ||
          node_->shape() != x->shape())
        return fail("result must be the gradient's floating-point dtype with the input's shape");
      if (node_->operand(2)->dtype() != DType::Int64 ||
          node_->operand(2)->shape() != pooled->shape())
        return fail("indices must be i64 of the gradient's shape");
    } else if (node_->op() == OpKind::AvgPool) {
      if (!isFloating(t) && t != DType::Int64)
        return fail("needs a floating-point or i64 input");
      if (a.getInt("divisor") < 0)
        return fail("divisor must be positive (or 0: the window count)");
    } else if (t == DType::Bool) {
      return fail("needs a numeric input, not bool");
    }
    DType want = node_->op() == OpKind::MaxPoolIndices ? DType::Int64 : t;
    if (!grad && node_->dtype() != want)
      return fail("result must be " + std::string(dtypeName(want)));
    size_t r = x->rank();
    if (r < spatial + 1 || pooled->rank() != r)
      return fail("input and pooled shape need one rank of at least " +
                  std::to_string(spatial + 1) + ", not " + std::to_string(r) + " and " +
                  std::to_string(pooled->rank()));
    for (size_t i = 0; i + spatial < r; ++i)
      if (pooled->shape()[i] != x->shape()[i])
        return fail("dim " + std::to_string(i) + " is not pooled and must equal the input's");
    for (size_t i = 0; i < spatial; ++i) {
      std::string err = GraphBuilder::poolWindowError(k[i], st[i], p[i], d[i]);
      if (!err.empty())
        return fail(err);
      SymExpr in = x->shape()[r - spatial + i], out = pooled->shape()[r - spatial + i];
      if (!in->isConst() || !out->isConst())
        return fail("the pooled dims must be constants");
      int64_t span = d[i] * (k[i] - 1) + 1;
      if (in->value() + 2 * p[i] < span)
        return fail("the window (" + std::to_string(span) + ") is larger than the padded input (" +
                    std::to_string(in->value() + 2 * p[i]) + ")");
      int64_t lo = GraphBuilder::pooledSize(in->value(), k[i], st[i], p[i], d[i], false),
              hi = GraphBuilder::pooledSize(in->value(), k[i], st[i], p[i], d[i], true);
      if (out->value() != lo && out->value() != hi)
        return fail("pooled dim " + std::to_string(r - spatial + i) + " is " +
                    std::to_string(out->value()) + " but the windows give " + std::to_string(lo) +
                    (hi != lo ? " (or " + std::to_string(hi) + " in ceil mode)" : ""));
    }
    return true;
  }

  /// Adaptive pooling of the last output_size.size() (1 to 3) dims of a floating-point input:
  /// static, non-empty pooled dims, and a result of the input's leading dims and output_size.
  bool checkAdaptivePooling() {
    const IntList &o = node_->attrs().getInts("output_size");
    const Node *x = node_->operand(0);
    size_t spatial = o.size(), r = x->rank();
    if (spatial < 1 || spatial > 3 || r < spatial + 1)
      return fail("needs 1 to 3 output sizes, and an input of a higher rank");
    if (!isFloating(x->dtype()))
      return fail("needs a floating-point input");
    DType want = node_->op() == OpKind::AdaptiveMaxPoolIndices ? DType::Int64 : x->dtype();
    if (node_->dtype() != want)
      return fail("result must be " + std::string(dtypeName(want)));
    std::vector<SymExpr> shape(x->shape().begin(), x->shape().end() - spatial);
    for (size_t i = 0; i < spatial; ++i) {
      SymExpr in = x->shape()[r - spatial + i];
      if (!in->isConst() || in->value() < 1 || o[i] < 1 || o[i] > GraphBuilder::kMaxAdaptiveSize)
        return fail("needs static, non-empty pooled dims and output sizes from 1 to " +
                    std::to_string(GraphBuilder::kMaxAdaptiveSize));
      shape.push_back(ctx_.constant(o[i]));
    }
    return node_->shape() == shape ? true : fail("result must be " + shapeText(shape));
  }

  /// Grid sampling: the input, grid and modes GraphBuilder::gridSampleShape accepts (static,
  /// non-empty spatial dims and static grid points: the decomposition flattens both), and a
  /// result of the input's dtype shaped [N, C, *O].
  bool checkGridSample() {
    const AttrMap &a = node_->attrs();
    const Node *x = node_->operand(0);
    std::vector<SymExpr> want;
    std::string err = GraphBuilder::gridSampleShape(x, node_->operand(1), a.getString("mode"),
                                                    a.getString("padding_mode"), want);
    if (!err.empty())
      return fail(err);
    if (node_->dtype() != x->dtype())
      return fail("result must be " + std::string(dtypeName(x->dtype())));
    return node_->shape() == want ? true : fail("result must be " + shapeText(want));
  }

  /// Attention's operands and result: q [B.., Sq, D], k [B.., Sk, D], v [B.., Sk, Dv] of one
  /// floating dtype, a bias of that dtype broadcasting to [B.., Sq, Sk], result [B.., Sq, Dv].
  bool checkAttention() {
    const Node *q = node_->operand(0), *k = node_->operand(1), *v = node_->operand(2);
    size_t r = q->shape().size();
    if (r < 2 || k->shape().size() != r || v->shape().size() != r)
      return fail("query, key and value must have one rank of at least 2");
    if (!isFloating(q->dtype()) || k->dtype() != q->dtype() || v->dtype() != q->dtype() ||
        node_->dtype() != q->dtype())
      return fail("query, key, value and result must share one floating-point dtype");
    for (size_t i = 0; i + 2 < r; ++i)
      if (k->shape()[i] != q->shape()[i] || v->shape()[i] != q->shape()[i])
        return fail("query, key and value must share their batch dims");
    if (k->shape()[r - 1] != q->shape()[r - 1] || v->shape()[r - 2] != k->shape()[r - 2])
      return fail("key must be [.., Sk, D] for a query [.., Sq, D] and value [.., Sk, Dv]");
    std::vector<SymExpr> want(q->shape().begin(), q->shape().end() - 1);
    want.push_back(v->shape()[r - 1]);
    if (node_->shape() != want)
      return fail("result must be " + shapeText(want));
    return node_->operands().size() != 4 || checkAttentionBias(node_->operand(3), q, k);
  }

  /// An attention's bias: the query's dtype, broadcasting to the scores [B.., Sq, Sk].
  bool checkAttentionBias(const Node *b, const Node *q, const Node *k) {
    size_t r = q->shape().size();
    std::vector<SymExpr> scores(q->shape().begin(), q->shape().end() - 1);
    scores.push_back(k->shape()[r - 2]);
    if (b->dtype() != q->dtype() || b->shape().size() > r)
      return fail("bias must have the query's dtype and a rank of at most " + std::to_string(r));
    size_t lead = r - b->shape().size();
    for (size_t i = 0; i < b->shape().size(); ++i)
      if (!b->shape()[i]->isConst(1) && b->shape()[i] != scores[lead + i])
        return fail("bias " + shapeText(b->shape()) + " does not broadcast to the scores " +
                    shapeText(scores));
    return true;
  }

  /// attention_lse (q, k[, bias] -> [B.., Sq] in the compute type) and attention_grad
  /// (dout, q, k, v, out, lse[, bias] -> the shape and dtype of q, k or v as `wrt` says).
  bool checkAttentionSaved() {
    const AttrMap &a = node_->attrs();
    bool grad = node_->op() == OpKind::AttentionGrad;
    size_t first = grad ? 1 : 0, operands = node_->operands().size();
    if (operands != (grad ? 6u : 2u) + a.getBool("bias"))
      return fail("operand count does not match the 'bias' attribute");
    const Node *q = node_->operand(first), *k = node_->operand(first + 1);
    size_t r = q->shape().size();
    if (r < 2 || k->shape().size() != r || !isFloating(q->dtype()) || k->dtype() != q->dtype())
      return fail("query and key must share one floating-point dtype and a rank of at least 2");
    for (size_t i = 0; i + 2 < r; ++i)
      if (k->shape()[i] != q->shape()[i])
        return fail("query and key must share their batch dims");
    if (k->shape()[r - 1] != q->shape()[r - 1])
      return fail("key must be [.., Sk, D] for a query [.., Sq, D]");
    std::vector<SymExpr> rows(q->shape().begin(), q->shape().end() - 1);
    if (a.getBool("bias") && !checkAttentionBias(node_->operand(operands - 1), q, k))
      return false;
    if (!grad)
      return node_->dtype() == computeType(q->dtype()) && node_->shape() == rows
                 ? true
                 : fail("result must be " + std::string(dtypeName(computeType(q->dtype()))) +
                        shapeText(rows));
    const Node *v = node_->operand(3), *lse = node_->operand(5);
    bool vOk = v->dtype() == q->dtype() && v->shape().size() == r &&
               v->shape()[r - 2] == k->shape()[r - 2];
    for (size_t i = 0; vOk && i + 2 < r; ++i)
      vOk = v->shape()[i] == q->shape()[i];
    if (!vOk)
      return fail("value must be [B.., Sk, Dv] of the query's dtype and batch dims");
    std::vector<SymExpr> outShape = rows;
    outShape.push_back(v->shape()[r - 1]);
    for (const Node *x : {node_->operand(0), node_->operand(4)})
      if (x->dtype() != q->dtype() || x->shape() != outShape)
        return fail("the output and its gradient must be " + shapeText(outShape));
    if (lse->dtype() != computeType(q->dtype()) || lse->shape() != rows)
      return fail("the log-sum-exp must be " + std::string(dtypeName(computeType(q->dtype()))) +
                  shapeText(rows));
    const std::string &wrt = a.getString("wrt");
    const Node *like = wrt == "q" ? q : wrt == "k" ? k : v;
    if (node_->dtype() != q->dtype() || node_->shape() != like->shape())
      return fail("result must be shaped as the operand named by wrt");
    return true;
  }

  /// The attributes each composite op's decomposition reads.
  /// What each composite op's attributes mean (Ops.def gave their presence and types). The
  /// switch lists every op: a composite without a case does not compile warning-free.
  bool checkComposite() {
    const AttrMap &a = node_->attrs();
    OpKind op = node_->op();
    size_t operands = node_->operands().size();
    switch (op) {
#define BRAZE_OP(E, cat, text, lo, hi, attrs) case OpKind::E:
#define BRAZE_COMPOSITE(E, text, lo, hi, attrs)
#include "braze/ir/graph/Ops.def"
      return fail("is not a composite op");
    case OpKind::Mean:
    case OpKind::Var:
      return checkReduction(true);
    case OpKind::Argsort:
    case OpKind::MedianIndex:
    case OpKind::Mode:
    case OpKind::ModeIndex:
      return checkSort();
    case OpKind::Cdist:
    case OpKind::Pdist:
      return checkDistances();
    case OpKind::Fft: {
      std::vector<SymExpr> want;
      std::string err = fftShape(a.getString("mode"), node_->operand(0)->shape(),
                                 a.getInts("dims"), a.getInt("normalization"), a.getBool("flag"),
                                 a.getInt("last_size"), ctx_, want);
      if (!err.empty())
        return fail(err);
      if (!isFloating(node_->dtype()) || node_->dtype() != node_->operand(0)->dtype())
        return fail("signal and result must share one floating-point dtype");
      return node_->shape() == want ? true : fail("result must be " + shapeText(want));
    }
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      return checkDim("dim", node_->operand(0)->rank());
    case OpKind::CumSum:
    case OpKind::CumProd:
    case OpKind::LogCumSumExp:
    case OpKind::CumExtreme:
    case OpKind::CumExtremeIndex:
      return checkScan();
    case OpKind::SearchSorted:
    case OpKind::Histogram:
      return checkSearch();
    case OpKind::LayerNorm: {
      if (!checkDim("axis", node_->operand(0)->rank()))
        return false;
      size_t want = 1 + a.getBool("weight") + a.getBool("bias");
      return operands == want ? true
                              : fail("has " + std::to_string(operands) +
                                     " operands but its weight/bias attributes say " +
                                     std::to_string(want));
    }
    case OpKind::Gelu:
      return a.getString("approximate") == "none" || a.getString("approximate") == "tanh"
                 ? true
                 : fail("needs attribute approximate=\"none\" or \"tanh\"");
    case OpKind::Silu:
    case OpKind::Random:
      return true;
    case OpKind::Convolution:
      if (operands != 2u + a.getBool("bias"))
        return fail("operand count does not match the 'bias' attribute");
      return checkConvolution();
    case OpKind::ConvTranspose:
      return checkConvTranspose();
    case OpKind::Attention:
      if (operands != 3u + a.getBool("bias"))
        return fail("operand count does not match the 'bias' attribute");
      if (!std::isfinite(a.getFloat("scale")))
        return fail("scale must be finite");
      return checkAttention();
    case OpKind::AttentionLse:
    case OpKind::AttentionGrad:
      if (!std::isfinite(a.getFloat("scale")))
        return fail("scale must be finite");
      if (op == OpKind::AttentionGrad && a.getString("wrt") != "q" && a.getString("wrt") != "k" &&
          a.getString("wrt") != "v")
        return fail("needs attribute wrt=\"q\", \"k\" or \"v\"");
      return checkAttentionSaved();
    case OpKind::MaxPool:
    case OpKind::MaxPoolIndices:
    case OpKind::AvgPool:
    case OpKind::MaxPoolGrad:
      return checkPooling();
    case OpKind::AdaptiveMaxPool:
    case OpKind::AdaptiveMaxPoolIndices:
    case OpKind::AdaptiveAvgPool:
      return checkAdaptivePooling();
    case OpKind::GridSample:
      return checkGridSample();
    case OpKind::Scatter:
      return checkScatter();
    }
    return fail("is not a composite op");
  }

  /// The sort family: a sorted dim of an operand of rank 1 or more within the sort limits;
  /// argsort gives i64 of the operand's shape, median_index and mode's results keep the dim
  /// as 1 (non-empty, and for mode an integer or bool operand).
  bool checkSort() {
    const Node *x = node_->operand(0);
    if (x->rank() == 0)
      return fail("needs an operand of rank 1 or more");
    if (!checkDim("dim", x->rank()))
      return false;
    int64_t dim = node_->attrs().getInt("dim");
    std::string err = GraphBuilder::sortLimitError(x->shape(), dim);
    if (!err.empty())
      return fail(err);
    OpKind op = node_->op();
    std::vector<SymExpr> want = x->shape();
    if (op != OpKind::Argsort) {
      if (want[dim]->value() == 0)
        return fail("needs a non-empty dim");
      want[dim] = ctx_.constant(1);
    }
    if (op == OpKind::Mode && isFloating(x->dtype()))
      return fail("takes integers and bools");
    DType type = op == OpKind::Mode ? x->dtype() : DType::Int64;
    if (node_->dtype() != type || node_->shape() != want)
      return fail("result must be " + std::string(dtypeName(type)) + shapeText(want));
    return true;
  }

  /// Scans: a scanned dim within GraphBuilder::scanLimitError, a result of the operand's shape
  /// and dtype (i64 for cum_extreme_index; cum_extreme needs a non-scalar operand).
  bool checkScan() {
    const Node *x = node_->operand(0);
    bool extreme = node_->op() == OpKind::CumExtreme || node_->op() == OpKind::CumExtremeIndex;
    if (extreme && x->rank() == 0)
      return fail("needs an operand of rank 1 or more");
    if (!checkDim("dim", x->rank()))
      return false;
    std::string err = GraphBuilder::scanLimitError(x->shape(), node_->attrs().getInt("dim"));
    if (!err.empty())
      return fail(err);
    DType want = node_->op() == OpKind::CumExtremeIndex ? DType::Int64 : x->dtype();
    if (node_->op() == OpKind::LogCumSumExp && !isFloating(x->dtype()))
      return fail("needs a floating-point operand");
    if (node_->dtype() != want || node_->shape() != x->shape())
      return fail("result must be " + std::string(dtypeName(want)) + shapeText(x->shape()));
    return true;
  }

  /// search_sorted: seq and values of one numeric dtype (GraphBuilder::searchShape), an i64
  /// sorter of seq's shape when the attribute says so, i32 or i64 indices shaped as values.
  /// histogram: GraphBuilder::histogramError, a result [bins] of the operand's dtype.
  bool checkSearch() {
    const AttrMap &a = node_->attrs();
    const Node *x = node_->operand(0);
    if (node_->op() == OpKind::Histogram) {
      std::string err =
          GraphBuilder::histogramError(x, a.getInt("bins"), a.getFloat("min"), a.getFloat("max"));
      if (!err.empty())
        return fail(err);
      std::vector<SymExpr> want{ctx_.constant(a.getInt("bins"))};
      return node_->dtype() == x->dtype() && node_->shape() == want
                 ? true
                 : fail("result must be " + std::string(dtypeName(x->dtype())) + shapeText(want));
    }
    const Node *values = node_->operand(1);
    if (node_->operands().size() != 2u + a.getBool("sorter"))
      return fail("operand count does not match the 'sorter' attribute");
    if (x->dtype() != values->dtype() || x->dtype() == DType::Bool)
      return fail("sequence and values must share one numeric dtype");
    std::string err = GraphBuilder::searchShape(x, values);
    if (!err.empty())
      return fail(err);
    if (a.getBool("sorter") &&
        (node_->operand(2)->dtype() != DType::Int64 || node_->operand(2)->shape() != x->shape()))
      return fail("the sorter must be i64 of the sequence's shape");
    if ((node_->dtype() != DType::Int64 && node_->dtype() != DType::Int32) ||
        node_->shape() != values->shape())
      return fail("result must be i32 or i64 of the values' shape");
    return true;
  }

  /// cdist: [.., P, M] and [.., R, M] (batch dims broadcast) -> [.., P, R]; pdist: [N, M] ->
  /// [N (N - 1) / 2]; f32 or f64 throughout, p >= 0.
  bool checkDistances() {
    const Node *x = node_->operand(0);
    double p = node_->attrs().getFloat("p");
    if (std::isnan(p) || p < 0)
      return fail("p must be >= 0 (or inf)");
    if ((x->dtype() != DType::Float32 && x->dtype() != DType::Float64) ||
        node_->dtype() != x->dtype())
      return fail("operands and result must be f32 or f64, of one dtype");
    std::vector<SymExpr> want;
    if (node_->op() == OpKind::Pdist) {
      if (x->rank() != 2 || !x->shape()[0]->isConst())
        return fail("needs a [N, M] operand with a static N");
      int64_t n = x->shape()[0]->value();
      want.push_back(ctx_.constant(n * (n - 1) / 2));
    } else {
      const Node *y = node_->operand(1);
      int r = x->rank();
      if (r < 2 || y->rank() != r || y->dtype() != x->dtype() ||
          x->shape()[r - 1] != y->shape()[r - 1])
        return fail("needs operands [.., P, M] and [.., R, M] of one rank and dtype");
      std::vector<SymExpr> a(x->shape().begin(), x->shape().end() - 2),
          c(y->shape().begin(), y->shape().end() - 2);
      size_t bad = 0;
      if (!broadcastShape(a, c, want, bad))
        return fail("batch dims do not broadcast");
      want.push_back(x->shape()[r - 2]);
      want.push_back(y->shape()[r - 2]);
    }
    return node_->shape() == want ? true : fail("result must be " + shapeText(want));
  }

  bool checkScatter() {
    const AttrMap &a = node_->attrs();
    static const char *kModes[] = {"overwrite", "sum", "prod", "mean", "amax", "amin"};
    if (std::none_of(std::begin(kModes), std::end(kModes),
                     [&](const char *m) { return a.getString("mode") == m; }))
      return fail("needs attribute mode=\"overwrite\", \"sum\", \"prod\", \"mean\", "
                  "\"amax\" or \"amin\"");
    if (a.has("max_hits") &&
        (a.getInt("max_hits") < 1 || a.getInt("max_hits") > GraphBuilder::kMaxScatterHits))
      return fail("attribute 'max_hits' must be an integer from 1 to " +
                  std::to_string(GraphBuilder::kMaxScatterHits));
    const Node *self = node_->operand(0), *target = node_->operand(1), *src = node_->operand(2);
    if (!isIntegral(target->dtype()) || target->shape() != src->shape())
      return fail("needs an integer target of the source's shape");
    if (src->dtype() != self->dtype() || node_->type().shape != self->shape())
      return fail("source and result must have self's dtype and shape");
    return true;
  }

  const Graph &g_;
  sym::SymContext &ctx_;
  const Node *node_ = nullptr;
  std::unordered_set<const Node *> defined_;
  std::string error_;
};

} // namespace

std::string verifyGraph(const Graph &g) { return GraphVerifier(g).run(); }

} // namespace braze
