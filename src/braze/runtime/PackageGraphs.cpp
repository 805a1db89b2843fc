#include "braze/runtime/PackageGraphs.h"

#include "braze/runtime/CudaModule.h"
#include "braze/runtime/Executable.h"

namespace braze::runtime {

struct PackageGraphs::Captured {
  int device = 0;
  std::vector<void *> inputs, outputs; ///< the graph's own buffers
  void *arena = nullptr;
  std::unique_ptr<CudaGraph> graph;

  ~Captured() {
    graph.reset();
    for (void *p : inputs)
      cudaRelease(device, p);
    for (void *p : outputs)
      cudaRelease(device, p);
    cudaRelease(device, arena);
  }
};

PackageGraphs::PackageGraphs(int device, std::string off) : device_(device) {
  stats_.off = std::move(off);
}

PackageGraphs::~PackageGraphs() {
  if (!graphs_.empty())
    try {
      cudaSynchronize(device_); // no replay still reads the buffers freed below
    } catch (const RunError &) {
    }
}

PackageGraphs::Captured *PackageGraphs::graphFor(const std::vector<int64_t> &layout,
                                                 const std::vector<Buffer> &inputs,
                                                 const std::vector<Buffer> &outputs,
                                                 size_t arenaBytes, const Enqueue &enqueue) {
  if (auto it = graphs_.find(layout); it != graphs_.end())
    return it->second.get();
  if (!stats_.off.empty() || static_cast<int>(graphs_.size()) >= kMaxLayouts)
    return nullptr;
  for (const std::vector<Buffer> *list : {&inputs, &outputs})
    for (const Buffer &b : *list)
      if (!b.dense)
        return nullptr;
  if (++seen_[layout] < 2)
    return nullptr; // the first call with this layout runs as it is
  seen_.erase(layout);
  auto c = std::make_unique<Captured>();
  c->device = device_;
  try {
    for (const Buffer &b : inputs)
      c->inputs.push_back(cudaAllocate(device_, b.bytes));
    for (const Buffer &b : outputs)
      c->outputs.push_back(cudaAllocate(device_, b.bytes));
    c->arena = cudaAllocate(device_, arenaBytes);
    const std::vector<const void *> in(c->inputs.begin(), c->inputs.end());
    c->graph = CudaGraph::capture(device_, [&](void *stream) {
      enqueue(in, c->outputs, c->arena, stream);
    });
  } catch (const RunError &e) {
    stats_.off = e.what();
    return nullptr;
  }
  ++stats_.captures;
  return (graphs_[layout] = std::move(c)).get();
}

void PackageGraphs::run(const std::vector<int64_t> &layout, const std::vector<Buffer> &inputs,
                        const std::vector<Buffer> &outputs, size_t arenaBytes,
                        const Enqueue &enqueue, void *stream) {
  std::lock_guard<std::mutex> lock(mu_); // a graph's buffers serve one run at a time
  Captured *c = graphFor(layout, inputs, outputs, arenaBytes, enqueue);
  if (!c) {
    ++stats_.uncaptured;
    cudaOrdered(device_, stream, [&] {
      // Scratch ordered on the stream: freed once the work enqueued before the free is done.
      void *arena = cudaAllocateOn(device_, arenaBytes, stream);
      try {
        std::vector<const void *> in;
        std::vector<void *> out;
        for (const Buffer &b : inputs)
          in.push_back(b.data);
        for (const Buffer &b : outputs)
          out.push_back(b.data);
        enqueue(in, out, arena, stream);
      } catch (...) {
        cudaReleaseOn(device_, arena, stream);
        throw;
      }
      cudaReleaseOn(device_, arena, stream);
    });
    return;
  }
  ++stats_.replays;
  cudaOrdered(device_, stream, [&] {
    for (size_t i = 0; i < inputs.size(); ++i)
      cudaCopyOn(device_, c->inputs[i], inputs[i].data, inputs[i].bytes, stream);
    c->graph->launch(stream);
    for (size_t i = 0; i < outputs.size(); ++i)
      cudaCopyOn(device_, outputs[i].data, c->outputs[i], outputs[i].bytes, stream);
  });
}

PackageGraphs::Stats PackageGraphs::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

} // namespace braze::runtime
