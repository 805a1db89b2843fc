#include "braze/runtime/Cudnn.h"

#include "braze/runtime/VendorLibrary.h"

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace braze::runtime {

namespace {

// ---------------------------------------------------------------------------------------------
// The slice of cuDNN's C ABI (cuDNN 8 and 9: cudnn_ops.h, cudnn_cnn.h, cudnn_graph.h) used here.
// No cuDNN header is included: C enums travel as int, handles and descriptors as void*.
// ---------------------------------------------------------------------------------------------

using Status = int; // cudnnStatus_t; 0 is CUDNN_STATUS_SUCCESS

// cudnnDataType_t
constexpr int kFloat = 0, kDouble = 1, kHalf = 2, kBFloat16 = 9;
// cudnnTensorFormat_t
constexpr int kNchw = 0, kNhwc = 1;
constexpr int kCrossCorrelation = 1; // cudnnConvolutionMode_t
// cudnnMathType_t
constexpr int kDefaultMath = 0, kTensorOpMath = 1, kFmaMath = 3;

/// cudnnConvolutionFwdAlgoPerf_t
struct FwdAlgoPerf {
  int algo;
  Status status;
  float time;
  size_t memory;
  int determinism;
  int mathType;
  int reserved[3];
};
static_assert(offsetof(FwdAlgoPerf, memory) == 16);
static_assert(sizeof(FwdAlgoPerf) == 48);

using CreateFn = Status (*)(void **);
using SetStreamFn = Status (*)(void *handle, void *stream);
using SetTensorFn = Status (*)(void *desc, int dtype, int rank, const int *dims, const int *strides);
using SetFilterFn = Status (*)(void *desc, int dtype, int format, int rank, const int *dims);
using SetConvFn = Status (*)(void *desc, int spatial, const int *pad, const int *stride,
                             const int *dilation, int mode, int computeType);
using SetConvIntFn = Status (*)(void *desc, int value);
using AlgoFn = Status (*)(void *handle, void *x, void *w, void *conv, void *y, int requested,
                          int *returned, FwdAlgoPerf *results);
using ForwardFn = Status (*)(void *handle, const void *alpha, void *xDesc, const void *x,
                             void *wDesc, const void *w, void *convDesc, int algo, void *workspace,
                             size_t workspaceBytes, const void *beta, void *yDesc, void *y);
using ErrorFn = const char *(*)(Status);

constexpr size_t kWorkspaceBytes = size_t(64) << 20;

/// The weight's cuDNN filter format from its strides, or -1 if cuDNN has none for them.
int filterFormat(const ConvProblem &p) {
  int r = p.rank;
  int64_t s = 1;
  bool nchw = true;
  for (int i = r - 1; i >= 0; --i) {
    nchw = nchw && (p.wDims[i] == 1 || p.wStrides[i] == s);
    s *= p.wDims[i];
  }
  if (nchw)
    return kNchw;
  // channels last: C is innermost, then the kernel dims, then O
  bool nhwc = p.wDims[1] == 1 || p.wStrides[1] == 1;
  s = p.wDims[1];
  for (int i = r - 1; i >= 2; --i) {
    nhwc = nhwc && (p.wDims[i] == 1 || p.wStrides[i] == s);
    s *= p.wDims[i];
  }
  nhwc = nhwc && (p.wDims[0] == 1 || p.wStrides[0] == s);
  return nhwc ? kNhwc : -1;
}

struct Plan {
  void *x = nullptr, *w = nullptr, *y = nullptr, *conv = nullptr;
  int algo = -1;
  size_t workspace = 0;
  std::string declined; ///< why cuDNN takes no such problem (algo -1)
};

} // namespace

struct Cudnn::Impl {
  void *library = nullptr;
  CreateFn create = nullptr, createTensor = nullptr, createFilter = nullptr, createConv = nullptr;
  SetStreamFn setStream = nullptr;
  SetTensorFn setTensor = nullptr;
  SetFilterFn setFilter = nullptr;
  SetConvFn setConv = nullptr;
  SetConvIntFn setGroups = nullptr, setMath = nullptr;
  AlgoFn algorithms = nullptr;
  ForwardFn forward = nullptr;
  ErrorFn errorString = nullptr;
  void *handle = nullptr;
  std::mutex mu;
  std::map<std::vector<int64_t>, Plan> plans; ///< by problem (declined ones have algo -1)

  std::string failed(const char *call, Status s) {
    return std::string("cuDNN ") + call + " failed: " + (errorString ? errorString(s) : "") +
           " (status " + std::to_string(s) + ")";
  }
};

Cudnn::Cudnn() : impl_(std::make_unique<Impl>()) {}
Cudnn::~Cudnn() = default;

size_t Cudnn::recommendedWorkspaceBytes() { return kWorkspaceBytes; }

Cudnn &Cudnn::load(const std::string &libraryPath) {
  static std::mutex loadMutex;
  static Cudnn *instance = nullptr; // never destroyed: it lives as long as the process
  std::lock_guard<std::mutex> lock(loadMutex);
  if (instance)
    return *instance;
  std::unique_ptr<Cudnn> c(new Cudnn());
  Impl &im = *c->impl_;
  VendorLibrary lib("cuDNN", libraryPath);
  im.library = lib.handle();
  lib.bind(im.create, "cudnnCreate");
  lib.bind(im.setStream, "cudnnSetStream");
  lib.bind(im.createTensor, "cudnnCreateTensorDescriptor");
  lib.bind(im.setTensor, "cudnnSetTensorNdDescriptor");
  lib.bind(im.createFilter, "cudnnCreateFilterDescriptor");
  lib.bind(im.setFilter, "cudnnSetFilterNdDescriptor");
  lib.bind(im.createConv, "cudnnCreateConvolutionDescriptor");
  lib.bind(im.setConv, "cudnnSetConvolutionNdDescriptor");
  lib.bind(im.setGroups, "cudnnSetConvolutionGroupCount");
  lib.bind(im.setMath, "cudnnSetConvolutionMathType");
  lib.bind(im.algorithms, "cudnnGetConvolutionForwardAlgorithm_v7");
  lib.bind(im.forward, "cudnnConvolutionForward");
  lib.bind(im.errorString, "cudnnGetErrorString");
  if (Status s = im.create(&im.handle); s != 0)
    throw RunError(im.failed("cudnnCreate", s));
  instance = c.release();
  return *instance;
}

ConvStatus Cudnn::conv(const ConvProblem &p, void *stream, void *workspace, size_t workspaceBytes,
                       std::string &error) {
  Impl &im = *impl_;
  if (p.rank < 3 || p.rank > 5 || p.dtype < 0 || p.dtype > 3) {
    error = "rank " + std::to_string(p.rank) + " or dtype code " + std::to_string(p.dtype) +
            " is not one cuDNN takes";
    return ConvStatus::Declined;
  }
  std::vector<int64_t> key{p.dtype, p.rank, p.groups, p.allowTf32 != 0};
  for (const int64_t *a : {p.xDims, p.xStrides, p.wDims, p.wStrides, p.yDims, p.yStrides})
    key.insert(key.end(), a, a + p.rank);
  for (const int64_t *a : {p.stride, p.padding, p.dilation})
    key.insert(key.end(), a, a + p.rank - 2);
  std::lock_guard<std::mutex> lock(im.mu);
  auto [it, fresh] = im.plans.try_emplace(key);
  Plan &plan = it->second;
  if (fresh) {
    int format = filterFormat(p);
    // cuDNN takes 4-d and 5-d tensors: a 1-d convolution gets a unit height.
    int rank = p.rank == 3 ? 4 : p.rank, spatial = rank - 2;
    int xd[5], xs[5], wd[5], yd[5], ys[5], st[3], pad[3], dil[3];
    bool fits = format >= 0;
    auto narrow = [&](int64_t v) {
      fits = fits && v >= 0 && v <= INT32_MAX;
      return static_cast<int>(v);
    };
    for (int i = 0, j = 0; i < rank; ++i) {
      bool unit = p.rank == 3 && i == 2; // the added height
      xd[i] = unit ? 1 : narrow(p.xDims[j]);
      xs[i] = unit ? narrow(p.xStrides[2] * p.xDims[2]) : narrow(p.xStrides[j]);
      wd[i] = unit ? 1 : narrow(p.wDims[j]);
      yd[i] = unit ? 1 : narrow(p.yDims[j]);
      ys[i] = unit ? narrow(p.yStrides[2] * p.yDims[2]) : narrow(p.yStrides[j]);
      j += unit ? 0 : 1;
    }
    for (int i = 0, j = 0; i < spatial; ++i) {
      bool unit = p.rank == 3 && i == 0;
      st[i] = unit ? 1 : narrow(p.stride[j]);
      pad[i] = unit ? 0 : narrow(p.padding[j]);
      dil[i] = unit ? 1 : narrow(p.dilation[j]);
      j += unit ? 0 : 1;
    }
    if (!fits) {
      plan.declined = format < 0 ? "the weight is neither contiguous nor channels-last"
                                 : "a size or stride is beyond int32";
      error = plan.declined;
      return ConvStatus::Declined;
    }
    static const int types[] = {kFloat, kDouble, kHalf, kBFloat16};
    int type = types[p.dtype], compute = p.dtype == 1 ? kDouble : kFloat;
    int math = p.dtype >= 2 ? kTensorOpMath : p.dtype == 0 && p.allowTf32 ? kDefaultMath : kFmaMath;
    Status s = 0;
    const char *call = nullptr;
    auto step = [&](const char *name, Status st) {
      if (s == 0 && st != 0) {
        s = st;
        call = name;
      }
    };
    step("cudnnCreateTensorDescriptor", im.createTensor(&plan.x));
    step("cudnnCreateTensorDescriptor", im.createTensor(&plan.y));
    step("cudnnCreateFilterDescriptor", im.createFilter(&plan.w));
    step("cudnnCreateConvolutionDescriptor", im.createConv(&plan.conv));
    if (s != 0) {
      error = im.failed(call, s);
      im.plans.erase(it);
      return ConvStatus::Failed;
    }
    // A layout or size cuDNN rejects is declined, not an error: the loop kernel computes it.
    step("cudnnSetTensorNdDescriptor", im.setTensor(plan.x, type, rank, xd, xs));
    step("cudnnSetTensorNdDescriptor", im.setTensor(plan.y, type, rank, yd, ys));
    step("cudnnSetFilterNdDescriptor", im.setFilter(plan.w, type, format, rank, wd));
    step("cudnnSetConvolutionNdDescriptor",
         im.setConv(plan.conv, spatial, pad, st, dil, kCrossCorrelation, compute));
    step("cudnnSetConvolutionGroupCount", im.setGroups(plan.conv, static_cast<int>(p.groups)));
    step("cudnnSetConvolutionMathType", im.setMath(plan.conv, math));
    FwdAlgoPerf perf[16];
    int returned = 0;
    step("cudnnGetConvolutionForwardAlgorithm_v7",
         im.algorithms(im.handle, plan.x, plan.w, plan.conv, plan.y, 16, &returned, perf));
    for (int i = 0; s == 0 && i < returned && plan.algo < 0; ++i)
      if (perf[i].status == 0 && perf[i].memory <= workspaceBytes &&
          (p.dtype != 0 || p.allowTf32 || perf[i].mathType != kTensorOpMath)) {
        plan.algo = perf[i].algo;
        plan.workspace = perf[i].memory;
      }
    if (s != 0)
      plan.declined = "cuDNN rejected it: " + im.failed(call, s);
    else if (plan.algo < 0)
      plan.declined = "none of cuDNN's " + std::to_string(returned) +
                      " algorithms runs it within the workspace";
  }
  if (plan.algo < 0) {
    error = plan.declined;
    return ConvStatus::Declined;
  }
  if (Status s = im.setStream(im.handle, stream); s != 0) {
    error = im.failed("cudnnSetStream", s);
    return ConvStatus::Failed;
  }
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *alpha = p.dtype == 1 ? static_cast<const void *>(&one64) : &one32;
  const void *beta = p.dtype == 1 ? static_cast<const void *>(&zero64) : &zero32;
  if (Status s = im.forward(im.handle, alpha, plan.x, p.x, plan.w, p.w, plan.conv, plan.algo,
                            workspace, plan.workspace, beta, plan.y, p.y);
      s != 0) {
    error = im.failed("cudnnConvolutionForward", s);
    return ConvStatus::Failed;
  }
  return ConvStatus::Done;
}

} // namespace braze::runtime
