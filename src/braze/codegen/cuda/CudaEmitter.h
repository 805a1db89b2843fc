#pragma once
/// The CUDA code emitter, internal to codegen/cuda: CudaLaunchPlan.cpp plans each loop
/// kernel's launch (plan-cuda's records: lanes, rows per block, persistent or column rows) and
/// checks records given by hand; CudaCodegen.cpp writes the kernels those records describe.
/// One CudaEmitter holds the names, lane caches and scopes both share.
#include "braze/codegen/cuda/CudaCodegen.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/KernelBody.h"
#include "braze/codegen/cuda/CudaHost.h"

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace braze::codegen {

using loop::Buffer;
using sched::Kernel;
using sched::Member;
using sched::PlacementKind;
using sched::Step;
using sched::StepKind;
using sym::SymExpr;

/// The device template grouped product kernels call (braze_grouped_mm), which needs
/// cudaAttentionPrelude()'s tensor-core helpers before it (CudaGroupedGemm.cpp).
const char *cudaGroupedGemmPrelude();
/// The sm_90a grouped kernel (braze_grouped_wgmma) and its wgmma wrappers, after
/// cudaGroupedGemmPrelude(); compiled only for sm_90a (NVRTC's target on compute capability 9.0).
const std::string &cudaGroupedWgmmaPrelude();

namespace cuda {

constexpr int kPointwiseBlock = 256;
constexpr int kRowBlock = 256;       ///< threads of a block that holds several rows
constexpr int kMaxPerThread = 64;    ///< elements one thread keeps of a persistent row
/// Row threads per multiprocessor a row kernel aims for at most (twice what one holds at once):
/// beyond it, rows whose threads take at most kRowWork elements get fewer threads each.
constexpr int64_t kRowFill = 2 * 2048;
constexpr int64_t kRowWork = 32;
constexpr int64_t kShortRow = 32;    ///< a strided row this long is one thread's
constexpr int64_t kColumnSteps = 8;  ///< columns: elements per thread the plan aims for
constexpr int kColumnLaneAccumulators = 16; ///< columns: lanes x reductions a thread holds
constexpr int kColumnBlock = 256;   ///< columns: threads of a block (at most)
/// Shared bytes that one round of a block's reduction combine (emitCombine) writes at most.
constexpr size_t kCombineScratch = 8192;
constexpr int kBudgetFraction = 4;   ///< a persistent block may use 1/4 of the register file
constexpr int kSpread = 4;           ///< spread: points per thread of a large scalar kernel
constexpr int64_t kSpreadMin = 1 << 20; ///< spread: from this many points

/// The largest power of two not above v (v >= 1).
inline int64_t prevPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v)
    p <<= 1;
  return p;
}

inline int64_t nextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v)
    p <<= 1;
  return p;
}

/// A kernel's launch record (plan-cuda's, sched::CudaLaunch) with what its text needs beside
/// it: for persistent rows, the operands loaded once and the values kept between steps.
struct KernelPlan : sched::CudaLaunch {
  std::vector<const loop::Expr *> rowLoads;
  std::vector<std::pair<const loop::Expr *, int>> rowValues;
};

/// A load the lanes of a point group share as one vector, or a row operand kept in registers.
struct VectorLoad {
  const loop::Expr *load = nullptr; ///< a load, or (row values) any expression
  std::string array;
  int step = -1; ///< row values: the Loop step that computes them; -1: loaded before the steps
};

class CudaEmitter {
public:
  CudaEmitter(const sched::Schedule &s, const CudaCodegenOptions &opts)
      : s_(s), opts_(opts), names_(s), sym_(s.program->sym()) {
    names_.narrowIndices(true);
  }

  CudaGeneratedSource run();

private:
  /// The helpers `kernels` use, then `kernels`: one NVRTC program's source. The special
  /// functions and the attention templates are long; only programs that call them get them.
  static std::string withPrelude(const std::string &kernels);

  // ---- Facts about a kernel ------------------------------------------------------------------

  bool inMemory(const Buffer &b) const;

  /// Buffers some member of k writes (their loads must not be hoisted or vectorized).
  std::set<const Buffer *> written(const Kernel &k) const;

  /// index(var + 1) - index(var) == 1; or, with group > 1, contiguous within each aligned
  /// group of `group` values of var: index(g*t + j) == index(g*t) + j for j < g (an index
  /// that divides var by multiples of g, such as attention's heads of 64 regrouped from a
  /// [S, B, 3E] projection, is then read as vectors of up to g). var's extent must be a
  /// multiple of g, and the lanes of a vector start at a multiple of it.
  bool contiguousIn(SymExpr index, SymExpr var, int group = 0);

