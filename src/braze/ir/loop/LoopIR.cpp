#include "braze/ir/loop/LoopIR.h"

#include "braze/support/Check.h"
#include "braze/support/Hashing.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace braze::loop {

std::string_view scalarOpName(ScalarOpKind k) {
  switch (k) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  case ScalarOpKind::E:                                                        \
    return text;
#include "braze/ir/types/ElementwiseOps.def"
  case ScalarOpKind::Cast:
    return "cast";
  }
  BRAZE_UNREACHABLE("bad ScalarOpKind");
}

bool parseScalarOp(std::string_view name, ScalarOpKind &out) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (name == text) {                                                          \
    out = ScalarOpKind::E;                                                     \
    return true;                                                               \
  }
#include "braze/ir/types/ElementwiseOps.def"
  if (name == "cast") {
    out = ScalarOpKind::Cast;
    return true;
  }
  return false;
}

int scalarOpArity(ScalarOpKind k) {
  switch (k) {
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  case ScalarOpKind::E:                                                        \
    return arity;
#include "braze/ir/types/ElementwiseOps.def"
  case ScalarOpKind::Cast:
    return 1;
  }
  BRAZE_UNREACHABLE("bad ScalarOpKind");
}

const char *attentionPartName(AttentionPart p) {
  switch (p) {
  case AttentionPart::Output:
    return "attention";
  case AttentionPart::Lse:
    return "attention_lse";
  case AttentionPart::GradQ:
    return "attention_grad_q";
  case AttentionPart::GradK:
    return "attention_grad_k";
  case AttentionPart::GradV:
    return "attention_grad_v";
  }
  return "attention";
}

std::string_view bufferKindName(BufferKind k) {
  switch (k) {
  case BufferKind::Input:
    return "input";
  case BufferKind::Output:
    return "output";
  case BufferKind::Intermediate:
    return "intermediate";
  }
  BRAZE_UNREACHABLE("bad BufferKind");
}

std::string_view scatterCombineName(ReduceKind k) {
  return k == ReduceKind::Sum ? "add" : reduceKindName(k);
}

std::string_view reduceKindName(ReduceKind k) {
  switch (k) {
  case ReduceKind::None:
    return "none";
  case ReduceKind::Sum:
    return "sum";
  case ReduceKind::Prod:
    return "prod";
  case ReduceKind::Max:
    return "max";
  case ReduceKind::Min:
    return "min";
  case ReduceKind::Any:
    return "any";
  case ReduceKind::All:
    return "all";
  case ReduceKind::ArgMax:
    return "argmax";
  case ReduceKind::ArgMin:
    return "argmin";
  }
  BRAZE_UNREACHABLE("bad ReduceKind");
}

bool parseReduceKind(std::string_view name, ReduceKind &out) {
  for (ReduceKind k : {ReduceKind::None, ReduceKind::Sum, ReduceKind::Prod, ReduceKind::Max,
                       ReduceKind::Min, ReduceKind::Any, ReduceKind::All, ReduceKind::ArgMax,
                       ReduceKind::ArgMin})
    if (reduceKindName(k) == name) {
      out = k;
      return true;
    }
  return false;
}

size_t ExprContext::Hash::operator()(const Expr *e) const {
  size_t h = std::hash<int>()(static_cast<int>(e->kind()));
  h = hashCombine(h, static_cast<size_t>(e->dtype()));
  uint64_t bits;
  double f = e->floatValue();
  std::memcpy(&bits, &f, sizeof bits);
  h = hashCombine(h, bits);
  h = hashCombine(h, std::hash<int64_t>()(e->intValue()));
  h = hashCombine(h, std::hash<const void *>()(e->index()));
  h = hashCombine(h, std::hash<const void *>()(e->buffer()));
  h = hashCombine(h, static_cast<size_t>(e->op()));
  for (const Expr *o : e->operands())
    h = hashCombine(h, std::hash<const void *>()(o));
  for (const auto &[s, v] : e->indirect())
    h = hashCombine(hashCombine(h, std::hash<const void *>()(s)), std::hash<const void *>()(v));
  return h;
}

bool ExprContext::Eq::operator()(const Expr *a, const Expr *b) const {
  // Bitwise comparison of constants keeps NaN payloads and -0.0 distinct from 0.0.
  return a->kind() == b->kind() && a->dtype() == b->dtype() &&
         std::memcmp(&a->fvalue_, &b->fvalue_, sizeof(double)) == 0 &&
         a->intValue() == b->intValue() && a->index() == b->index() &&
         a->buffer() == b->buffer() && a->op() == b->op() && a->operands() == b->operands() &&
         a->indirect() == b->indirect();
}

const Expr *ExprContext::intern(Expr &&e) {
  auto it = table_.find(&e);
  if (it != table_.end())
    return it->second;
  storage_.push_back(std::move(e));
  const Expr *p = &storage_.back();
  table_.emplace(p, p);
  return p;
}

const Expr *ExprContext::constant(double value, DType dtype) {
  Expr e;
  e.kind_ = ExprKind::Const;
  e.dtype_ = dtype;
  if (isFloating(dtype)) {
    e.fvalue_ = value;
  } else if (dtype == DType::Bool) {
    e.ivalue_ = value != 0;
    e.fvalue_ = static_cast<double>(e.ivalue_);
  } else {
    e.ivalue_ = static_cast<int64_t>(value);
    e.fvalue_ = static_cast<double>(e.ivalue_);
  }
  return intern(std::move(e));
}

