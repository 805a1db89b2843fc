#include "braze/runtime/CudaModule.h"

#include "braze/runtime/CublasLt.h"
#include "braze/runtime/CudaDriver.h"
#include "braze/runtime/Cudnn.h"
#include "braze/runtime/Executable.h"
#include "braze/runtime/Files.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace braze::runtime {

namespace {

using namespace driverapi;

std::string readBinary(const std::string &path) {
  std::string bytes;
  if (!readWholeFile(path, bytes))
    throw RunError("cannot read CUDA module " + path);
  return bytes;
}

/// How deviceBuffer may get more memory than it holds: allocate or throw, allocate or give
/// null, or give null (while a CUDA graph is captured).
enum class Allocate { OrThrow, OrNull, Never };

/// A buffer of at least `bytes` per device and `what` for the process (launches are
/// stream-ordered on it). A larger buffer replaces a smaller one, which is kept: a CUDA graph
/// captured before may still read it.
void *deviceBuffer(int device, size_t bytes, const char *what,
                   Allocate allocate = Allocate::OrThrow) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, std::vector<std::pair<CUdeviceptr, size_t>>> held;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::pair<CUdeviceptr, size_t>> &buffers = held[{device, what}];
  if (!buffers.empty() && buffers.back().second >= bytes)
    return reinterpret_cast<void *>(buffers.back().first);
  CUdeviceptr b = 0;
  CUresult r = allocate == Allocate::Never ? 1 : driver().memAlloc(&b, bytes);
  if (r != 0 && allocate == Allocate::OrThrow)
    check(r, std::string("allocating the ") + what);
  if (r != 0)
    return nullptr;
  buffers.emplace_back(b, bytes);
  return reinterpret_cast<void *>(b);
}

/// Whether `stream` is being captured into a CUDA graph (then nothing may be allocated).
bool capturing(CUstream stream) {
  int status = 0;
  return driver().streamIsCapturing(stream, &status) != 0 || status != 0;
}

void *gemmWorkspace(int device) {
  return deviceBuffer(device, CublasLt::recommendedWorkspaceBytes(), "cuBLASLt workspace");
}

/// Products whose result rows are not 16-byte aligned (a vocabulary of 50257 columns) run on
/// cuBLASLt's slowest kernels. Large ones are computed in row chunks into this buffer, with a
/// padded row pitch, and copied into place.
constexpr size_t kPaddedResultBytes = size_t(64) << 20;

void *paddedResult(int device) {
  return deviceBuffer(device, kPaddedResultBytes, "padded GEMM result buffer");
}

} // namespace

constexpr CUresult kNotFound = 500; // CUDA_ERROR_NOT_FOUND

struct CudaModule::State {
  CUcontext ctx = nullptr;
  std::vector<CUmodule> modules; ///< the kernels, in one or more cubins
  std::vector<CUfunction> functions;
  std::vector<std::string> names; ///< of functions
  /// Per function: the dynamic shared memory its launches were allowed so far (above 48 KiB
  /// a function must be allowed it before its launch).
  std::vector<int> sharedAllowed;
  int *errHost = nullptr; ///< mapped host memory the kernels write
  CudaApi api{};
  CUstream stream = nullptr; ///< of the call in progress
  CublasLt *lt = nullptr;
  Cudnn *dnn = nullptr;
  void *workspace = nullptr;
  void *convWorkspace = nullptr; ///< Cudnn::recommendedWorkspaceBytes() of device memory
  int device = 0;
  void *padded = nullptr; ///< kPaddedResultBytes of device memory
  /// Per kernel: its compile where it is deferred (its function stays null until the first
  /// launch compiles and loads it), else empty.
  std::vector<std::function<std::string()>> deferred;
  std::string failure; ///< message of a failed launch or GEMM
  bool logFallback = false;        ///< say why cuDNN declined a call, once per reason
  std::set<std::string> declined;
  std::mutex mu;       ///< one call at a time per module (the callbacks share `stream`)
  CudaModule::LaunchObserver observer; ///< setLaunchObserver's

