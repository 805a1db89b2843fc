#pragma once
/// Internals of the cuDNN runtime (Cudnn.cpp: loading and convolutions; CudnnAttention.cpp:
/// fused attention and its backward): the slice of cuDNN's C ABI they use, a problem's plan,
/// and Cudnn::Impl with its backend-descriptor builder. Included by those files only.
#include "braze/runtime/Cudnn.h"

#include "braze/runtime/VendorLibrary.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace braze::runtime {

namespace dnn {

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
using VersionFn = size_t (*)();

// The backend (graph) API, cudnn_graph.h: descriptors are built once per problem and finalized
// into an execution plan; a call only fills a variant pack (pointers) and executes the plan. The
// legacy cudnnConvolutionForward costs about 100 us of host time per call on cuDNN 9 (it builds
// such a plan internally); the plan's execute costs a few.
using BackendCreateFn = Status (*)(int type, void **desc);
using BackendDestroyFn = Status (*)(void *desc);
using BackendFinalizeFn = Status (*)(void *desc);
using BackendSetFn = Status (*)(void *desc, int name, int type, int64_t count, const void *values);
using BackendGetFn = Status (*)(void *desc, int name, int type, int64_t requested, int64_t *count,
                                void *values);
using BackendExecuteFn = Status (*)(void *handle, void *plan, void *variantPack);

// cudnnBackendDescriptorType_t
constexpr int kPointwiseDesc = 0, kConvolutionDesc = 1, kEngineDesc = 2, kEngineCfgDesc = 3,
              kEngineHeurDesc = 4, kExecutionPlanDesc = 5, kConvForwardOpDesc = 10,
              kConvBwdFilterOpDesc = 11, kConvBwdDataOpDesc = 12,
              kPointwiseOperation = 13, kOperationGraphDesc = 15, kVariantPackDesc = 16,
              kTensorDesc = 17, kMatmulDesc = 18, kMatmulOperation = 19, kReductionDesc = 21,
              kReductionOperation = 22, kReshapeOperation = 31;
// cudnnBackendAttributeType_t
constexpr int kTypeHandle = 0, kTypeDataType = 1, kTypeBoolean = 2, kTypeInt64 = 3,
              kTypeFloat = 4, kTypeDouble = 5, kTypeVoidPtr = 6, kTypeConvMode = 7,
              kTypeHeurMode = 8, kTypeNumericalNote = 11, kTypePointwiseMode = 14,
              kTypeDescriptor = 15, kTypeReductionOp = 18;
// cudnnBackendAttributeName_t
constexpr int kPwMode = 0, kPwMathPrec = 1, kPwAxis = 9, kConvCompType = 100, kConvMode = 101,
              kConvDilations = 102, kConvFilterStrides = 103, kConvPostPaddings = 104,
              kConvPrePaddings = 105, kConvSpatialDims = 106, kHeurMode = 200,
              kHeurOperationGraph = 201, kHeurResults = 202, kEngineCfgEngine = 300,
              kEngineGlobalIndex = 1301, kPlanHandle = 400, kPlanEngineConfig = 401,
              kPlanWorkspaceSize = 402,
              kFwdAlpha = 700, kFwdBeta = 701, kFwdConvDesc = 702, kFwdW = 703, kFwdX = 704,
              kFwdY = 705, kBwdDataAlpha = 706, kBwdDataBeta = 707, kBwdDataConvDesc = 708,
              kBwdDataW = 709, kBwdDataDx = 710, kBwdDataDy = 711, kBwdFilterAlpha = 712,
              kBwdFilterBeta = 713, kBwdFilterConvDesc = 714, kBwdFilterDw = 715,
              kBwdFilterX = 716, kBwdFilterDy = 717, kPwOpDesc = 750, kPwOpX = 751, kPwOpB = 752,
              kPwOpY = 753,
              kPwOpT = 758, kOpGraphHandle = 800, kOpGraphOps = 801, kTensorByteAlignment = 900,
              kTensorDataType = 901, kTensorDimensions = 902, kTensorStrides = 903,
              kTensorUniqueId = 906, kTensorIsVirtual = 907, kTensorIsByValue = 908,
              kPackUniqueIds = 1000, kPackDataPointers = 1001, kPackWorkspace = 1003,
              kEngineNumericalNote = 1303, kMatmulCompType = 1500, kMatmulOpA = 1520,
              kMatmulOpB = 1521, kMatmulOpC = 1522, kMatmulOpDesc = 1523,
              kReductionOperator = 1600, kReductionCompType = 1601, kReductionOpX = 1610,
              kReductionOpY = 1611, kReductionOpDesc = 1612, kReshapeOpX = 2200, kReshapeOpY = 2201;
constexpr int kInt32 = 4, kBoolean = 11; // cudnnDataType_t, beyond the floating types
// cudnnPointwiseMode_t
constexpr int kPwAdd = 0, kPwMul = 1, kPwDiv = 6, kPwSub = 9, kPwExp = 13, kPwLog = 15,
              kPwIdentity = 21, kPwCmpGe = 303, kPwGenIndex = 501, kPwBinarySelect = 601;
constexpr int kReduceAdd = 0, kReduceMax = 3; // cudnnReduceTensorOp_t
// cudnnBackendHeurMode_t
constexpr int kHeurInstant = 0, kHeurFallback = 2, kHeurA = 3;
constexpr int kNoteTensorCore = 0, kNoteDownConvertInputs = 1; // cudnnBackendNumericalNote_t

constexpr size_t kWorkspaceBytes = size_t(64) << 20;
constexpr size_t kLargeWorkspaceBytes = size_t(1) << 30;

/// One problem in cuDNN's terms: 1-d convolutions get a unit height (cuDNN takes 4-d and 5-d).
struct Shapes {
  int rank = 4, spatial = 2;
  int64_t xd[5], xs[5], wd[5], ws[5], yd[5], ys[5], stride[3], padding[3], dilation[3];
};

/// How many engine configs a convolution's or an attention's plan keeps for the autotuner
/// (Cudnn::setTuner).
constexpr size_t kOfferedEngines = 8;

/// A problem's key as one word: LibraryTuning::key, a tuned module's record. An attention's
/// key (Cudnn::attention's) begins with -1 (forward) or -2 (backward), a convolution's
/// (Cudnn::conv's) with its dtype.
inline std::string keyText(const std::vector<int64_t> &key) {
  std::string s = !key.empty() && key[0] < 0 ? "attention" : "conv";
  for (int64_t v : key)
    s += "_" + std::to_string(v);
  return s;
}

/// The bytes a tensor of `rank` dims and strides spans from its first element (0: empty).
inline size_t spanBytes(int rank, const int64_t *dims, const int64_t *strides,
                        int64_t elementBytes) {
  int64_t span = 1;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] == 0)
      return 0;
    span += (dims[i] - 1) * strides[i];
  }
  return static_cast<size_t>(span * elementBytes);
}

