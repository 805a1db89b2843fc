#include "braze/runtime/CudaDriver.h"

#include "braze/runtime/Executable.h"

#include <dlfcn.h>
#include <type_traits>

namespace braze::runtime::driverapi {

const Driver &driver() {
  static Driver d = [] {
    Driver d;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      d.why = std::string("cannot load the CUDA driver (libcuda.so.1): ") + dlerror();
      return d;
    }
    bool missing = false;
    auto optional = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      return fn != nullptr;
    };
    auto get = [&](auto &fn, const char *name) {
      if (!optional(fn, name) && !missing) {
        missing = true;
        d.why = std::string("the CUDA driver lacks ") + name;
      }
    };
    get(d.init, "cuInit");
    get(d.deviceGet, "cuDeviceGet");
    get(d.deviceGetCount, "cuDeviceGetCount");
    get(d.primaryCtxRetain, "cuDevicePrimaryCtxRetain");
    get(d.ctxGetCurrent, "cuCtxGetCurrent");
    get(d.ctxSetCurrent, "cuCtxSetCurrent");
    get(d.ctxSynchronize, "cuCtxSynchronize");
    get(d.streamSynchronize, "cuStreamSynchronize");
    get(d.moduleLoadData, "cuModuleLoadData");
    get(d.moduleUnload, "cuModuleUnload");
    get(d.moduleGetFunction, "cuModuleGetFunction");
    get(d.launchKernel, "cuLaunchKernel");
    get(d.funcSetAttribute, "cuFuncSetAttribute");
    get(d.memHostAlloc, "cuMemHostAlloc");
    get(d.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    get(d.memFreeHost, "cuMemFreeHost");
    get(d.memAlloc, "cuMemAlloc_v2");
    get(d.streamIsCapturing, "cuStreamIsCapturing");
    get(d.memFree, "cuMemFree_v2");
    get(d.memAllocAsync, "cuMemAllocAsync");
    get(d.memFreeAsync, "cuMemFreeAsync");
    get(d.memcpyHtoD, "cuMemcpyHtoD_v2");
    get(d.memcpyDtoH, "cuMemcpyDtoH_v2");
    get(d.deviceGetAttribute, "cuDeviceGetAttribute");
    get(d.memcpy2DAsync, "cuMemcpy2DAsync_v2");
    get(d.getErrorString, "cuGetErrorString");
    if (missing)
      return d;
    d.graphs = optional(d.streamCreate, "cuStreamCreate") &&
               optional(d.streamDestroy, "cuStreamDestroy_v2") &&
               optional(d.streamBeginCapture, "cuStreamBeginCapture_v2") &&
               optional(d.streamEndCapture, "cuStreamEndCapture") &&
               optional(d.graphInstantiate, "cuGraphInstantiateWithFlags") &&
               optional(d.graphLaunch, "cuGraphLaunch") &&
               optional(d.graphExecDestroy, "cuGraphExecDestroy") &&
               optional(d.graphDestroy, "cuGraphDestroy") &&
               optional(d.eventCreate, "cuEventCreate") &&
               optional(d.eventRecord, "cuEventRecord") &&
               optional(d.streamWaitEvent, "cuStreamWaitEvent") &&
               optional(d.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    d.timing = d.graphs && optional(d.eventSynchronize, "cuEventSynchronize") &&
               optional(d.eventElapsedTime, "cuEventElapsedTime") &&
               optional(d.eventDestroy, "cuEventDestroy_v2") &&
               optional(d.memsetD8Async, "cuMemsetD8Async");
    if (CUresult r = d.init(0); r != 0) {
      d.why = "cuInit failed with CUresult " + std::to_string(r);
      return d;
    }
    d.ok = true;
    return d;
  }();
  return d;
}

std::string errorText(CUresult r) {
  const char *s = nullptr;
  if (driver().getErrorString)
    driver().getErrorString(r, &s);
  return std::to_string(r) + (s ? std::string(" (") + s + ")" : "");
}

void check(CUresult r, const std::string &what) {
  if (r != 0)
    throw RunError(what + " failed: CUresult " + errorText(r));
}

} // namespace braze::runtime::driverapi