  /// Launches kernel `kernel` on the call's stream with `sharedBytes` of dynamic shared memory:
  /// 0 or 2 (failed, with `failure` set).
  int launch(int kernel, int64_t blocks, int threads, int sharedBytes, void **args) {
    if (blocks > 0x7fffffff) {
      failure = "a launch needs " + std::to_string(blocks) + " blocks, more than CUDA allows";
      return 2;
    }
    if (!functions[kernel] && !loadDeferred(kernel))
      return 2;
    constexpr int kMaxDynamicShared = 8; // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if (sharedBytes > sharedAllowed[kernel]) {
      CUresult r = driver().funcSetAttribute(functions[kernel], kMaxDynamicShared, sharedBytes);
      if (r != 0) {
        failure = "kernel " + names[kernel] + " cannot have " + std::to_string(sharedBytes) +
                  " bytes of shared memory: CUresult " + errorText(r);
        return 2;
      }
      sharedAllowed[kernel] = sharedBytes;
    }
    if (observer)
      observer(kernel, blocks, threads, args, stream, false);
    CUresult r = driver().launchKernel(functions[kernel], static_cast<unsigned>(blocks), 1, 1,
                                       static_cast<unsigned>(threads), 1, 1,
                                       static_cast<unsigned>(sharedBytes), stream, args, nullptr);
    if (r == 0 && observer)
      observer(kernel, blocks, threads, args, stream, true);
    if (r != 0) {
      failure = "launching kernel " + std::to_string(kernel) + " failed: CUresult " + errorText(r);
      return 2;
    }
    return 0;
  }

  /// Compiles and loads deferred kernel `kernel` (and every launch index of the same function);
  /// false with `failure` set when that fails.
  bool loadDeferred(int kernel) {
    try {
      if (logFallback)
        std::fprintf(stderr, "braze: compiling kernel %s at its first launch (a library "
                             "declined the call it stands in for)\n", names[kernel].c_str());
      std::string image = readBinary(deferred[kernel]());
      CUmodule module = nullptr;
      check(driver().moduleLoadData(&module, image.data()),
            "loading deferred kernel " + names[kernel]);
      modules.push_back(module);
      CUfunction f = nullptr;
      check(driver().moduleGetFunction(&f, module, names[kernel].c_str()),
            "looking up kernel " + names[kernel]);
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == names[kernel]) {
          functions[i] = f;
          sharedAllowed[i] = 0;
        }
      return true;
    } catch (const std::exception &e) {
      failure = std::string("compiling deferred kernel ") + names[kernel] + ": " + e.what();
      return false;
    }
  }

  /// The callback's code for a cuDNN call of `what` ("a convolution"): 0 done, 1 declined
  /// (said once per reason with logFallback; the caller runs its own kernel), 2 failed
  /// (`failure` says why).
  int dnnResult(const char *what, DnnStatus status) {
    switch (status) {
    case DnnStatus::Done:
      return 0;
    case DnnStatus::Declined:
      if (logFallback && declined.insert(failure).second)
        std::fprintf(stderr, "braze: cuDNN declined %s (%s); braze's kernel runs\n", what,
                     failure.c_str());
      failure.clear();
      return 1;
    case DnnStatus::Failed:
      return 2;
    }
    return 2;
  }
};

