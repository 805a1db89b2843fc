/// The pooling family over the last s (1 to 3) dims, as index remaps and reductions.
///
/// Regular windows (max_pool, max_pool_indices, avg_pool): each pooled dim is padded and
/// unfolded, giving [.., O1..Os, k1..ks]; max and sum reduce the window dims. The index of a
/// maximum is arithmetic on the argmax a over the flattened window: tap t_i of dim i is
/// (a / (k_{i+1} * .. * k_s)) % k_i, at input position o_i * stride_i - padding_i + t_i *
/// dilation_i, and the flat index is row-major over the pooled dims.
///
/// Adaptive windows (adaptive_max_pool, adaptive_max_pool_indices, adaptive_avg_pool) vary in
/// length: output j of a dim of n elements pooled to o covers [floor(j n / o),
/// ceil((j + 1) n / o)). Each dim is taken through an i64 index [o, K] (K the longest window),
/// whose taps past a shorter window repeat its last element (max) or are masked to zero (sum).
///
/// max_pool_grad: input position h of a dim lies in the windows floor((h + p) / s) - j for
/// j < ceil(span / s) that exist; the gradient and the indices are taken through that [n, J]
/// candidate index per dim, and a position receives the gradients whose index names it.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

namespace braze::decomp {

namespace {
int64_t constOf(GraphBuilder &b, SymExpr e) {
  int64_t v = 0;
  b.sym().constValue(e, v);
  return v;
}

/// The window parameters of a regular pooling node, and the sizes it pools from and to. (Every
/// regular pooling op has max_pool's attributes.)
struct Geometry {
  IntList kernel, stride, padding, dilation, sizes, outs;
  int64_t spatial;
};

Geometry geometryOf(GraphBuilder &b, const Node *n, const Node *x, const Node *pooled) {
  const attrs::MaxPool a(*n);
  Geometry g{a.kernel(), a.stride(), a.padding(), a.dilation(), {}, {},
             static_cast<int64_t>(a.kernel().size())};
  for (int64_t i = 0; i < g.spatial; ++i) {
    g.sizes.push_back(constOf(b, x->shape()[x->rank() - g.spatial + i]));
    g.outs.push_back(constOf(b, pooled->shape()[pooled->rank() - g.spatial + i]));
  }
  return g;
}

/// x's windows as [.., O1..Os, k1..ks]: the declared padding is filled with `padValue`, the
/// extra right padding ceil mode needs with `extraValue`.
Node *windows(GraphBuilder &b, const Geometry &g, Node *x, double padValue, double extraValue) {
  int64_t r = x->rank();
  for (int64_t i = 0; i < g.spatial; ++i) {
    int64_t d = r - g.spatial + i, n = g.sizes[i], p = g.padding[i];
    int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    int64_t right = std::max<int64_t>(0, (g.outs[i] - 1) * g.stride[i] + span - (n + p));
    x = b.pad(x, d, p, p, padValue);
    x = b.pad(x, d, 0, right - std::min(right, p), extraValue);
    if (right < p) // the declared right padding is more than the windows reach
      x = b.slice(x, d, 0, n + p + right, 1);
    x = b.unfold(x, d, g.kernel[i], g.stride[i], g.dilation[i]);
  }
  return x;
}

/// The last `count` dims of x merged into one.
Node *flattenLast(GraphBuilder &b, Node *x, int64_t count) {
  std::vector<SymExpr> shape(x->shape().begin(), x->shape().end() - count);
  int64_t total = 1;
  for (int64_t i = x->rank() - count; i < x->rank(); ++i)
    total *= constOf(b, x->shape()[i]);
  shape.push_back(b.dim(total));
  return b.reshape(x, shape);
}

std::vector<int64_t> lastDims(int64_t rank, int64_t count) {
  std::vector<int64_t> dims;
  for (int64_t i = rank - count; i < rank; ++i)
    dims.push_back(i);
  return dims;
}

/// The flat input index (row-major over the pooled dims of `sizes`) of per-dim positions.
Node *flatIndex(GraphBuilder &b, const std::vector<Node *> &coords, const IntList &sizes) {
  Node *index = nullptr;
  int64_t stride = 1;
  for (size_t i = coords.size(); i-- > 0;) {
    Node *term = stride == 1 ? coords[i] : b.mul(coords[i], i64(b, stride));
    index = index ? b.add(index, term) : term;
    stride *= sizes[i];
  }
  return index;
}

/// The per-dim taps of a position `pos` in a flattened window of `taps` (row-major).
std::vector<Node *> splitTaps(GraphBuilder &b, Node *pos, const IntList &taps) {
  std::vector<Node *> out(taps.size());
  for (size_t i = taps.size(); i-- > 0;) {
    out[i] = i ? b.binary(OpKind::Remainder, pos, i64(b, taps[i])) : pos;
    if (i)
      pos = b.binary(OpKind::FloorDiv, pos, i64(b, taps[i]));
  }
  return out;
}

/// Integer division rounding toward zero (eager's integer average) of a by a positive b.
Node *truncDiv(GraphBuilder &b, Node *a, Node *d) {
  Node *q = b.binary(OpKind::FloorDiv, a, d);
  Node *inexact = b.binary(OpKind::Ne, b.binary(OpKind::Remainder, a, d), i64(b, 0));
  Node *negative = b.binary(OpKind::Lt, a, i64(b, 0));
  return b.where(b.binary(OpKind::LogicalAnd, inexact, negative), b.add(q, i64(b, 1)), q);
}

/// The shape of `rank` dims, all 1 but dim `at` of `size`.
std::vector<SymExpr> along(GraphBuilder &b, int64_t rank, int64_t at, int64_t size) {
  std::vector<SymExpr> shape(rank, b.dim(1));
  shape[at] = b.dim(size);
  return shape;
}
} // namespace

/// The tap a max pool's index names in flattened windows `w` whose first maximum is at `pos`.
/// Eager takes a NaN over anything and a later NaN over an earlier one (its test is
/// `v > max || isnan(v)`), where argmax keeps the first: the last NaN's tap, if any.
static Node *lastNanFirst(GraphBuilder &b, Node *w, Node *pos) {
  if (!isFloating(w->dtype()))
    return pos;
  Node *tap = b.iota(DType::Int64, w->shape(), w->rank() - 1);
  Node *nanTap = b.where(b.binary(OpKind::Ne, w, w), tap, i64(b, -1));
  Node *lastNan = b.reduce(OpKind::Amax, nanTap, {-1}, false);
  return b.where(b.binary(OpKind::Ge, lastNan, i64(b, 0)), lastNan, pos);
}

Node *decomposeMaxPool(GraphBuilder &b, Node *n) {
  Geometry g = geometryOf(b, n, n->operand(0), n);
  double lowest = lowestValue(n->dtype());
  // Over the flattened window, as max_pool_indices reduces it: a pool whose indices are kept
  // too (training) then reduces the same loops twice, and the two join one kernel.
  Node *w = flattenLast(b, windows(b, g, n->operand(0), lowest, lowest), g.spatial);
  return b.reduce(OpKind::Amax, w, {-1}, false);
}

Node *decomposeMaxPoolIndices(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  Geometry g = geometryOf(b, n, x, n);
  double lowest = lowestValue(x->dtype());
  Node *w = flattenLast(b, windows(b, g, x, lowest, lowest), g.spatial);
  Node *pos = b.reduce(OpKind::ArgMax, w, {-1}, false);
  pos = lastNanFirst(b, w, pos);
  std::vector<Node *> taps = splitTaps(b, pos, g.kernel), coords, firsts;
  int64_t r = n->rank();
  Node *outside = nullptr;
  for (int64_t i = 0; i < g.spatial; ++i) {
    Node *o = b.iota(DType::Int64, n->shape(), r - g.spatial + i);
    Node *start = b.sub(b.mul(o, i64(b, g.stride[i])), i64(b, g.padding[i]));
    Node *coord = b.add(start, b.mul(taps[i], i64(b, g.dilation[i])));
    Node *off = b.binary(OpKind::LogicalOr, b.binary(OpKind::Lt, coord, i64(b, 0)),
                         b.binary(OpKind::Ge, coord, i64(b, g.sizes[i])));
    outside = outside ? b.binary(OpKind::LogicalOr, outside, off) : off;
    // The window's first tap inside the input along this dim: start, or past the padding by
    // whole dilation steps, start + ceil(-start / dilation) * dilation.
    Node *skip = b.binary(OpKind::FloorDiv, b.sub(i64(b, g.dilation[i] - 1), start),
                          i64(b, g.dilation[i]));
    firsts.push_back(b.where(b.binary(OpKind::Lt, start, i64(b, 0)),
                             b.add(start, b.mul(skip, i64(b, g.dilation[i]))), start));
    coords.push_back(coord);
  }
  // A tap in the padding wins only where every tap inside ties with the padding's value (a
  // window of -inf): eager's index is then its first tap inside the input.
  for (int64_t i = 0; i < g.spatial; ++i)
    coords[i] = b.where(outside, firsts[i], coords[i]);
  return flatIndex(b, coords, g.sizes);
}

/// avg_pool(x) = sum(window) / divisor, where the divisor is the `divisor` attribute, or the
/// count of window positions inside the input (plus the declared padding with
/// count_include_pad). A window covers a box, so its count is the product of per-dim counts:
/// with start = o * stride - padding, [start, min(start + k, size + padding)) with the
/// padding counted, else that range clipped to [0, size).
Node *decomposeAvgPool(GraphBuilder &b, Node *n) {
  Node *x = n->operand(0);
  Geometry g = geometryOf(b, n, x, n);
  DType work = computeType(x->dtype());
  Node *w = windows(b, g, b.convert(x, work), 0.0, 0.0);
  Node *sum = b.reduce(OpKind::Sum, w, lastDims(w->rank(), g.spatial), false, work);
  const attrs::AvgPool a(*n);
  Node *count = nullptr;
  if (int64_t divisor = a.divisor())
    count = b.scalar(static_cast<double>(divisor), work);
  bool includePad = a.count_include_pad();
  for (int64_t i = 0; i < g.spatial && !a.divisor(); ++i) {
    Node *o = b.iota(DType::Int64, along(b, g.spatial, i, g.outs[i]), i);
    Node *start = b.sub(b.mul(o, i64(b, g.stride[i])), i64(b, g.padding[i]));
    Node *end = b.binary(OpKind::Minimum, b.add(start, i64(b, g.kernel[i])),
                         i64(b, g.sizes[i] + g.padding[i]));
    if (!includePad) {
      start = b.binary(OpKind::Maximum, start, i64(b, 0));
      end = b.binary(OpKind::Minimum, end, i64(b, g.sizes[i]));
    }
    Node *c = b.convert(b.sub(end, start), work);
    count = count ? b.mul(count, c) : c;
  }
  Node *avg = work == DType::Int64 ? truncDiv(b, sum, count) : b.div(sum, count);
  return b.convert(avg, n->dtype());
}

Node *decomposeMaxPoolGrad(GraphBuilder &b, Node *n) {
  Node *grad = n->operand(0), *x = n->operand(1), *ind = n->operand(2);
  Geometry g = geometryOf(b, n, x, grad);
  DType work = computeType(grad->dtype());
  Node *gw = b.convert(grad, work), *valid = nullptr;
  int64_t lead = x->rank() - g.spatial, s = g.spatial;
  for (int64_t i = 0; i < s; ++i) {
    int64_t d = lead + 2 * i, span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    int64_t taps = (span + g.stride[i] - 1) / g.stride[i];
    std::vector<SymExpr> shape{b.dim(g.sizes[i]), b.dim(taps)};
    Node *rows = b.iota(DType::Int64, shape, 0), *js = b.iota(DType::Int64, shape, 1);
    Node *cand = b.sub(
        b.binary(OpKind::FloorDiv, b.add(rows, i64(b, g.padding[i])), i64(b, g.stride[i])), js);
    Node *ok = b.binary(OpKind::LogicalAnd, b.binary(OpKind::Ge, cand, i64(b, 0)),
                        b.binary(OpKind::Lt, cand, i64(b, g.outs[i])));
    cand = b.binary(OpKind::Minimum, b.binary(OpKind::Maximum, cand, i64(b, 0)),
                    i64(b, g.outs[i] - 1));
    gw = b.take(gw, d, cand);
    ind = b.take(ind, d, cand);
    // ok as [n_i, J_i, 1, 1, ..] to broadcast into the [.., n1, J1, n2, J2, ..] layout.
    shape.resize(2 + 2 * (s - 1 - i), b.dim(1));
    Node *okb = b.reshape(ok, shape);
    valid = valid ? b.binary(OpKind::LogicalAnd, valid, okb) : okb;
  }
  std::vector<Node *> coords;
  for (int64_t i = 0; i < s; ++i)
    coords.push_back(b.iota(DType::Int64, along(b, 2 * s, 2 * i, g.sizes[i]), 2 * i));
  Node *hit = b.binary(OpKind::LogicalAnd, valid,
                       b.binary(OpKind::Eq, ind, flatIndex(b, coords, g.sizes)));
  Node *picked = b.where(hit, gw, b.scalar(0.0, work));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < s; ++i)
    dims.push_back(lead + 2 * i + 1);
  return b.convert(b.reduce(OpKind::Sum, picked, dims, false, work), grad->dtype());
}

