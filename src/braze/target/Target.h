#pragma once
/// Target descriptions as data. Tiling and parallelization read these numbers; no code path
/// asks "which machine is this" beyond `kind`.
#include <cstdint>
#include <string>

namespace braze {

enum class TargetKind { Cpu, Cuda };

struct Target {
  TargetKind kind = TargetKind::Cpu;
  std::string name;            ///< e.g. "cpu-x86_64"
  int vectorBytes = 32;        ///< SIMD register width
  int cores = 1;               ///< threads a kernel may use
  int64_t onChipBytes = 1 << 20; ///< per-core cache budget (L2) used to size tiles
  /// Below this many elements of work a CPU kernel runs on one thread.
  int64_t minParallelWork = 32768;

  // CUDA devices (kind == Cuda).
  int computeCapability = 0;          ///< e.g. 90 for sm_90
  int warpSize = 32;
  int maxThreadsPerBlock = 1024;
  int64_t registerBytesPerSm = 1 << 18; ///< the register file: the budget for rows kept on chip
  int64_t sharedBytesPerBlock = 48 << 10;
  /// The bytes of arguments a kernel launch may pass: 4 KiB, or 32764 where both NVRTC and
  /// the driver are CUDA 12.1 or later.
  int64_t kernelArgBytes = 4096;

  /// A CUDA device of compute capability `cc` with `sms` multiprocessors.
  static Target cudaDevice(int cc, int sms, int64_t registerBytesPerSm,
                           int64_t kernelArgBytes = 4096);

  /// The machine this process runs on (cores from OpenMP's default or the hardware).
  static Target hostCpu();
  /// Stable text that goes into cache keys.
  std::string fingerprint() const;
};

} // namespace braze
