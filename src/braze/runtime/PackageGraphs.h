#pragma once
/// CUDA graphs for a CUDA package's runs. A package run enqueues tens to hundreds of launches and
/// library calls, whose host cost is most of a small model's latency; a CUDA graph enqueues them
/// all at once. A graph holds the addresses it was captured with, so each one owns buffers for
/// the user inputs, the outputs and the scratch arena: a replay copies the caller's inputs in,
/// launches the graph and copies the outputs out (device-to-device copies on the caller's
/// stream). Graphs are made per input layout (sizes and strides), at the second call with that
/// layout: the first runs as an ordinary call, which also sets up the libraries' plans.
///
/// A layout is not captured when an input or output is not dense (its elements do not fill
/// the span between its first and last), when `kMaxLayouts` layouts are captured already, or
/// once a capture has failed (the reason is kept in stats()). Those calls run uncaptured.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace braze::runtime {

class CudaGraph;

class PackageGraphs {
public:
  /// A device buffer of a run: where it is, its bytes (the span its elements cover), and
  /// whether its elements fill that span.
  struct Buffer {
    void *data = nullptr;
    size_t bytes = 0;
    bool dense = true;
  };
  /// Enqueues the package's work on `stream`, reading `inputs` (the user inputs, in order),
  /// writing `outputs`, with scratch `arena`.
  using Enqueue = std::function<void(const std::vector<const void *> &inputs,
                                     const std::vector<void *> &outputs, void *arena,
                                     void *stream)>;
  struct Stats {
    int captures = 0;       ///< layouts captured
    int64_t replays = 0;    ///< runs that launched a graph
    int64_t uncaptured = 0; ///< runs that did not
    std::string off;        ///< why no more graphs are made ("" while they may be)
  };
  static constexpr int kMaxLayouts = 16;

  /// `off`: why this package never captures ("" when it may).
  PackageGraphs(int device, std::string off);
  ~PackageGraphs();

  /// One run on `stream`: through the graph of `layout` (the run's sizes and strides), made
  /// now if this is the layout's second call, else uncaptured. Either way it is ordered after
  /// the device's work on other streams (cudaOrdered).
  void run(const std::vector<int64_t> &layout, const std::vector<Buffer> &inputs,
           const std::vector<Buffer> &outputs, size_t arenaBytes, const Enqueue &enqueue,
           void *stream);

  Stats stats() const;

private:
  struct Captured;
  /// The layout's graph when it may replay (made now at its second call); null otherwise.
  Captured *graphFor(const std::vector<int64_t> &layout, const std::vector<Buffer> &inputs,
                     const std::vector<Buffer> &outputs, size_t arenaBytes,
                     const Enqueue &enqueue);

  int device_;
  mutable std::mutex mu_;
  std::map<std::vector<int64_t>, int64_t> seen_; ///< calls per layout not captured yet
  std::map<std::vector<int64_t>, std::unique_ptr<Captured>> graphs_;
  Stats stats_;
};

} // namespace braze::runtime
