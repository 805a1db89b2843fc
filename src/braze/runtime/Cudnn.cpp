// cuDNN, loaded at run time, and its convolutions: a backend (graph) API plan per problem, or
// the legacy API's descriptors and algorithm where no such plan can be built. Attention is in
// CudnnAttention.cpp; what both share, in CudnnImpl.h.
#include "braze/runtime/CudnnImpl.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace braze::runtime {

namespace dnn {

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

Shapes cudnnShapes(const ConvProblem &p) {
  Shapes c;
  c.rank = p.rank == 3 ? 4 : p.rank;
  c.spatial = c.rank - 2;
  for (int i = 0, j = 0; i < c.rank; ++i) {
    bool unit = p.rank == 3 && i == 2; // the added height
    c.xd[i] = unit ? 1 : p.xDims[j];
    c.xs[i] = unit ? p.xStrides[2] * p.xDims[2] : p.xStrides[j];
    c.wd[i] = unit ? 1 : p.wDims[j];
    c.ws[i] = unit ? p.wStrides[2] * p.wDims[2] : p.wStrides[j];
    c.yd[i] = unit ? 1 : p.yDims[j];
    c.ys[i] = unit ? p.yStrides[2] * p.yDims[2] : p.yStrides[j];
    j += unit ? 0 : 1;
  }
  for (int i = 0, j = 0; i < c.spatial; ++i) {
    bool unit = p.rank == 3 && i == 0;
    c.stride[i] = unit ? 1 : p.stride[j];
    c.padding[i] = unit ? 0 : p.padding[j];
    c.dilation[i] = unit ? 1 : p.dilation[j];
    j += unit ? 0 : 1;
  }
  return c;
}

} // namespace dnn

Cudnn::Cudnn() : impl_(std::make_unique<Impl>()) {}
Cudnn::~Cudnn() = default;

size_t Cudnn::recommendedWorkspaceBytes() { return kWorkspaceBytes; }

Cudnn &Cudnn::load(const std::string &libraryPath) {
  return loadedOnce<Cudnn>([&] { return openLibrary(libraryPath); });
}

std::unique_ptr<Cudnn> Cudnn::openLibrary(const std::string &libraryPath) {
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
  if (auto version = reinterpret_cast<VersionFn>(lib.find("cudnnGetVersion")))
    im.version = version();
  // The backend API (cuDNN 8.x and 9): optional; without it every problem takes the legacy API.
  im.backendCreate = reinterpret_cast<BackendCreateFn>(lib.find("cudnnBackendCreateDescriptor"));
  im.backendDestroy = reinterpret_cast<BackendDestroyFn>(lib.find("cudnnBackendDestroyDescriptor"));
  im.backendFinalize = reinterpret_cast<BackendFinalizeFn>(lib.find("cudnnBackendFinalize"));
  im.backendSet = reinterpret_cast<BackendSetFn>(lib.find("cudnnBackendSetAttribute"));
  im.backendGet = reinterpret_cast<BackendGetFn>(lib.find("cudnnBackendGetAttribute"));
  im.backendExecute = reinterpret_cast<BackendExecuteFn>(lib.find("cudnnBackendExecute"));
  if (!im.backendDestroy || !im.backendFinalize || !im.backendSet || !im.backendGet ||
      !im.backendExecute)
    im.backendCreate = nullptr;
  if (Status s = im.create(&im.handle); s != 0)
    throw RunError(im.failed("cudnnCreate", s));
  return c;
}

