/// Fusion: computations are taken in program order and each joins the last kernel when
///   1. its iteration space fits the kernel's (pointwise over outer ++ inner or over outer;
///      a reduction over outer with inner reduced), possibly refining a kernel that so far has
///      only pointwise members (outer = E becomes outer = Eo, inner = Ei when E = Eo ++ Ei), and
///   2. every value it reads from a member of that kernel is read at exactly the point where
///      the member stored it (so no thread reads another thread's element).
/// A computation that fits no last kernel may join one of the few kernels before it
/// (earlierKernel): one whose space it fits (a reduction: one whose loops are its own), after
/// every kernel that makes what it reads, when it writes a buffer nothing wrote before. The
/// foreach steps of an optimizer (every parameter's m, then every v, then every parameter) so
/// become one pass per shape, and a scalar computed from a step count joins the scalar kernel
/// that made the count, before the updates that read it. Further back, a reduction joins a
/// kernel that reads what it reads over the same loops (a max pool's values and indices,
/// far apart in program order, read the window once), and a pointwise value reading what a
/// reduction so joined made follows it there before trying the last kernel. On CUDA a kernel
/// names no more buffers than its launch can pass (448 pointers where arguments are limited
/// to 4 KiB).
/// Otherwise it starts a new kernel. A value that no other kernel reads and that is consumed in
/// the step that made it, or that is a per-outer scalar or a reduction result, stays in a
/// register; everything else is stored.
#include "braze/scheduler/Schedule.h"

#include "braze/ir/loop/Rewrite.h"
#include "braze/scheduler/LoopOrder.h"
#include "braze/scheduler/MemoryPlan.h"
#include "braze/support/Check.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace braze::sched {

