#include "braze/runtime/CublasLt.h"

#include "braze/runtime/VendorLibrary.h"
#include "braze/support/Hashing.h"

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace braze::runtime {

namespace {

// ---------------------------------------------------------------------------------------------
// The slice of the cuBLASLt C ABI used here. No CUDA header is included: these are the values of
// the cuBLASLt ABI (CUDA 12/13), as cublasLt.h, cublas_api.h and library_types.h declare them.
// C enums travel as int; opaque handles and descriptors as void*; a CUstream/cudaStream_t is a
// pointer (struct CUstream_st *). Descriptors are made with the *Create functions (heap), never
// with the *Init_internal ones, so the size of the semi-opaque descriptor structs does not matter.
// ---------------------------------------------------------------------------------------------

using Status = int;                    // cublasStatus_t
constexpr Status kStatusSuccess = 0;   // CUBLAS_STATUS_SUCCESS

// cudaDataType_t (library_types.h).
constexpr int kCudaR32F = 0;   // CUDA_R_32F
constexpr int kCudaR64F = 1;   // CUDA_R_64F
constexpr int kCudaR16F = 2;   // CUDA_R_16F
constexpr int kCudaR16BF = 14; // CUDA_R_16BF

// cublasComputeType_t (cublas_api.h).
constexpr int kCompute32F = 68;         // CUBLAS_COMPUTE_32F: true f32, no TF32
constexpr int kCompute64F = 70;         // CUBLAS_COMPUTE_64F
constexpr int kCompute32FFastTf32 = 77; // CUBLAS_COMPUTE_32F_FAST_TF32

// cublasOperation_t (cublas_api.h); the matmul descriptor stores it as int32_t.
constexpr int32_t kOpN = 0; // CUBLAS_OP_N
constexpr int32_t kOpT = 1; // CUBLAS_OP_T

// cublasLtMatmulDescAttributes_t (cublasLt.h).
constexpr int kDescTransA = 3;      // CUBLASLT_MATMUL_DESC_TRANSA, int32_t
constexpr int kDescTransB = 4;      // CUBLASLT_MATMUL_DESC_TRANSB, int32_t
constexpr int kDescEpilogue = 7;    // CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t
constexpr int kDescBiasPointer = 8; // CUBLASLT_MATMUL_DESC_BIAS_POINTER, const void *

// cublasLtEpilogue_t (cublasLt.h); stored as uint32_t.
constexpr uint32_t kEpilogueDefault = 1;   // CUBLASLT_EPILOGUE_DEFAULT
constexpr uint32_t kEpilogueRelu = 2;      // CUBLASLT_EPILOGUE_RELU
constexpr uint32_t kEpilogueBias = 4;      // CUBLASLT_EPILOGUE_BIAS
constexpr uint32_t kEpilogueReluBias = 6;  // CUBLASLT_EPILOGUE_RELU_BIAS (RELU | BIAS)
constexpr uint32_t kEpilogueGelu = 32;     // CUBLASLT_EPILOGUE_GELU (the tanh approximation)
constexpr uint32_t kEpilogueGeluBias = 36; // CUBLASLT_EPILOGUE_GELU_BIAS (GELU | BIAS)

// cublasLtMatrixLayoutAttribute_t (cublasLt.h).
constexpr int kLayoutBatchCount = 5;   // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t
constexpr int kLayoutBatchStride = 6;  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t

// cublasLtMatmulPreferenceAttributes_t (cublasLt.h).
constexpr int kPrefMaxWorkspaceBytes = 1; // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t
constexpr int kPrefMinAlignmentA = 5;     // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t
constexpr int kPrefMinAlignmentB = 6;     // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t
constexpr int kPrefMinAlignmentC = 7;     // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t
constexpr int kPrefMinAlignmentD = 8;     // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t

/// cublasLtMatmulAlgo_t: { uint64_t data[8]; }.
struct MatmulAlgo {
  uint64_t data[8];
};

/// cublasLtMatmulHeuristicResult_t.
struct HeuristicResult {
  MatmulAlgo algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};

static_assert(sizeof(MatmulAlgo) == 64);
static_assert(offsetof(HeuristicResult, workspaceSize) == 64);
static_assert(offsetof(HeuristicResult, state) == 72);
static_assert(offsetof(HeuristicResult, wavesCount) == 76);
static_assert(offsetof(HeuristicResult, reserved) == 80);
static_assert(sizeof(HeuristicResult) == 96);

using CreateFn = Status (*)(void **handle);
using DescCreateFn = Status (*)(void **desc, int computeType, int scaleType);
using DescDestroyFn = Status (*)(void *desc);
using DescSetFn = Status (*)(void *desc, int attr, const void *buf, size_t bytes);
using LayoutCreateFn = Status (*)(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
using LayoutSetFn = Status (*)(void *layout, int attr, const void *buf, size_t bytes);
using LayoutDestroyFn = Status (*)(void *layout);
using PrefCreateFn = Status (*)(void **pref);
using PrefSetFn = Status (*)(void *pref, int attr, const void *buf, size_t bytes);
using HeuristicFn = Status (*)(void *handle, void *desc, void *aDesc, void *bDesc, void *cDesc,
                               void *dDesc, void *pref, int requested, HeuristicResult *results,
                               int *returned);
using MatmulFn = Status (*)(void *handle, void *desc, const void *alpha, const void *a, void *aDesc,
                            const void *b, void *bDesc, const void *beta, const void *c,
                            void *cDesc, void *d, void *dDesc, const MatmulAlgo *algo,
                            void *workspace, size_t workspaceBytes, void *stream);
using StatusNameFn = const char *(*)(Status status);

constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

const char *dtypeName(GemmDType t) {
  switch (t) {
  case GemmDType::Float32: return "float32";
  case GemmDType::Float64: return "float64";
  case GemmDType::Float16: return "float16";
  case GemmDType::BFloat16: return "bfloat16";
  }
  return "?";
}

int64_t elementBytes(GemmDType t) {
  switch (t) {
  case GemmDType::Float32: return 4;
  case GemmDType::Float64: return 8;
  case GemmDType::Float16: return 2;
  case GemmDType::BFloat16: return 2;
  }
  return 1;
}

int cudaType(GemmDType t) {
  switch (t) {
  case GemmDType::Float32: return kCudaR32F;
  case GemmDType::Float64: return kCudaR64F;
  case GemmDType::Float16: return kCudaR16F;
  case GemmDType::BFloat16: return kCudaR16BF;
  }
  return kCudaR32F;
}

uint32_t epilogueCode(GemmEpilogue e, bool bias) {
  switch (e) {
  case GemmEpilogue::None: return bias ? kEpilogueBias : kEpilogueDefault;
  case GemmEpilogue::Relu: return bias ? kEpilogueReluBias : kEpilogueRelu;
  case GemmEpilogue::GeluTanh: return bias ? kEpilogueGeluBias : kEpilogueGelu;
  }
  return kEpilogueDefault;
}


/// One operand as cuBLASLt sees it: a column-major rows x cols matrix with leading dimension ld,
/// and the distance between consecutive matrices of a batch.
struct ColumnMajor {
  int64_t rows, cols, ld;
  int64_t batchStride = 0;
};

/// A row-major matrix with `rowLength` elements per row, `numRows` rows and row stride `stride`
/// is, read column-major, its transpose: rowLength x numRows with leading dimension `stride`.
/// With a single column the leading dimension is never used, so it is replaced by the row count
/// rounded up to 16 bytes (callers' strides for size-1 dims are arbitrary, and an aligned ld keeps
/// the fast kernels eligible, which matters for m == 1).
ColumnMajor columnMajorView(int64_t rowLength, int64_t numRows, int64_t stride, int64_t elemBytes) {
  ColumnMajor v{rowLength, numRows, stride};
  if (v.cols == 1) {
    int64_t perChunk = 16 / elemBytes;
    v.ld = (v.rows + perChunk - 1) / perChunk * perChunk;
  }
  return v;
}

/// Everything that decides the descriptors and the algorithm; pointer values enter only through
/// their alignment.
struct PlanKey {
  int64_t m, n, k, lda, ldb, ldc, batch, strideA, strideB, strideC;
  uint64_t workspaceLimit;
  GemmDType dtype;
  GemmEpilogue epilogue;
  bool transA, transB, hasBias, tf32, f32Out;
  uint32_t alignA, alignB, alignC, alignBias;
  bool operator==(const PlanKey &) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey &k) const {
    size_t h = 0;
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.batch, k.strideA, k.strideB, k.strideC})
      h = hashCombine(h, static_cast<size_t>(v));
    h = hashCombine(h, static_cast<size_t>(k.workspaceLimit));
    size_t flags = static_cast<size_t>(k.dtype) | static_cast<size_t>(k.epilogue) << 4 |
                   size_t(k.transA) << 8 | size_t(k.transB) << 9 | size_t(k.hasBias) << 10 |
                   size_t(k.tf32) << 11 | size_t(k.f32Out) << 12 | size_t(k.alignA) << 16 | size_t(k.alignB) << 24 |
                   size_t(k.alignC) << 32 | size_t(k.alignBias) << 40;
    return hashCombine(h, flags);
  }
};

