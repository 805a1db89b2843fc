#pragma once
/// A schedule is data: the kernels in launch order, which computations each one fuses, how they
/// are nested, and where every buffer lives.
///
/// A kernel iterates an outer space (parallel) and, for each outer point, runs its steps in
/// order. A Loop step is one loop over the inner space holding pointwise members (one value per
/// inner point) and reduction members (folded over the inner space). A Scalar step holds
/// pointwise members with one value per outer point. Member values are rewritten into the
/// kernel's own loop variables.
#include "braze/ir/loop/LoopIR.h"
#include "braze/scheduler/Gemm.h"
#include "braze/target/Target.h"

#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace braze::sched {

using loop::Buffer;
using loop::Computation;
using loop::Expr;
using sym::SymExpr;

struct Member {
  const Computation *comp = nullptr;
  const Expr *value = nullptr; ///< in kernel variables
  SymExpr storeIndex = nullptr; ///< in kernel variables
  bool store = false;          ///< the result must reach memory
};

enum class StepKind { Loop, Scalar };

/// A costly value that a Loop step computes and a later Loop step of the same kernel needs
/// again (softmax's exp(x - max), summed in one loop and divided in the next). The earlier
/// step stores it where the later step's member will store its own result (an output, at
/// the same point), and the later step loads it back instead of computing it again.
struct Stash {
  const Expr *value = nullptr; ///< in kernel variables; a subexpression of the step's members
  const Buffer *buffer = nullptr;
  SymExpr index = nullptr;
};

struct Step {
  StepKind kind = StepKind::Loop;
  std::vector<Member> members;
  std::vector<Stash> stashes; ///< stored after the members, at each inner point
};

/// How a CUDA loop kernel maps its points to threads: the plan-cuda step's record
/// (codegen::planCudaLaunches), which code generation prints as it says and --print=schedule
/// shows as `launch{...}`. A pointwise kernel uses block, vec and spread; a kernel with an
/// inner loop all of it.
struct CudaLaunch {
  int block = 256;       ///< threads per block
  int threads = 32;      ///< rows: T, threads per row (a power of two)
  int vec = 1;           ///< consecutive elements per thread per iteration (with columns:
                         ///< neighbouring rows a thread takes, its column lanes)
  int spread = 1;        ///< pointwise without lanes: points per thread, a block apart
  /// A one-step kernel's independent member groups (KernelBody's independentMembers: an
  /// optimizer's updates of same-sized parameters, the weight gradients of many layer norms),
  /// each over blocks of its own. Block b runs group b / (blocks per group) alone, so a thread
  /// holds one group's operands and accumulators, not every group's. Not with persistent
  /// rows. 1: every block runs every member.
  int groups = 1;
  /// Columns: the rows' elements lie apart in memory and neighbouring rows are neighbours
  /// (a sum over the rows of a row-major matrix, per column). A block holds `columnRows` rows;
  /// its neighbouring threads take neighbouring rows, so that a warp reads adjacent elements
  /// at each step, and a row's T threads, columnRows apart, combine by shuffles and through
  /// shared memory. With vec = V > 1, a thread takes V neighbouring rows (columnRows groups of
  /// V a block), reads each operand as one vector a step and keeps an accumulator per row.
  bool columns = false;
  int columnRows = 32;
  /// Persistent rows: each thread keeps its `iters` x vec elements of the row (of constant
  /// `length`) in registers across the kernel's steps; `ragged` when the last iteration is
  /// partial.
  bool persistent = false;
  int64_t iters = 0, length = 0;
  bool ragged = false;
};

/// How a CPU loop kernel shares its points among the threads and vectorizes them: the plan-cpu
/// step's record, `cpu{...}` in --print=schedule (braze-opt --launch reads records back).
struct CpuLaunch {
  enum class Shape {
    Region, ///< no outer loop: one parallel region, inner loops work-shared, partials per thread
    Outer,  ///< `omp parallel for` over the first `parallel` outer loops (collapsed)
    Groups, ///< one outer loop as a work-shared `omp for simd` loop per independent group of
            ///< members (an optimizer's same-sized parameters), none waiting for the others
    Lanes,  ///< outer loop `along` in blocks of `lanes` values computed as simd lanes around
            ///< the inner loops (a column sum); the other outer loops shared by the threads
  };
  Shape shape = Shape::Outer;
  /// Outer: the outer loops the threads share; the others run inside each thread, the last of
  /// them as `omp simd` when the kernel has no inner loop. 0: one thread.
  int parallel = 0;
  bool simd = false; ///< Outer: `omp parallel for simd` (every outer loop shared, no inner loop)
  int along = -1;    ///< Lanes: the outer loop (its position among the outer variables)
  int lanes = 0;     ///< Lanes: values per block
};

