#pragma once
/// Building blocks for C-family kernel emitters: an indenting writer, naming of buffers,
/// locals and symbols, scopes that remember which values are already in locals, and an Expr
/// writer that emits each distinct subexpression once per scope.
#include "braze/scheduler/Schedule.h"

#include <functional>
#include <set>
#include <string>
#include <unordered_map>

namespace braze::codegen {

class Writer {
public:
  Writer(std::string &out, int indent) : out_(out), indent_(indent) {}
  void line(const std::string &s) { out_ += std::string(2 * indent_, ' ') + s + "\n"; }
  void indent() { ++indent_; }
  void dedent() { --indent_; }

private:
  std::string &out_;
  int indent_;
};

/// Names in generated code. Deterministic: derived from ids and positions, never pointers.
class Names {
public:
  explicit Names(const sched::Schedule &s);
  std::string buffer(const loop::Buffer &b) const { return "b" + std::to_string(b.id); }
  std::string local(const loop::Buffer &b) const { return "v" + std::to_string(b.id); }
  std::string acc(const loop::Computation &c) const { return "acc" + std::to_string(c.id); }
  int symbolIndex(sym::SymExpr s) const;
  std::string symbol(sym::SymExpr s) const { return "sz" + std::to_string(symbolIndex(s)); }
  /// A fresh name for an indirect index symbol.
  std::string bindIndirect(sym::SymExpr s);
  /// C text of an index expression, in int64_t arithmetic.
  std::string index(sym::SymExpr e) const { return indexText(e, false); }
  /// C text of an index a kernel reads, writes or computes at each point: as index(), or with
  /// narrowIndices on, in int arithmetic where the expression has a clamp, a quotient or a
  /// remainder, is over loop indices of constant extents alone (no sizes, no indirect indices)
  /// and every part of it provably lies within +-2^30 (codegen::fitsNarrowIndex).
  std::string pointIndex(sym::SymExpr e) const { return indexText(e, narrow_); }
  /// CUDA's kernels turn this on: a GPU does int arithmetic in about half the instructions of
  /// int64_t's, and an address computation with clamps and windows is mostly such arithmetic.
  void narrowIndices(bool on) { narrow_ = on; }

private:
  std::string indexText(sym::SymExpr e, bool narrow) const;
  bool narrow_ = false;
  std::unordered_map<sym::SymExpr, int> sizeIndex_;
  std::unordered_map<sym::SymExpr, std::string> indirect_;
  int nextIndirect_ = 0;
};

/// Values available as locals at some point of a kernel; nested scopes see their parents'.
class Scope {
public:
  explicit Scope(Scope *parent) : parent_(parent) {}
  void defineLocal(const loop::Buffer *b, const std::string &name, sym::SymExpr storeIndex) {
    locals_[b] = {{name, storeIndex}};
  }
  /// Another local of buffer b, at another index (a paired epilogue's two reads of a product).
  void addLocal(const loop::Buffer *b, const std::string &name, sym::SymExpr index) {
    locals_[b].push_back({name, index});
  }
  /// The local holding buffer b at `index`, or "" if none is visible.
  std::string localFor(const loop::Buffer *b, sym::SymExpr index) const;
  const std::string *memo(const loop::Expr *e) const;
  void remember(const loop::Expr *e, const std::string &name) { memo_[e] = name; }

private:
  Scope *parent_;
  std::unordered_map<const loop::Buffer *, std::vector<std::pair<std::string, sym::SymExpr>>>
      locals_;
  std::unordered_map<const loop::Expr *, std::string> memo_;
};

class ExprWriter {
public:
  /// `counter` numbers the locals; share one per kernel so names never repeat.
  ExprWriter(Writer &w, Scope &scope, Names &names, int &counter)
      : w_(w), scope_(scope), names_(names), next_(counter) {}
  /// Emits e's subexpressions as locals; returns a C expression for e.
  std::string emit(const loop::Expr *e);
  /// The statement that records an out-of-bounds indirect index (the kernel's `err` flag).
  void setErrorStatement(std::string s) { errorStatement_ = std::move(s); }

private:
  Writer &w_;
  Scope &scope_;
  Names &names_;
  int &next_;
  std::string errorStatement_ = "__atomic_store_n(err, 1, __ATOMIC_RELAXED);";
};

/// `{e0, e1, ...}`: index expressions as a C initializer list.
std::string cIndexList(const Names &names, const std::vector<sym::SymExpr> &xs);
/// `{INT64_C(a), INT64_C(b), ...}`
std::string cIntList(const std::vector<int64_t> &xs);


/// The buffers (by id) and size symbols a kernel's members and loops use; symbols in binding order.
void collectKernelUses(const sched::Kernel &k, const Names &names, std::set<int> &used,
                       std::vector<sym::SymExpr> &syms);

/// Defines M, N, K, lda, ldb and ldc of a matrix-product kernel as int64 locals and returns the
/// C condition under which a GEMM library takes that layout (each leading dimension at least
/// the row length it spans); the kernel's loop nest computes the product otherwise.
std::string emitGemmLayout(Writer &w, const sched::GemmCall &g, const Names &names);

/// Whether e mentions one of `vars` (a load whose index mentions none is one value wherever
/// those variables are: a kernel loads it once, before its loops).
using sym::mentionsAny;

/// The members of a pointwise step in independent groups: two members share a group when one
/// reads what the other computes or both read one buffer (directly or through members
/// between), and groups are in the order of their first member. Members of different groups
/// share no memory, so a kernel may run the groups as loops of their own without reading
/// anything twice (a load that no variable of `vars` moves is one value, read once, unless a
/// member of the step makes it: a scalar kernel's members read each other's values).
std::vector<std::vector<sched::Member>> independentMembers(const sched::Step &st,
                                                           const std::vector<sym::SymExpr> &vars);

/// Reductions that return a position (argmax/argmin) instead of a value.
bool isArgReduction(const loop::Computation &c);
/// The C expression of a reduction's identity, in the value's C type.
std::string accumulatorInit(const loop::Computation &c);
/// Folds v (or another partial result) into acc: a statement. Not for argmax/argmin.
std::string accumulatorUpdate(const loop::Computation &c, const std::string &acc,
                              const std::string &v);
/// argmax/argmin: true when candidate v (at a later position) replaces acc.
std::string argBetter(const loop::Computation &c, const std::string &acc, const std::string &v);

/// Every distinct node of e, operands first.
void forEachExpr(const loop::Expr *e, const std::function<void(const loop::Expr *)> &f);

/// The module ABI around the kernels: braze_bind, braze_output_shapes, braze_arena_bytes and
/// braze_run, which calls `kernelCalls` in order (each a statement that may set `err`).
/// `runParams` extends braze_run's parameter list (text starting with ", ").
std::string emitModuleAbi(const sched::Schedule &s, Names &names,
                          const std::vector<std::string> &kernelCalls,
                          const std::string &runParams = "");

} // namespace braze::codegen