DnnStatus Cudnn::conv(const ConvProblem &p, void *stream, void *workspace, size_t workspaceBytes,
                      std::string &error, const LargeWorkspace &large) {
  Impl &im = *impl_;
  if (p.rank < 3 || p.rank > 5 || p.dtype < 0 || p.dtype > 3 || p.direction < 0 ||
      p.direction > 2) {
    error = "rank " + std::to_string(p.rank) + ", dtype code " + std::to_string(p.dtype) +
            " or direction " + std::to_string(p.direction) + " is not one cuDNN takes";
    return DnnStatus::Declined;
  }
  std::vector<int64_t> key{p.dtype,          p.rank,           p.groups,        p.allowTf32 != 0,
                           alignmentOf(p.x), alignmentOf(p.w), alignmentOf(p.y), p.direction};
  for (const int64_t *a : {p.xDims, p.xStrides, p.wDims, p.wStrides, p.yDims, p.yStrides})
    key.insert(key.end(), a, a + p.rank);
  for (const int64_t *a : {p.stride, p.padding, p.dilation})
    key.insert(key.end(), a, a + p.rank - 2);
  std::lock_guard<std::mutex> lock(im.mu);
  // (Not a structured binding: clang 14 does not let the lambda below capture one.)
  auto emplaced = im.plans.try_emplace(key);
  auto it = emplaced.first;
  bool fresh = emplaced.second;
  Plan &plan = it->second;
  static const int types[] = {kFloat, kDouble, kHalf, kBFloat16};
  int type = types[p.dtype];
  // Builds the plan within `limit` bytes of workspace; false (the entry erased, `error` set)
  // when cuDNN fails to create a descriptor.
  auto build = [&](size_t limit, size_t keep = 1, int64_t until = -1) {
    for (void *d : plan.descriptors)
      im.backendDestroy(d);
    plan = Plan{};
    Shapes c = cudnnShapes(p);
    if (!im.buildGraphPlan(plan, p, c, type, limit, keep, until)) {
      for (void *d : plan.descriptors)
        im.backendDestroy(d);
      plan.descriptors.clear();
      // A gradient has no legacy path here: braze's loops compute it (Declined).
      if (p.direction == 0 && !im.legacyPlan(plan, p, c, type, workspaceBytes, error)) {
        im.plans.erase(it);
        return false;
      }
    }
    return true;
  };
  // A larger workspace only where it can be allocated now: a plan built while a capture is
  // under way keeps within the common workspace.
  if (fresh && !build(large.get && large.canAllocate && large.canAllocate()
                          ? std::max(kLargeWorkspaceBytes, workspaceBytes)
                          : workspaceBytes))
    return DnnStatus::Failed;
  // The engine the autotuner or a tuned module chooses, once per plan.
  if (plan.graphPlan && !plan.tuned && plan.checked != im.choices &&
      im.mayChoose(LibraryKind::Convolution)) {
    // The result: y, the weight's gradient (w) or the input's (x), by direction.
    const int64_t *dims = p.direction == 0 ? p.yDims : p.direction == 1 ? p.wDims : p.xDims;
    const int64_t *strides = p.direction == 0 ? p.yStrides
                             : p.direction == 1 ? p.wStrides : p.xStrides;
    static const int64_t elementBytes[] = {4, 8, 2, 2};
    const int64_t uids[3] = {'x', 'w', 'y'};
    const void *pointers[3] = {p.x, p.w, p.y};
    Impl::EngineCall call{LibraryKind::Convolution, 3, uids, pointers, {}};
    call.results.push_back({p.direction == 0 ? p.y : p.direction == 1 ? p.w : p.x,
                            spanBytes(p.rank, dims, strides, elementBytes[p.dtype]), p.dtype});
    if (!im.chooseEngine(plan, keyText(key), call, stream, workspace, workspaceBytes, large,
                         [&](size_t keep, int64_t until) { return build(plan.limit, keep, until); }))
      return DnnStatus::Failed;
  }
  // A plan over the common workspace whose workspace cannot be had (the device is out of
  // memory, or a capture is under way) is built again within the common one, for good.
  if (plan.graphPlan && size_t(plan.graphWorkspace) > workspaceBytes) {
    if (void *big = large.get ? large.get(size_t(plan.graphWorkspace)) : nullptr)
      workspace = big;
    else if (!build(workspaceBytes))
      return DnnStatus::Failed;
  }
  if (!plan.graphPlan && plan.algo < 0) {
    error = plan.declined;
    return DnnStatus::Declined;
  }
  if (Status s = im.setStream(im.handle, stream); s != 0) {
    error = im.failed("cudnnSetStream", s);
    return DnnStatus::Failed;
  }
  if (plan.graphPlan) {
    const int64_t uids[3] = {'x', 'w', 'y'};
    const void *pointers[3] = {p.x, p.w, p.y};
    return im.execute(plan, 3, uids, pointers, workspace, error);
  }
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  const void *alpha = p.dtype == 1 ? static_cast<const void *>(&one64) : &one32;
  const void *beta = p.dtype == 1 ? static_cast<const void *>(&zero64) : &zero32;
  if (Status s = im.forward(im.handle, alpha, plan.x, p.x, plan.w, p.w, plan.conv, plan.algo,
                            workspace, plan.workspace, beta, plan.y, p.y);
      s != 0) {
    error = im.failed("cudnnConvolutionForward", s);
    return DnnStatus::Failed;
  }
  return DnnStatus::Done;
}

