#include "braze/target/Target.h"

#include <algorithm>
#include <thread>

namespace braze {

Target Target::hostCpu() {
  Target t;
  t.kind = TargetKind::Cpu;
  t.name = "cpu-x86_64";
  t.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#if defined(__AVX512F__)
  t.vectorBytes = 64;
#elif defined(__AVX__)
  t.vectorBytes = 32;
#else
  t.vectorBytes = 16;
#endif
  return t;
}

Target Target::cudaDevice(int cc, int sms, int64_t registerBytesPerSm, int64_t kernelArgBytes) {
  Target t;
  t.kind = TargetKind::Cuda;
  t.name = "cuda-sm_" + std::to_string(cc);
  t.computeCapability = cc;
  t.cores = sms;
  t.vectorBytes = 16; // the widest load one thread issues
  t.registerBytesPerSm = registerBytesPerSm;
  t.onChipBytes = registerBytesPerSm;
  t.minParallelWork = 0;
  t.kernelArgBytes = kernelArgBytes;
  return t;
}

std::string Target::fingerprint() const {
  if (kind == TargetKind::Cuda)
    return name + ";sms=" + std::to_string(cores) + ";regs=" + std::to_string(registerBytesPerSm) +
           ";args=" + std::to_string(kernelArgBytes);
  return name + ";vec=" + std::to_string(vectorBytes) + ";l2=" + std::to_string(onChipBytes) +
         ";minwork=" + std::to_string(minParallelWork);
}

} // namespace braze
