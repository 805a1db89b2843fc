/// verifyGraph: the graph's structure (inputs, size symbols, outputs and their layouts), each
/// node's types and the op schema (Ops.def: arity, attributes), the primitives' checks and
/// the dispatch of composite ops to their family's checks (VerifierNN.cpp, VerifierOps.cpp).
#include "braze/ir/graph/GraphVerifier.h"
#include "braze/ir/graph/OpAttrs.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

namespace braze::detail {

std::string GraphVerifier::run() {
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
    if (!checkOperandsDefined() || !checkType() || !checkSchema() || !checkNode() ||
        !checkStoredMark())
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
bool GraphVerifier::isDenseLayout(const std::vector<SymExpr> &shape, const std::vector<SymExpr> &strides) {
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

/// Starts a message about the current node; returns false so that checks can `return fail()`.
bool GraphVerifier::fail(const std::string &message) {
  error_ = "node %" + node_->name() + " (" + std::string(opName(node_->op())) + "): " + message;
  return false;
}

bool GraphVerifier::checkSizeSymbols() {
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

bool GraphVerifier::checkOperandsDefined() {
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

bool GraphVerifier::checkType() {
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

/// A `stored` or `stored_at_use` mark (the realize step's) only on a value to-loops would
/// otherwise compute inside its readers: not on an input, a reduction, a product or a
/// composite, which are stored anyway (a convolution's bias add is computed lazily, so it may
/// carry one).
bool GraphVerifier::checkStoredMark() {
  if (!node_->stored())
    return true;
  switch (opCategory(node_->op())) {
  case OpCategoryKind::Input:
  case OpCategoryKind::Reduce:
  case OpCategoryKind::MatMul:
    return fail("is marked stored, but its value is always stored");
  case OpCategoryKind::Composite:
    return fail("is marked stored, but its value is always stored");
  case OpCategoryKind::Extern:
    return node_->op() == OpKind::Convolution
               ? true
               : fail("is marked stored, but its value is always stored");
  case OpCategoryKind::Full:
  case OpCategoryKind::Elementwise:
  case OpCategoryKind::Cast:
  case OpCategoryKind::View:
  case OpCategoryKind::Gather:
  case OpCategoryKind::Iota:
  case OpCategoryKind::Numel:
  case OpCategoryKind::Concat:
    return true;
  }
  return true;
}

/// The operand count and the attributes Ops.def gives the op: each required attribute
/// present, each present one of its type, and no other.
bool GraphVerifier::checkSchema() {
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
    if (!spec.values.empty() && std::find(spec.values.begin(), spec.values.end(),
                                          std::get<std::string>(v)) == spec.values.end()) {
      std::string allowed;
      for (std::string_view x : spec.values)
        allowed += std::string(allowed.empty() ? "" : ", ") + "'" + std::string(x) + "'";
      return fail("attribute '" + spec.name + "' must be one of " + allowed + ", got '" +
                  std::get<std::string>(v) + "'");
    }
  }
  for (const auto &attr : attrs.all())
    if (std::none_of(schema.attrs.begin(), schema.attrs.end(),
                     [&](const AttrSpec &spec) { return spec.name == attr.first; }))
      return fail("has no attribute '" + attr.first + "'");
  return true;
}

/// An int attribute, or a failure naming it.
std::optional<int64_t> GraphVerifier::intAttr(const std::string &name) {
  const AttrMap &a = node_->attrs();
  if (!a.has(name) || !std::holds_alternative<int64_t>(a.get(name))) {
    fail("needs an integer attribute '" + name + "'");
    return std::nullopt;
  }
  return a.getInt(name);
}

bool GraphVerifier::checkDim(const std::string &attr, int64_t rank) {
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
bool GraphVerifier::checkReduction(bool hasKeepdim) {
  const IntList &dims = attrs::Numel(*node_).dims(); // every reduction's and numel's
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
  // The builder converts a sum's, product's, max's or min's operand to the result's dtype.
  DType in = node_->operand(0)->dtype(), type = in;
  OpKind op = node_->op();
  if (op == OpKind::ArgMax || op == OpKind::ArgMin) {
    if (in == DType::Bool)
      return fail("needs a numeric operand, not bool");
    type = DType::Int64;
  } else if (op == OpKind::Any || op == OpKind::All) {
    type = DType::Bool;
  } else if (opCategory(op) == OpCategoryKind::Composite) { // mean, var: checked on their own
    type = node_->dtype();
  }
  if (node_->dtype() != type)
    return fail("result must be " + std::string(dtypeName(type)) + " for a " +
                std::string(dtypeName(in)) + " operand");
  bool keep = attrs::Sum(*node_).keepdim(); // every reduction's
  int64_t reduced = rank == 0 ? 0 : static_cast<int64_t>(dims.size());
  int64_t want = keep ? rank : rank - reduced;
  if (node_->rank() != want)
    return fail("result rank " + std::to_string(node_->rank()) + " is not " +
                std::to_string(want) + " (operand rank " + std::to_string(rank) +
                ", keepdim=" + (keep ? "true" : "false") + ")");
  return true;
}

bool GraphVerifier::checkElementwise() {
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

bool GraphVerifier::checkView() {
  const Node *x = node_->operand(0);
  OpKind op = node_->op();
  if (node_->dtype() != x->dtype())
    return fail("a view keeps its operand's dtype " + std::string(dtypeName(x->dtype())) +
                ", not " + std::string(dtypeName(node_->dtype())));
  if (op == OpKind::Reshape) {
    SymExpr a = ctx_.product(x->shape()), b = ctx_.product(node_->shape());
    if (a != b)
      return fail(sym::toString(a) + " elements cannot become " + shapeText(node_->shape()));
    return true;
  }
  if (op == OpKind::Permute) {
    const IntList &dims = attrs::Permute(*node_).dims();
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
    for (int64_t d : attrs::Flip(*node_).dims())
      if (d < 0 || d >= x->rank())
        return fail("dim " + std::to_string(d) + " is out of range for rank " +
                    std::to_string(x->rank()));
    return node_->shape() == x->shape() ? true : fail("flip must keep the shape");
  }
  return fail("unknown view op");
}

bool GraphVerifier::checkNode() {
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
    if (node_->dtype() != x->dtype())
      return fail("result must have the input's dtype " + std::string(dtypeName(x->dtype())));
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
      if (attrs::Take(*node_).dim() + k > x->rank())
        return fail("take's " + std::to_string(k) + " index tensors do not fit rank " +
                    std::to_string(x->rank()));
      if (node_->rank() != x->rank() - k + index->rank())
        return fail("take's rank must be the input's minus the index count plus the index's");
      // result = x.shape[:dim] + index.shape + x.shape[dim + k:]
      size_t dim = static_cast<size_t>(attrs::Take(*node_).dim());
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
  case OpCategoryKind::Extern:
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
bool GraphVerifier::checkConcat() {
  const Node *first = node_->operand(0);
  if (!checkDim("dim", first->rank()))
    return false;
  size_t d = static_cast<size_t>(attrs::Concat(*node_).dim());
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

/// The attributes each composite op's decomposition reads.
/// What each composite op's attributes mean (Ops.def gave their presence and types). The
/// switch lists every op: a composite without a case does not compile warning-free.
bool GraphVerifier::checkComposite() {
  const AttrMap &a = node_->attrs();
  OpKind op = node_->op();
  size_t operands = node_->operands().size();
  switch (op) {
#define BRAZE_OP(E, cat, text, lo, hi, attrs) case OpKind::E:
#define BRAZE_COMPOSITE(E, text, lo, hi, attrs)
#define BRAZE_EXTERN(E, text, lo, hi, attrs)
#include "braze/ir/graph/Ops.def"
    return fail("is not a composite op");
  case OpKind::Mean:
  case OpKind::Var:
    return checkReduction(true);
  case OpKind::Argsort:
  case OpKind::Sort:
  case OpKind::Median:
  case OpKind::MedianIndex:
  case OpKind::Mode:
  case OpKind::ModeIndex:
    return checkSort();
  case OpKind::Cdist:
  case OpKind::Pdist:
    return checkDistances();
  case OpKind::Complex: {
    const Node *re = node_->operand(0), *im = node_->operand(1);
    std::vector<SymExpr> want = re->shape();
    want.push_back(ctx_.constant(2));
    if (!isFloating(re->dtype()) || im->dtype() != re->dtype() || im->shape() != re->shape())
      return fail("parts must share one floating-point dtype and shape");
    return node_->dtype() == re->dtype() && node_->shape() == want
               ? true : fail("result must be " + std::string(dtypeName(re->dtype())) + shapeText(want));
  }
  case OpKind::Conj: {
    const Node *x = node_->operand(0);
    if (!GraphBuilder::isPairs(x))
      return fail("needs floating-point pairs [.., 2]");
    return node_->dtype() == x->dtype() && node_->shape() == x->shape()
               ? true : fail("result must have the operand's dtype and shape");
  }
  case OpKind::Fft: {
    const attrs::Fft f(*node_);
    std::vector<SymExpr> want;
    std::string err = fftShape(f.mode_text(), node_->operand(0)->shape(), f.dims(),
                               f.normalization(), f.flag(), f.last_size(), ctx_, want);
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
    const attrs::LayerNorm norm(*node_);
    size_t want = 1 + norm.weight() + norm.bias();
    return operands == want ? true
                            : fail("has " + std::to_string(operands) +
                                   " operands but its weight/bias attributes say " +
                                   std::to_string(want));
  }
  case OpKind::Gelu: // checkSchema has checked `approximate`
  case OpKind::Silu:
  case OpKind::Random:
    return true;
  case OpKind::AddMatMul:
  case OpKind::Trilinear: {
    std::vector<const Node *> ops(node_->operands().begin(), node_->operands().end());
    TensorType want;
    std::string err = GraphBuilder::productError(op, ops, a, ctx_, want);
    if (!err.empty())
      return fail(err);
    return node_->dtype() == want.dtype && node_->shape() == want.shape
               ? true
               : fail("result must be " + std::string(dtypeName(want.dtype)) +
                      shapeText(want.shape));
  }
  case OpKind::RandomDraw: {
    std::vector<const Node *> ops(node_->operands().begin(), node_->operands().end());
    std::string err = GraphBuilder::randomDrawError(node_->type(), ops, a);
    return err.empty() ? true : fail(err);
  }
  case OpKind::Convolution:
    if (operands != 2u + attrs::Convolution(*node_).bias())
      return fail("operand count does not match the 'bias' attribute");
    return checkConvolution();
  case OpKind::ConvTranspose:
    return checkConvTranspose();
  case OpKind::ConvWeightGrad:
    return checkConvWeightGrad();
  case OpKind::ConvInputGrad:
    return checkConvInputGrad();
  case OpKind::Attention:
    if (!std::isfinite(attrs::Attention(*node_).scale()))
      return fail("scale must be finite");
    return checkAttention();
  case OpKind::AttentionLse:
  case OpKind::AttentionGrad:
    if (!std::isfinite(attrs::AttentionLse(*node_).scale())) // and attention_grad's
      return fail("scale must be finite");
    return checkAttentionSaved();
  case OpKind::MaxPool:
  case OpKind::MaxPoolIndices:
  case OpKind::AvgPool:
  case OpKind::MaxPoolGrad:
    return checkPooling();
  case OpKind::AdaptiveMaxPool:
  case OpKind::AdaptiveMaxPoolIndices:
  case OpKind::AdaptiveAvgPool:
  case OpKind::AdaptiveAvgPoolGrad:
  case OpKind::AdaptiveMaxPoolGrad:
    return checkAdaptivePooling();
  case OpKind::GridSample:
    return checkGridSample();
  case OpKind::Scatter:
    return checkScatter();
  case OpKind::ScatterDim:
  case OpKind::IndexReduce:
  case OpKind::Put:
  case OpKind::DiagonalScatter:
  case OpKind::IndexPut:
  case OpKind::MaskPut:
  case OpKind::MaskedScatter:
  case OpKind::AsStridedScatter:
  case OpKind::NonzeroStatic:
  case OpKind::AsStrided:
    return checkScatterLike();
  case OpKind::EmbeddingBag:
    return checkEmbeddingBag();
  case OpKind::Cross:
  case OpKind::FMax:
  case OpKind::FMin:
  case OpKind::TruncDiv:
  case OpKind::SoftMarginLoss:
  case OpKind::RoundDecimals:
  case OpKind::Signbit:
  case OpKind::Ldexp:
  case OpKind::Angle:
    return checkArithmetic();
  }
  return fail("is not a composite op");
}

} // namespace braze::detail

namespace braze {

std::string verifyGraph(const Graph &g) { return detail::GraphVerifier(g).run(); }

} // namespace braze