  /// Direct loads in members' values, in first-use order, that read memory nobody in k writes.
  std::vector<const loop::Expr *> plainLoads(const std::vector<const Member *> &members,
                                             const std::set<const Buffer *> &writes);

  /// Elements per thread along `var`: 16 bytes of the narrowest operand contiguous along it,
  /// when var's extent is a constant multiple of that; else 1. `widest`, when given, is set to
  /// the size in bytes of the widest such operand (0 if none).
  int laneCount(const std::vector<const Member *> &members, SymExpr var,
                const std::set<const Buffer *> &writes, int *widest = nullptr);

  // ---- Kernel text ---------------------------------------------------------------------------

  std::string params(const Kernel &k);

  std::string product(const std::vector<SymExpr> &vars) { return extentProduct(names_, vars); }

  /// Defines vars (row-major) from the linear position `linear`; the last one gets `lastName`.
  void decompose(Writer &w, const std::vector<SymExpr> &vars, const std::string &linear,
                 const std::string &lastName);

  /// An accumulating scatter: a thread per source point combines its value atomically at its
  /// position (an atomic add, or a compare-and-swap loop for products, maxima and minima),
  /// which is checked against the buffer's size (the error flag, as an indirect load's index).
  static constexpr int kScatterBlock = 256;
  std::string emitScatterKernel(const Kernel &k);

  std::string emitKernel(const Kernel &k, const KernelPlan &plan);

  // ---- Grouped products (CudaGroupedGemm.cpp) --------------------------------------------------

  /// Whether grouped product k (GemmCall::group) runs braze's tensor-core kernel: half
  /// operands on sm_80 or later (wgmma on sm_90 where B is read K-major, else mma.sync). Any
  /// other grouped product runs its loop kernel.
  bool tensorCoreGroupedGemm(const Kernel &k) const;
  /// The grouped product's kernel: a block per tile of C (groupedShape in CudaGroupedGemm.cpp).
  std::string emitGroupedGemmKernel(const Kernel &k);
  /// braze_run's launch of that kernel (index `index`).
  std::string groupedGemmLaunch(const Kernel &k, int index);
  /// The lambda `epilogue(row, column, gate, up)` of a grouped product's paired epilogue
  /// (GemmCall::epilogue): the member's value from C's two values, and its store.
  void emitPairedEpilogue(Writer &w, const Kernel &k);

  /// Emits, in `scope`, every subexpression of the members that does not depend on `vars`
  /// (row statistics, broadcast operands, constants folded with them), so that the loops over
  /// `vars` find them computed once.
  void hoistInvariants(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                       const std::vector<SymExpr> &vars, const std::set<const Buffer *> &writes);

  // ---- Shape 1: pointwise --------------------------------------------------------------------

  std::vector<const Member *> allMembers(const Kernel &k);

  void emitPointwise(const Kernel &k, const KernelPlan &plan, Writer &w);
  /// The points of `members` from block `blockIndex` (an expression) of a pointwise kernel.
  void emitPointwiseBlock(const Kernel &k, const KernelPlan &plan, Writer &w,
                          const std::vector<const Member *> &members,
                          const std::string &blockIndex);
  /// The independent member groups a one-step kernel may run over blocks of their own (1
  /// where it has one, or several steps), by independentMembers over groupVars(k).
  int memberGroups(const Kernel &k);
  /// Declares group_blocks (blocks per member group, of `perBlock` points or rows each), and
  /// the block's group and group_block (its block within the group).
  void emitGroupBlocks(const Kernel &k, const std::string &perBlock, Writer &w);
  /// A `switch (group)` whose case g is `emit` of member group g's members (a group's blocks
  /// all take one case, so its barriers are reached by every thread of the block).
  void emitGroupCases(const Kernel &k, int groups, Writer &w,
                      const std::function<void(const std::vector<const Member *> &)> &emit);
  /// The variables a load must mention to count as memory of its own: outer and inner ones.
  static std::vector<SymExpr> groupVars(const Kernel &k);