struct Plan {
  // backend API: the finalized execution plan and every descriptor it was built from
  void *graphPlan = nullptr;
  int64_t graphWorkspace = 0;
  /// The execution plans built (graphPlan among them) and their workspaces, in the
  /// heuristics' order: one, unless the autotuner or a tuned module asked for more.
  std::vector<std::pair<void *, int64_t>> offered;
  std::vector<int64_t> engines; ///< offered's engines, by global index (-1: cuDNN does not say)
  size_t limit = 0;   ///< the workspace the plans were built within
  bool tuned = false; ///< chosen among `offered` (by the autotuner or a tuned module)
  uint64_t checked = 0; ///< the Impl::choices at which no choice was wanted for it
  /// Bytes at the start of the workspace that the plan's own tensors take (the attention
  /// backward's f32 accumulator of dQ and its rows' sums of dO·O); the engine's follow.
  size_t scratch = 0;
  std::vector<void *> descriptors;
  // legacy API, where no backend plan could be built
  void *x = nullptr, *w = nullptr, *y = nullptr, *conv = nullptr;
  int algo = -1;
  size_t workspace = 0;
  std::string declined; ///< why cuDNN takes no such problem (neither plan)
};

} // namespace dnn

using namespace dnn; // NOLINT: an internal header of two files

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
  size_t version = 0; ///< cudnnGetVersion(), e.g. 90600 for 9.6.0
  BackendCreateFn backendCreate = nullptr;
  BackendDestroyFn backendDestroy = nullptr;
  BackendFinalizeFn backendFinalize = nullptr;
  BackendSetFn backendSet = nullptr;
  BackendGetFn backendGet = nullptr;
  BackendExecuteFn backendExecute = nullptr;
  void *handle = nullptr;
  std::mutex mu;
  std::map<std::vector<int64_t>, Plan> plans; ///< by problem (declined ones have algo -1)
  std::function<int(const LibraryTuning &)> tuner; ///< setTuner's
  std::function<bool()> tunerHasTime;              ///< setTuner's
  bool tuneAttentions = false;                     ///< setTuner's
  std::map<std::string, int64_t> preferred; ///< prefer's engine global indices, by key
  uint64_t choices = 1; ///< counts setTuner's and prefer's calls: a plan checked before looks again

  /// Whether the tuner takes problems of `kind` (attentions only where setTuner said so).
  bool tunes(LibraryKind kind) const {
    return tuner && (kind != LibraryKind::Attention || tuneAttentions);
  }
  /// Whether a plan of `kind` not yet checked goes to chooseEngine: a tuner takes it, or some
  /// tuned module left preferences (for it or for others).
  bool mayChoose(LibraryKind kind) const { return tunes(kind) || !preferred.empty(); }

  /// A backend descriptor of `type` that `plan` owns; nullptr if cuDNN cannot make one.
  void *describe(Plan &plan, int type) {
    void *d = nullptr;
    if (backendCreate(type, &d) != 0)
      return nullptr;
    plan.descriptors.push_back(d);
    return d;
  }

  /// Makes, sets and finalizes backend descriptors that `plan` owns. `ok` turns false at the
  /// first call cuDNN rejects; the calls after it do nothing.
  struct Builder {
    Builder(Impl &im, Plan &plan) : im(im), plan(plan) {}

    Impl &im;
    Plan &plan;
    bool ok = true;
    std::string why; ///< the first call cuDNN rejected

    void *make(int type) {
      void *d = ok ? im.describe(plan, type) : nullptr;
      if (ok && !d)
        fail("creating descriptor type " + std::to_string(type), -1);
      return d;
    }
    void set(void *d, int name, int attrType, int64_t count, const void *values) {
      if (ok && d)
        if (Status s = im.backendSet(d, name, attrType, count, values); s != 0)
          fail("setting attribute " + std::to_string(name), s);
    }
    void finalize(void *d) {
      if (ok && d)
        if (Status s = im.backendFinalize(d); s != 0)
          fail("finalizing descriptor " + std::to_string(plan.descriptors.size() - 1), s);
    }
    void fail(const std::string &what, Status s) {
      ok = false;
      why = what + (s >= 0 ? " (" + im.failed("call", s) + ")" : "");
    }
    /// A tensor of `type` and `rank` dims; a virtual one lives inside the plan, a by-value one
    /// is a host scalar the variant pack points at.
    void *tensor(int64_t uid, int type, int rank, const int64_t *dims, const int64_t *strides,
                 int64_t align, bool isVirtual = false, bool byValue = false) {
      void *t = make(kTensorDesc);
      set(t, kTensorDataType, kTypeDataType, 1, &type);
      set(t, kTensorDimensions, kTypeInt64, rank, dims);
      set(t, kTensorStrides, kTypeInt64, rank, strides);
      set(t, kTensorUniqueId, kTypeInt64, 1, &uid);
      set(t, kTensorByteAlignment, kTypeInt64, 1, &align);
      if (isVirtual)
        set(t, kTensorIsVirtual, kTypeBoolean, 1, &isVirtual);
      if (byValue)
        set(t, kTensorIsByValue, kTypeBoolean, 1, &byValue);
      finalize(t);
      return t;
    }
    /// y = mode(x[, b][, t]) computed in `precision`; `axis` for an index generator.
    void *pointwise(int mode, int precision, void *x, void *b, void *t, void *y,
                    int64_t axis = -1) {
      void *pw = make(kPointwiseDesc);
      set(pw, kPwMode, kTypePointwiseMode, 1, &mode);
      set(pw, kPwMathPrec, kTypeDataType, 1, &precision);
      if (axis >= 0)
        set(pw, kPwAxis, kTypeInt64, 1, &axis);
      finalize(pw);
      void *op = make(kPointwiseOperation);
      set(op, kPwOpDesc, kTypeDescriptor, 1, &pw);
      set(op, kPwOpX, kTypeDescriptor, 1, &x);
      if (b)
        set(op, kPwOpB, kTypeDescriptor, 1, &b);
      if (t)
        set(op, kPwOpT, kTypeDescriptor, 1, &t);
      set(op, kPwOpY, kTypeDescriptor, 1, &y);
      finalize(op);
      return op;
    }
    /// y = x reduced with `reduce` over the dims where y has size 1, in f32.
    void *reduction(int reduce, void *x, void *y) {
      void *r = make(kReductionDesc);
      int compute = kFloat;
      set(r, kReductionOperator, kTypeReductionOp, 1, &reduce);
      set(r, kReductionCompType, kTypeDataType, 1, &compute);
      finalize(r);
      void *op = make(kReductionOperation);
      set(op, kReductionOpDesc, kTypeDescriptor, 1, &r);
      set(op, kReductionOpX, kTypeDescriptor, 1, &x);
      set(op, kReductionOpY, kTypeDescriptor, 1, &y);
      finalize(op);
      return op;
    }
    /// y = x with y's dims and strides (a view: a transpose, or a cast of a virtual tensor).
    void *reshape(void *x, void *y) {
      void *op = make(kReshapeOperation);
      set(op, kReshapeOpX, kTypeDescriptor, 1, &x);
      set(op, kReshapeOpY, kTypeDescriptor, 1, &y);
      finalize(op);
      return op;
    }
    /// c = a b over the last two dims (batched over the others), accumulated in f32.
    void *matmul(void *a, void *b, void *c) {
      void *mm = make(kMatmulDesc);
      int compute = kFloat;
      set(mm, kMatmulCompType, kTypeDataType, 1, &compute);
      finalize(mm);
      void *op = make(kMatmulOperation);
      set(op, kMatmulOpDesc, kTypeDescriptor, 1, &mm);
      set(op, kMatmulOpA, kTypeDescriptor, 1, &a);
      set(op, kMatmulOpB, kTypeDescriptor, 1, &b);
      set(op, kMatmulOpC, kTypeDescriptor, 1, &c);
      finalize(op);
      return op;
    }
  };

  /// Finalizes `ops` into an operation graph and sets plan.graphPlan to the first engine config
  /// of cuDNN's heuristics (each mode of `modes` in turn) that finalizes into an execution plan
  /// within the workspace and computes what the precision allows (allowedEngine); plan.offered
  /// holds it and up to `keep` - 1 more that do, in the heuristics' order, each engine once
  /// (the later modes only while fewer than `keep`), plan.engines their global indices; the
  /// search stops early once engine `until` (>= 0) is offered. False if none does.
  bool finishPlan(Builder &b, const std::vector<void *> &ops, bool narrowTypes,
                  size_t workspaceBytes, std::initializer_list<int> modes, size_t keep = 1,
                  int64_t until = -1) {
    void *graph = b.make(kOperationGraphDesc);
    b.set(graph, kOpGraphOps, kTypeDescriptor, int64_t(ops.size()), ops.data());
    b.set(graph, kOpGraphHandle, kTypeHandle, 1, &handle);
    b.finalize(graph);
    if (!b.ok) {
      b.plan.declined = "cuDNN rejected its operation graph: " + b.why;
      return false;
    }
    b.plan.declined = "cuDNN's heuristics offer no engine for it";
    std::vector<int64_t> &engines = b.plan.engines;
    auto enough = [&] {
      return b.plan.offered.size() >= keep ||
             (until >= 0 && !engines.empty() && engines.back() == until);
    };
    for (int mode : modes) {
      Plan &plan = b.plan;
      void *heur = describe(plan, kEngineHeurDesc);
      int64_t count = 0;
      if (!heur || backendSet(heur, kHeurOperationGraph, kTypeDescriptor, 1, &graph) != 0 ||
          backendSet(heur, kHeurMode, kTypeHeurMode, 1, &mode) != 0 ||
          backendFinalize(heur) != 0 ||
          backendGet(heur, kHeurResults, kTypeDescriptor, 0, &count, nullptr) != 0 || count <= 0)
        continue;
      plan.declined = "none of the " + std::to_string(count) +
                      " engine configs cuDNN's heuristics offer builds a plan within the workspace";
      std::vector<void *> configs;
      for (int64_t i = 0; i < count; ++i)
        if (void *cfg = describe(plan, kEngineCfgDesc))
          configs.push_back(cfg);
      int64_t got = 0;
      if (backendGet(heur, kHeurResults, kTypeDescriptor, int64_t(configs.size()), &got,
                     configs.data()) != 0)
        continue;
      for (int64_t i = 0; i < got && i < int64_t(configs.size()); ++i) {
        int64_t engine = -1;
        if (!allowedEngine(plan, configs[i], narrowTypes, &engine) ||
            (engine >= 0 && std::find(engines.begin(), engines.end(), engine) != engines.end()))
          continue;
        void *exec = describe(plan, kExecutionPlanDesc);
        if (!exec || backendSet(exec, kPlanHandle, kTypeHandle, 1, &handle) != 0 ||
            backendSet(exec, kPlanEngineConfig, kTypeDescriptor, 1, &configs[i]) != 0 ||
            backendFinalize(exec) != 0)
          continue;
        int64_t bytes = 0, n = 0;
        if (backendGet(exec, kPlanWorkspaceSize, kTypeInt64, 1, &n, &bytes) != 0 || bytes < 0 ||
            size_t(bytes) > workspaceBytes)
          continue;
        plan.offered.push_back({exec, bytes});
        engines.push_back(engine);
        if (enough())
          break;
      }
      if (enough())
        break;
    }
    Plan &plan = b.plan;
    if (plan.offered.empty())
      return false;
    plan.graphPlan = plan.offered.front().first;
    plan.graphWorkspace = plan.offered.front().second;
    plan.limit = workspaceBytes;
    return true;
  }

  /// Builds plan.graphPlan for `p` through the backend API: tensors, the convolution, the
  /// forward, backward-filter or backward-data operation (by p.direction), and the plan
  /// finishPlan picks (no TF32 in f32 unless allowed). False if none (the legacy API is tried
  /// next for a forward one).
  bool buildGraphPlan(Plan &plan, const ConvProblem &p, const Shapes &c, int type,
                      size_t workspaceBytes, size_t keep = 1, int64_t until = -1);

  /// One execution of a plan's problem, for chooseEngine: its tensors by unique id, and what
  /// it writes (compared across engines).
  struct EngineCall {
    LibraryKind kind = LibraryKind::Convolution;
    int64_t n = 0;
    const int64_t *uids = nullptr;
    const void *const *pointers = nullptr;
    std::vector<LibraryResult> results;
  };

  /// Where the autotuner or a tuned module chooses the engine of `plan` (its problem's key
  /// `name`): builds up to kOfferedEngines configs again through `rebuild(keep, until)` (for a
  /// preference, until its engine is among them) and points the plan at the chosen one; a
  /// preferred engine the heuristics no longer offer leaves their first. Each engine runs
  /// `call` with `workspace` (`workspaceBytes`, or a larger one from `large`). False when the
  /// rebuild failed (the plan is gone).
  bool chooseEngine(Plan &plan, const std::string &name, const EngineCall &call, void *stream,
                    void *workspace, size_t workspaceBytes, const LargeWorkspace &large,
                    const std::function<bool(size_t, int64_t)> &rebuild);

  /// Builds plan.graphPlan for attention `p`: the operation graph of cuDNN's fused flash
  /// attention (two products around a softmax in f32, the causal mask as index comparisons),
  /// which its heuristics hand to that engine; up to `keep` configs for the autotuner, as
  /// finishPlan's. False if no engine takes it.
  bool buildAttentionPlan(Plan &plan, const AttentionProblem &p, size_t workspaceBytes,
                          size_t keep = 1, int64_t until = -1);

  /// Builds plan.graphPlan for the gradients of attention `p` (p.grad): the operation graph of
  /// cuDNN's fused flash attention backward, with its f32 scratch (plan.scratch) at the start
  /// of the workspace; up to `keep` configs, as the forward's. False if no engine takes it.
  bool buildAttentionBackwardPlan(Plan &plan, const AttentionProblem &p, size_t workspaceBytes,
                                  size_t keep = 1, int64_t until = -1);

  /// The attention's scores as its operation graphs compute them, in f32: scale * q kᵀ (kT is
  /// k transposed, [b, hk, d, skv]), the bias added, keys after the row dropped (causal);
  /// virtual, [b, hq, sq, skv]. `ops` gains their operations.
  static void *maskedScores(Builder &b, const AttentionProblem &p, void *q, void *kT,
                            void *scale, std::vector<void *> &ops);

  /// A virtual tensor of attention p's scores, [b, hq, sq, skv] row-major, of `type`.
  static void *scoresTensor(Builder &b, const AttentionProblem &p, int64_t uid,
                            int type = kFloat);

  /// An f32 tensor of attention p's rows, [b, hq, sq, 1] row-major: virtual, or (not) one the
  /// variant pack points at.
  static void *rowsTensor(Builder &b, const AttentionProblem &p, int64_t uid,
                          bool isVirtual = true);

  /// Whether engine config `cfg` computes what eager would: no tensor cores unless
  /// `narrowTypes` (f16/bf16, or f32 with TF32 allowed), and never inputs converted down to a
  /// narrower type.
  /// `index`, when given, receives the engine's global index (-1 where cuDNN does not say).
  bool allowedEngine(Plan &plan, void *cfg, bool narrowTypes, int64_t *index = nullptr) {
    void *engine = describe(plan, kEngineDesc);
    int64_t n = 0;
    if (!engine || backendGet(cfg, kEngineCfgEngine, kTypeDescriptor, 1, &n, &engine) != 0)
      return false;
    if (index && backendGet(engine, kEngineGlobalIndex, kTypeInt64, 1, &n, index) != 0)
      *index = -1; // unknown: not compared with the others
    int notes[16] = {};
    int64_t count = 0;
    if (backendGet(engine, kEngineNumericalNote, kTypeNumericalNote, 16, &count, notes) != 0)
      return false;
    for (int64_t i = 0; i < count && i < 16; ++i)
      if (notes[i] == kNoteDownConvertInputs || (notes[i] == kNoteTensorCore && !narrowTypes))
        return false;
    return true;
  }

  /// Fills plan's legacy descriptors and algorithm (cuDNN's heuristics), or plan.declined;
  /// false, with `error` set, if cuDNN cannot create a descriptor.
  bool legacyPlan(Plan &plan, const ConvProblem &p, const Shapes &c, int type,
                  size_t workspaceBytes, std::string &error);

  /// Runs plan.graphPlan on the handle's stream with the `n` tensors of `uids` at `pointers`.
  DnnStatus execute(const Plan &plan, int64_t n, const int64_t *uids, const void *const *pointers,
                    void *workspace, std::string &error) {
    return execute(plan.graphPlan, n, uids, pointers, workspace, error);
  }
  /// Runs execution plan `graphPlan` as above.
  DnnStatus execute(void *graphPlan, int64_t n, const int64_t *uids, const void *const *pointers,
                    void *workspace, std::string &error) {
    void *pack = nullptr;
    Status s = backendCreate(kVariantPackDesc, &pack);
    if (s == 0)
      s = backendSet(pack, kPackUniqueIds, kTypeInt64, n, uids);
    if (s == 0)
      s = backendSet(pack, kPackDataPointers, kTypeVoidPtr, n, pointers);
    if (s == 0)
      s = backendSet(pack, kPackWorkspace, kTypeVoidPtr, 1, &workspace);
    if (s == 0)
      s = backendFinalize(pack);
    if (s == 0)
      s = backendExecute(handle, graphPlan, pack);
    if (pack)
      backendDestroy(pack);
    if (s != 0) {
      error = failed("cudnnBackendExecute", s);
      return DnnStatus::Failed;
    }
    return DnnStatus::Done;
  }

  std::string failed(const char *call, Status s) {
    return std::string("cuDNN ") + call + " failed: " + (errorString ? errorString(s) : "") +
           " (status " + std::to_string(s) + ")";
  }
};

} // namespace braze::runtime