namespace {
/// An adaptive pooling's per-dim windows.
struct Adaptive {
  IntList sizes, outs, taps; ///< taps: the longest window of each dim
  int64_t spatial;
};

/// `x` is the pooled input (the node's first operand, or a gradient's second). (Every adaptive
/// pooling op has adaptive_max_pool's attribute.)
Adaptive adaptiveOf(GraphBuilder &b, const Node *n, const Node *x) {
  Adaptive a{{}, attrs::AdaptiveMaxPool(*n).output_size(), {}, 0};
  a.spatial = static_cast<int64_t>(a.outs.size());
  for (int64_t i = 0; i < a.spatial; ++i) {
    int64_t size = constOf(b, x->shape()[x->rank() - a.spatial + i]), o = a.outs[i], k = 0;
    for (int64_t j = 0; j < o; ++j)
      k = std::max(k, ((j + 1) * size + o - 1) / o - j * size / o);
    a.sizes.push_back(size);
    a.taps.push_back(k);
  }
  return a;
}

/// Window starts floor(j n / o) and ends ceil((j + 1) n / o) of dim i over an i64 `rows`.
std::pair<Node *, Node *> bounds(GraphBuilder &b, const Adaptive &a, int64_t i, Node *rows) {
  Node *scaled = b.mul(rows, i64(b, a.sizes[i]));
  return {b.binary(OpKind::FloorDiv, scaled, i64(b, a.outs[i])),
          b.binary(OpKind::FloorDiv, b.add(scaled, i64(b, a.sizes[i] + a.outs[i] - 1)),
                   i64(b, a.outs[i]))};
}

/// x's adaptive windows as [.., O1..Os, K1..Ks]; with `fill`, taps past a window are `*fill`.
Node *adaptiveWindows(GraphBuilder &b, const Adaptive &a, Node *x,
                      std::optional<double> fill) {
  int64_t lead = x->rank() - a.spatial;
  for (int64_t i = 0; i < a.spatial; ++i) {
    int64_t d = lead + 2 * i;
    std::vector<SymExpr> shape{b.dim(a.outs[i]), b.dim(a.taps[i])};
    auto [start, end] = bounds(b, a, i, b.iota(DType::Int64, shape, 0));
    Node *pos = b.add(start, b.iota(DType::Int64, shape, 1));
    x = b.take(x, d, b.binary(OpKind::Minimum, pos, b.sub(end, i64(b, 1))));
    if (fill) {
      shape.resize(x->rank() - d, b.dim(1));
      Node *inside = b.reshape(b.binary(OpKind::Lt, pos, end), shape);
      x = b.where(inside, x, b.scalar(*fill, x->dtype()));
    }
  }
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < lead; ++i)
    perm.push_back(i);
  for (int64_t i = 0; i < a.spatial; ++i)
    perm.push_back(lead + 2 * i);
  for (int64_t i = 0; i < a.spatial; ++i)
    perm.push_back(lead + 2 * i + 1);
  return b.permute(x, perm);
}

