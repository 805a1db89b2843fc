/// grid_sample(x [N, C, *S], grid [N, *O, s]) -> [N, C, *O]: PyTorch's grid sampler, as
/// coordinate arithmetic and gathers.
///
/// 1. Grid entry i (x, y, z) addresses spatial dim s - 1 - i, of n elements: g in [-1, 1]
///    becomes the position p = (g + 1) / 2 * (n - 1) with align_corners (-1 and 1 are the
///    corner elements' centers), else p = ((g + 1) n - 1) / 2 (they are the outer edges).
/// 2. The padding mode maps a position into the input: border clips it to [0, n - 1];
///    reflection reflects it off the edges (the corner centers [0, n - 1] with align_corners,
///    else the outer edges [-1/2, n - 1/2]) as |p - low| folded by fmod and floor into the
///    span, then clips it; zeros leaves it, and a tap outside the input reads 0.
/// 3. nearest reads the tap at round(p) (ties to even). bilinear (trilinear in 3-d) reads the
///    2^s taps floor(p) + {0, 1}, each weighed by the product over the entries (x first) of
///    floor(p) + 1 - p for the lower tap and p - floor(p) for the upper, and adds them corner
///    by corner with x varying fastest. bicubic (2-d) reads the 4 x 4 taps floor(p) + {-1, 0,
///    1, 2}, padding each tap's position on its own (the point itself is not padded), weighs
///    them with cubic convolution (A = -0.75) of t = p - floor(p):
///      W(d) = ((A + 2) d - (A + 3)) d d + 1          for the taps at distance d = t, 1 - t,
///      W(d) = ((A d - 5 A) d + 8 A) d - 4 A          for the taps at distance d = t + 1, 2 - t,
///    sums each row over x and then the rows over y.
/// 4. A tap is read from x flattened to [N, C, P] by a gather at the flat index of its
///    position clamped into the input; a tap outside the input is masked to 0.
///
/// Half precision is computed in the dtype, rounding after every operation, on the CPU
/// (DecomposeOptions::cpuHalfRounding: eager's CPU kernels), else in f32 and rounded once (its
/// CUDA kernels); the operations come in eager's order.
#include "braze/lowering/decompose/Decompose.h"

#include "braze/ir/graph/OpAttrs.h"

#include <array>

namespace braze::decomp {

namespace {
/// Builds one grid_sample node's replacement: positions from grid entries, padding, reads.
class Sampler {
public:
  /// `x` is n's input in the work dtype.
  Sampler(GraphBuilder &b, Node *n, Node *x) : b_(b), work_(x->dtype()) {
    const attrs::GridSample a(*n);
    padding_ = a.padding_mode();
    alignCorners_ = a.align_corners();
    spatial_ = x->rank() - 2;
    int64_t inputs = 1;
    for (int64_t d = 0; d < spatial_; ++d) {
      sizes_.push_back(x->shape()[2 + d]->value());
      inputs *= sizes_.back();
    }
    for (int64_t i = 0; i < spatial_; ++i)
      points_ *= n->shape()[2 + i]->value();
    shape_ = n->shape();
    flat_ = b_.reshape(x, {shape_[0], shape_[1], b_.dim(inputs)});
  }

  /// The size of the input dim that grid entry i addresses.
  int64_t sizeOf(int64_t entry) const { return sizes_[spatial_ - 1 - entry]; }

  Node *constant(double v) { return b_.scalar(v, work_); }

  /// Grid entry in [-1, 1] -> position in a dim of n elements.
  Node *unnormalize(Node *g, int64_t n) {
    Node *one = constant(1);
    Node *shifted = b_.add(g, one);
    if (alignCorners_) {
      Node *half = b_.div(shifted, constant(2));
      return b_.mul(half, constant(static_cast<double>(n - 1)));
    }
    Node *scaled = b_.mul(shifted, constant(static_cast<double>(n)));
    Node *centered = b_.sub(scaled, one);
    return b_.div(centered, constant(2));
  }