/// Cached per problem shape. cuBLASLt's operand A is our B and its B is our A (see gemm()).
struct GemmPlan {
  void *desc = nullptr;
  void *ltA = nullptr, *ltB = nullptr, *ltD = nullptr; ///< layouts; C and D share ltD
  MatmulAlgo algo{};
  std::vector<MatmulAlgo> offered; ///< the heuristics' list, their choice first
  bool tuned = false;              ///< the autotuner chose among `offered`
};

/// How many algorithms the heuristics are asked for (the autotuner's candidates).
constexpr int kOfferedAlgorithms = 8;

/// A PlanKey as one word (LibraryTuning::key, the tuned modules' record of their choices).
std::string keyText(const PlanKey &k) {
  std::string s = "gemm";
  for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.batch, k.strideA, k.strideB, k.strideC,
                    int64_t(k.workspaceLimit), int64_t(k.dtype), int64_t(k.epilogue),
                    int64_t(k.transA), int64_t(k.transB), int64_t(k.hasBias), int64_t(k.tf32),
                    int64_t(k.f32Out), int64_t(k.alignA), int64_t(k.alignB), int64_t(k.alignC),
                    int64_t(k.alignBias)})
    s += "_" + std::to_string(v);
  return s;
}

} // namespace

struct CublasLt::Impl {
  std::string path;
  void *library = nullptr;
  void *handle = nullptr; ///< cublasLtHandle_t
  void *pref = nullptr;   ///< cublasLtMatmulPreference_t, reused for every heuristic query