const Expr *ExprContext::indexValue(SymExpr index, DType dtype) {
  Expr e;
  e.kind_ = ExprKind::IndexValue;
  e.dtype_ = dtype;
  e.index_ = index;
  return intern(std::move(e));
}

const Expr *ExprContext::load(const Buffer *buf, SymExpr index,
                              std::vector<IndirectBinding> indirect) {
  Expr e;
  e.kind_ = ExprKind::Load;
  e.dtype_ = buf->dtype;
  e.buffer_ = buf;
  e.index_ = index;
  e.indirect_ = std::move(indirect);
  return intern(std::move(e));
}

const Expr *ExprContext::op(ScalarOpKind op, std::vector<const Expr *> operands, DType dtype) {
  BRAZE_CHECK(static_cast<int>(operands.size()) == scalarOpArity(op))
      << scalarOpName(op) << " takes " << scalarOpArity(op) << " operands";
  Expr e;
  e.kind_ = ExprKind::Op;
  e.dtype_ = dtype;
  e.op_ = op;
  e.operands_ = std::move(operands);
  return intern(std::move(e));
}

std::vector<SymExpr> Computation::extents() const {
  std::vector<SymExpr> xs;
  for (SymExpr v : vars)
    xs.push_back(v->extent());
  return xs;
}

std::vector<SymExpr> Computation::rextents() const {
  std::vector<SymExpr> xs;
  for (SymExpr v : rvars)
    xs.push_back(v->extent());
  return xs;
}

Buffer *LoopProgram::addBuffer(std::string name, DType dtype, std::vector<SymExpr> shape,
                               BufferKind kind, int ioIndex, std::vector<SymExpr> strides) {
  auto b = std::make_unique<Buffer>();
  b->id = static_cast<int>(buffers_.size());
  b->name = std::move(name);
  b->dtype = dtype;
  if (strides.empty()) {
    strides.resize(shape.size());
    SymExpr s = sym_->constant(1);
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = s;
      s = sym_->mul(s, shape[i]);
    }
  }
  b->shape = std::move(shape);
  b->strides = std::move(strides);
  b->kind = kind;
  b->ioIndex = ioIndex;
  buffers_.push_back(std::move(b));
  return buffers_.back().get();
}

Computation *LoopProgram::addComputation(Buffer *out, std::vector<SymExpr> vars,
                                         std::vector<SymExpr> rvars, ReduceKind reduce,
                                         const Expr *value) {
  auto c = std::make_unique<Computation>();
  c->id = static_cast<int>(comps_.size());
  c->out = out;
  c->vars = std::move(vars);
  c->rvars = std::move(rvars);
  c->reduce = reduce;
  c->value = value;
  comps_.push_back(std::move(c));
  return comps_.back().get();
}

std::vector<size_t> nonUnitDims(const Buffer &b) {
  std::vector<size_t> dims;
  for (size_t i = 0; i < b.shape.size(); ++i)
    if (!b.shape[i]->isConst(1))
      dims.push_back(i);
  return dims;
}

SymExpr storeIndex(sym::SymContext &ctx, const Computation &c) {
  std::vector<size_t> dims = nonUnitDims(*c.out);
  BRAZE_CHECK(dims.size() == c.vars.size())
      << "computation " << c.id << " has " << c.vars.size() << " vars for " << dims.size()
      << " non-unit dims of " << c.out->name;
  SymExpr idx = ctx.constant(0);
  for (size_t k = 0; k < dims.size(); ++k)
    idx = ctx.add(idx, ctx.mul(c.vars[k], c.out->strides[dims[k]]));
  return idx;
}

std::vector<Buffer *> LoopProgram::inputs() const {
  std::vector<Buffer *> out;
  for (const auto &b : buffers_)
    if (b->kind == BufferKind::Input)
      out.push_back(b.get());
  std::sort(out.begin(), out.end(), [](Buffer *a, Buffer *b) { return a->ioIndex < b->ioIndex; });
  return out;
}

std::vector<Buffer *> LoopProgram::outputs() const {
  std::vector<Buffer *> out;
  for (const auto &b : buffers_)
    if (b->kind == BufferKind::Output)
      out.push_back(b.get());
  std::sort(out.begin(), out.end(), [](Buffer *a, Buffer *b) { return a->ioIndex < b->ioIndex; });
  return out;
}

/// Whether strides lay shape out densely: in some order of its dims, each stride is the product
/// of the sizes inside it, so the elements fill [0, numel) once (unit dims may have any stride).
bool denseLayout(sym::SymContext &ctx, const std::vector<SymExpr> &shape,
                 const std::vector<SymExpr> &strides) {
  std::vector<bool> placed(shape.size(), false);
  size_t left = 0;
  for (size_t i = 0; i < shape.size(); ++i)
    left += !(placed[i] = shape[i]->isConst(1));
  SymExpr step = ctx.constant(1);
  while (left > 0) {
    size_t i = 0;
    while (i < shape.size() && (placed[i] || strides[i] != step))
      ++i;
    if (i == shape.size())
      return false;
    placed[i] = true;
    --left;
    step = ctx.mul(step, shape[i]);
  }
  return true;
}

} // namespace braze::loop