  /// Emits the members for `vec` consecutive values of var (from `base`), each lane in its own
  /// block where var = base + j. With vec > 1, operands contiguous along var are read (and
  /// stored results written) as vectors when every such pointer is aligned; otherwise lane by
  /// lane. `cached` loads read `array[cacheIndex + j]` instead of memory. Reductions fold into
  /// their accumulators (each lane's own with `laneAccumulators`: column lanes, where the
  /// lanes are different rows); `storeGuard` (C condition) limits stores.
  void emitLanes(Writer &w, Scope &parent, const std::vector<const Member *> &members,
                 SymExpr var, const std::string &base, int vec,
                 const std::set<const Buffer *> &writes, const std::vector<VectorLoad> &cached,
                 const std::string &cacheIndex, const std::string &storeGuard, int step = 0,
                 bool laneAccumulators = false);

  /// One point of every member: reductions fold, pointwise members define locals and store
  /// (into `laneStores` slots when given, else to memory under `storeGuard`).
  void emitMembers(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                   const std::string &storeGuard,
                   const std::map<const Member *, std::string> &laneStores);

  // ---- Shape 2: rows -------------------------------------------------------------------------

  std::string accType(const loop::Computation &c) { return ctype(c.value->dtype()); }
  /// The accumulator of reduction c: `acc<id>`, with the lane's suffix while column lanes
  /// (accLane_) are written one by one.
  std::string accName(const loop::Computation &c) { return names_.acc(c) + accLane_; }
  /// Sets accName's suffix to column lane j's (`_l<j>`); j < 0 clears it.
  void setAccLane(int j) { accLane_ = j < 0 ? "" : "_l" + std::to_string(j); }
  /// A row kernel under `l`: the rows a thread takes (vec with columns: its column lanes), the
  /// elements of its row it reads a step (vec otherwise), and the rows a block takes.
  static int rowLanes(const sched::CudaLaunch &l) { return l.columns ? l.vec : 1; }
  static int stepLanes(const sched::CudaLaunch &l) { return l.columns ? 1 : l.vec; }
  static int64_t rowsPerBlock(const sched::CudaLaunch &l) {
    return int64_t(l.block) / l.threads * rowLanes(l);
  }
  std::string argIndex(const loop::Computation &c) { return accName(c) + "_i"; }

  std::string innerPosition();

  std::string foldText(const loop::Computation &c, const std::string &v);

  static std::vector<const Member *> membersOf(const Step &st);

  /// Loads that more than one Loop step of k reads, and that depend on the inner space.
  std::vector<const loop::Expr *> rowOperands(const Kernel &k);

  /// Values (not loads) that a later Loop step of k recomputes: each with the first step that
  /// computes it. Only the outermost such values (a shared value whose every later use is inside
  /// another shared value is left out), and no bare widening of a load.
  std::vector<std::pair<const loop::Expr *, int>> rowValues(const Kernel &k);

  /// Whether every operand the members read in memory is contiguous along the last row
  /// variable, so that neighbouring rows read neighbouring elements.
  bool rowsAdjacent(const std::vector<const Member *> &members,
                    const std::vector<SymExpr> &rowVars, const std::set<const Buffer *> &writes);

  /// Whether the members read columns: every operand in memory that differs between rows and
  /// along the row (`inner`) is contiguous along the last row variable and not along the last
  /// inner one. An operand the rows share (a per-element mean every column reads) or that a row
  /// reads once does not count. The smallest element size of those operands in bytes, or 0
  /// when there are none or they do not.
  int columnBytes(const std::vector<const Member *> &members,
                  const std::vector<SymExpr> &rowVars, const std::vector<SymExpr> &inner,
                  const std::set<const Buffer *> &writes);

  /// The number of points the loop variables `vars` span (product() writes it as C text).
  SymExpr points(const std::vector<SymExpr> &vars);

  /// The members whose accesses decide k's lanes and row shape: all of a pointwise kernel's,
  /// the Loop steps' of a kernel with an inner loop.
  std::vector<const Member *> laneMembers(const Kernel &k);

  /// The most lanes k's accesses and sizes allow along its innermost variable (the inner one,
  /// else the last outer one); `widest` as laneCount sets it.
  int lanesAllowed(const Kernel &k, const std::set<const Buffer *> &writes,
                   int *widest = nullptr);

  /// Column lanes: how many neighbouring rows of column kernel k a thread may take, their
  /// operands read as vectors along the last row variable (laneCount over it). 1 unless k is
  /// one Loop step then Scalar steps, with no argmax or argmin; at most
  /// kColumnLaneAccumulators / (the reductions of a member group).
  int columnLanes(const Kernel &k, const std::set<const Buffer *> &writes);