  CreateFn create = nullptr;
  DescCreateFn descCreate = nullptr;
  DescDestroyFn descDestroy = nullptr;
  DescSetFn descSet = nullptr;
  LayoutCreateFn layoutCreate = nullptr;
  LayoutSetFn layoutSet = nullptr;
  LayoutDestroyFn layoutDestroy = nullptr;
  PrefCreateFn prefCreate = nullptr;
  PrefSetFn prefSet = nullptr;
  HeuristicFn heuristic = nullptr;
  MatmulFn matmul = nullptr;
  StatusNameFn statusName = nullptr; ///< optional

  std::mutex mutex; ///< guards plans and the per-call bias pointer on a cached descriptor
  std::unordered_map<PlanKey, GemmPlan, PlanKeyHash> plans;
  std::function<int(const LibraryTuning &)> tuner;  ///< setTuner's
  std::unordered_map<std::string, int> preferred; ///< prefer's, by keyText

  std::string statusText(Status s) const {
    std::string text = std::to_string(s);
    if (statusName)
      if (const char *name = statusName(s))
        text += std::string(" (") + name + ")";
    return text;
  }

  static std::string where(const GemmProblem &p) {
    return " for m=" + std::to_string(p.m) + ", n=" + std::to_string(p.n) +
           ", k=" + std::to_string(p.k) + ", dtype=" + dtypeName(p.dtype) +
           (p.f32Out ? " (f32 result)" : "") +
           (p.batch != 1 ? ", batch=" + std::to_string(p.batch) : std::string());
  }

  std::string failure(const char *call, Status s, const GemmProblem &p) const {
    return std::string(call) + " failed with status " + statusText(s) + where(p);
  }

  void destroy(GemmPlan &plan) {
    for (void *layout : {plan.ltA, plan.ltB, plan.ltD})
      if (layout)
        layoutDestroy(layout);
    if (plan.desc)
      descDestroy(plan.desc);
    plan = GemmPlan{};
  }

