#include "braze/runtime/Cudnn.h"

#include "braze/runtime/VendorLibrary.h"

#include <cstddef>
#include <cstdint>
#include <limits>
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
              kPlanHandle = 400, kPlanEngineConfig = 401, kPlanWorkspaceSize = 402,
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

/// One problem in cuDNN's terms: 1-d convolutions get a unit height (cuDNN takes 4-d and 5-d).
struct Shapes {
  int rank = 4, spatial = 2;
  int64_t xd[5], xs[5], wd[5], ws[5], yd[5], ys[5], stride[3], padding[3], dilation[3];
};

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


struct Plan {
  // backend API: the finalized execution plan and every descriptor it was built from
  void *graphPlan = nullptr;
  int64_t graphWorkspace = 0;
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
  /// within the workspace and computes what the precision allows (allowedEngine). False if
  /// none does.
  bool finishPlan(Builder &b, const std::vector<void *> &ops, bool narrowTypes,
                  size_t workspaceBytes, std::initializer_list<int> modes) {
    void *graph = b.make(kOperationGraphDesc);
    b.set(graph, kOpGraphOps, kTypeDescriptor, int64_t(ops.size()), ops.data());
    b.set(graph, kOpGraphHandle, kTypeHandle, 1, &handle);
    b.finalize(graph);
    if (!b.ok) {
      b.plan.declined = "cuDNN rejected its operation graph: " + b.why;
      return false;
    }
    b.plan.declined = "cuDNN's heuristics offer no engine for it";
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
        if (!allowedEngine(plan, configs[i], narrowTypes))
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
        plan.graphPlan = exec;
        plan.graphWorkspace = bytes;
        return true;
      }
    }
    return false;
  }

  /// Builds plan.graphPlan for `p` through the backend API: tensors, the convolution, the
  /// forward, backward-filter or backward-data operation (by p.direction), and the plan
  /// finishPlan picks (no TF32 in f32 unless allowed). False if none (the legacy API is tried
  /// next for a forward one).
  bool buildGraphPlan(Plan &plan, const ConvProblem &p, const Shapes &c, int type,
                      size_t workspaceBytes) {
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
    return finishPlan(b, {op}, narrowTypes, workspaceBytes, {kHeurInstant});
  }

  /// Builds plan.graphPlan for attention `p`: the operation graph of cuDNN's fused flash
  /// attention (two products around a softmax in f32, the causal mask as index comparisons),
  /// which its heuristics hand to that engine. False if no engine takes it.
  bool buildAttentionPlan(Plan &plan, const AttentionProblem &p, size_t workspaceBytes);

  /// Builds plan.graphPlan for the gradients of attention `p` (p.grad): the operation graph of
  /// cuDNN's fused flash attention backward, with its f32 scratch (plan.scratch) at the start
  /// of the workspace. False if no engine takes it.
  bool buildAttentionBackwardPlan(Plan &plan, const AttentionProblem &p, size_t workspaceBytes);

  /// The attention's scores as its operation graphs compute them, in f32: scale * q kᵀ (kT is
  /// k transposed, [b, hk, d, skv]), the bias added, keys after the row dropped (causal);
  /// virtual, [b, hq, sq, skv]. `ops` gains their operations.
  static void *maskedScores(Builder &b, const AttentionProblem &p, void *q, void *kT,
                            void *scale, std::vector<void *> &ops);

  /// Whether engine config `cfg` computes what eager would: no tensor cores unless
  /// `narrowTypes` (f16/bf16, or f32 with TF32 allowed), and never inputs converted down to a
  /// narrower type.
  bool allowedEngine(Plan &plan, void *cfg, bool narrowTypes) {
    void *engine = describe(plan, kEngineDesc);
    int64_t n = 0;
    if (!engine || backendGet(cfg, kEngineCfgEngine, kTypeDescriptor, 1, &n, &engine) != 0)
      return false;
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
      s = backendExecute(handle, plan.graphPlan, pack);
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
  instance = c.release();
  return *instance;
}