namespace {

/// A product's result this large, with unaligned rows or columns, is worth splitting (smaller
/// ones run as they are).
constexpr int64_t kLargeResultBytes = int64_t(8) << 20;

int64_t resultBytes(const GemmProblem &p) {
  bool half = p.dtype == GemmDType::Float16 || p.dtype == GemmDType::BFloat16;
  return p.dtype == GemmDType::Float64 ? 8 : half && !p.f32Out ? 2 : 4;
}

/// Rows per chunk when p's result should go through the padded buffer (its rows are not
/// 16-byte aligned and it is large), else 0. Chunks start at multiples of 8 rows, so a chunk's
/// operand pointers keep the alignment of the whole operand.
int64_t paddedRows(const void *padded, const GemmProblem &p) {
  int64_t esz = resultBytes(p);
  if (!padded || p.batch != 1 || (p.ldc * esz) % 16 == 0 || p.m * p.n * esz < kLargeResultBytes)
    return 0;
  int64_t pitch = (p.n * esz + 15) / 16 * 16;
  int64_t rows = static_cast<int64_t>(kPaddedResultBytes) / pitch / 8 * 8;
  return rows >= 64 ? rows : 0;
}

int64_t operandBytes(const GemmProblem &p) {
  return p.dtype == GemmDType::Float64 ? 8 : p.dtype == GemmDType::Float32 ? 4 : 2;
}

/// Whether p's result is large and its column count is not a whole number of 16-byte words of
/// operand (50257): cuBLASLt then runs its slowest kernels (3.35 ms against 0.50 ms for GPT-2's
/// logits on an H100), even into an aligned result.
/// (A chunk of a large product counts as large.)
bool unalignedColumns(const GemmProblem &p, bool large = false) {
  int64_t perWord = 16 / operandBytes(p);
  return p.batch == 1 && p.n > perWord && p.n % perWord != 0 &&
         (large || p.m * p.n * resultBytes(p) >= kLargeResultBytes);
}

/// The product as two: the columns up to the last whole word, and the few after it.
std::string gemmInColumnParts(CublasLt &lt, void *workspace, CUstream stream,
                              const GemmProblem &p) {
  int64_t opsz = operandBytes(p), perWord = 16 / opsz, wide = p.n / perWord * perWord;
  GemmProblem head = p, tail = p;
  head.n = wide;
  tail.n = p.n - wide;
  // B's column `wide`: a row-major [k,n] moves by elements; a transposed [n,k] by rows.
  tail.b = static_cast<const char *>(p.b) + (p.transB ? wide * p.ldb : wide) * opsz;
  tail.c = static_cast<char *>(p.c) + wide * resultBytes(p);
  if (p.bias)
    tail.bias = static_cast<const char *>(p.bias) + wide * resultBytes(p);
  for (const GemmProblem &part : {head, tail})
    if (std::string e = lt.gemm(part, stream, workspace, CublasLt::recommendedWorkspaceBytes());
        !e.empty())
      return e;
  return "";
}

/// The product on `stream`, chunk by chunk through `padded` (rows padded to 16 bytes), each
/// chunk copied into place.
std::string gemmInRowChunks(CublasLt &lt, void *padded, void *workspace, CUstream stream,
                            const GemmProblem &p) {
  int64_t esz = resultBytes(p), opsz = operandBytes(p);
  int64_t pitch = (p.n * esz + 15) / 16 * 16, rows = paddedRows(padded, p);
  for (int64_t r0 = 0; r0 < p.m; r0 += rows) {
    GemmProblem c = p;
    c.m = std::min(rows, p.m - r0);
    // A's row r0: row-major [m,k] moves by rows of lda; a transposed [k,m] by columns.
    c.a = static_cast<const char *>(p.a) + (p.transA ? r0 : r0 * p.lda) * opsz;
    c.c = padded;
    c.ldc = pitch / esz;
    std::string e = unalignedColumns(c, /*large=*/true)
                        ? gemmInColumnParts(lt, workspace, stream, c)
                        : lt.gemm(c, stream, workspace, CublasLt::recommendedWorkspaceBytes());
    if (!e.empty())
      return e;
    Memcpy2D m{};
    m.srcMemoryType = m.dstMemoryType = kMemoryTypeDevice;
    m.srcDevice = reinterpret_cast<CUdeviceptr>(padded);
    m.srcPitch = static_cast<size_t>(pitch);
    m.dstDevice = reinterpret_cast<CUdeviceptr>(static_cast<char *>(p.c) + r0 * p.ldc * esz);
    m.dstPitch = static_cast<size_t>(p.ldc * esz);
    m.widthInBytes = static_cast<size_t>(p.n * esz);
    m.height = static_cast<size_t>(c.m);
    if (CUresult r = driver().memcpy2DAsync(&m, stream); r != 0)
      return "copying a padded GEMM result into place failed: CUresult " + errorText(r);
  }
  return "";
}

} // namespace

