#pragma once
/// The CPU code emitter, internal to codegen/cpu: CppCodegen.cpp writes the loop nests (outer
/// loops, lanes, inner loops and their reductions) and CppLibraryKernels.cpp the kernels that
/// call a library (BLAS, oneDNN, the fused attention prelude) with the loop nest as their
/// fallback, and the accumulating scatters. One CpuEmitter holds the names, scopes and options
/// every kernel form shares.
#include "braze/codegen/cpu/CppCodegen.h"

#include "braze/codegen/CFamily.h"
#include "braze/codegen/KernelBody.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace braze::codegen {

using loop::Buffer;
using loop::ReduceKind;
using sched::Kernel;
using sched::Member;
using sched::PlacementKind;
using sched::Step;
using sched::StepKind;

namespace cpu {

class CpuEmitter {
public:
  CpuEmitter(const sched::Schedule &s, const CpuCodegenOptions &opts)
      : s_(s), opts_(opts), names_(s) {}

  GeneratedSource run();

  /// plan-cpu's record for loop kernel k.
  sched::CpuLaunch planLaunch(const Kernel &k);
  /// Fills the record of every kernel codegen writes as loops.
  void planLaunches(sched::Schedule &s);
  /// The autotuner's forms of loop kernel k: its record first, then the other records
  /// checkLaunch accepts (shared outer loops, simd, lanes, groups), none twice.
  std::vector<sched::CpuLaunch> launchCandidates(const Kernel &k);
  /// Replaces the records `records` names, each checked (checkLaunch); a user error otherwise.
  void applyLaunches(sched::Schedule &s, const std::map<std::string, sched::CpuLaunch> &records);

private:
  /// "" when k's code can run record `l`, else why not.
  std::string checkLaunch(const Kernel &k, const sched::CpuLaunch &l);

  /// Whether k is one pointwise loop whose members fall in at least two independent groups
  /// (emitGroups).
  static bool hasGroups(const Kernel &k);

  bool usesBlas(const Kernel &k) const;

  /// Sets the BLAS's own threads to one, once per module, where it has such an entry point:
  /// braze splits products over the OpenMP threads it shares with PyTorch.
  void keepBlasSingleThreaded(Writer &w);

  /// The size symbols kernel k uses, as locals read from `syms`.
  void declareSymbols(const Kernel &k, Writer &w);

  bool usesDnnl(const Kernel &k) const;

  /// A convolution or a weight gradient through oneDNN (braze_dnnl_conv in the prelude), with
  /// the buffers' own sizes and strides; where oneDNN declines, the loop nest computes it.
  std::string emitConvKernel(const Kernel &k);

  /// A fused attention part (braze_attention_f32, braze_attention_lse_f32 or
  /// braze_attention_grad_f32 in the prelude) over the operands' logical sizes and strides;
  /// the output is strided with its last dim contiguous (row-major but for the output part).
  std::string emitAttentionKernel(const Kernel &k);

  /// A matrix product through a single-threaded BLAS, spread over the OpenMP threads braze's
  /// kernels and PyTorch share (one pool: BLAS's own threads are set to one).
  ///   1. The layout BLAS needs is checked once; one it rejects (a zero stride from
  ///      broadcasting) runs the loop nest instead.
  ///   2. The work is cut into tasks: batch points, each split into row blocks (or column blocks
  ///      when rows are few) until there are as many tasks as threads. Small products run on
  ///      the calling thread.
  ///   3. Each task makes one gemm call on its block; blocks never overlap, so any assignment of
  ///      tasks to threads gives the same bits.
  std::string emitGemmKernel(const Kernel &k);

  /// An integer Expr of a grouped product's row m (GemmCall::group, rowOf) as a function
  /// `<kernel><suffix>(.., m)`.
  std::string emitRowFunction(const Kernel &k, const loop::Expr *e, const std::string &suffix);

  /// A grouped product: the threads take blocks of A's rows, and each run of rows with one
  /// group in a block is one gemm call with that group's B. Gathered rows of A are copied into
  /// a dense block per run first. A group or row outside its operand sets the error flag, as
  /// the loop nest's indirect load does.
  void emitGroupedRuns(const Kernel &k, Writer &w, const std::string &fn);

  /// An accumulating scatter. A float sum or product runs on threads that each own a
  /// contiguous range of the buffer's positions: every thread walks all the sources in order
  /// and combines those aimed at its range, so each position receives its values in source
  /// order from one thread (the same result on every run and at any thread count, as eager's
  /// CPU kernels), with no atomics; the value of a source is computed only by the thread that
  /// combines it. A combine that no order changes (an integer sum or product, a maximum or a
  /// minimum, a NaN winning) splits the sources among the threads and combines atomically.
  /// Positions are checked against the buffer's size.
  std::string emitScatterKernel(const Kernel &k);

  /// The expression combining `held` and `value` by k: braze_max and braze_min (the C
  /// prelude's) keep a NaN, and `held` where the two are equal.
  static std::string combined(ReduceKind k, const std::string &held, const std::string &value);

  /// Writes an atomic combine of `value` into `dst` (of dtype t, which is its own compute
  /// type): a fetch-and-add for an integer sum, else a compare-and-swap loop that stops once
  /// the element holds the combined value (the same bits: a maximum that changes nothing).
  void combineAtomically(Writer &w, DType t, ReduceKind k, const std::string &dst,
                         const std::string &value);

  /// Writes the statements that combine `value` (in computeType(t)) into `dst`, an element
  /// of dtype t: in place for a sum in t itself; otherwise through the compute type (f32 for
  /// half precision, rounded after each value), a maximum or minimum keeping a NaN.
  void combineInto(Writer &w, DType t, ReduceKind k, const std::string &dst,
                   const std::string &value);