  /// Creates the descriptors and asks the heuristics for the best algorithm; on failure destroys
  /// what it made and returns the message.
  std::string makePlan(const PlanKey &key, const GemmProblem &p, const ColumnMajor &ltA,
                       const ColumnMajor &ltB, const ColumnMajor &ltD, GemmPlan &plan) {
    // 1. The operation: compute and scale type, transposes, epilogue (and the bias pointer,
    //    whose alignment the heuristics read).
    bool f64 = p.dtype == GemmDType::Float64;
    int compute = f64 ? kCompute64F : key.tf32 ? kCompute32FFastTf32 : kCompute32F;
    int scale = f64 ? kCudaR64F : kCudaR32F;
    if (Status s = descCreate(&plan.desc, compute, scale); s != kStatusSuccess) {
      plan.desc = nullptr;
      return failure("cublasLtMatmulDescCreate", s, p);
    }
    int32_t opA = p.transB ? kOpT : kOpN, opB = p.transA ? kOpT : kOpN;
    uint32_t epilogue = epilogueCode(p.epilogue, key.hasBias);
    Status s = descSet(plan.desc, kDescTransA, &opA, sizeof opA);
    if (s == kStatusSuccess)
      s = descSet(plan.desc, kDescTransB, &opB, sizeof opB);
    if (s == kStatusSuccess)
      s = descSet(plan.desc, kDescEpilogue, &epilogue, sizeof epilogue);
    if (s == kStatusSuccess && key.hasBias)
      s = descSet(plan.desc, kDescBiasPointer, &p.bias, sizeof p.bias);
    if (s != kStatusSuccess) {
      destroy(plan);
      return failure("cublasLtMatmulDescSetAttribute", s, p);
    }

    // 2. The layouts.
    int operandType = cudaType(p.dtype), resultType = key.f32Out ? kCudaR32F : operandType;
    for (auto [slot, v, type] : {std::tuple{&plan.ltA, ltA, operandType},
                                 std::tuple{&plan.ltB, ltB, operandType},
                                 std::tuple{&plan.ltD, ltD, resultType}}) {
      if (Status ls = layoutCreate(slot, type, static_cast<uint64_t>(v.rows),
                                   static_cast<uint64_t>(v.cols), v.ld);
          ls != kStatusSuccess) {
        *slot = nullptr;
        destroy(plan);
        return failure("cublasLtMatrixLayoutCreate", ls, p);
      }
      if (p.batch == 1)
        continue;
      int32_t count = static_cast<int32_t>(p.batch);
      Status ls = layoutSet(*slot, kLayoutBatchCount, &count, sizeof count);
      if (ls == kStatusSuccess)
        ls = layoutSet(*slot, kLayoutBatchStride, &v.batchStride, sizeof v.batchStride);
      if (ls != kStatusSuccess) {
        destroy(plan);
        return failure("cublasLtMatrixLayoutSetAttribute", ls, p);
      }
    }

    // 3. The preference: workspace limit and the operands' alignment (cuBLASLt's A is our B).
    uint64_t workspaceLimit = key.workspaceLimit;
    s = prefSet(pref, kPrefMaxWorkspaceBytes, &workspaceLimit, sizeof workspaceLimit);
    for (auto [attr, align] : {std::pair{kPrefMinAlignmentA, key.alignB},
                               std::pair{kPrefMinAlignmentB, key.alignA},
                               std::pair{kPrefMinAlignmentC, key.alignC},
                               std::pair{kPrefMinAlignmentD, key.alignC}})
      if (s == kStatusSuccess)
        s = prefSet(pref, attr, &align, sizeof align);
    if (s != kStatusSuccess) {
      destroy(plan);
      return failure("cublasLtMatmulPreferenceSetAttribute", s, p);
    }

    // 4. The heuristics' list: their first choice, unless a tuned module chose another.
    HeuristicResult results[kOfferedAlgorithms]{};
    int returned = 0;
    s = heuristic(handle, plan.desc, plan.ltA, plan.ltB, plan.ltD, plan.ltD, pref,
                  kOfferedAlgorithms, results, &returned);
    if (s != kStatusSuccess) {
      destroy(plan);
      return failure("cublasLtMatmulAlgoGetHeuristic", s, p);
    }
    if (returned < 1 || results[0].state != kStatusSuccess) {
      destroy(plan);
      return "cublasLtMatmulAlgoGetHeuristic found no algorithm (state " +
             statusText(results[0].state) + ")" + where(p);
    }
    for (int i = 0; i < returned && results[i].state == kStatusSuccess; ++i)
      plan.offered.push_back(results[i].algo);
    plan.algo = plan.offered[0];
    if (auto chosen = preferred.find(keyText(key)); chosen != preferred.end() &&
                                                    chosen->second < int(plan.offered.size())) {
      plan.algo = plan.offered[chosen->second];
      plan.tuned = true;
    }
    return "";
  }
};

void foldBatchIntoRows(GemmProblem &p) {
  if (p.batch > 1 && p.strideB == 0 && !p.transA && p.strideA == p.m * p.lda &&
      p.strideC == p.m * p.ldc) {
    p.m *= p.batch;
    p.batch = 1;
    p.strideA = p.strideC = 0;
  }
}

