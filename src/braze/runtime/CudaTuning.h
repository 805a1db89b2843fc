#pragma once
/// What the autotuner needs of the device beyond a compiled module: kernels loaded from cubins
/// of their own (a kernel's candidate forms), launched and timed with events on a stream, and
/// device memory filled, copied and compared. Each call makes the device's primary context
/// current and throws RunError naming what failed.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braze::runtime {

/// Kernels outside any module, from cubins loaded on `device`.
class CudaKernelSet {
public:
  CudaKernelSet(int device, const std::vector<std::string> &cubinPaths);
  ~CudaKernelSet();
  CudaKernelSet(const CudaKernelSet &) = delete;
  CudaKernelSet &operator=(const CudaKernelSet &) = delete;

  /// The function `name` (a RunError when no cubin has it).
  void *function(const std::string &name) const;
  /// Enqueues f on `stream`: "" when launched, else why not (too many registers for the block,
  /// say).
  std::string launch(void *f, int64_t blocks, int threads, void **args, void *stream) const;

private:
  int device_;
  std::vector<void *> modules_;
};

/// A pair of timing events.
class CudaTimer {
public:
  explicit CudaTimer(int device);
  ~CudaTimer();
  CudaTimer(const CudaTimer &) = delete;
  CudaTimer &operator=(const CudaTimer &) = delete;
  void start(void *stream);
  void stop(void *stream);
  /// Milliseconds from start to stop (waits for stop).
  double milliseconds();

private:
  int device_;
  void *start_ = nullptr, *stop_ = nullptr;
};

/// Whether the driver has what timing needs (events with timing, memset).
bool cudaTimingAvailable();
/// Sets `bytes` bytes at `p` to `value`, enqueued on `stream`.
void cudaFillOn(int device, void *p, unsigned char value, size_t bytes, void *stream);

} // namespace braze::runtime