bool Cudnn::Impl::chooseEngine(Plan &plan, const std::string &name, const EngineCall &call,
                               void *stream, void *workspace, size_t workspaceBytes,
                               const LargeWorkspace &large,
                               const std::function<bool(size_t, int64_t)> &rebuild) {
  auto pref = preferred.find(name);
  const int64_t want = pref == preferred.end() ? -1 : pref->second;
  // Preferences for other problems only, or a tuner out of time (or not for attentions): the
  // heuristics' choice stays until a tuner or a preference comes (prefer() also clears `tuned`
  // of the plans it names).
  if (want < 0 && (!tunes(call.kind) || (tunerHasTime && !tunerHasTime()))) {
    plan.checked = choices;
    return true;
  }
  auto wanted = [&] { return std::find(plan.engines.begin(), plan.engines.end(), want); };
  if ((want >= 0 ? wanted() == plan.engines.end() : plan.offered.size() < kOfferedEngines) &&
      !rebuild(kOfferedEngines, want))
    return false;
  if (!plan.graphPlan) // the rebuild found no graph plan (the legacy one serves)
    return true;
  size_t chosen = 0;
  const bool empty = std::any_of(call.results.begin(), call.results.end(),
                                 [](const LibraryResult &r) { return r.bytes == 0; });
  if (want >= 0) {
    chosen = wanted() == plan.engines.end() ? 0 : size_t(wanted() - plan.engines.begin());
  } else if (plan.offered.size() > 1 && !empty) {
    LibraryTuning t;
    t.kind = call.kind;
    t.key = name;
    t.choices = static_cast<int>(plan.offered.size());
    t.ids = plan.engines;
    t.results = call.results;
    t.stream = stream;
    t.run = [&](int i) -> std::string {
      const auto &[exec, bytes] = plan.offered.at(size_t(i));
      void *space = size_t(bytes) <= workspaceBytes ? workspace
                    : large.get                      ? large.get(size_t(bytes))
                                                     : nullptr;
      if (!space)
        return "its workspace of " + std::to_string(bytes) + " bytes cannot be had";
      std::string error;
      if (Status s = setStream(handle, stream); s != 0)
        return failed("cudnnSetStream", s);
      return execute(exec, call.n, call.uids, call.pointers, space, error) == DnnStatus::Done
                 ? ""
                 : error;
    };
    const int got = tuner(t);
    chosen = got >= 0 && got < t.choices ? size_t(got) : 0;
  }
  plan.graphPlan = plan.offered[chosen].first;
  plan.graphWorkspace = plan.offered[chosen].second;
  plan.tuned = true;
  return true;
}

void Cudnn::setTuner(std::function<int(const LibraryTuning &)> tuner,
                     std::function<bool()> hasTime, bool attentions) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->tuner = std::move(tuner);
  impl_->tunerHasTime = std::move(hasTime);
  impl_->tuneAttentions = attentions;
  ++impl_->choices;
}

void Cudnn::prefer(const std::string &key, int64_t engine) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->preferred[key] = engine;
  ++impl_->choices;
  // A plan this process made already (another module's) chooses again at its next call.
  for (auto &[k, plan] : impl_->plans)
    if (keyText(k) == key)
      plan.tuned = false;
}

bool Cudnn::Impl::legacyPlan(Plan &plan, const ConvProblem &p, const Shapes &c, int type,
                             size_t workspaceBytes, std::string &error) {
  Impl &im = *this;
  int format = filterFormat(p);
  int xd[5], xs[5], wd[5], yd[5], ys[5], st[3], pad[3], dil[3];
  bool fits = format >= 0;
  auto narrow = [&](int64_t v) {
    fits = fits && v >= 0 && v <= INT32_MAX;
    return static_cast<int>(v);
  };
  for (int i = 0; i < c.rank; ++i) {
    xd[i] = narrow(c.xd[i]), xs[i] = narrow(c.xs[i]), wd[i] = narrow(c.wd[i]);
    yd[i] = narrow(c.yd[i]), ys[i] = narrow(c.ys[i]);
  }
  for (int i = 0; i < c.spatial; ++i)
    st[i] = narrow(c.stride[i]), pad[i] = narrow(c.padding[i]), dil[i] = narrow(c.dilation[i]);
  if (!fits) {
    plan.declined = format < 0 ? "the weight is neither contiguous nor channels-last"
                               : "a size or stride is beyond int32";
    return true;
  }
  int compute = p.dtype == 1 ? kDouble : kFloat;
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
    return false;
  }
  // A layout or size cuDNN rejects is declined, not an error: the loop kernel computes it.
  step("cudnnSetTensorNdDescriptor", im.setTensor(plan.x, type, c.rank, xd, xs));
  step("cudnnSetTensorNdDescriptor", im.setTensor(plan.y, type, c.rank, yd, ys));
  step("cudnnSetFilterNdDescriptor", im.setFilter(plan.w, type, format, c.rank, wd));
  step("cudnnSetConvolutionNdDescriptor",
       im.setConv(plan.conv, c.spatial, pad, st, dil, kCrossCorrelation, compute));
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
  return true;
}