void useDevice(int device) {
  const Driver &d = driver();
  if (!d.ok)
    throw RunError(d.why);
  static std::mutex mu;
  static std::map<int, CUcontext> contexts;
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    CUcontext &c = contexts[device];
    if (!c) {
      CUdevice dev = 0;
      check(d.deviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
      check(d.primaryCtxRetain(&c, dev), "retaining the primary context");
    }
    ctx = c;
  }
  CUcontext current = nullptr;
  d.ctxGetCurrent(&current);
  if (current != ctx)
    check(d.ctxSetCurrent(ctx), "cuCtxSetCurrent");
}

int cudaComputeCapability(int device) {
  useDevice(device);
  CUdevice dev = 0;
  check(driver().deviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
  int major = 0, minor = 0;
  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
  check(driver().deviceGetAttribute(&major, 75, dev), "reading the compute capability");
  check(driver().deviceGetAttribute(&minor, 76, dev), "reading the compute capability");
  return major * 10 + minor;
}

double cudaPeakBandwidth(int device) {
  useDevice(device);
  CUdevice dev = 0;
  check(driver().deviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")");
  int kHz = 0, bits = 0;
  // CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE (kHz), CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH
  if (driver().deviceGetAttribute(&kHz, 36, dev) != 0 ||
      driver().deviceGetAttribute(&bits, 37, dev) != 0 || kHz <= 0 || bits <= 0)
    return 0;
  return 2.0 * kHz * 1e3 * bits / 8;
}

void *cudaAllocate(int device, size_t bytes) {
  useDevice(device);
  CUdeviceptr p = 0;
  check(driver().memAlloc(&p, bytes ? bytes : 1),
        "allocating " + std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device));
  return reinterpret_cast<void *>(p);
}

void *cudaAllocateOn(int device, size_t bytes, void *stream) {
  useDevice(device);
  CUdeviceptr p = 0;
  check(driver().memAllocAsync(&p, bytes ? bytes : 1, stream),
        "allocating " + std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device));
  return reinterpret_cast<void *>(p);
}

namespace {
/// Whether `p` is memory to free on `device`, whose context is then current (never throws: with
/// no driver, nothing was allocated).
bool releasable(int device, void *p) noexcept {
  if (!p)
    return false;
  try {
    useDevice(device);
  } catch (const RunError &) {
    return false;
  }
  return true;
}
} // namespace

void cudaRelease(int device, void *p) noexcept {
  if (releasable(device, p))
    driver().memFree(reinterpret_cast<CUdeviceptr>(p));
}

void cudaReleaseOn(int device, void *p, void *stream) noexcept {
  if (releasable(device, p))
    driver().memFreeAsync(reinterpret_cast<CUdeviceptr>(p), stream);
}

void cudaCopy(int device, void *dst, const void *src, size_t bytes, bool toDevice) {
  useDevice(device);
  if (bytes == 0)
    return;
  check(toDevice ? driver().memcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes)
                 : driver().memcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes),
        std::string("copying ") + std::to_string(bytes) + " bytes " +
            (toDevice ? "to" : "from") + " CUDA device " + std::to_string(device));
}

void cudaSynchronize(int device, void *stream) {
  useDevice(device);
  check(stream ? driver().streamSynchronize(stream) : driver().ctxSynchronize(),
        "waiting for CUDA device " + std::to_string(device));
}

void cudaCopyOn(int device, void *dst, const void *src, size_t bytes, void *stream) {
  useDevice(device);
  if (bytes == 0)
    return;
  check(driver().memcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst),
                                 reinterpret_cast<CUdeviceptr>(src), bytes, stream),
        "copying " + std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device));
}

std::string cudaGraphsUnavailable() {
  const Driver &d = driver();
  if (!d.ok)
    return d.why;
  return d.graphs ? "" : "the CUDA driver lacks the CUDA graph entry points (CUDA 11.4 or later)";
}

