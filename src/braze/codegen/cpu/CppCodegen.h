#pragma once
/// C++/OpenMP code generation for a Schedule: one translation unit per graph exposing the
/// module ABI that runtime/Executable loads (see runtime/ModuleAbi.h).
#include "braze/scheduler/Schedule.h"

#include <map>
#include <string>

namespace braze::codegen {

struct GeneratedSource {
  std::string source;
  int numKernels = 0;
  bool usesBlas = false; ///< the module must be linked with the BLAS library
  bool usesDnnl = false; ///< the module must be linked with oneDNN
};

/// A CBLAS-style library the generated code may call for matrix products (row-major gemm with
/// the usual argument order). Empty symbols: products run as loop nests.
struct BlasSymbols {
  std::string sgemm, dgemm;
  int indexBits = 64; ///< 64 for ILP64 builds (int64 sizes), 32 for LP64
  /// The library's set-thread-count entry point (OpenBLAS's), called once with 1: braze splits
  /// products over its own OpenMP threads. Empty when the library has none known.
  std::string setThreads;
  /// The library has Fortran's ILP64 interface only (MKL inside libtorch_cpu: sgemm_64_,
  /// column-major, arguments by address): sgemm and dgemm name CBLAS-style row-major wrappers
  /// that the generated code defines around it.
  bool fortran64 = false;
};

/// C declarations of `blas`'s gemm for dtype t (sgemm for f32, dgemm for f64) and of its
/// set-thread-count entry point, if it has one.
std::string blasDeclarations(const BlasSymbols &blas, DType t);

struct CpuCodegenOptions {
  BlasSymbols blas;
  /// Convolution kernels (sched::Kernel::conv) call oneDNN (its C API, version 3), falling
  /// back to their loop nests where it declines; false: loop nests only.
  bool dnnl = false;
  /// The autotuner's module (driver/Autotune.h): for each kernel named, its forms as functions
  /// of their own, `braze_tune_form(kernel, form, bufs, syms, err)` to run one (kernel: its
  /// position in the schedule), and `braze_set_tune_hook(hook)`, a function braze_run calls
  /// before each kernel with the same arguments but the form. Empty: none of it.
  std::map<std::string, std::vector<sched::CpuLaunch>> tuneForms;
};

/// The forms of CPU loop kernel `kernel` of s the autotuner times: its record first, then the
/// other records its code can run (shared outer loops, simd, lanes, member groups), none twice.
/// Empty for a kernel not written as loops (a library call's, attention, scatter).
std::vector<sched::CpuLaunch> cpuKernelForms(const sched::Schedule &s, const std::string &kernel);

/// plan-cpu: records in each kernel that codegen writes as loops how its points run on the
/// threads (sched::Kernel::cpuLaunch: a parallel region, the shared outer loops and simd, lanes
/// along an outer loop, or a loop per independent group). generateCpu prints what they say.
void planCpuLaunches(sched::Schedule &s);

/// Puts records given by hand (sched::parseCpuLaunchRecords of an edited schedule) in place of
/// plan-cpu's, for the kernels they name; each is checked against what its kernel's code can
/// do: a user error names the kernel and the rule.
void applyCpuLaunches(sched::Schedule &s, const std::map<std::string, sched::CpuLaunch> &records);

GeneratedSource generateCpu(const sched::Schedule &s, const CpuCodegenOptions &opts = {});

} // namespace braze::codegen
