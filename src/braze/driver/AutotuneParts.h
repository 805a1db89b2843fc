#pragma once
/// What the CUDA autotuner (Autotune.cpp) and the CPU's (AutotuneCpu.cpp) share, internal to
/// the driver: the clock and budget of one tuning, its scratch memory, the byte spans of a
/// graph's buffers, the rule that picks a winner and the tolerance a candidate is checked with.
#include "braze/driver/Autotune.h"

#include "braze/runtime/CudaModule.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace braze::tune {

using Clock = std::chrono::steady_clock;

/// A form wins only where it takes under this fraction of the planned form's time (the noise
/// of one timing is a few percent).
inline constexpr double kBetter = 0.97;

inline double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Calls `f` when it goes out of scope (an observer, tuner or hook cleared, however the run
/// ends).
struct Finally {
  std::function<void()> f;
  ~Finally() { f(); }
};

/// The tuner's own memory (scratch inputs, outputs, arena, saved buffers): on CUDA `device`,
/// or on the host (kHost), 64-byte aligned as the generated kernels' own buffers are.
class Scratch {
public:
  static constexpr int kHost = -1;
  Scratch(int device, size_t bytes)
      : device_(device), bytes_(bytes),
        p_(device == kHost ? std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64)
                           : runtime::cudaAllocate(device, bytes)) {
    if (!p_)
      throw std::bad_alloc();
  }
  ~Scratch() { device_ == kHost ? std::free(p_) : runtime::cudaRelease(device_, p_); }
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  void *get() const { return p_; }
  size_t bytes() const { return bytes_; }

private:
  int device_;
  size_t bytes_;
  void *p_;
};

/// Bytes from a buffer's first element to past its last (0 when it has none).
inline int64_t spanBytes(DType t, const std::vector<int64_t> &shape,
                         const std::vector<int64_t> &strides) {
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0)
      return 0;
    last += (shape[i] - 1) * std::abs(strides[i]);
  }
  return (last + 1) * dtypeSize(t);
}

/// The same of a symbolic layout: -1 when a size or stride is not a constant.
inline int64_t spanBytes(DType t, const std::vector<sym::SymExpr> &shape,
                         const std::vector<sym::SymExpr> &strides) {
  std::vector<int64_t> sizes, steps;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!shape[i]->isConst() || !strides[i]->isConst())
      return -1;
    sizes.push_back(shape[i]->value());
    steps.push_back(strides[i]->value());
  }
  return spanBytes(t, sizes, steps);
}

/// ms as the log writes it, in microseconds.
inline std::string milliseconds(double ms) {
  std::ostringstream o;
  o.precision(4);
  o << ms * 1000 << " us";
  return o.str();
}

/// The candidate to keep among `times` (ms; negative: it failed or differs), the planned one
/// first: the fastest that takes under kBetter of the planned one's time, else the planned.
inline int fastest(const std::vector<double> &times) {
  int best = 0;
  for (size_t i = 1; i < times.size(); ++i)
    if (times[i] >= 0 && times[0] > 0 && times[i] < kBetter * times[0] &&
        (best == 0 || times[i] < times[best]))
      best = static_cast<int>(i);
  return best;
}

/// The median of `samples` (reordered).
inline double median(std::vector<double> &samples) {
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

/// The relative tolerance a candidate's floats are checked with against the planned one's,
/// scaled by the output's largest magnitude as well as each value's own.
inline double relativeTolerance(DType t) {
  return t == DType::Float64 ? 1e-9 : t == DType::Float32 ? 1e-4 : t == DType::Float16 ? 4e-3
                                                                                         : 3e-2;
}

/// One tuning's clock, budget and log, and the result it returns.
struct Tuning {
  explicit Tuning(double seconds) : budget(seconds) {}
  TuneResult result;
  const Clock::time_point start = Clock::now();
  const double budget;
  std::ostringstream log;
  TuneResult finish() {
    result.seconds = since(start);
    result.log = log.str();
    return result;
  }
};

/// The bytes of a graph's inputs and outputs as the caller lays them out, or why they are not
/// known (symbolic sizes).
struct IoBytes {
  std::vector<std::pair<const loop::Buffer *, size_t>> inputs, outputs;
  std::string unknown;
};

inline IoBytes ioBytes(const sched::Schedule &s, runtime::Executable &exe) {
  IoBytes io;
  if (!s.program->sizeSymbols().empty()) {
    io.unknown = "the graph has symbolic sizes";
    return io;
  }
  for (const loop::Buffer *b : s.program->inputs()) {
    int64_t bytes = spanBytes(b->dtype, b->seenShape(), b->seenStrides());
    if (bytes < 0) {
      io.unknown = "input " + b->name + " has a symbolic layout";
      return io;
    }
    io.inputs.push_back({b, static_cast<size_t>(bytes)});
  }
  std::vector<runtime::Executable::Layout> layouts = exe.layoutsFor({});
  const std::vector<loop::Buffer *> outs = s.program->outputs();
  for (size_t i = 0; i < layouts.size(); ++i) {
    int64_t bytes = spanBytes(outs.at(i)->dtype, layouts[i].shape, layouts[i].strides);
    io.outputs.push_back({outs.at(i), static_cast<size_t>(std::max<int64_t>(bytes, 1))});
  }
  return io;
}

} // namespace braze::tune