CublasLt::CublasLt() : impl_(std::make_unique<Impl>()) {}

CublasLt::~CublasLt() = default;

CublasLt &CublasLt::load(const std::string &libraryPath) {
  return loadedOnce<CublasLt>([&] { return openLibrary(libraryPath); });
}

std::unique_ptr<CublasLt> CublasLt::openLibrary(const std::string &libraryPath) {
  std::unique_ptr<CublasLt> lt(new CublasLt());
  Impl &im = *lt->impl_;
  im.path = libraryPath;
  VendorLibrary lib("cuBLASLt", libraryPath);
  im.library = lib.handle();
  auto fail = [&](const std::string &msg) {
    lib.close();
    throw RunError(msg);
  };
  try {
    lib.bind(im.create, "cublasLtCreate");
    lib.bind(im.descCreate, "cublasLtMatmulDescCreate");
    lib.bind(im.descDestroy, "cublasLtMatmulDescDestroy");
    lib.bind(im.descSet, "cublasLtMatmulDescSetAttribute");
    lib.bind(im.layoutCreate, "cublasLtMatrixLayoutCreate");
    lib.bind(im.layoutSet, "cublasLtMatrixLayoutSetAttribute");
    lib.bind(im.layoutDestroy, "cublasLtMatrixLayoutDestroy");
    lib.bind(im.prefCreate, "cublasLtMatmulPreferenceCreate");
    lib.bind(im.prefSet, "cublasLtMatmulPreferenceSetAttribute");
    lib.bind(im.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    lib.bind(im.matmul, "cublasLtMatmul");
  } catch (const RunError &e) {
    fail(e.what());
  }
  im.statusName = reinterpret_cast<StatusNameFn>(lib.find("cublasLtGetStatusName"));

  if (Status s = im.create(&im.handle); s != kStatusSuccess)
    fail("cublasLtCreate failed with status " + im.statusText(s) + " (" + libraryPath + ")");
  if (Status s = im.prefCreate(&im.pref); s != kStatusSuccess)
    fail("cublasLtMatmulPreferenceCreate failed with status " + im.statusText(s));
  return lt;
}

size_t CublasLt::recommendedWorkspaceBytes() { return kGemmWorkspaceBytes; }

void CublasLt::setTuner(std::function<int(const LibraryTuning &)> tuner) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->tuner = std::move(tuner);
}

void CublasLt::prefer(const std::string &key, int index) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->preferred[key] = index;
  // A plan this process made already (another module's) takes it too.
  for (auto &[k, plan] : impl_->plans)
    if (keyText(k) == key && index < int(plan.offered.size())) {
      plan.algo = plan.offered[index];
      plan.tuned = true;
    }
}

size_t CublasLt::cachedPlans() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->plans.size();
}

