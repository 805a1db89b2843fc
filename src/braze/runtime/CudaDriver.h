// The CUDA driver API as the runtime uses it: loaded with dlopen (libcuda.so.1) at the first
// call, so that braze builds and runs without CUDA and says why CUDA is unavailable.
#pragma once

#include <cstddef>
#include <string>

namespace braze::runtime::driverapi {

// The few CUDA driver API entry points braze uses, with the driver's ABI: handles are opaque
// pointers, CUresult an int (0 = CUDA_SUCCESS), CUdevice an int.
using CUresult = int;
using CUdevice = int;
using CUcontext = void *;
using CUmodule = void *;
using CUfunction = void *;
using CUstream = void *;
using CUdeviceptr = unsigned long long;
constexpr unsigned kHostAllocDeviceMap = 0x02; // CU_MEMHOSTALLOC_DEVICEMAP

/// CUDA_MEMCPY2D, with the driver's layout.
struct Memcpy2D {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void *srcHost;
  CUdeviceptr srcDevice;
  void *srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void *dstHost;
  CUdeviceptr dstDevice;
  void *dstArray;
  size_t dstPitch;
  size_t widthInBytes, height;
};
constexpr int kMemoryTypeDevice = 2; // CU_MEMORYTYPE_DEVICE

struct Driver {
  CUresult (*init)(unsigned);
  CUresult (*deviceGet)(CUdevice *, int);
  CUresult (*deviceGetCount)(int *);
  CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*ctxGetCurrent)(CUcontext *);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*ctxSynchronize)();
  CUresult (*streamSynchronize)(CUstream);
  CUresult (*moduleLoadData)(CUmodule *, const void *);
  CUresult (*moduleUnload)(CUmodule);
  CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void **, void **);
  CUresult (*funcSetAttribute)(CUfunction, int, int);
  CUresult (*memHostAlloc)(void **, size_t, unsigned);
  CUresult (*memHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
  CUresult (*memFreeHost)(void *);
  CUresult (*memAlloc)(CUdeviceptr *, size_t);
  CUresult (*streamIsCapturing)(CUstream, int *); ///< CUstreamCaptureStatus as int
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memAllocAsync)(CUdeviceptr *, size_t, CUstream);
  CUresult (*memFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*memcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*deviceGetAttribute)(int *, int, CUdevice);
  CUresult (*memcpy2DAsync)(const struct Memcpy2D *, CUstream);
  CUresult (*getErrorString)(CUresult, const char **);
  // CUDA graphs and events (optional: a driver without them runs packages uncaptured).
  CUresult (*streamCreate)(CUstream *, unsigned);
  CUresult (*streamDestroy)(CUstream);
  CUresult (*streamBeginCapture)(CUstream, int);
  CUresult (*streamEndCapture)(CUstream, void **);
  CUresult (*graphInstantiate)(void **, void *, unsigned long long);
  CUresult (*graphLaunch)(void *, CUstream);
  CUresult (*graphExecDestroy)(void *);
  CUresult (*graphDestroy)(void *);
  CUresult (*eventCreate)(void **, unsigned);
  CUresult (*eventRecord)(void *, CUstream);
  CUresult (*streamWaitEvent)(CUstream, void *, unsigned);
  CUresult (*memcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  // Timing (optional: the autotuner and launch profiles need them).
  CUresult (*eventSynchronize)(void *);
  CUresult (*eventElapsedTime)(float *, void *, void *);
  CUresult (*eventDestroy)(void *);
  CUresult (*memsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  bool ok = false;
  bool graphs = false; ///< every CUDA-graph and event entry point above was found
  bool timing = false; ///< graphs, and the timing entry points
  std::string why;
};

/// The process's driver entry points (loaded once; `ok` false, with `why`, where they are not).
const Driver &driver();

/// A CUresult as its number and the driver's name for it.
std::string errorText(CUresult r);

/// Throws RunError("<what> failed: CUresult ...") unless r is 0.
void check(CUresult r, const std::string &what);

} // namespace braze::runtime::driverapi

namespace braze::runtime {
/// Makes `device`'s primary context current on this thread (what PyTorch's runtime uses too);
/// throws RunError where the driver or the device cannot be had.
void useDevice(int device);
} // namespace braze::runtime