/// Each window's element count along dim i, as [1.., O_i, 1..] over the s pooled dims.
Node *adaptiveCount(GraphBuilder &b, const Adaptive &a, int64_t i, DType dtype) {
  auto [start, end] =
      bounds(b, a, i, b.iota(DType::Int64, along(b, a.spatial, i, a.outs[i]), i));
  return b.convert(b.sub(end, start), dtype);
}

/// Eager's 3-d half-precision kernel adds a window's elements one at a time in the dtype
/// (each sum rounded) and divides by the depth, height and width counts in turn; windows of
/// more taps than this sum in f32 instead (within the dtype's tolerance of eager).
constexpr int64_t kMaxRoundedAdaptiveTaps = 512;
} // namespace

Node *decomposeAdaptiveMaxPool(GraphBuilder &b, Node *n) {
  Adaptive a = adaptiveOf(b, n, n->operand(0));
  Node *w = adaptiveWindows(b, a, n->operand(0), std::nullopt);
  return b.reduce(OpKind::Amax, w, lastDims(w->rank(), a.spatial), false);
}

/// The first maximum of a flattened window is a real tap (a repeated tap comes after the one
/// it repeats), at start_i(o_i) + t_i along each dim. The last NaN may be a repeat of a
/// window's last tap: the position is at most end_i - 1.
Node *decomposeAdaptiveMaxPoolIndices(GraphBuilder &b, Node *n) {
  Adaptive a = adaptiveOf(b, n, n->operand(0));
  Node *w = flattenLast(b, adaptiveWindows(b, a, n->operand(0), std::nullopt), a.spatial);
  std::vector<Node *> taps =
      splitTaps(b, lastNanFirst(b, w, b.reduce(OpKind::ArgMax, w, {-1}, false)), a.taps);
  std::vector<Node *> coords;
  for (int64_t i = 0; i < a.spatial; ++i) {
    Node *o = b.iota(DType::Int64, n->shape(), n->rank() - a.spatial + i);
    auto [start, end] = bounds(b, a, i, o);
    coords.push_back(
        b.binary(OpKind::Minimum, b.add(start, taps[i]), b.sub(end, i64(b, 1))));
  }
  return flatIndex(b, coords, a.sizes);
}