DnnStatus Cudnn::conv(const ConvProblem &p, void *stream, void *workspace, size_t workspaceBytes,
                      std::string &error) {
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
  auto [it, fresh] = im.plans.try_emplace(key);
  Plan &plan = it->second;
  static const int types[] = {kFloat, kDouble, kHalf, kBFloat16};
  int type = types[p.dtype];
  if (fresh) {
    Shapes c = cudnnShapes(p);
    if (!im.buildGraphPlan(plan, p, c, type, workspaceBytes)) {
      for (void *d : plan.descriptors)
        im.backendDestroy(d);
      plan.descriptors.clear();
      // A gradient has no legacy path here: braze's loops compute it (Declined).
      if (p.direction == 0 && !im.legacyPlan(plan, p, c, type, workspaceBytes, error)) {
        im.plans.erase(it);
        return DnnStatus::Failed;
      }
    }
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

namespace {
// The tensors of an attention plan, by unique id.
enum AttentionUid : int64_t {
  kUidQ = 1, kUidK, kUidV, kUidO, kUidScale, kUidNegInf, kUidScores, kUidScaled, kUidRow,
  kUidCol, kUidKeep, kUidMasked, kUidMax, kUidCentered, kUidExp, kUidSum, kUidProbs, kUidLogSum,
  kUidStats, kUidBias, kUidBiased,
  // the backward's
  kUidDout, kUidDq, kUidDk, kUidDv, kUidOne, kUidDoutO, kUidDoutORows, kUidSoftmaxSum,
  kUidProbsT, kUidDp, kUidDpCentered, kUidDpProbs, kUidDs, kUidDsT, kUidKRows, kUidDqAccum
};
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kOne = 1;

size_t roundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }
} // namespace

bool Cudnn::Impl::buildAttentionPlan(Plan &plan, const AttentionProblem &p,
                                     size_t workspaceBytes) {
  if (!backendCreate)
    return false;
  Builder b{*this, plan};
  int io = p.dtype == 3 ? kBFloat16 : kHalf;
  // K enters the first product transposed: [b, hk, d, skv].
  const int64_t qd[4] = {p.b, p.hq, p.sq, p.d}, kd[4] = {p.b, p.hk, p.d, p.skv},
                vd[4] = {p.b, p.hk, p.skv, p.dv}, od[4] = {p.b, p.hq, p.sq, p.dv};
  const int64_t ks[4] = {p.kStrides[0], p.kStrides[1], p.kStrides[3], p.kStrides[2]};
  void *q = b.tensor(kUidQ, io, 4, qd, p.qStrides, alignmentOf(p.q));
  void *k = b.tensor(kUidK, io, 4, kd, ks, alignmentOf(p.k));
  void *v = b.tensor(kUidV, io, 4, vd, p.vStrides, alignmentOf(p.v));
  void *o = b.tensor(kUidO, io, 4, od, p.oStrides, alignmentOf(p.o));
  const int64_t unit[4] = {1, 1, 1, 1};
  void *scale = b.tensor(kUidScale, kFloat, 4, unit, unit, 16, false, true);
  // The scores and what follows them live inside the fused kernel: virtual, row-major.
  const int64_t sd[4] = {p.b, p.hq, p.sq, p.skv},
                ss[4] = {p.hq * p.sq * p.skv, p.sq * p.skv, p.skv, 1};
  const int64_t rd[4] = {p.b, p.hq, p.sq, 1}, rs[4] = {p.hq * p.sq, p.sq, 1, 1};
  auto scores = [&](int64_t uid, int type = kFloat) {
    return b.tensor(uid, type, 4, sd, ss, 16, true);
  };
  auto rows = [&](int64_t uid) { return b.tensor(uid, kFloat, 4, rd, rs, 16, true); };
  std::vector<void *> ops;
  void *scaled = maskedScores(b, p, q, k, scale, ops);
  void *max = rows(kUidMax), *centered = scores(kUidCentered), *e = scores(kUidExp);
  void *sum = rows(kUidSum), *probs = scores(kUidProbs, io);
  ops.push_back(b.reduction(kReduceMax, scaled, max));
  ops.push_back(b.pointwise(kPwSub, kFloat, scaled, max, nullptr, centered));
  ops.push_back(b.pointwise(kPwExp, kFloat, centered, nullptr, nullptr, e));
  ops.push_back(b.reduction(kReduceAdd, e, sum));
  // The rows' log-sum-exp: cuDNN recognizes the softmax by it; virtual unless asked for.
  void *logSum = rows(kUidLogSum);
  void *stats = p.stats ? b.tensor(kUidStats, kFloat, 4, rd, p.statsStrides, alignmentOf(p.stats))
                        : rows(kUidStats);
  ops.push_back(b.pointwise(kPwLog, kFloat, sum, nullptr, nullptr, logSum));
  ops.push_back(b.pointwise(kPwAdd, kFloat, max, logSum, nullptr, stats));
  ops.push_back(b.pointwise(kPwDiv, kFloat, e, sum, nullptr, probs));
  ops.push_back(b.matmul(probs, v, o));
  return finishPlan(b, ops, /*narrowTypes=*/true, workspaceBytes, {kHeurA, kHeurFallback});
}

void *Cudnn::Impl::maskedScores(Builder &b, const AttentionProblem &p, void *q, void *kT,
                                void *scale, std::vector<void *> &ops) {
  int io = p.dtype == 3 ? kBFloat16 : kHalf;
  const int64_t sd[4] = {p.b, p.hq, p.sq, p.skv},
                ss[4] = {p.hq * p.sq * p.skv, p.sq * p.skv, p.skv, 1};
  const int64_t unit[4] = {1, 1, 1, 1};
  auto scores = [&](int64_t uid, int type = kFloat) {
    return b.tensor(uid, type, 4, sd, ss, 16, true);
  };
  void *s = scores(kUidScores), *scaled = scores(kUidScaled);
  ops.push_back(b.matmul(q, kT, s));
  ops.push_back(b.pointwise(kPwMul, kFloat, s, scale, nullptr, scaled));
  if (p.bias) {
    void *bias = b.tensor(kUidBias, io, 4, p.biasDims, p.biasStrides, alignmentOf(p.bias));
    void *biased = scores(kUidBiased);
    ops.push_back(b.pointwise(kPwAdd, kFloat, scaled, bias, nullptr, biased));
    scaled = biased;
  }
  if (p.causal) {
    // keep key j of row i where i >= j; the others become -inf
    void *negInf = b.tensor(kUidNegInf, kFloat, 4, unit, unit, 16, false, true);
    void *row = scores(kUidRow, kInt32), *col = scores(kUidCol, kInt32);
    void *keep = scores(kUidKeep, kBoolean), *masked = scores(kUidMasked);
    ops.push_back(b.pointwise(kPwGenIndex, kFloat, scaled, nullptr, nullptr, row, 2));
    ops.push_back(b.pointwise(kPwGenIndex, kFloat, scaled, nullptr, nullptr, col, 3));
    ops.push_back(b.pointwise(kPwCmpGe, kBoolean, row, col, nullptr, keep));
    ops.push_back(b.pointwise(kPwBinarySelect, kFloat, scaled, negInf, keep, masked));
    scaled = masked;
  }
  return scaled;
}

bool Cudnn::Impl::buildAttentionBackwardPlan(Plan &plan, const AttentionProblem &p,
                                             size_t workspaceBytes) {
  if (!backendCreate)
    return false;
  if (version < 90600) {
    // Before 9.6 the caller zeroes the dQ accumulator, which this runtime has no call for.
    plan.declined = "cuDNN " + std::to_string(version) + " is older than 9.6, the first whose "
                    "fused attention backward zeroes its own dQ accumulator";
    return false;
  }
  Builder b{*this, plan};
  int io = p.dtype == 3 ? kBFloat16 : kHalf;
  // K and V enter transposed, [b, hk, d, skv], as in the forward.
  const int64_t qd[4] = {p.b, p.hq, p.sq, p.d}, kd[4] = {p.b, p.hk, p.d, p.skv},
                vd[4] = {p.b, p.hk, p.dv, p.skv}, od[4] = {p.b, p.hq, p.sq, p.dv},
                dkd[4] = {p.b, p.hg, p.skv, p.d}, dvd[4] = {p.b, p.hg, p.skv, p.dv};
  const int64_t ks[4] = {p.kStrides[0], p.kStrides[1], p.kStrides[3], p.kStrides[2]},
                vs[4] = {p.vStrides[0], p.vStrides[1], p.vStrides[3], p.vStrides[2]};
  const int64_t rd[4] = {p.b, p.hq, p.sq, 1}, rs[4] = {p.hq * p.sq, p.sq, 1, 1};
  void *q = b.tensor(kUidQ, io, 4, qd, p.qStrides, alignmentOf(p.q));
  void *kT = b.tensor(kUidK, io, 4, kd, ks, alignmentOf(p.k));
  void *vT = b.tensor(kUidV, io, 4, vd, vs, alignmentOf(p.v));
  void *o = b.tensor(kUidO, io, 4, od, p.oStrides, alignmentOf(p.o));
  void *dout = b.tensor(kUidDout, io, 4, od, p.gradOutStrides, alignmentOf(p.gradOut));
  void *stats = b.tensor(kUidStats, kFloat, 4, rd, p.statsStrides, alignmentOf(p.stats));
  void *dq = b.tensor(kUidDq, io, 4, qd, p.gradQStrides, alignmentOf(p.gradQ));
  void *dk = b.tensor(kUidDk, io, 4, dkd, p.gradKStrides, alignmentOf(p.gradK));
  void *dv = b.tensor(kUidDv, io, 4, dvd, p.gradVStrides, alignmentOf(p.gradV));
  const int64_t unit[4] = {1, 1, 1, 1};
  void *scale = b.tensor(kUidScale, kFloat, 4, unit, unit, 16, false, true);
  void *one = b.tensor(kUidOne, kFloat, 4, unit, unit, 16, false, true);
  const int64_t sd[4] = {p.b, p.hq, p.sq, p.skv},
                ss[4] = {p.hq * p.sq * p.skv, p.sq * p.skv, p.skv, 1};
  // The scores transposed for the products that give dK and dV: [b, hq, skv, sq].
  const int64_t td[4] = {p.b, p.hq, p.skv, p.sq}, ts[4] = {p.hq * p.sq * p.skv, p.sq * p.skv, 1,
                                                           p.skv};
  auto scores = [&](int64_t uid) { return b.tensor(uid, kFloat, 4, sd, ss, 16, true); };
  std::vector<void *> ops;
  // softmax_sum = sum over dv of dO * O per row: f32, in the workspace.
  const int64_t dood[4] = {p.b, p.hq, p.sq, p.dv},
                doos[4] = {p.hq * p.sq * p.dv, p.sq * p.dv, p.hq * p.dv, 1};
  void *doutO = b.tensor(kUidDoutO, kFloat, 4, dood, doos, 16, true);
  void *doutORows = b.tensor(kUidDoutORows, kFloat, 4, rd, rs, 16, true);
  void *softmaxSum = b.tensor(kUidSoftmaxSum, kFloat, 4, rd, rs, 16);
  ops.push_back(b.pointwise(kPwMul, kFloat, dout, o, nullptr, doutO));
  ops.push_back(b.reduction(kReduceAdd, doutO, doutORows));
  ops.push_back(b.pointwise(kPwMul, kFloat, doutORows, one, nullptr, softmaxSum));
  // P = exp(scores - stats); dV = Pᵀ dO.
  void *scaled = maskedScores(b, p, q, kT, scale, ops);
  void *centered = scores(kUidCentered), *probs = scores(kUidExp);
  ops.push_back(b.pointwise(kPwSub, kFloat, scaled, stats, nullptr, centered));
  ops.push_back(b.pointwise(kPwExp, kFloat, centered, nullptr, nullptr, probs));
  void *probsT = b.tensor(kUidProbsT, io, 4, td, ts, 16, true);
  ops.push_back(b.reshape(probs, probsT));
  ops.push_back(b.matmul(probsT, dout, dv));
  // dS = P * (dO Vᵀ - softmax_sum) * scale; dK = dSᵀ Q; dQ = dS K (accumulated in f32).
  void *dp = scores(kUidDp), *dpCentered = scores(kUidDpCentered);
  void *dpProbs = scores(kUidDpProbs), *ds = scores(kUidDs);
  ops.push_back(b.matmul(dout, vT, dp));
  ops.push_back(b.pointwise(kPwSub, kFloat, dp, softmaxSum, nullptr, dpCentered));
  ops.push_back(b.pointwise(kPwMul, kFloat, dpCentered, probs, nullptr, dpProbs));
  ops.push_back(b.pointwise(kPwMul, kFloat, dpProbs, scale, nullptr, ds));
  void *dsT = b.tensor(kUidDsT, io, 4, td, ts, 16, true);
  ops.push_back(b.reshape(ds, dsT));
  ops.push_back(b.matmul(dsT, q, dk));
  const int64_t kr[4] = {p.b, p.hk, p.skv, p.d};
  void *kRows = b.tensor(kUidKRows, io, 4, kr, p.kStrides, alignmentOf(p.k), true);
  ops.push_back(b.reshape(kT, kRows));
  const int64_t qs[4] = {p.hq * p.sq * p.d, p.sq * p.d, p.d, 1};
  void *dqAccum = b.tensor(kUidDqAccum, kFloat, 4, qd, qs, 16);
  ops.push_back(b.matmul(ds, kRows, dqAccum));
  ops.push_back(b.pointwise(kPwIdentity, kFloat, dqAccum, nullptr, nullptr, dq));
  plan.scratch = roundUp256(size_t(p.b * p.hq * p.sq * p.d) * sizeof(float)) +
                 roundUp256(size_t(p.b * p.hq * p.sq) * sizeof(float));
  if (plan.scratch >= workspaceBytes) {
    plan.declined = "its f32 scratch (" + std::to_string(plan.scratch) +
                    " bytes) does not fit the workspace";
    return false;
  }
  return finishPlan(b, ops, /*narrowTypes=*/true, workspaceBytes - plan.scratch,
                    {kHeurA, kHeurFallback});
}

DnnStatus Cudnn::attention(const AttentionProblem &p, void *stream, void *workspace,
                           size_t workspaceBytes, std::string &error) {
  Impl &im = *impl_;
  if ((p.dtype != 2 && p.dtype != 3) || p.hk <= 0 || p.hq % p.hk != 0 || p.d % 8 != 0 ||
      p.dv % 8 != 0 || p.d > 256 || p.dv > 256) {
    error = "dtype code " + std::to_string(p.dtype) + ", heads " + std::to_string(p.hq) + "/" +
            std::to_string(p.hk) + " or head dims " + std::to_string(p.d) + "/" +
            std::to_string(p.dv) + " are not ones cuDNN's fused attention takes";
    return DnnStatus::Declined;
  }
  if (p.bias && (p.biasStrides[3] != 1 || p.biasDims[3] != p.skv)) {
    error = "a bias whose keys are not contiguous is not one cuDNN's fused attention takes";
    return DnnStatus::Declined;
  }
  if (p.grad && (!p.stats || !p.gradOut || !p.gradQ || !p.gradK || !p.gradV ||
                 (p.hg != p.hk && p.hg != p.hq))) {
    error = "an attention backward needs the saved statistics, the output's gradient, and "
            "gradients of k and v with " + std::to_string(p.hk) + " or " +
            std::to_string(p.hq) + " heads (got " + std::to_string(p.hg) + ")";
    return DnnStatus::Declined;
  }
  if (p.grad && p.bias && p.biasDims[2] == 1 && p.sq > 1) {
    // Measured on cuDNN 9.19 (H200): such a backward runs, but its gradients are wrong.
    error = "cuDNN's fused attention backward takes a bias of every query row, not one "
            "broadcast over them";
    return DnnStatus::Declined;
  }
  std::vector<int64_t> key{p.grad ? -2 : -1, p.dtype, p.causal, p.b, p.hq, p.hk, p.sq, p.skv,
                           p.d, p.dv, alignmentOf(p.q), alignmentOf(p.k), alignmentOf(p.v),
                           alignmentOf(p.o), p.bias ? alignmentOf(p.bias) : -1,
                           p.stats ? alignmentOf(p.stats) : -1};
  for (const int64_t *a : {p.qStrides, p.kStrides, p.vStrides, p.oStrides})
    key.insert(key.end(), a, a + 4);
  if (p.bias)
    for (const int64_t *a : {p.biasDims, p.biasStrides})
      key.insert(key.end(), a, a + 4);
  if (p.stats)
    key.insert(key.end(), p.statsStrides, p.statsStrides + 4);
  if (p.grad) {
    key.insert(key.end(), {p.hg, alignmentOf(p.gradOut), alignmentOf(p.gradQ), alignmentOf(p.gradK),
                           alignmentOf(p.gradV)});
    for (const int64_t *a : {p.gradOutStrides, p.gradQStrides, p.gradKStrides, p.gradVStrides})
      key.insert(key.end(), a, a + 4);
  }
  std::lock_guard<std::mutex> lock(im.mu);
  auto [it, fresh] = im.plans.try_emplace(key);
  Plan &plan = it->second;
  if (fresh && !(p.grad ? im.buildAttentionBackwardPlan(plan, p, workspaceBytes)
                        : im.buildAttentionPlan(plan, p, workspaceBytes))) {
    for (void *d : plan.descriptors)
      im.backendDestroy(d);
    plan.descriptors.clear();
    if (!im.backendCreate)
      plan.declined = "this cuDNN has no backend API";
  }
  if (!plan.graphPlan) {
    error = plan.declined;
    return DnnStatus::Declined;
  }
  if (Status s = im.setStream(im.handle, stream); s != 0) {
    error = im.failed("cudnnSetStream", s);
    return DnnStatus::Failed;
  }
  int64_t uids[16] = {kUidQ, kUidK, kUidV, kUidO, kUidScale};
  const void *pointers[16] = {p.q, p.k, p.v, p.o, &p.scale};
  int64_t n = 5;
  if (p.causal)
    uids[n] = kUidNegInf, pointers[n++] = &kNegInf;
  if (p.bias)
    uids[n] = kUidBias, pointers[n++] = p.bias;
  if (p.stats)
    uids[n] = kUidStats, pointers[n++] = p.stats;
  if (p.grad) {
    // The scratch leads the workspace: the dQ accumulator, then the rows' sums.
    char *scratch = static_cast<char *>(workspace);
    size_t rows = roundUp256(size_t(p.b * p.hq * p.sq * p.d) * sizeof(float));
    const std::pair<int64_t, const void *> grads[] = {
        {kUidDout, p.gradOut}, {kUidDq, p.gradQ}, {kUidDk, p.gradK}, {kUidDv, p.gradV}, {kUidOne, &kOne},
        {kUidDqAccum, scratch}, {kUidSoftmaxSum, scratch + rows}};
    for (auto [uid, pointer] : grads)
      uids[n] = uid, pointers[n++] = pointer;
    workspace = scratch + plan.scratch;
  }
  return im.execute(plan, n, uids, pointers, workspace, error);
}

} // namespace braze::runtime