namespace {
/// The order of the work that shares a device's library workspaces, across streams.
struct DeviceOrder {
  std::mutex mu;
  void *event = nullptr;
  void *stream = nullptr; ///< where the last ordered work went
};
DeviceOrder &deviceOrder(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceOrder>> orders;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<DeviceOrder> &o = orders[device];
  if (!o)
    o = std::make_unique<DeviceOrder>();
  return *o;
}
} // namespace

void cudaOrdered(int device, void *stream, const std::function<void()> &enqueue) {
  useDevice(device);
  const Driver &d = driver();
  DeviceOrder &o = deviceOrder(device);
  std::lock_guard<std::mutex> lock(o.mu);
  if (!d.graphs) { // no events: one stream at a time is the caller's to keep
    enqueue();
    return;
  }
  if (!o.event)
    check(d.eventCreate(&o.event, 0x2 /* CU_EVENT_DISABLE_TIMING */), "creating a CUDA event");
  if (o.stream != stream)
    check(d.streamWaitEvent(stream, o.event, 0), "ordering work across CUDA streams");
  enqueue();
  check(d.eventRecord(o.event, stream), "recording a CUDA event");
  o.stream = stream;
}

std::unique_ptr<CudaGraph> CudaGraph::capture(int device,
                                              const std::function<void(void *stream)> &enqueue) {
  useDevice(device);
  const Driver &d = driver();
  if (!d.graphs)
    throw RunError(cudaGraphsUnavailable());
  CUstream stream = nullptr;
  check(d.streamCreate(&stream, 0x1 /* CU_STREAM_NON_BLOCKING */), "creating a CUDA stream");
  // Relaxed: the capture records this thread's work on its own stream, and other threads'
  // calls go on undisturbed.
  if (CUresult r = d.streamBeginCapture(stream, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */); r != 0) {
    d.streamDestroy(stream);
    throw RunError("beginning a CUDA graph capture failed: CUresult " + errorText(r));
  }
  std::string failed;
  try {
    enqueue(stream);
  } catch (const std::exception &e) {
    failed = e.what();
  }
  void *graph = nullptr;
  CUresult ended = d.streamEndCapture(stream, &graph);
  d.streamDestroy(stream);
  if (failed.empty() && ended != 0)
    failed = "ending the capture failed: CUresult " + errorText(ended);
  void *exec = nullptr;
  if (failed.empty())
    if (CUresult r = d.graphInstantiate(&exec, graph, 0); r != 0)
      failed = "instantiating the graph failed: CUresult " + errorText(r);
  if (graph)
    d.graphDestroy(graph);
  if (!failed.empty())
    throw RunError("capturing a CUDA graph: " + failed);
  std::unique_ptr<CudaGraph> g(new CudaGraph());
  g->exec_ = exec;
  g->device_ = device;
  return g;
}

void CudaGraph::launch(void *stream) const {
  useDevice(device_);
  check(driver().graphLaunch(exec_, stream), "launching a CUDA graph");
}

CudaGraph::~CudaGraph() {
  if (exec_ && driver().ok)
    driver().graphExecDestroy(exec_);
}

bool cudaDriverAvailable() {
  const Driver &d = driver();
  int n = 0;
  return d.ok && d.deviceGetCount(&n) == 0 && n > 0;
}