Node *decomposeAdaptiveAvgPool(GraphBuilder &b, Node *n) {
  Adaptive a = adaptiveOf(b, n, n->operand(0));
  Node *x = n->operand(0);
  DType t = x->dtype(), work = computeType(t);
  int64_t taps = 1;
  for (int64_t k : a.taps)
    taps *= k;
  if (a.spatial == 3 && work != t && taps <= kMaxRoundedAdaptiveTaps) {
    Node *w = flattenLast(b, adaptiveWindows(b, a, x, 0.0), a.spatial);
    Node *total = b.select(w, w->rank() - 1, 0);
    for (int64_t k = 1; k < taps; ++k)
      total = b.add(total, b.select(w, w->rank() - 1, k));
    for (int64_t i = 0; i < a.spatial; ++i)
      total = b.div(total, adaptiveCount(b, a, i, t));
    return total;
  }
  Node *w = adaptiveWindows(b, a, b.convert(x, work), 0.0);
  Node *sum = b.reduce(OpKind::Sum, w, lastDims(w->rank(), a.spatial), false, work);
  Node *count = nullptr;
  for (int64_t i = 0; i < a.spatial; ++i) {
    Node *c = adaptiveCount(b, a, i, work);
    count = count ? b.mul(count, c) : c;
  }
  return b.convert(b.div(sum, count), t);
}