  /// A row of constant `length` in `l`: its iterations of threads x vec elements, and whether
  /// the last is partial.
  static void setRowIterations(sched::CudaLaunch &l, int64_t length);

  /// The plan-cuda step's choice for loop kernel k: threads, lanes, columns or rows, and
  /// whether a row stays in registers (persistent).
  sched::CudaLaunch planLaunch(const Kernel &k);

public:
  /// Fills the launch record of every kernel codegen writes as loops (plan-cuda).
  void planLaunches(sched::Schedule &s);

  /// Replaces the records of the kernels `records` names with those records, each checked
  /// against what its kernel's code can do; a record that names no loop kernel, or asks for
  /// what the code cannot do, is a user error that says which field and why.
  void applyLaunches(sched::Schedule &s, const std::map<std::string, sched::CudaLaunch> &records);

  /// The autotuner's forms of loop kernel k (CudaTuning.cpp): its record first, then
  /// variations that completeLaunch accepts, none twice.
  std::vector<sched::CudaLaunch> launchCandidates(const Kernel &k);
  /// Kernel k's __global__ function under record `l` (accepted by completeLaunch), named
  /// `name`.
  std::string variantFunction(const Kernel &k, const sched::CudaLaunch &l,
                              const std::string &name);
  /// The blocks a launch of k under record `l` takes; -1 where its outer space is symbolic.
  int64_t formBlocks(const Kernel &k, const sched::CudaLaunch &l);
  /// The helpers `kernels` use, then `kernels`: one NVRTC program's source.
  static std::string program(const std::string &kernels) { return withPrelude(kernels); }

private:
  /// Checks record `l`, given for loop kernel k, and fills in what follows from it (the row
  /// length, iterations and raggedness): "" when the kernel's code can run it, else why not.
  std::string completeLaunch(const Kernel &k, sched::CudaLaunch &l);

  /// k's plan: its launch record (planned here where the schedule has none), and for
  /// persistent rows the operands and values the record's registers hold.
  KernelPlan planOf(const Kernel &k);

  void emitRows(const Kernel &k, const KernelPlan &plan, Writer &w);

  /// Opens the loop over this thread's part of the row and defines the inner vars but the
  /// last, whose lane-0 value is `base`.
  void openRowLoop(Writer &w, const Kernel &k, const KernelPlan &plan, const std::string &base);

  void closeRowLoop(Writer &w, const KernelPlan &);

  /// Tests once, before the row loop, the alignment of the members' vector accesses along var
  /// (vec lanes: column lanes from `laneBase`, or an inner variable's when laneBase is empty)
  /// whose alignment no step of the loop changes, into a flag (alignedFlag_) that emitLanes
  /// takes for theirs (alignedOnce_) until the loop closes.
  void hoistAlignment(Writer &w, const Kernel &k, const std::vector<const Member *> &members,
                      SymExpr var, int vec, const std::string &laneBase,
                      const std::set<const Buffer *> &writes);

  /// Loads each cached row operand for this iteration's lanes into its register array.
  void emitCacheFill(Writer &w, const std::vector<VectorLoad> &cached, SymExpr var,
                     const std::string &base, int vec);

  /// A reduction's accumulator: column lane `lane`'s (setAccLane), or the only one (-1).
  struct CombineSlot {
    const loop::Computation *comp;
    int lane;
  };
  /// Combines every thread's partial results of the reductions `slots` over its row group,
  /// their shared-memory rounds together; afterwards every thread of the group holds the
  /// row's results.
  void emitCombine(Writer &w, const std::vector<CombineSlot> &slots, const KernelPlan &plan);

  void finishReductions(Writer &w, Scope &scope, const std::vector<const Member *> &members,
                        const std::string &guard);

  // ---- Host side -----------------------------------------------------------------------------

  /// A statement that launches k's kernel (setting `err`).
  std::string launchCall(const Kernel &k, const KernelPlan &plan, int index);

  const sched::Schedule &s_;
  CudaCodegenOptions opts_;
  size_t scratchBytes_ = 0; ///< the kernel's shared scratch for its reductions so far
  Names names_;
  std::string accLane_; ///< accName's suffix: `_l<j>` for column lane j, else empty
  std::set<const void *> alignedOnce_; ///< loads and stored members hoistAlignment tested
  std::string alignedFlag_;            ///< their flag
  sym::SymContext &sym_;
  int next_ = 0;
  const Kernel *kernel_ = nullptr;
};

} // namespace cuda

} // namespace braze::codegen