std::unique_ptr<CudaModule> CudaModule::load(const ModuleSpec &spec) {
  const Driver &d = driver();
  if (!d.ok)
    throw RunError(d.why);
  std::unique_ptr<CudaModule> m(new CudaModule());
  m->state_ = std::make_unique<State>();
  State &s = *m->state_;
  const int device = spec.device;
  useDevice(device);
  d.ctxGetCurrent(&s.ctx);
  for (const std::string &path : spec.cubinPaths) {
    std::string image = readBinary(path);
    CUmodule module = nullptr;
    check(d.moduleLoadData(&module, image.data()), "loading CUDA module " + path);
    s.modules.push_back(module);
  }
  s.names = spec.kernels;
  s.deferred.resize(spec.kernels.size());
  for (size_t i = 0; i < spec.kernels.size(); ++i) {
    const std::string &k = spec.kernels[i];
    CUfunction f = nullptr;
    auto later = std::find_if(spec.deferred.begin(), spec.deferred.end(),
                              [&](const DeferredCubin &c) { return c.kernel == k; });
    if (later != spec.deferred.end()) {
      s.deferred[i] = later->compile;
    } else {
      CUresult r = kNotFound; // in no module
      for (CUmodule module : s.modules)
        if ((r = d.moduleGetFunction(&f, module, k.c_str())) == 0)
          break;
      check(r, "looking up kernel " + k);
    }
    s.functions.push_back(f);
  }
  check(d.memHostAlloc(reinterpret_cast<void **>(&s.errHost), sizeof(int), kHostAllocDeviceMap),
        "allocating the kernel error flag");
  *s.errHost = 0;
  CUdeviceptr errDev = 0;
  check(d.memHostGetDevicePointer(&errDev, s.errHost, 0), "mapping the kernel error flag");
  if (!spec.cublasLtLibrary.empty()) {
    s.lt = &CublasLt::load(spec.cublasLtLibrary);
    for (const LibraryChoice &c : spec.libraryChoices)
      if (c.kind == LibraryKind::Gemm)
        s.lt->prefer(c.key, static_cast<int>(c.id));
    s.workspace = gemmWorkspace(device);
    s.padded = paddedResult(device);
  }
  s.logFallback = spec.logFallback;
  if (!spec.cudnnLibrary.empty()) {
    s.dnn = &Cudnn::load(spec.cudnnLibrary);
    for (const LibraryChoice &c : spec.libraryChoices)
      if (c.kind == LibraryKind::Convolution || c.kind == LibraryKind::Attention)
        s.dnn->prefer(c.key, c.id);
    s.convWorkspace = deviceBuffer(device, Cudnn::recommendedWorkspaceBytes(), "cuDNN workspace");
    s.device = device;
  }
  s.api.ctx = &s;
  s.api.err = reinterpret_cast<int *>(errDev);
  s.api.assertIndices = 0;
  s.sharedAllowed.assign(s.functions.size(), 0);
  s.api.launch = [](void *ctx, int kernel, int64_t blocks, int threads, void **args) -> int {
    return static_cast<State *>(ctx)->launch(kernel, blocks, threads, 0, args);
  };
  s.api.launchShared = [](void *ctx, int kernel, int64_t blocks, int threads, int sharedBytes,
                          void **args) -> int {
    return static_cast<State *>(ctx)->launch(kernel, blocks, threads, sharedBytes, args);
  };
  s.api.gemm = [](void *ctx, const CudaGemmCall *g) -> int {
    State &st = *static_cast<State *>(ctx);
    if (!st.lt) {
      st.failure = "this module calls cuBLASLt but none was loaded";
      return 2;
    }
    static const GemmDType types[] = {GemmDType::Float32, GemmDType::Float64, GemmDType::Float16,
                                      GemmDType::BFloat16};
    GemmProblem p;
    p.dtype = types[g->dtype];
    p.f32Out = g->outDtype != g->dtype;
    p.m = g->m, p.n = g->n, p.k = g->k;
    p.transA = g->transA != 0, p.transB = g->transB != 0;
    p.a = g->a, p.lda = g->lda, p.b = g->b, p.ldb = g->ldb, p.c = g->c, p.ldc = g->ldc;
    p.bias = g->bias;
    p.batch = g->batch;
    p.strideA = g->strideA, p.strideB = g->strideB, p.strideC = g->strideC;
    p.allowTf32 = g->allowTf32 != 0;
    foldBatchIntoRows(p);
    // A result with unaligned rows goes through the padded buffer; one with aligned (padded)
    // rows but unaligned columns is written in place, in two parts.
    std::string e = paddedRows(st.padded, p)
                    ? gemmInRowChunks(*st.lt, st.padded, st.workspace, st.stream, p)
                    : unalignedColumns(p)
                    ? gemmInColumnParts(*st.lt, st.workspace, st.stream, p)
                    : st.lt->gemm(p, st.stream, st.workspace, CublasLt::recommendedWorkspaceBytes());
    if (!e.empty()) {
      st.failure = e;
      return 2;
    }
    return 0;
  };
  s.api.conv = [](void *ctx, const CudaConvCall *c) -> int {
    State &st = *static_cast<State *>(ctx);
    if (!st.dnn)
      return 1;
    LargeWorkspace large;
    large.canAllocate = [&st] { return !capturing(st.stream); };
    large.get = [&st, &large](size_t bytes) {
      return deviceBuffer(st.device, bytes, "large cuDNN workspace",
                          large.canAllocate() ? Allocate::OrNull : Allocate::Never);
    };
    return st.dnnResult("a convolution",
                        st.dnn->conv(*c, st.stream, st.convWorkspace,
                                     Cudnn::recommendedWorkspaceBytes(), st.failure, large));
  };
  s.api.attention = [](void *ctx, const CudaAttentionCall *a) -> int {
    State &st = *static_cast<State *>(ctx);
    if (!st.dnn)
      return 1;
    return st.dnnResult(a->grad ? "an attention backward" : "an attention",
                        st.dnn->attention(*a, st.stream, st.convWorkspace,
                                          Cudnn::recommendedWorkspaceBytes(), st.failure));
  };
  return m;
}

