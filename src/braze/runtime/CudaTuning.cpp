#include "braze/runtime/CudaTuning.h"

#include "braze/runtime/CudaDriver.h"
#include "braze/runtime/Executable.h"
#include "braze/runtime/Files.h"

namespace braze::runtime {

using namespace driverapi;

CudaKernelSet::CudaKernelSet(int device, const std::vector<std::string> &cubinPaths)
    : device_(device) {
  useDevice(device);
  for (const std::string &path : cubinPaths) {
    std::string image;
    if (!readWholeFile(path, image))
      throw RunError("cannot read CUDA module " + path);
    CUmodule m = nullptr;
    check(driver().moduleLoadData(&m, image.data()), "loading CUDA module " + path);
    modules_.push_back(m);
  }
}

CudaKernelSet::~CudaKernelSet() {
  try {
    useDevice(device_);
  } catch (const RunError &) {
    return;
  }
  for (void *m : modules_)
    driver().moduleUnload(m);
}

void *CudaKernelSet::function(const std::string &name) const {
  useDevice(device_);
  for (void *m : modules_) {
    CUfunction f = nullptr;
    if (driver().moduleGetFunction(&f, m, name.c_str()) == 0)
      return f;
  }
  throw RunError("no loaded cubin has kernel " + name);
}

std::string CudaKernelSet::launch(void *f, int64_t blocks, int threads, void **args,
                                  void *stream) const {
  if (blocks <= 0 || blocks > 0x7fffffff)
    return std::to_string(blocks) + " blocks";
  CUresult r = driver().launchKernel(f, static_cast<unsigned>(blocks), 1, 1,
                                     static_cast<unsigned>(threads), 1, 1, 0, stream, args,
                                     nullptr);
  return r == 0 ? "" : "CUresult " + errorText(r);
}

CudaTimer::CudaTimer(int device) : device_(device) {
  if (!cudaTimingAvailable())
    throw RunError("the CUDA driver lacks the event timing entry points");
  useDevice(device);
  check(driver().eventCreate(&start_, 0), "creating a CUDA event");
  check(driver().eventCreate(&stop_, 0), "creating a CUDA event");
}

CudaTimer::~CudaTimer() {
  try {
    useDevice(device_);
  } catch (const RunError &) {
    return;
  }
  driver().eventDestroy(start_);
  driver().eventDestroy(stop_);
}

void CudaTimer::start(void *stream) { check(driver().eventRecord(start_, stream), "cuEventRecord"); }
void CudaTimer::stop(void *stream) { check(driver().eventRecord(stop_, stream), "cuEventRecord"); }

double CudaTimer::milliseconds() {
  check(driver().eventSynchronize(stop_), "waiting for a CUDA event");
  float ms = 0;
  check(driver().eventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
  return ms;
}

bool cudaTimingAvailable() { return driver().ok && driver().timing; }

void cudaFillOn(int device, void *p, unsigned char value, size_t bytes, void *stream) {
  useDevice(device);
  if (bytes == 0)
    return;
  check(driver().memsetD8Async(reinterpret_cast<CUdeviceptr>(p), value, bytes, stream),
        "filling " + std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device));
}

} // namespace braze::runtime