std::string CublasLt::gemm(const GemmProblem &p, void *stream, void *workspace,
                           size_t workspaceBytes) {
  Impl &im = *impl_;
  if (p.m < 0 || p.n < 0 || p.k < 0)
    return "cuBLASLt gemm: negative size" + Impl::where(p);
  if (p.m == 0 || p.n == 0)
    return "";
  if (p.k == 0)
    return "cuBLASLt gemm: k == 0 is not supported (C is bias or zero; fill it directly)" +
           Impl::where(p);
  if (!p.a || !p.b || !p.c)
    return "cuBLASLt gemm: null operand pointer" + Impl::where(p);
  if (p.batch < 1 || p.batch > INT32_MAX || p.strideA < 0 || p.strideB < 0 || p.strideC < 0 ||
      (p.batch > 1 && p.strideC == 0))
    return "cuBLASLt gemm: batch " + std::to_string(p.batch) + " with strides " +
           std::to_string(p.strideA) + ", " + std::to_string(p.strideB) + ", " +
           std::to_string(p.strideC) + " is not a batch it takes" + Impl::where(p);
  if (!workspace)
    workspaceBytes = 0;

  // Row-major C[m,n] is column-major C^T[n,m] with ld = ldc, so compute C^T = op(B)^T op(A)^T:
  // cuBLASLt's A is our B, its B is our A, (m', n', k) = (n, m, k). A row-major operand read
  // column-major is already transposed, so an operand the caller did not transpose goes in with
  // CUBLAS_OP_N and a transposed one with CUBLAS_OP_T. The bias, one value per column of
  // row-major C, is one per row of C^T: exactly cuBLASLt's bias (length = rows of D).
  int64_t elem = elementBytes(p.dtype);
  ColumnMajor ltA = p.transB ? columnMajorView(p.k, p.n, p.ldb, elem)  // B stored [n,k]
                             : columnMajorView(p.n, p.k, p.ldb, elem); // B stored [k,n]
  ColumnMajor ltB = p.transA ? columnMajorView(p.m, p.k, p.lda, elem)  // A stored [k,m]
                             : columnMajorView(p.k, p.m, p.lda, elem); // A stored [m,k]
  bool f32Out = p.f32Out && (p.dtype == GemmDType::Float16 || p.dtype == GemmDType::BFloat16);
  ColumnMajor ltD = columnMajorView(p.n, p.m, p.ldc, f32Out ? 4 : elem);
  ltA.batchStride = p.strideB;
  ltB.batchStride = p.strideA;
  ltD.batchStride = p.strideC;
  for (auto [v, name, ld] : {std::tuple{ltA, "ldb", p.ldb}, std::tuple{ltB, "lda", p.lda},
                             std::tuple{ltD, "ldc", p.ldc}})
    if (v.ld < v.rows)
      return std::string("cuBLASLt gemm: ") + name + "=" + std::to_string(ld) +
             " is less than the row length " + std::to_string(v.rows) + Impl::where(p);

  PlanKey key{};
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.lda = p.lda;
  key.ldb = p.ldb;
  key.ldc = p.ldc;
  key.batch = p.batch;
  key.strideA = p.strideA;
  key.strideB = p.strideB;
  key.strideC = p.strideC;
  key.workspaceLimit = std::min(workspaceBytes, kGemmWorkspaceBytes);
  key.dtype = p.dtype;
  key.epilogue = p.epilogue;
  key.transA = p.transA;
  key.transB = p.transB;
  key.hasBias = p.bias != nullptr;
  key.tf32 = p.allowTf32 && p.dtype == GemmDType::Float32;
  key.f32Out = f32Out;
  key.alignA = alignmentOf(p.a);
  key.alignB = alignmentOf(p.b);
  key.alignC = alignmentOf(p.c);
  key.alignBias = alignmentOf(p.bias);

  std::lock_guard<std::mutex> lock(im.mutex);
  auto it = im.plans.find(key);
  if (it == im.plans.end()) {
    GemmPlan plan;
    if (std::string err = im.makePlan(key, p, ltA, ltB, ltD, plan); !err.empty())
      return err;
    it = im.plans.emplace(key, plan).first;
  }
  GemmPlan &plan = it->second;
  if (key.hasBias)
    if (Status s = im.descSet(plan.desc, kDescBiasPointer, &p.bias, sizeof p.bias);
        s != kStatusSuccess)
      return im.failure("cublasLtMatmulDescSetAttribute", s, p);

  static constexpr float oneF = 1.0f, zeroF = 0.0f;
  static constexpr double oneD = 1.0, zeroD = 0.0;
  bool f64 = p.dtype == GemmDType::Float64;
  const void *alpha = f64 ? static_cast<const void *>(&oneD) : &oneF;
  const void *beta = f64 ? static_cast<const void *>(&zeroD) : &zeroF;
  auto run = [&](const MatmulAlgo &algo) {
    Status s = im.matmul(im.handle, plan.desc, alpha, p.b, plan.ltA, p.a, plan.ltB, beta, p.c,
                         plan.ltD, p.c, plan.ltD, &algo, workspace, workspaceBytes, stream);
    return s == kStatusSuccess ? std::string() : im.failure("cublasLtMatmul", s, p);
  };
  if (im.tuner && !plan.tuned && plan.offered.size() > 1) {
    LibraryTuning t;
    t.kind = LibraryKind::Gemm;
    t.key = keyText(key);
    t.choices = static_cast<int>(plan.offered.size());
    t.run = [&](int i) { return run(plan.offered.at(i)); };
    int64_t cElem = f32Out ? 4 : elem;
    // GemmDType's order is the kinds'
    t.results = {{p.c,
                  static_cast<size_t>(((p.batch - 1) * p.strideC + (p.m - 1) * p.ldc + p.n) * cElem),
                  f32Out ? 0 : static_cast<int>(p.dtype)}};
    static_assert(int(GemmDType::Float64) == 1 && int(GemmDType::BFloat16) == 3);
    t.stream = stream;
    int chosen = im.tuner(t);
    plan.algo = plan.offered.at(chosen >= 0 && chosen < t.choices ? chosen : 0);
    plan.tuned = true;
  }
  return run(plan.algo);
}

} // namespace braze::runtime
