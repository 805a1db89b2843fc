#include "braze/lowering/realize/Realize.h"

#include "braze/ir/graph/OpAttrs.h"
#include "braze/lowering/to_loops/IndexMaps.h"
#include "braze/support/Check.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace braze {

namespace {

/// A library function of many instructions per element (sin, exp, erf, pow, ...): the
/// float-valued ops other than the few that are one instruction or a division. A division or
/// root in f64 counts: a GPU computes it by a sequence of dependent f64 steps (a batch norm's
/// one-pass statistics, mean = sum / n and the variance from f64 sums, computed again for
/// each element of a ResNet activation it normalizes took its kernel from memory-bound to
/// 1.6x Inductor's time), and a CPU's f64 divider is its slowest unit.
bool manyInstructions(const Node *n) {
  OpKind op = n->op();
  if (op == OpKind::Sqrt || op == OpKind::Rsqrt || op == OpKind::Reciprocal ||
      op == OpKind::Div)
    return n->dtype() == DType::Float64;
  if (op == OpKind::CopySign)
    return false;
  if (op == OpKind::Pow) // typed as its operands, a library call all the same
    return true;
#define BRAZE_ELEMENTWISE(E, arity, text, result)                              \
  if (op == OpKind::E)                                                         \
    return std::string_view(#result) == "float";
#include "braze/ir/types/ElementwiseOps.def"
  return false;
}

/// How many times each element of an operand of shape `in` is read by a value of shape
/// `out` that broadcasts it (the product of the extents it is broadcast along); 0 when a
/// size is symbolic.
int64_t broadcastFactor(const std::vector<SymExpr> &in, const std::vector<SymExpr> &out) {
  int64_t factor = 1;
  size_t lead = out.size() - in.size();
  for (size_t d = 0; d < out.size(); ++d) {
    if (d >= lead && !in[d - lead]->isConst(1))
      continue;
    if (!out[d]->isConst())
      return 0;
    factor *= out[d]->value();
  }
  return factor;
}

std::optional<int64_t> staticCount(const std::vector<SymExpr> &shape) {
  int64_t count = 1;
  for (SymExpr d : shape)
    if (!d->isConst() || __builtin_mul_overflow(count, d->value(), &count))
      return std::nullopt;
  return count;
}

/// The node a chain of views starts from (n itself when n is not a view).
Node *viewRoot(Node *n) {
  while (opCategory(n->op()) == OpCategoryKind::View)
    n = n->operand(0);
  return n;
}

/// A buffer a value reads: a stored node's, or (second = 1) a convolution's result before its
/// bias is added.
using BufferKey = std::pair<const Node *, int>;

/// What to-loops would make of a node: stored, or a body computed inside each reader.
struct State {
  bool stored = false;
  int cost = 0;         ///< ops in the body
  bool library = false; ///< the body calls a library function (manyInstructions)
  /// The body reads its own index as a value (iota, a concatenation's choice) or loads through
  /// an index (a take or gather inside it): a gather cannot bind its index into it.
  bool indexDependent = false;
  std::vector<BufferKey> reads; ///< buffers the body loads, sorted, each once

  void read(BufferKey k) {
    auto at = std::lower_bound(reads.begin(), reads.end(), k);
    if (at == reads.end() || *at != k)
      reads.insert(at, k);
  }

  void absorb(const State &x) {
    cost += x.cost;
    library |= x.library;
    indexDependent |= x.indexDependent;
    if (x.reads.empty())
      return;
    std::vector<BufferKey> both;
    both.reserve(reads.size() + x.reads.size());
    std::set_union(reads.begin(), reads.end(), x.reads.begin(), x.reads.end(),
                   std::back_inserter(both));
    reads = std::move(both);
  }
};

/// One walk over the graph in order, as to-loops lowers it, with the values in `needed` stored
/// as they are computed. It records what it stores and what readers need stored.
class Walk {
public:
  Walk(Graph &g, const RealizeOptions &opts, const std::unordered_set<const Node *> &needed,
       std::unordered_map<const Node *, bool> &strided)
      : g_(g), opts_(opts), s_(g.sym()), needed_(needed), strided_(strided) {
    for (const auto &n : g.nodes()) {
      order_[n.get()] = order_.size();
      for (Node *o : n->operands()) {
        ++users_[o];
        readers_[o].push_back(n.get());
      }
    }
    for (Node *o : g.outputs()) {
      ++users_[o];
      outputs_.insert(o);
    }
  }

  void run() {
    for (const auto &n : g_.nodes()) {
      Node *node = n.get();
      states_[node] = lower(node);
      // A computed output is stored into the output buffer, which later readers read.
      if (outputs_.count(node) && !readsStored(node, false))
        states_[node] = storedState(node);
      own_[node] = states_[node];
      if (!own_[node].stored && needed_.count(node)) {
        stored_.insert(node);
        states_[node] = storedState(node);
      }
    }
  }

  /// How to-loops stores n: where it is computed when it is shared (settle), else where it is
  /// first read when a reader needs it in memory, else not at all.
  Storage storage(const Node *n) const {
    if (shared_.count(n))
      return Storage::Stored;
    return stored_.count(n) ? Storage::StoredAtUse : Storage::Inline;
  }
  /// The values readers need stored: the ones they asked for, and the ones stored for some
  /// reader that others read in place through views.
  const std::unordered_set<const Node *> &needs() const { return needs_; }

private:
  State storedState(const Node *n) const {
    State s;
    s.stored = true;
    s.read({n, 0});
    return s;
  }

  State lazy(int cost) const {
    State s;
    s.cost = cost;
    return s;
  }

  /// n as readers see it now: stored, maybe because a reader needs it.
  const State &state(const Node *n) const { return states_.at(n); }
  /// n as its own rule leaves it, before any reader's need: what decides whether a reader
  /// needs it, so that a need holds from one walk to the next.
  const State &own(const Node *n) const { return own_.at(n); }

  /// Whether n is stored, or a chain of views of a stored value (its body is one load, with no
  /// arithmetic), as things stand: a value stored for a later reader is read by the views of
  /// it that came before, as to-loops' views read their operand when they are read. With
  /// `rely`, a value stored only because a reader needs it becomes needed by this reader too.
  bool readsStored(const Node *n, bool rely) {
    for (;; n = n->operand(0)) {
      if (state(n).stored) {
        if (rely && !own(n).stored)
          needs_.insert(n);
        return true;
      }
      if (opCategory(n->op()) != OpCategoryKind::View)
        return false;
    }
  }

  /// Whether a reader can read o in place: o is stored by its own rule, or views a stored value.
  bool inPlace(const Node *o) {
    if (own(o).stored)
      return true;
    return opCategory(o->op()) == OpCategoryKind::View && readsStored(o->operand(0), true);
  }

  /// The half value o widens to f32, where o is such a widening (not a graph output), else o:
  /// what to store of o for a reader that rereads it (half the bytes, widened as it is loaded;
  /// a product of it then reads a half operand, as a half GEMM's).
  Node *halfSource(Node *o) const {
    Node *x = o->op() == OpKind::Convert ? o->operand(0) : nullptr;
    return x && o->dtype() == DType::Float32 && isHalf(x->dtype()) && !outputs_.count(o) ? x : o;
  }

  /// A reader needs n stored: from now on, and in the next walk from n's computation on.
  void need(const Node *n) {
    if (own(n).stored)
      return;
    needs_.insert(n);
    if (states_.at(n).stored)
      return;
    stored_.insert(n);
    states_[n] = storedState(n);
  }

  /// Stores a value that is read by several readers and costly to recompute or reread, or
  /// whose body is too large to inline.
  State settle(const Node *n, State s) {
    bool shared = users_[n] > 1 && (s.cost > opts_.inlineCostLimit || rereadsMore(n, s));
    if (!shared && s.cost <= opts_.maxInlineOps)
      return s;
    shared_.insert(n);
    return storedState(n);
  }

  /// Whether n's readers, each computing n, would read more memory than n stored: `large`
  /// full-size operands read in each of n's passes, against one pass that reads them and
  /// writes n and each pass reading n once (ties store: the readers' operands then die
  /// sooner). So a value of two operands read in two passes (a ReLU's gradient read by a batch
  /// norm's sums and by its input gradient) is computed in both: 4 reads, not 2 + 1 + 2.
  bool rereadsMore(const Node *n, const State &s) {
    int large = largeReads(n, s);
    if (large <= opts_.maxSharedReads)
      return false;
    int p = passes(n);
    return large * p >= large + 1 + p;
  }

  /// The passes over memory that n's readers make: a reader that is an elementwise value read
  /// once (and not returned) counts as that value's reader; reductions over the same dims of
  /// values of one shape, none reading another, count once (fusion runs them in one kernel).
  int passes(const Node *n) {
    std::vector<const Node *> sinks;
    for (const Node *u : readers_[n]) {
      while (readers_[u].size() == 1 && !outputs_.count(u) &&
             (opCategory(u->op()) == OpCategoryKind::Elementwise ||
              opCategory(u->op()) == OpCategoryKind::Cast))
        u = readers_[u].front();
      bool joins = std::any_of(sinks.begin(), sinks.end(), [&](const Node *v) {
        return v == u || (sameReduction(u, v) && !dependsOn(u, v) && !dependsOn(v, u));
      });
      if (!joins)
        sinks.push_back(u);
    }
    return static_cast<int>(sinks.size());
  }

  /// Whether a and b are reductions over the same dims of values of one shape.
  static bool sameReduction(const Node *a, const Node *b) {
    return opCategory(a->op()) == OpCategoryKind::Reduce &&
           opCategory(b->op()) == OpCategoryKind::Reduce &&
           a->operand(0)->shape() == b->operand(0)->shape() &&
           attrs::Sum(*a).dims() == attrs::Sum(*b).dims();
  }

  /// Whether a reads b, directly or through other values: a search of a's operands that
  /// comes after b in the graph (nodes are in order), which gives up, answering yes, after
  /// kMaxVisits values.
  bool dependsOn(const Node *a, const Node *b) {
    constexpr size_t kMaxVisits = 4096;
    if (order_.at(a) < order_.at(b))
      return false;
    std::vector<const Node *> todo(a->operands().begin(), a->operands().end());
    std::unordered_set<const Node *> seen;
    while (!todo.empty()) {
      const Node *x = todo.back();
      todo.pop_back();
      if (x == b || seen.size() >= kMaxVisits)
        return true;
      if (order_.at(x) < order_.at(b) || !seen.insert(x).second)
        continue;
      todo.insert(todo.end(), x->operands().begin(), x->operands().end());
    }
    return false;
  }

  /// The buffers s reads that hold at least as many elements as n (its full-size operands; a
  /// broadcast bias or a gathered row's indices are not counted).
  int largeReads(const Node *n, const State &s) {
    int large = 0;
    for (const BufferKey &k : s.reads)
      large += atLeastAsLarge(k.first, n);
    return large;
  }

  /// Whether a holds at least as many elements as b (provably, when a size is symbolic).
  bool atLeastAsLarge(const Node *a, const Node *b) {
    std::optional<int64_t> x = staticCount(a->shape()), y = staticCount(b->shape());
    if (x && y)
      return *x >= *y;
    SymExpr ea = s_.product(a->shape()), eb = s_.product(b->shape());
    return ea == eb || s_.provablyNonNegative(s_.sub(ea, eb));
  }

  State lower(Node *n) {
    switch (opCategory(n->op())) {
    case OpCategoryKind::Input:
    case OpCategoryKind::Reduce:
      return storedState(n);
    case OpCategoryKind::Full:
      return lazy(0);
    case OpCategoryKind::Iota: {
      State s = lazy(1);
      s.indexDependent = true;
      return s;
    }
    case OpCategoryKind::Numel:
      return lazy(1);
    case OpCategoryKind::Elementwise:
      return elementwise(n);
    case OpCategoryKind::Cast: {
      State s = lazy(1);
      s.absorb(state(n->operand(0)));
      return settle(n, std::move(s));
    }
    case OpCategoryKind::View:
      return view(n);
    case OpCategoryKind::Gather:
      return n->op() == OpKind::Take ? take(n) : gather(n);
    case OpCategoryKind::Concat: {
      State s = lazy(0);
      for (Node *o : n->operands()) {
        s.absorb(state(o));
        s.cost += 2;
      }
      s.indexDependent = true;
      return settle(n, std::move(s));
    }
    case OpCategoryKind::MatMul:
      for (Node *o : matMulSources(n, opts_.widenedHalfMatMul))
        if (inPlace(o))
          continue;
        else if (Node *x = reshapedSharedValue(o))
          need(x);
        else if (Node *x = largerViewedValue(o))
          need(x);
        else
          need(o);
      return storedState(n);
    case OpCategoryKind::Composite: // undecomposed (braze-opt --passes=realize alone): stored
      return storedState(n);
    case OpCategoryKind::Extern:
      if (n->op() == OpKind::Convolution || n->op() == OpKind::ConvWeightGrad ||
          n->op() == OpKind::ConvInputGrad)
        return convolution(n);
      if (isAttentionFamily(n->op()))
        attention(n);
      return storedState(n);
    }
    BRAZE_UNREACHABLE("bad category");
  }

  State elementwise(Node *n) {
    // A broadcast operand is computed again for each element that reads it: stored when its
    // body calls a library function, or when it is a graph output (through views) and so in
    // memory anyway (a train-mode batch norm's mean and inverse deviation, saved for the
    // backward and read by the normalization of every element).
    for (Node *o : n->operands()) {
      const State &x = own(o);
      if (broadcastFactor(o->shape(), n->shape()) >= opts_.storedBroadcast && !x.stored &&
          x.cost > 0 && (x.library || viewedAsOutput(o)))
        need(halfSource(o));
    }
    State s = lazy(1);
    for (Node *o : n->operands())
      s.absorb(state(o));
    s.library |= manyInstructions(n);
    if (computeType(n->dtype()) != n->dtype())
      s.cost += 2; // the result rounded to its half dtype
    return settle(n, std::move(s));
  }

  /// Whether n, or a view of it (through views only), is a graph output.
  bool viewedAsOutput(const Node *n) const {
    if (outputs_.count(n))
      return true;
    auto readers = readers_.find(n);
    if (readers == readers_.end())
      return false;
    for (const Node *r : readers->second)
      if (opCategory(r->op()) == OpCategoryKind::View && viewedAsOutput(r))
        return true;
    return false;
  }

  State view(Node *n) {
    Node *x = n->operand(0);
    if (n->op() == OpKind::Expand)
      storeBroadcastGather(n);
    // Overlapping windows read each element several times: a costly computed operand (the
    // batch norm and relu before a max pool) is stored once rather than recomputed per read.
    if (n->op() == OpKind::Unfold && attrs::Unfold(*n).size() > attrs::Unfold(*n).step() &&
        own(x).cost > opts_.inlineCostLimit)
      need(x);
    State s = state(x);
    s.stored = false;
    return s;
  }

  /// A broadcast n of a view that reads its stored root at an index that is not affine (the
  /// flat view of top-k's chosen experts, sliced from a wider buffer: a floor division and a
  /// remainder per element) repeats that arithmetic and gather on every read: at
  /// `storedBroadcast` or more reads per element (a sort's rank counts read every key once per
  /// key), the lowest such view of the broadcast's element count is stored, densely, and read
  /// through plain loads.
  void storeBroadcastGather(Node *n) {
    Node *x = n->operand(0), *root = viewRoot(x);
    const std::optional<int64_t> count = staticCount(x->shape());
    if (root == x || !own(root).stored || !count ||
        broadcastFactor(x->shape(), n->shape()) < opts_.storedBroadcast)
      return;
    Node *pick = nullptr;
    for (Node *v = x; v != root && staticCount(v->shape()) == count; v = v->operand(0)) {
      if (stridedView(v, root, /*unitLast=*/false))
        break;
      pick = v;
    }
    if (pick)
      need(pick);
  }

  /// Whether take n computes its source's elements where it takes them, leaving the source
  /// unstored: a cheap computed value (no library call) read by n alone, through one index
  /// tensor, that n takes no more elements of than it has (a permutation's inverse: the expert
  /// outputs of a mixture of experts, weighted in expert order and taken back in token order).
  /// Its own loads through indices nest (to-loops binds the take's index inside them).
  bool computedAtTaken(Node *n) {
    Node *xn = n->operand(0);
    const State &x = own(xn);
    const std::optional<int64_t> taken = staticCount(n->shape()), source = staticCount(xn->shape());
    return n->operands().size() == 2 && !x.stored && !x.library && users_[xn] == 1 &&
           !outputs_.count(xn) && x.cost <= opts_.inlineCostLimit &&
           opCategory(xn->op()) != OpCategoryKind::View && taken && source && *taken <= *source;
  }

  /// A take loads its source through indices: the source is in memory, where it is (a view of
  /// a stored value, such as experts' weights read transposed, with takeViewsInPlace or
  /// takeMatrixViewsInPlace) or stored.
  State take(Node *n) {
    Node *xn = n->operand(0);
    State s = lazy(4 * static_cast<int>(n->operands().size() - 1));
    size_t gathered = n->operands().size() - 1, dim = attrs::Take(*n).dim();
    bool matrices = static_cast<size_t>(xn->rank()) >= dim + gathered + 2; // each index picks a whole matrix
    bool viewInPlace = (opts_.takeViewsInPlace || (opts_.takeMatrixViewsInPlace && matrices) ||
                        reshapesRows(xn)) &&
                       opCategory(xn->op()) == OpCategoryKind::View && !own(xn).stored &&
                       inPlace(xn);
    if (viewInPlace || computedAtTaken(n)) {
      s.absorb(state(xn));
    } else {
      need(xn);
      s.read({xn, 0});
    }
    for (size_t i = 1; i < n->operands().size(); ++i)
      s.absorb(state(n->operand(i)));
    s.indexDependent = true;
    return settle(n, std::move(s));
  }

  /// Whether view o only reshapes a value that is stored, or that a reader stores, into rows
  /// that lie in it as they are (a mixture of experts' normalized tokens, [B, S, H] viewed as
  /// [B * S, H], stored for the router's product and gathered per expert): a take reads the
  /// rows in place, as coalesced as from a copy, where storing the view would be a second
  /// copy, computed in the view's shape apart from its producer's kernel.
  bool reshapesRows(Node *o) {
    Node *root = o;
    while (root->op() == OpKind::Reshape)
      root = root->operand(0);
    return root != o && opCategory(root->op()) != OpCategoryKind::View && state(root).stored &&
           stridedViewOfStored(o, root);
  }

  /// A gather computes a cheap value read nowhere else (log_softmax feeding nll_loss), or a
  /// view of a stored one, at the gathered positions only; any other source is stored.
  State gather(Node *n) {
    Node *xn = n->operand(0);
    const State &x = own(xn);
    bool computed = !x.stored && (inPlace(xn) || (users_[xn] == 1 &&
                                                  x.cost <= opts_.inlineCostLimit &&
                                                  !x.indexDependent));
    State s = lazy(1);
    s.absorb(state(n->operand(1)));
    if (computed) {
      s.absorb(state(xn));
    } else {
      need(xn);
      s.read({xn, 0});
    }
    s.indexDependent = true;
    return settle(n, std::move(s));
  }

  /// An operand a library reads in memory: a stored value or a view of one is read in place
  /// (to-loops copies one whose layout the library cannot take); a computed one is stored.
  void inPlaceOrStored(Node *o) {
    if (!inPlace(o))
      need(o);
  }

  /// The computed value o reshapes (through reshapes only) when others read it too (the q, k
  /// and v gradients joined by a cat, read by both of a projection's gradient products through
  /// two reshapes): stored once, the product reads it through the reshape in place.
  Node *reshapedSharedValue(Node *o) {
    Node *x = o;
    while (x->op() == OpKind::Reshape)
      x = x->operand(0);
    return x != o && !own(x).stored && users_[x] > 1 && !outputs_.count(x) ? x : nullptr;
  }

  /// The computed value o is a strided view of when o reads each of its elements at least
  /// once (a weight converted to half precision, transposed and expanded over a batch of rows):
  /// stored once, the product reads it through the view in place (a GEMM takes either of the
  /// last two strides as the unit one, and any batch stride), where storing o would write a
  /// copy per batch.
  Node *largerViewedValue(Node *o) {
    Node *root = viewRoot(o);
    if (root == o || own(root).stored || !atLeastAsLarge(o, root) || storedInChain(o, root))
      return nullptr;
    return stridedView(o, root, /*unitLast=*/false) ? root : nullptr;
  }

  /// A convolution reads its input and weight in memory; a weight gradient its input and the
  /// output gradient (images both, like the input); an input gradient the output gradient
  /// (an image) and the weight.
  State convolution(Node *n) {
    bool weightGrad = n->op() == OpKind::ConvWeightGrad;
    Node *x = n->operand(0), *w = n->operand(1);
    if (!(opts_.channelsLast && x->rank() == 4)) { // a channels-last image is copied anyway
      need(x);
      if (weightGrad)
        need(w);
    }
    if (!weightGrad)
      need(w);
    if (n->op() != OpKind::Convolution || !attrs::Convolution(*n).bias())
      return storedState(n);
    State s = lazy(1);
    s.absorb(state(n->operand(2)));
    s.read({n, 1});
    return settle(n, std::move(s));
  }

  void attention(Node *n) {
    bool grad = n->op() == OpKind::AttentionGrad, lse = n->op() == OpKind::AttentionLse;
    std::vector<Node *> operands{n->operand(grad), n->operand(grad + 1)};
    if (!lse)
      operands.push_back(n->operand(grad + 2));
    // A bias broadcast over batch and heads (expanded as memory-efficient attention's mask is)
    // stores its source once and is read through zero strides.
    if (attrs::AttentionLse(*n).bias()) // attention, _lse or _grad
      operands.push_back(n->operands().back());
    storeViewedRoots(operands);
    if (grad)
      for (size_t i : {0, 4, 5})
        operands.push_back(n->operand(i));
    for (Node *o : operands)
      inPlaceOrStored(o);
  }

  /// Stores each computed value that attention operands are views of, where that costs no
  /// more than storing the views that are not graph outputs: q, k and v sliced out of one
  /// projection with its bias are then read in place from the projection (whose bias the
  /// scheduler gives the product's epilogue) instead of being copied out one by one.
  void storeViewedRoots(const std::vector<Node *> &operands) {
    struct Viewed {
      Node *root;
      int64_t elements; ///< viewed by the operands
      bool known;       ///< every viewing operand has a static shape
    };
    std::vector<Viewed> viewed; // in operand order
    for (Node *o : operands) {
      Node *root = viewRoot(o);
      // A graph output (a returned K/V cache) is stored anyway, and read in place.
      if (root == o || outputs_.count(o) || own(root).stored || own(o).stored ||
          !stridedViewOfStored(o, root))
        continue;
      auto it = std::find_if(viewed.begin(), viewed.end(),
                             [root](const Viewed &v) { return v.root == root; });
      if (it == viewed.end())
        it = viewed.insert(viewed.end(), {root, 0, true});
      std::optional<int64_t> count = staticCount(o->shape());
      it->known &=
          count.has_value() && !__builtin_add_overflow(it->elements, *count, &it->elements);
    }
    for (const Viewed &v : viewed) {
      std::optional<int64_t> size = staticCount(v.root->shape());
      if (v.known && size && *size <= v.elements)
        need(v.root);
    }
  }

  /// Whether o, a chain of views of root, would be a strided view with a unit last stride
  /// were root stored row-major (a reshape that splits the heads of an expanded K/V is not).
  bool stridedViewOfStored(Node *o, Node *root) {
    if (storedInChain(o, root)) // read as it is stored
      return false;
    auto [at, fresh] = strided_.try_emplace(o, false);
    if (fresh)
      at->second = stridedView(o, root, /*unitLast=*/true);
    return at->second;
  }

  /// Whether a view in the chain from o down to root (root excluded) is stored by its own rule.
  bool storedInChain(Node *o, Node *root) {
    for (Node *v = o; v != root; v = v->operand(0))
      if (own(v).stored)
        return true;
    return false;
  }

  /// The index arithmetic of stridedViewOfStored, which no walk changes: whether o reads root
  /// stored row-major at an affine index, its last stride 1 if `unitLast`.
  bool stridedView(Node *o, Node *root, bool unitLast) {
    Index full;
    std::vector<SymExpr> vars;
    for (SymExpr e : o->shape()) {
      if (e->isConst(1)) {
        full.push_back(s_.constant(0));
        continue;
      }
      vars.push_back(s_.indexSymbol("a" + std::to_string(vars.size()), e));
      full.push_back(vars.back());
    }
    Index idx = full;
    for (Node *v = o; v != root; v = v->operand(0))
      idx = viewOperandIndex(s_, *v, idx);
    SymExpr at = linearIndex(s_, idx, contiguousStrides(s_, root->shape()));
    std::optional<sym::AffineForm> form = sym::affineIn(s_, at, vars);
    return form && (!unitLast || vars.empty() || full.back() != vars.back() ||
                    form->coef.back()->isConst(1));
  }

  Graph &g_;
  const RealizeOptions &opts_;
  sym::SymContext &s_;
  const std::unordered_set<const Node *> &needed_;
  std::unordered_map<const Node *, bool> &strided_; ///< stridedView's answers, by view
  std::unordered_map<const Node *, State> states_, own_;
  std::unordered_map<const Node *, int> users_;
  std::unordered_map<const Node *, std::vector<const Node *>> readers_; ///< by operand, in order
  std::unordered_map<const Node *, size_t> order_;                       ///< position in g
  std::unordered_set<const Node *> outputs_, shared_, stored_, needs_;
};

} // namespace

std::array<Node *, 2> matMulSources(Node *n, bool widenedHalfMatMul) {
  std::array<Node *, 2> src{n->operand(0), n->operand(1)};
  auto widened = [](Node *o) {
    return o->op() == OpKind::Convert && o->dtype() == DType::Float32 &&
                   computeType(o->operand(0)->dtype()) == DType::Float32 &&
                   o->operand(0)->dtype() != DType::Float32 && isFloating(o->operand(0)->dtype())
               ? o->operand(0)
               : nullptr;
  };
  if (Node *wa = widened(src[0]), *wb = widened(src[1]);
      widenedHalfMatMul && wa && wb && wa->dtype() == wb->dtype())
    src = {wa, wb};
  return src;
}

void realize(Graph &g, const RealizeOptions &opts) {
  // Each walk stores what the previous one found needed; a need found late (a reader near the
  // end) then holds for every reader, and a store no reader relies on any more is dropped.
  // Should the needs not settle, they only grow from then on, which must end.
  constexpr int kExactWalks = 8;
  std::unordered_set<const Node *> needed;
  std::unordered_map<const Node *, bool> strided;
  for (int walks = 1;; ++walks) {
    Walk walk(g, opts, needed, strided);
    walk.run();
    std::unordered_set<const Node *> next = walk.needs();
    if (walks > kExactWalks)
      next.insert(needed.begin(), needed.end());
    if (next != needed) {
      needed = std::move(next);
      continue;
    }
    for (const auto &n : g.nodes())
      g.setStorage(n.get(), walk.storage(n.get()));
    break;
  }
  g.setRealized(true);
}

} // namespace braze