  /// A position mapped into a dim of n elements by the padding mode.
  Node *pad(Node *p, int64_t n) {
    switch (padding_) {
    case attrs::GridSamplePadding::Zeros:
      return p;
    case attrs::GridSamplePadding::Border:
      return clip(p, n);
    case attrs::GridSamplePadding::Reflection:
      p = alignCorners_ ? reflect(p, 0, 2.0 * static_cast<double>(n - 1))
                        : reflect(p, -1, 2.0 * static_cast<double>(n) - 1);
      return clip(p, n);
    }
    return p;
  }

  /// The input values at integer positions (i64 [N, *O], one per grid entry, x first):
  /// [N, C, *O], 0 where a position lies outside the input.
  Node *read(const std::vector<Node *> &positions) {
    Node *valid = nullptr, *flat = nullptr;
    for (int64_t d = 0; d < spatial_; ++d) {
      Node *p = positions[spatial_ - 1 - d];
      int64_t n = sizes_[d];
      Node *above = b_.binary(OpKind::Ge, p, index(0));
      Node *ok = b_.binary(OpKind::LogicalAnd, above, b_.binary(OpKind::Lt, p, index(n)));
      valid = valid ? b_.binary(OpKind::LogicalAnd, valid, ok) : ok;
      Node *low = b_.binary(OpKind::Maximum, p, index(0));
      p = b_.binary(OpKind::Minimum, low, index(n - 1));
      flat = flat ? b_.add(b_.mul(flat, index(n)), p) : p;
    }
    Node *at = b_.reshape(flat, {shape_[0], b_.dim(1), b_.dim(points_)});
    at = b_.expand(at, {shape_[0], shape_[1], b_.dim(points_)});
    Node *values = b_.reshape(b_.gather(flat_, 2, at), shape_);
    Node *mask = b_.unsqueeze(valid, 1);
    return b_.where(mask, values, b_.scalar(0.0, work_));
  }

  /// The weights of the four bicubic taps at floor - 1 .. floor + 2 for t = p - floor(p).
  std::array<Node *, 4> cubicCoefficients(Node *t) {
    Node *rest = b_.sub(constant(1), t);
    Node *farLow = far(b_.add(t, constant(1)));
    Node *nearLow = near(t);
    Node *nearHigh = near(rest);
    Node *farHigh = far(b_.add(rest, constant(1)));
    return {farLow, nearLow, nearHigh, farHigh};
  }

private:
  static constexpr double kCubicA = -0.75;

  Node *index(int64_t v) { return b_.scalar(static_cast<double>(v), DType::Int64); }

  Node *clip(Node *p, int64_t n) {
    Node *low = b_.binary(OpKind::Maximum, p, constant(0));
    return b_.binary(OpKind::Minimum, low, constant(static_cast<double>(n - 1)));
  }

  /// p reflected into [twiceLow / 2, twiceHigh / 2] off the interval's edges.
  Node *reflect(Node *p, double twiceLow, double twiceHigh) {
    if (twiceLow == twiceHigh)
      return b_.mul(p, constant(0));
    double low = twiceLow / 2, span = (twiceHigh - twiceLow) / 2;
    Node *dist = b_.unary(OpKind::Abs, b_.sub(p, constant(low)));
    Node *extra = b_.binary(OpKind::Fmod, dist, constant(span));
    Node *flips = b_.unary(OpKind::Floor, b_.div(dist, constant(span)));
    Node *parity = b_.binary(OpKind::Fmod, flips, constant(2));
    Node *even = b_.binary(OpKind::Eq, parity, constant(0));
    Node *forward = b_.add(extra, constant(low));
    Node *mirrored = b_.sub(constant(span), extra);
    Node *back = b_.add(mirrored, constant(low));
    return b_.where(even, forward, back);
  }

  /// W(d) for |d| <= 1.
  Node *near(Node *d) {
    Node *r = b_.mul(constant(kCubicA + 2), d);
    r = b_.mul(b_.sub(r, constant(kCubicA + 3)), d);
    r = b_.mul(r, d);
    return b_.add(r, constant(1));
  }

  /// W(d) for 1 < |d| < 2.
  Node *far(Node *d) {
    Node *r = b_.mul(constant(kCubicA), d);
    r = b_.sub(r, constant(5 * kCubicA));
    r = b_.mul(r, d);
    r = b_.add(r, constant(8 * kCubicA));
    r = b_.mul(r, d);
    return b_.sub(r, constant(4 * kCubicA));
  }