  /// The kernel's buffer pointers and size symbols, as locals.
  void emitPointers(const Kernel &k, Writer &w);

  /// The autotuner's forms (CpuCodegenOptions::tuneForms), their dispatch and the hook.
  std::string emitTuneForms();
  std::string emitKernel(const Kernel &k, const std::string &name);

  std::string loopHead(sym::SymExpr v);

  /// The `omp simd` line for a Loop step: every accumulator (and NaN flag) as a reduction.
  std::string simdClause(const Step &st);

  /// Float max/min fold with a plain compare (which vectorizes) and remember NaNs separately,
  /// so that a NaN anywhere still makes the result NaN, as in PyTorch.
  static bool tracksNan(const loop::Computation &c);
  std::string nanFlag(const loop::Computation &c) { return "nan" + std::to_string(c.id); }

  std::string argIndex(const loop::Computation &c) { return names_.acc(c) + "_i"; }

  /// Row-major position over the kernel's inner space (what argmax/argmin return).
  std::string innerPosition();

  void declareAccumulator(const Member &m, Writer &w);

  /// After a step's loop: a NaN seen anywhere becomes the result.
  void applyNanFlags(const Step &st, Writer &w);

  /// One element folded into an accumulator inside the loop.
  std::string accFold(const loop::Computation &c, const std::string &acc, const std::string &v);

  void emitWithOuter(const Kernel &k, Writer &w, const sched::CpuLaunch &l);

  /// A one-dim pointwise kernel whose members fall in independent groups (an optimizer's
  /// updates of same-shaped parameters, joined by earlierKernel): one parallel region with a
  /// work-shared loop per group, none waiting for the others. One loop interleaving every
  /// group's dozens of loads and stores ran at half the speed per element of a loop per group.
  void emitGroups(const Kernel &k, Writer &w, Scope &top);

  /// Lane mode, for kernels whose reductions read memory along an outer dim (a column sum, a
  /// channels-last pooling window): that dim is cut into blocks of lanes_ consecutive values,
  /// and every step runs its inner loops outside a `omp simd` loop over the block's values,
  /// which keep their accumulators and results in arrays. plan-cpu chooses it, with kLanes,
  /// when no load is contiguous along the innermost inner variable and some load is along an
  /// outer one.
  static constexpr int kLanes = 16;
  int lanes_ = kLanes;

  std::optional<size_t> laneVar(const Kernel &k);

  /// Emits, into `scope` before a loop nest, the loads of `steps` whose index names none of
  /// `vars` (a per-channel scale read in a loop over the channel's points, a scalar read
  /// everywhere), from buffers this kernel does not write. GCC does not hoist them itself
  /// (it cannot tell a local restrict pointer's stores apart), and such a load feeding a
  /// select stops a loop's vectorization.
  void hoistLoads(const Kernel &k, const std::vector<const Step *> &steps,
                  const std::vector<sym::SymExpr> &vars, Writer &w, Scope &scope);

  static std::vector<sym::SymExpr> allVars(const Kernel &k);

  /// The lane arrays a step's results live in: its reductions' accumulators, NaN flags,
  /// positions and results, and a Scalar step's values.
  void declareLaneLocals(const Step &st, Writer &w);

  void emitWithLanes(const Kernel &k, Writer &w, size_t laneIndex);

  void emitWithoutOuter(const Kernel &k, Writer &w);

  /// Folds the per-thread partials in thread order: deterministic, and for argmax/argmin the
  /// earlier position wins ties because threads own ascending chunks.
  void combinePartials(const loop::Computation &c, Writer &w);

  /// A float sum folds into a float partial per block of kSumBlock inner points, in `omp simd`
  /// lanes, and each block's partial into its double accumulator: the loop runs at float
  /// width, and no float partial holds more than kSumBlock / lanes terms.
  static constexpr int kSumBlock = 512;
  static bool foldsInBlocks(const loop::Computation &c);

  /// The accumulator a member folds into inside the loop being emitted.
  std::string accOf(const loop::Computation &c);

  /// Opens a Loop step's innermost loop over v in [lo, hi): its `omp simd` line and, when the
  /// step has float sums and vectorizes, the blocks that hold their float partials.
  void openInnermost(const Step &st, Writer &w, sym::SymExpr v, const std::string &lo,
                     const std::string &hi);

  void closeInnermost(const Step &st, Writer &w);

  std::string accType(const loop::Computation &c);

  /// Emits the members of a step at the current point. Reductions fold into their accumulator;
  /// pointwise members define a local and store it if needed (`storeGuard` limits who stores).
  /// `exportTo` (lane mode's Scalar steps): the members' values are lane arrays declared
  /// before the lane loop (declareLaneLocals), visible to later steps through that scope.
  void emitMembers(const Step &st, Writer &w, Scope &scope,
                   const std::string &storeGuard = "", Scope *exportTo = nullptr);

  void finishReductions(const Step &st, Writer &w, Scope &scope, const std::string &storeGuard);

  std::string emitAbi();

  const sched::Schedule &s_;
  CpuCodegenOptions opts_;
  Names names_;
  int next_ = 0; ///< numbering of expression locals, unique per kernel
  const Kernel *kernel_ = nullptr; ///< the kernel being emitted
  std::unordered_map<const loop::Computation *, std::string> blockAcc_; ///< float partials
  bool blocked_ = false; ///< the innermost loop being emitted runs in blocks
  std::string lane_; ///< lane mode: `[x - xb]`, the lane's element of each lane array
};

} // namespace cpu

} // namespace braze::codegen