void CudaModule::preload(int device, const std::string &cublasLtLibrary,
                         const std::string &cudnnLibrary) {
  try {
    const Driver &d = driver();
    if (!d.ok)
      return;
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (d.deviceGet(&dev, device) != 0 || d.primaryCtxRetain(&ctx, dev) != 0 ||
        d.ctxSetCurrent(ctx) != 0)
      return;
    // The libraries only: their workspaces are allocated by the first module that uses them
    // (a graph without products or convolutions never holds them).
    if (!cublasLtLibrary.empty())
      CublasLt::load(cublasLtLibrary);
    if (!cudnnLibrary.empty())
      Cudnn::load(cudnnLibrary);
  } catch (const std::exception &) {
    // load() reports it
  }
}

CudaModule::~CudaModule() {
  if (!state_ || !driver().ok)
    return;
  for (CUmodule module : state_->modules)
    driver().moduleUnload(module);
  if (state_->errHost)
    driver().memFreeHost(state_->errHost);
}

namespace {
std::string kernelErrorText(int code) {
  if (code == 1)
    return "an index is out of bounds (gather/indexing/scatter with an index outside the dim)";
  return "kernel error code " + std::to_string(code);
}
} // namespace

void CudaModule::run(CudaRunFn run, void *const *inputs, void *const *outputs, char *arena,
                     const int64_t *syms, void *stream) {
  State &s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (int e = *static_cast<volatile int *>(s.errHost)) {
    *s.errHost = 0;
    throw RunError("a kernel of an earlier call of this graph failed: " + kernelErrorText(e));
  }
  CUcontext current = nullptr;
  driver().ctxGetCurrent(&current);
  if (current != s.ctx)
    check(driver().ctxSetCurrent(s.ctx), "cuCtxSetCurrent");
  s.stream = stream;
  s.failure.clear();
  int code = run(inputs, outputs, arena, syms, &s.api);
  if (code != 0)
    throw RunError(s.failure.empty() ? kernelErrorText(code) : s.failure);
}

void CudaModule::setAssertIndices(bool on) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->api.assertIndices = on ? 1 : 0;
}

void CudaModule::setLaunchObserver(LaunchObserver observer) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->observer = std::move(observer);
}

void CudaModule::synchronizeAndCheck(void *stream) {
  State &s = *state_;
  check(stream ? driver().streamSynchronize(stream) : driver().ctxSynchronize(),
        "waiting for the kernels");
  if (int e = *static_cast<volatile int *>(s.errHost)) {
    *s.errHost = 0;
    throw RunError(kernelErrorText(e));
  }
}

} // namespace braze::runtime