  GraphBuilder &b_;
  DType work_;
  attrs::GridSamplePadding padding_;
  bool alignCorners_;
  int64_t spatial_;
  IntList sizes_;              ///< the input's spatial sizes, in its dim order
  int64_t points_ = 1;         ///< the sampled points per (batch, channel)
  std::vector<SymExpr> shape_; ///< the result's [N, C, *O]
  Node *flat_;                 ///< the input as [N, C, P] in the work dtype
};
} // namespace

Node *decomposeGridSample(GraphBuilder &b, Node *n, const DecomposeOptions &opts) {
  attrs::GridSampleMode mode = attrs::GridSample(*n).mode();
  DType t = n->dtype(), work = opts.cpuHalfRounding ? t : computeType(t);
  // An empty result reads nothing, and the reads would reshape to or from an empty dim.
  for (SymExpr d : n->shape())
    if (d->isConst(0))
      return b.full(0.0, t, n->shape());
  Node *x = b.convert(n->operand(0), work);
  Node *grid = b.convert(n->operand(1), work);
  Sampler s(b, n, x);
  int64_t spatial = x->rank() - 2;
  std::vector<Node *> coords; // in grid entry order: x, y, z
  for (int64_t i = 0; i < spatial; ++i) {
    Node *c = s.unnormalize(b.select(grid, grid->rank() - 1, i), s.sizeOf(i));
    coords.push_back(mode == attrs::GridSampleMode::Bicubic ? c : s.pad(c, s.sizeOf(i)));
  }
  if (mode == attrs::GridSampleMode::Nearest) {
    std::vector<Node *> positions;
    for (Node *c : coords)
      positions.push_back(b.convert(b.unary(OpKind::Round, c), DType::Int64));
    return b.convert(s.read(positions), t);
  }
  std::vector<Node *> floors;
  for (Node *c : coords)
    floors.push_back(b.unary(OpKind::Floor, c));
  if (mode == attrs::GridSampleMode::Bilinear) {
    Node *out = nullptr;
    for (int64_t corner = 0; corner < (int64_t(1) << spatial); ++corner) {
      std::vector<Node *> positions;
      Node *weight = nullptr;
      for (int64_t i = 0; i < spatial; ++i) {
        bool upper = (corner >> i) & 1;
        Node *w = upper ? b.sub(coords[i], floors[i])
                        : b.sub(b.add(floors[i], s.constant(1)), coords[i]);
        weight = weight ? b.mul(weight, w) : w;
        Node *p = b.convert(floors[i], DType::Int64);
        positions.push_back(upper ? b.add(p, b.scalar(1.0, DType::Int64)) : p);
      }
      Node *values = s.read(positions);
      Node *term = b.mul(values, b.unsqueeze(weight, 1));
      out = out ? b.add(out, term) : term;
    }
    return b.convert(out, t);
  }
  // bicubic
  Node *tx = b.sub(coords[0], floors[0]);
  Node *ty = b.sub(coords[1], floors[1]);
  std::array<Node *, 4> cx = s.cubicCoefficients(tx), cy = s.cubicCoefficients(ty);
  std::array<Node *, 4> rows{};
  for (int64_t row = 0; row < 4; ++row) {
    Node *&sum = rows[row];
    for (int64_t col = 0; col < 4; ++col) {
      std::vector<Node *> positions;
      for (int64_t i = 0; i < 2; ++i) {
        double offset = static_cast<double>((i == 0 ? col : row) - 1);
        Node *p = s.pad(b.add(floors[i], s.constant(offset)), s.sizeOf(i));
        positions.push_back(b.convert(p, DType::Int64));
      }
      Node *values = s.read(positions);
      Node *term = b.mul(values, b.unsqueeze(cx[col], 1));
      sum = sum ? b.add(sum, term) : term;
    }
  }
  Node *out = nullptr;
  for (int64_t row = 0; row < 4; ++row) {
    Node *term = b.mul(rows[row], b.unsqueeze(cy[row], 1));
    out = out ? b.add(out, term) : term;
  }
  return b.convert(out, t);
}

} // namespace braze::decomp