/// A convolution kernel: its one computation, which has a ConvSpec; codegen may call the
/// convolution library instead of the loop nest.
struct ConvCall {
  const loop::Computation *comp = nullptr;
};
/// A fused attention kernel: its one computation `main` (an AttentionSpec and no value), which
/// codegen writes itself, and up to two more parts from the same operands in the same pass:
///   - `pair`: the gradient of v beside the gradient of k, or the log-sum-exp beside the
///     output (the kernel's second member);
///   - `gradQ` (CUDA): q's gradient beside k's and v's. cuDNN's fused backward writes all three
///     in one call; where cuDNN declines, braze's own kernels run as two launches (k and v's,
///     then q's). The kernel's third member.
struct AttentionCall {
  const loop::Computation *main = nullptr, *pair = nullptr, *gradQ = nullptr;
};
/// An accumulating scatter kernel: its one computation (which has a scatterAt), whose member's
/// value is added at `at` (in kernel variables) of the computation's buffer. Codegen writes it
/// as its own loop: atomic adds on CUDA, one thread in order on the CPU.
struct ScatterCall {
  const loop::Computation *comp = nullptr;
  const loop::Expr *at = nullptr;
};
/// The extern family: what a kernel that stands alone calls. A matrix product (in kernel
/// variables; codegen may call BLAS), a convolution, a fused attention or an accumulating
/// scatter.
using ExternCall = std::variant<GemmCall, ConvCall, AttentionCall, ScatterCall>;

struct Kernel {
  std::string name;
  std::vector<SymExpr> outerVars; ///< index symbols; parallel
  std::vector<SymExpr> innerVars; ///< index symbols; empty for a kernel with only Scalar steps
  std::vector<Step> steps;
  /// Set when the kernel is one op of the extern family (ExternCall): codegen writes it in a
  /// form of its own, and no other computation joins it.
  std::optional<ExternCall> ext;
  /// Set by plan-cuda on a CUDA kernel that codegen writes as loops (a GEMM's or a
  /// convolution's too, for where the library declines it).
  std::optional<CudaLaunch> cudaLaunch;
  /// Set by plan-cpu on a CPU kernel that codegen writes as loops (a GEMM's or a convolution's
  /// too: its loop nest stands in where no library takes it).
  std::optional<CpuLaunch> cpuLaunch;

  /// A matrix product, a convolution, an attention or a scatter: one computation, which
  /// codegen writes in a form of its own; no other computation joins it.
  bool standsAlone() const { return ext.has_value(); }

  /// The extern call of kind T, or null when the kernel makes another call (or none).
  template <class T>
  const T *call() const { return ext ? std::get_if<T>(&*ext) : nullptr; }
  template <class T>
  T *call() { return ext ? std::get_if<T>(&*ext) : nullptr; }

  /// The extern call's parts, or null when the kernel makes another call (or none).
  const GemmCall *gemm() const { return call<GemmCall>(); }
  GemmCall *gemm() { return call<GemmCall>(); }
  const loop::Computation *conv() const { return part(&ConvCall::comp); }
  const AttentionCall *attentionCall() const { return call<AttentionCall>(); }
  const loop::Computation *attention() const { return part(&AttentionCall::main); }
  const loop::Computation *attentionPair() const { return part(&AttentionCall::pair); }
  const loop::Computation *attentionGradQ() const { return part(&AttentionCall::gradQ); }
  const loop::Computation *scatter() const { return part(&ScatterCall::comp); }
  const loop::Expr *scatterAt() const { return part(&ScatterCall::at); }

private:
  /// Field `f` of the extern call of f's kind, or null.
  template <class T, class F>
  F *part(F *const T::*f) const {
    const T *c = call<T>();
    return c ? c->*f : nullptr;
  }
};

enum class PlacementKind { Input, Output, Arena, Local };

struct Placement {
  PlacementKind kind = PlacementKind::Local;
  SymExpr offsetBytes = nullptr; ///< Arena only
};

struct Schedule {
  loop::LoopProgram *program = nullptr;
  Target target;
  std::vector<Kernel> kernels;
  std::map<int, Placement> placement; ///< by buffer id
  SymExpr arenaBytes = nullptr;
};

struct ScheduleOptions {
  bool fuse = true; ///< false: one kernel per computation (for debugging and tests)
  bool pairedEpilogues = false; ///< CUDA: pairGemmEpilogues (CompileOptions::pairedEpilogues)
};

Schedule scheduleProgram(loop::LoopProgram &p, const Target &target,
                         const ScheduleOptions &opts = {});
std::string printSchedule(const Schedule &s);
/// A CUDA kernel's launch record as --print=schedule writes it, `launch{block=B threads=T
/// vec=V ...}`: threads for a kernel of `rows`; spread, groups, columns and persistent
/// (iters, ragged) where they apply.
std::string launchText(const CudaLaunch &l, bool rows);
/// A CPU kernel's record as --print=schedule writes it: `cpu{region}`, `cpu{groups}`,
/// `cpu{parallel=P [simd]}` or `cpu{lanes=L along=x<i>}` (`outer`: the kernel's outer vars).
std::string cpuLaunchText(const CpuLaunch &l, const std::vector<SymExpr> &outer);

/// The CUDA launch records of a printed schedule (`kernelN ... launch{block=.. ...}`), by
/// kernel name: what printSchedule writes, read back, so that a record written or edited by
/// hand steers code generation (braze-opt --launch). A malformed record is a user error naming
/// its line; lines without one are passed over.
std::map<std::string, CudaLaunch> parseLaunchRecords(const std::string &text);

/// The CPU records of a printed schedule (`kernelN ... cpu{parallel=.. ...}`), by kernel name,
/// as parseLaunchRecords reads CUDA's.
std::map<std::string, CpuLaunch> parseCpuLaunchRecords(const std::string &text);

} // namespace braze::sched