/// Each pooled dim in turn: the gradient's output dim o_i becomes the input dim n_i through
/// the [n_i, o_i] matrix M[h, j] = (h in window j) / |window j| (an average spreads over its
/// window; a window's size is the product of its per-dim lengths).
Node *decomposeAdaptiveAvgPoolGrad(GraphBuilder &b, Node *n) {
  Node *grad = n->operand(0);
  Adaptive a = adaptiveOf(b, n, n->operand(1));
  DType work = computeType(grad->dtype());
  Node *t = b.convert(grad, work);
  int64_t lead = grad->rank() - a.spatial;
  for (int64_t i = 0; i < a.spatial; ++i) {
    int64_t d = lead + i, rest = a.spatial - 1 - i;
    std::vector<SymExpr> shape{b.dim(a.sizes[i]), b.dim(a.outs[i])};
    Node *h = b.iota(DType::Int64, shape, 0);
    auto [start, end] = bounds(b, a, i, b.iota(DType::Int64, shape, 1));
    Node *inside = b.binary(OpKind::LogicalAnd, b.binary(OpKind::Le, start, h),
                            b.binary(OpKind::Lt, h, end));
    Node *m = b.div(b.convert(inside, work), b.convert(b.sub(end, start), work));
    shape.resize(2 + rest, b.dim(1));
    Node *spread = b.mul(b.unsqueeze(t, d), b.reshape(m, shape)); // [.., n_i, o_i, ..]
    t = b.reduce(OpKind::Sum, spread, {d + 1}, false);
  }
  return b.convert(t, grad->dtype());
}

/// Input position p of a pooled plane receives sum_j (indices[j] == p ? grad[j] : 0) over the
/// plane's outputs j (a masked reduction over [.., P, O]).
Node *decomposeAdaptiveMaxPoolGrad(GraphBuilder &b, Node *n) {
  Node *grad = n->operand(0), *x = n->operand(1), *indices = n->operand(2);
  Adaptive a = adaptiveOf(b, n, x);
  DType work = computeType(grad->dtype());
  int64_t positions = 1, outputs = 1;
  for (int64_t i = 0; i < a.spatial; ++i) {
    positions *= a.sizes[i];
    outputs *= a.outs[i];
  }
  std::vector<SymExpr> flat(grad->shape().begin(), grad->shape().end() - a.spatial);
  flat.push_back(b.dim(outputs));
  Node *g = b.unsqueeze(b.reshape(b.convert(grad, work), flat), flat.size() - 1);
  Node *at = b.unsqueeze(b.reshape(indices, flat), flat.size() - 1); // [.., 1, O]
  Node *p = b.iota(DType::Int64, {b.dim(positions), b.dim(1)}, 0);
  Node *picked = b.where(b.binary(OpKind::Eq, at, p), g, b.scalar(0.0, work));
  Node *sums = b.reduce(OpKind::Sum, picked, {static_cast<int64_t>(flat.size())}, false);
  return b.convert(b.reshape(sums, x->shape()), grad->dtype());
}

} // namespace braze::decomp