bool Cudnn::Impl::buildGraphPlan(Plan &plan, const ConvProblem &p, const Shapes &c, int type,
                                  size_t workspaceBytes, size_t keep, int64_t until) {
  if (!backendCreate)
    return false;
  Builder b{*this, plan};
  // a backend plan is built for its operands' alignment
  void *x = b.tensor('x', type, c.rank, c.xd, c.xs, alignmentOf(p.x)),
       *w = b.tensor('w', type, c.rank, c.wd, c.ws, alignmentOf(p.w)),
       *y = b.tensor('y', type, c.rank, c.yd, c.ys, alignmentOf(p.y));
  void *conv = b.make(kConvolutionDesc);
  int compute = p.dtype == 1 ? kDouble : kFloat, mode = kCrossCorrelation;
  int64_t spatial = c.spatial;
  b.set(conv, kConvCompType, kTypeDataType, 1, &compute);
  b.set(conv, kConvMode, kTypeConvMode, 1, &mode);
  b.set(conv, kConvSpatialDims, kTypeInt64, 1, &spatial);
  b.set(conv, kConvDilations, kTypeInt64, spatial, c.dilation);
  b.set(conv, kConvFilterStrides, kTypeInt64, spatial, c.stride);
  b.set(conv, kConvPrePaddings, kTypeInt64, spatial, c.padding);
  b.set(conv, kConvPostPaddings, kTypeInt64, spatial, c.padding);
  b.finalize(conv);
  // The attributes of the operation: alpha, beta, the convolution, x (dx), w (dw), y (dy).
  static const int attributes[3][6] = {
      {kFwdAlpha, kFwdBeta, kFwdConvDesc, kFwdX, kFwdW, kFwdY},
      {kBwdFilterAlpha, kBwdFilterBeta, kBwdFilterConvDesc, kBwdFilterX, kBwdFilterDw,
       kBwdFilterDy},
      {kBwdDataAlpha, kBwdDataBeta, kBwdDataConvDesc, kBwdDataDx, kBwdDataW, kBwdDataDy}};
  static const int operations[3] = {kConvForwardOpDesc, kConvBwdFilterOpDesc,
                                    kConvBwdDataOpDesc};
  const int *at = attributes[p.direction];
  void *op = b.make(operations[p.direction]);
  double one64 = 1, zero64 = 0;
  float one32 = 1, zero32 = 0;
  bool f64 = p.dtype == 1;
  b.set(op, at[0], f64 ? kTypeDouble : kTypeFloat, 1, f64 ? (void *)&one64 : (void *)&one32);
  b.set(op, at[1], f64 ? kTypeDouble : kTypeFloat, 1, f64 ? (void *)&zero64 : (void *)&zero32);
  b.set(op, at[2], kTypeDescriptor, 1, &conv);
  b.set(op, at[3], kTypeDescriptor, 1, &x);
  b.set(op, at[4], kTypeDescriptor, 1, &w);
  b.set(op, at[5], kTypeDescriptor, 1, &y);
  b.finalize(op);
  bool narrowTypes = p.dtype >= 2 || (p.dtype == 0 && p.allowTf32);
  // For the autotuner, the fallback engines too: the instant heuristics offer a half-precision
  // or gradient convolution one or two.
  if (keep > 1)
    return finishPlan(b, {op}, narrowTypes, workspaceBytes, {kHeurInstant, kHeurFallback}, keep,
                      until);
  return finishPlan(b, {op}, narrowTypes, workspaceBytes, {kHeurInstant});
}

} // namespace braze::runtime