namespace {

using loop::ExprKind;

std::vector<SymExpr> extentsOf(const std::vector<SymExpr> &vars) {
  std::vector<SymExpr> xs;
  for (SymExpr v : vars)
    xs.push_back(v->extent());
  return xs;
}

std::vector<SymExpr> concat(std::vector<SymExpr> a, const std::vector<SymExpr> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Where {
  int kernel = -1;
  int step = -1;
  bool inner = false;     ///< produced by a pointwise member of a Loop step
  bool reduction = false;
  SymExpr storeIndex = nullptr;
};

class Fuser {
public:
  /// On CUDA a kernel names at most as many buffers as its launch can pass: its pointers fill
  /// the argument space but 512 bytes, left to the error flag and the symbolic sizes (448
  /// pointers in 4 KiB). On the CPU there is no limit, and products may be grouped (GemmCall).
  Fuser(loop::LoopProgram &p, Schedule &s, const Target &target)
      : p_(p), s_(s), cudaParts_(target.kind == TargetKind::Cuda), sym_(p.sym()),
        groupedGemms_(true), maskedRows_(target.kind == TargetKind::Cuda),
        maxBuffers_(target.kind == TargetKind::Cuda
                        ? static_cast<size_t>((target.kernelArgBytes - 512) / 8)
                        : 0) {}

  void add(const Computation &c, bool fuse) {
    if (skipped_.count(c.id) || paired_.count(c.id))
      return;
    if (c.conv()) {
      // A convolution keeps a kernel to itself, like a matrix product.
      startKernel(c);
      s_.kernels.back().ext = ConvCall{&c};
      return;
    }
    if (c.attention()) {
      startAttentionKernel(c);
      return;
    }
    if (c.scatterAt()) {
      startScatterKernel(c);
      return;
    }
    std::optional<GemmCall> gemm = matchGemm(p_, c, groupedGemms_);
    if (gemm && !gemm->rowZero.empty() && !maskedRows_)
      gemm.reset(); // the CPU's grouped calls read A's rows in place: its loops compute it
    if (!gemm && fuse && joinsFarProducer(c))
      return;
    if (!gemm && fuse && !s_.kernels.empty() && !s_.kernels.back().standsAlone() &&
        tryJoin(static_cast<int>(s_.kernels.size()) - 1, c))
      return;
    if (!gemm && fuse && earlierKernel(c))
      return;
    startKernel(c);
    if (gemm) {
      // A matrix product keeps a kernel to itself, in the kernel's variables.
      Kernel &k = s_.kernels.back();
      std::unordered_map<SymExpr, SymExpr> map;
      for (size_t i = 0; i < c.vars.size(); ++i)
        map[c.vars[i]] = k.outerVars[i];
      for (SymExpr &v : gemm->batchVars)
        v = map.at(v);
      gemm->offA = sym_.substitute(gemm->offA, map);
      gemm->offB = sym_.substitute(gemm->offB, map);
      gemm->offC = sym_.substitute(gemm->offC, map);
      if (gemm->group) {
        gemm->group = loop::substituteIndices(p_, gemm->group, map);
        gemm->mVar = map.at(gemm->mVar);
      }
      if (gemm->rowOf)
        gemm->rowOf = loop::substituteIndices(p_, gemm->rowOf, map);
      for (GemmCall::RowMask &mask : gemm->rowZero)
        mask.cond = loop::substituteIndices(p_, mask.cond, map);
      if (auto it = bias_.find(c.id); it != bias_.end())
        gemm->bias = it->second;
      if (auto it = epilogues_.find(c.id); it != epilogues_.end())
        addEpilogue(k, *gemm, *it->second);
      k.ext = std::move(*gemm);
    }
  }

  const std::unordered_map<const Buffer *, Where> &producers() const { return where_; }
  void setGemmBias(std::map<int, const loop::Buffer *> bias) { bias_ = std::move(bias); }
  /// Computations that compute nothing (copies a product now writes itself).
  void skip(std::set<int> ids) { skipped_ = std::move(ids); }
  /// Paired epilogues (pairGemmEpilogues), by product id: each joins its product's kernel.
  void setGemmEpilogues(std::map<int, const Computation *> e) {
    epilogues_ = std::move(e);
    for (const auto &entry : epilogues_)
      paired_.insert(entry.second->id);
  }

private:
  SymExpr freshVar(const char *prefix, size_t i, SymExpr extent) {
    return sym_.indexSymbol(prefix + std::to_string(i), extent);
  }

  /// An empty kernel over c's space: outer variables for its vars, inner ones for its rvars.
  Kernel newKernel(const Computation &c) {
    Kernel k;
    k.name = "kernel" + std::to_string(s_.kernels.size());
    for (size_t i = 0; i < c.vars.size(); ++i)
      k.outerVars.push_back(freshVar("x", i, c.vars[i]->extent()));
    for (size_t i = 0; i < c.rvars.size(); ++i)
      k.innerVars.push_back(freshVar("y", i, c.rvars[i]->extent()));
    return k;
  }

  void startKernel(const Computation &c) {
    s_.kernels.push_back(newKernel(c));
    int ki = static_cast<int>(s_.kernels.size()) - 1;
    bool ok = tryJoin(ki, c);
    BRAZE_CHECK(ok) << "a computation must fit a kernel made for it";
  }

  /// A fused attention is a kernel of its own with one Scalar-step member that has no value:
  /// codegen writes the whole kernel from the spec. An output and its log-sum-exp from the same
  /// operands are one kernel, and so are the gradients of k and v (v's the second member); on
  /// CUDA q's gradient joins them as the third, and the kernel stands where the first of the
  /// three stands in program order.
  void startAttentionKernel(const Computation &c) {
    const Computation *main = &c, *gradQ = nullptr;
    if (cudaParts_ && c.attention()->part == loop::AttentionPart::GradQ)
      if (const Computation *gradK = gradientAfter(c, loop::AttentionPart::GradK);
          gradK && partBeside(*gradK))
        main = gradK, gradQ = &c;
    std::unordered_map<SymExpr, SymExpr> map;
    Kernel k = soloKernel(*main, map);
    SymExpr store = sym_.substitute(loop::storeIndex(sym_, *main), map);
    const Computation *v = partBeside(*main);
    if (v) {
      for (size_t i = 0; i < v->vars.size(); ++i) // v's output dims lead c's
        map[v->vars[i]] = k.outerVars[i];
      if (cudaParts_ && !gradQ && main->attention()->part == loop::AttentionPart::GradK)
        gradQ = gradientAfter(*main, loop::AttentionPart::GradQ);
    }
    k.ext = AttentionCall{main, v, gradQ};
    pushSolo(std::move(k), Member{main, nullptr, store, false});
    if (main != &c)
      paired_.insert(main->id);
    for (const Computation *part : {v, gradQ}) {
      if (!part)
        continue;
      Where w = where_[main->out];
      if (part == gradQ) // q's rows are not k's: variables of its own
        for (size_t i = 0; i < part->vars.size(); ++i)
          map[part->vars[i]] = freshVar("q", i, part->vars[i]->extent());
      w.storeIndex = sym_.substitute(loop::storeIndex(sym_, *part), map);
      s_.kernels.back().steps[0].members.push_back(Member{part, nullptr, w.storeIndex, false});
      where_[part->out] = w;
      paired_.insert(part->id);
    }
  }

  /// Whether attentions a and b read the same operands (the gradients' too, with `grads`).
  static bool sameOperands(const loop::AttentionSpec &a, const loop::AttentionSpec &b,
                           bool grads) {
    auto same = [](const loop::AttentionOperand &x, const loop::AttentionOperand &y) {
      return x.buffer == y.buffer && x.offset == y.offset && x.shape == y.shape &&
             x.strides == y.strides;
    };
    auto sameOptional = [&](const std::optional<loop::AttentionOperand> &x,
                            const std::optional<loop::AttentionOperand> &y) {
      return x.has_value() == y.has_value() && (!x || same(*x, *y));
    };
    return same(a.q, b.q) && same(a.k, b.k) && sameOptional(a.bias, b.bias) &&
           a.scale == b.scale && a.causal == b.causal &&
           (!grads || (same(a.v, b.v) && sameOptional(a.dout, b.dout) &&
                       sameOptional(a.out, b.out) && sameOptional(a.lse, b.lse) &&
                       a.dropout == b.dropout && sameOptional(a.seed, b.seed)));
  }

  /// The first attention part `part` after c in program order, from c's operands, that no
  /// kernel writes yet: for a gradient, one from the same gradient operands.
  const Computation *gradientAfter(const Computation &c, loop::AttentionPart part) {
    bool after = false;
    for (const auto &d : p_.computations()) {
      after |= d.get() == &c;
      if (after && d.get() != &c && d->attention() && !paired_.count(d->id) &&
          d->attention()->part == part && sameOperands(*c.attention(), *d->attention(), true))
        return d.get();
    }
    return nullptr;
  }

  /// The later attention part that c's kernel computes too, if there is one: for the
  /// gradient of k, the gradient of v from the same operands with an output of the same shape
  /// and layout; for the output, its log-sum-exp.
  const Computation *partBeside(const Computation &c) {
    const loop::AttentionSpec &a = *c.attention();
    bool grads = a.part == loop::AttentionPart::GradK;
    if (!grads && a.part != loop::AttentionPart::Output)
      return nullptr;
    bool after = false;
    for (const auto &d : p_.computations()) {
      after |= d.get() == &c;
      if (!after || !d->attention() || paired_.count(d->id) ||
          d->attention()->part !=
              (grads ? loop::AttentionPart::GradV : loop::AttentionPart::Lse))
        continue;
      if (!sameOperands(a, *d->attention(), grads))
        continue;
      if (!grads || !cudaParts_ ||
          (d->out->shape == c.out->shape && d->out->strides == c.out->strides &&
           d->out->dtype == c.out->dtype))
        return d.get();
    }
    return nullptr;
  }

  /// An accumulating scatter is a kernel of its own with one Scalar-step member over the
  /// source's space. The buffer's readers after it read memory: it is recorded as the
  /// buffer's producer, and no computation joins its kernel.
  void startScatterKernel(const Computation &c) {
    std::unordered_map<SymExpr, SymExpr> map;
    Kernel k = soloKernel(c, map);
    SymExpr point = sym_.constant(0); // the source point, row-major (no element of c.out)
    for (SymExpr v : k.outerVars)
      point = sym_.add(sym_.mul(point, v->extent()), v);
    k.ext = ScatterCall{&c, loop::substituteIndices(p_, c.scatterAt(), map)};
    pushSolo(std::move(k), Member{&c, loop::substituteIndices(p_, c.value, map), point, true});
  }

  /// A kernel over c's space, for c alone; `map` takes c's variables to the kernel's.
  Kernel soloKernel(const Computation &c, std::unordered_map<SymExpr, SymExpr> &map) {
    Kernel k = newKernel(c);
    for (size_t i = 0; i < c.vars.size(); ++i)
      map[c.vars[i]] = k.outerVars[i];
    return k;
  }

  /// Product kernel k computes d, its paired epilogue, as a second member over variables of
  /// d's own (d's columns are half the product's); d's buffer is then produced there.
  void addEpilogue(Kernel &k, GemmCall &g, const Computation &d) {
    std::unordered_map<SymExpr, SymExpr> map;
    for (size_t i = 0; i < d.vars.size(); ++i) {
      g.epilogueVars.push_back(freshVar("g", i, d.vars[i]->extent()));
      map[d.vars[i]] = g.epilogueVars.back();
    }
    g.epilogue = &d;
    Member m{&d, loop::substituteIndices(p_, d.value, map),
             sym_.substitute(loop::storeIndex(sym_, d), map), false};
    Where w;
    w.kernel = static_cast<int>(s_.kernels.size()) - 1;
    w.step = 0;
    w.storeIndex = m.storeIndex;
    where_[d.out] = w;
    k.steps[0].members.push_back(std::move(m));
  }

  /// Appends kernel k with `m` as its one Scalar-step member, the producer of m's buffer.
  void pushSolo(Kernel k, Member m) {
    const Buffer *out = m.comp->out;
    SymExpr store = m.storeIndex;
    k.steps.push_back(Step{StepKind::Scalar, {std::move(m)}, {}});
    s_.kernels.push_back(std::move(k));
    Where w;
    w.kernel = static_cast<int>(s_.kernels.size()) - 1;
    w.step = 0;
    w.storeIndex = store;
    where_[out] = w;
  }

  /// Maps c's variables onto kernel variables, or returns false if its space does not fit.
  /// `refine` is set when the kernel's outer space must first be split into outer ++ inner.
  bool mapVars(const Kernel &k, const Computation &c, std::unordered_map<SymExpr, SymExpr> &map,
               bool &inner, size_t &refineAt) {
    std::vector<SymExpr> O = extentsOf(k.outerVars), I = extentsOf(k.innerVars);
    std::vector<SymExpr> E = c.extents(), R = c.rextents();
    refineAt = SIZE_MAX;
    std::vector<SymExpr> outer = k.outerVars, innerVars = k.innerVars;
    if (c.isReduction()) {
      if (!I.empty()) {
        if (E != O || R != I)
          return false;
      } else if (E == O) {
        // Kernel with only scalar steps gains an inner space.
      } else if (concat(E, R) == O && onlyScalarSteps(k)) {
        refineAt = E.size();
        innerVars.assign(outer.begin() + E.size(), outer.end());
        outer.resize(E.size());
      } else {
        return false;
      }
      for (size_t i = 0; i < c.vars.size(); ++i)
        map[c.vars[i]] = outer[i];
      for (size_t i = 0; i < c.rvars.size(); ++i)
        map[c.rvars[i]] = innerVars.empty() ? nullptr : innerVars[i];
      inner = true;
      return true;
    }
    if (!I.empty() && E == concat(O, I)) {
      for (size_t i = 0; i < c.vars.size(); ++i)
        map[c.vars[i]] = i < O.size() ? k.outerVars[i] : k.innerVars[i - O.size()];
      inner = true;
      return true;
    }
    if (E == O) {
      for (size_t i = 0; i < c.vars.size(); ++i)
        map[c.vars[i]] = k.outerVars[i];
      inner = false;
      return true;
    }
    return false;
  }

  /// Joins c (pointwise, or a reduction over the kernel's own loops) to one of the kEarlier
  /// kernels before the last (the latest that takes it) where that keeps the program's order:
  /// every buffer c reads is an input or made by that kernel or one before it, and c's buffer
  /// was not written before (a scatter's accumulation into initial values stays in order). An
  /// in-place output's value is the only reader of its input (braze/mutations.py), so
  /// computing it earlier reorders no read of that memory.
  bool earlierKernel(const Computation &c) {
    constexpr int kEarlier = 32;
    if (where_.count(c.out))
      return false;
    int latest = latestProducer(c);
    int last = static_cast<int>(s_.kernels.size()) - 1;
    int low = std::max({latest, 0, last - kEarlier});
    for (int ki = last - 1; ki >= low; --ki)
      if (joinsEarlier(ki, c)) {
        if (c.isReduction())
          reachedBack_.insert(ki);
        return true;
      }
    // Further back than kEarlier kernels, a reduction joins a kernel that reads what it reads
    // over the same loops (a max pool's indices, which only the backward reads, come last in
    // program order but read the pooled image as the pool's values do). The pointwise values
    // that read what it makes follow it there (joinsFarProducer).
    if (!c.isReduction())
      return false;
    std::vector<int> far;
    loop::forEachLoad(c.value, [&](const Expr *ld) {
      if (auto it = readers_.find(ld->buffer()); it != readers_.end())
        for (int ki : it->second)
          if (ki >= std::max(latest, 0) && ki < low)
            far.push_back(ki);
    });
    std::sort(far.rbegin(), far.rend());
    far.erase(std::unique(far.begin(), far.end()), far.end());
    for (int ki : far)
      if (joinsEarlier(ki, c)) {
        reachedBack_.insert(ki);
        return true;
      }
    return false;
  }

  /// The last kernel that makes a buffer c reads; -1 when c reads only inputs.
  int latestProducer(const Computation &c) const {
    int latest = -1;
    loop::forEachLoad(c.value, [&](const Expr *ld) {
      if (auto it = where_.find(ld->buffer()); it != where_.end())
        latest = std::max(latest, it->second.kernel);
    });
    return latest;
  }

  /// A pointwise value that reads what a kernel joined from far back makes, and what kernels
  /// before that one make, joins it before any other kernel: there its operands are in
  /// registers (a max pool's index, computed from the argmax of its window).
  bool joinsFarProducer(const Computation &c) {
    if (c.isReduction() || reachedBack_.empty() || where_.count(c.out))
      return false;
    int latest = latestProducer(c);
    return latest >= 0 && reachedBack_.count(latest) &&
           latest != static_cast<int>(s_.kernels.size()) - 1 && joinsEarlier(latest, c);
  }

  bool joinsEarlier(int ki, const Computation &c) {
    return !s_.kernels[ki].standsAlone() && (!c.isReduction() || sameLoops(s_.kernels[ki], c)) &&
           tryJoin(ki, c); // never a refinement
  }

  /// Whether reduction c runs over k's loops as they are: its space k's outer loops and its
  /// reduced dims k's inner ones. A reduction joins an earlier kernel only so (a batch norm's
  /// two sums over one gradient), never refining that kernel or giving it inner loops.
  static bool sameLoops(const Kernel &k, const Computation &c) {
    return !k.innerVars.empty() && c.extents() == extentsOf(k.outerVars) &&
           c.rextents() == extentsOf(k.innerVars);
  }

  static bool onlyScalarSteps(const Kernel &k) {
    for (const Step &st : k.steps)
      if (st.kind != StepKind::Scalar)
        return false;
    return true;
  }

  bool tryJoin(int ki, const Computation &c) {
    Kernel &k = s_.kernels[ki];
    std::unordered_map<SymExpr, SymExpr> map;
    bool inner = false;
    size_t refineAt = SIZE_MAX;
    if (!mapVars(k, c, map, inner, refineAt))
      return false;
    std::vector<SymExpr> newInner;
    if (c.isReduction() && k.innerVars.empty() && refineAt == SIZE_MAX)
      for (size_t i = 0; i < c.rvars.size(); ++i) {
        newInner.push_back(freshVar("y", i, c.rvars[i]->extent()));
        map[c.rvars[i]] = newInner.back();
      }
    const Expr *value = loop::substituteIndices(p_, c.value, map);
    SymExpr store = sym_.substitute(loop::storeIndex(sym_, c), map);
    // After a refinement, members that were per-outer become per-inner-point.
    int lastStep = static_cast<int>(k.steps.size()) - 1;
    bool dependsOnLastStepReduction = false, legal = true;
    loop::forEachLoad(value, [&](const Expr *ld) {
      auto it = where_.find(ld->buffer());
      if (it == where_.end() || it->second.kernel != ki)
        return;
      const Where &w = it->second;
      if (!ld->indirect().empty() || ld->index() != w.storeIndex) {
        legal = false;
        return;
      }
      bool producerInner = w.inner || (refineAt != SIZE_MAX);
      if (producerInner && !inner)
        legal = false;
      if (w.reduction && w.step == lastStep)
        dependsOnLastStepReduction = true;
    });
    if (!legal)
      return false;
    std::vector<const Buffer *> named; // c's buffers the kernel does not name yet
    if (maxBuffers_ > 0) {
      if (kernelBuffers_.size() < s_.kernels.size())
        kernelBuffers_.resize(s_.kernels.size());
      const std::unordered_set<const Buffer *> &has = kernelBuffers_[ki];
      auto note = [&](const Buffer *b) {
        if (!has.count(b) && std::find(named.begin(), named.end(), b) == named.end())
          named.push_back(b);
      };
      loop::forEachBufferRead(c, c.value, note);
      note(c.out);
      if (!has.empty() && has.size() + named.size() > maxBuffers_)
        return false;
    }
    // Commit.
    if (maxBuffers_ > 0)
      kernelBuffers_[ki].insert(named.begin(), named.end());
    if (refineAt != SIZE_MAX) {
      k.innerVars.assign(k.outerVars.begin() + refineAt, k.outerVars.end());
      k.outerVars.resize(refineAt);
      Step merged{StepKind::Loop, {}, {}};
      for (Step &st : k.steps)
        for (Member &m : st.members)
          merged.members.push_back(m);
      k.steps = {merged};
      for (auto &[buf, w] : where_)
        if (w.kernel == ki) {
          w.step = 0;
          w.inner = true;
        }
      lastStep = 0;
      dependsOnLastStepReduction = false;
    }
    if (!newInner.empty())
      k.innerVars = newInner;
    StepKind kind = inner ? StepKind::Loop : StepKind::Scalar;
    bool append = !k.steps.empty() && k.steps.back().kind == kind &&
                  !(kind == StepKind::Loop && dependsOnLastStepReduction);
    if (!append)
      k.steps.push_back(Step{kind, {}, {}});
    k.steps.back().members.push_back(Member{&c, value, store, false});
    loop::forEachLoad(value, [&](const Expr *ld) {
      std::vector<int> &r = readers_[ld->buffer()];
      if (r.empty() || r.back() != ki)
        r.push_back(ki);
    });
    Where w;
    w.kernel = ki;
    w.step = static_cast<int>(k.steps.size()) - 1;
    w.inner = inner && !c.isReduction();
    w.reduction = c.isReduction();
    w.storeIndex = store;
    where_[c.out] = w;
    return true;
  }

  loop::LoopProgram &p_;
  Schedule &s_;
  std::map<int, const loop::Buffer *> bias_; ///< GEMM bias epilogues, by computation id
  std::set<int> skipped_;                     ///< computations that compute nothing
  /// CUDA's attention kernels: q's gradient joins k's and v's kernel, and a pair of gradients
  /// shares one store index (same shapes). The CPU's take pairs of any shapes.
  bool cudaParts_;
  std::set<int> paired_;                      ///< parts another part's kernel writes
  std::map<int, const Computation *> epilogues_; ///< paired epilogues by product id
  sym::SymContext &sym_;
  std::unordered_map<const Buffer *, Where> where_;
  bool groupedGemms_;
  bool maskedRows_; ///< a grouped product may have rows of zeros (GemmCall::rowZero)
  size_t maxBuffers_; ///< 0: no limit
  std::vector<std::unordered_set<const Buffer *>> kernelBuffers_; ///< by kernel, when limited
  /// The kernels whose members load each buffer (a kernel once, unless members joined it out
  /// of order), and the kernels a computation joined from further back than kEarlier.
  std::unordered_map<const Buffer *, std::vector<int>> readers_;
  std::set<int> reachedBack_;
};

/// Decides which members store to memory.
void decideStores(Schedule &s, const std::unordered_map<const Buffer *, Where> &where) {
  // Readers of each buffer: (kernel, step).
  std::unordered_map<const Buffer *, std::vector<std::pair<int, int>>> readers;
  for (size_t ki = 0; ki < s.kernels.size(); ++ki)
    for (size_t si = 0; si < s.kernels[ki].steps.size(); ++si)
      for (const Member &m : s.kernels[ki].steps[si].members)
        loop::forEachBufferRead(*m.comp, m.value, [&](const Buffer *b) {
          readers[b].push_back({static_cast<int>(ki), static_cast<int>(si)});
        });
  for (Kernel &k : s.kernels)
    for (Step &st : k.steps)
      for (Member &m : st.members) {
        const Buffer *b = m.comp->out;
        const Where &w = where.at(b);
        bool store = b->kind == loop::BufferKind::Output;
        for (auto [rk, rs] : readers[b])
          if (rk != w.kernel || (w.inner && rs != w.step))
            store = true;
        m.store = store;
      }
}

/// Operations cheap enough to compute twice rather than store and load.
bool cheapOp(loop::ScalarOpKind op) {
  using K = loop::ScalarOpKind;
  switch (op) {
  case K::Add:
  case K::Sub:
  case K::Mul:
  case K::Neg:
  case K::Abs:
  case K::Cast:
  case K::Maximum:
  case K::Minimum:
  case K::Where:
  case K::Eq:
  case K::Ne:
  case K::Lt:
  case K::Le:
  case K::Gt:
  case K::Ge:
    return true;
  default:
    return false;
  }
}

bool costly(const Expr *e) {
  if (e->kind() != ExprKind::Op)
    return false;
  if (!cheapOp(e->op()))
    return true;
  for (const Expr *o : e->operands())
    if (costly(o))
      return true;
  return false;
}

void collectSubexpressions(const Expr *e, std::unordered_set<const Expr *> &out) {
  if (!out.insert(e).second)
    return;
  for (const Expr *o : e->operands())
    collectSubexpressions(o, out);
}

/// The largest subexpression of e (pre-order) in `earlier` that is costly, of `dtype` and
/// reads at an inner point; null if none.
const Expr *largestShared(const Expr *e, const std::unordered_set<const Expr *> &earlier,
                          DType dtype, const std::vector<SymExpr> &innerVars) {
  if (e->kind() != ExprKind::Op)
    return nullptr;
  if (earlier.count(e) && e->dtype() == dtype && costly(e)) {
    bool inner = false;
    loop::forEachLoad(e, [&](const Expr *ld) {
      std::vector<SymExpr> syms;
      collectSymbols(ld->index(), syms);
      for (SymExpr v : syms)
        inner |= std::find(innerVars.begin(), innerVars.end(), v) != innerVars.end();
    });
    if (inner)
      return e;
  }
  for (const Expr *o : e->operands())
    if (const Expr *found = largestShared(o, earlier, dtype, innerVars))
      return found;
  return nullptr;
}

const Expr *replaceSubexpression(loop::LoopProgram &p, const Expr *e, const Expr *from,
                                 const Expr *to) {
  if (e == from)
    return to;
  if (e->kind() != ExprKind::Op)
    return e;
  std::vector<const Expr *> ops;
  bool changed = false;
  for (const Expr *o : e->operands()) {
    ops.push_back(replaceSubexpression(p, o, from, to));
    changed |= ops.back() != o;
  }
  return changed ? p.exprs().op(e->op(), ops, e->dtype()) : e;
}

/// CPU kernels: a later Loop step's output member whose value repeats a costly value of an
/// earlier Loop step reads it from a Stash instead (only outputs: they never share memory
/// with another buffer, so storing early clobbers nothing). Other threads own other outer
/// points, hence other store positions.
void stashRecomputedValues(Schedule &s) {
  for (Kernel &k : s.kernels) {
    std::unordered_set<const Expr *> earlier;
    for (size_t si = 0; si < k.steps.size(); ++si) {
      Step &st = k.steps[si];
      if (st.kind != StepKind::Loop)
        continue;
      if (!earlier.empty())
        for (Member &m : st.members) {
          const Buffer *b = m.comp->out;
          if (m.comp->isReduction() || !m.store || b->kind != loop::BufferKind::Output)
            continue;
          const Expr *shared = largestShared(m.value, earlier, b->dtype, k.innerVars);
          if (!shared)
            continue;
          for (size_t pi = 0; pi < si; ++pi) {
            Step &prev = k.steps[pi];
            std::unordered_set<const Expr *> mine;
            for (const Member &pm : prev.members)
              collectSubexpressions(pm.value, mine);
            if (prev.kind == StepKind::Loop && mine.count(shared)) {
              prev.stashes.push_back(Stash{shared, b, m.storeIndex});
              break;
            }
          }
          m.value = replaceSubexpression(*s.program, m.value, shared,
                                         s.program->exprs().load(b, m.storeIndex));
        }
      for (const Member &m : st.members)
        collectSubexpressions(m.value, earlier);
    }
  }
}

} // namespace

Schedule scheduleProgram(loop::LoopProgram &p, const Target &target, const ScheduleOptions &opts) {
  Schedule s;
  s.program = &p;
  s.target = target;
  Fuser fuser(p, s, target);
  if (target.kind == TargetKind::Cuda) {
    absorbGemmRounding(p);
    fuser.setGemmBias(absorbGemmBias(p));
    fuser.skip(forwardGemmCopies(p));
    if (opts.pairedEpilogues)
      fuser.setGemmEpilogues(pairGemmEpilogues(p, target.computeCapability));
  }
  for (const auto &c : p.computations())
    fuser.add(*c, opts.fuse);
  decideStores(s, fuser.producers());
  if (target.kind == TargetKind::Cpu) {
    stashRecomputedValues(s);
    flattenLoops(s, false);
  } else {
    // CUDA's neighbouring threads take neighbouring values of the innermost outer variable
    // (storeOrder): a result stored transposed (a saved activation returned as its
    // transpose) is then written, and its row-major source read, in memory order.
    flattenLoops(s, true);
  }
  planMemory(s);
  return s;
}

} // namespace braze::sched
