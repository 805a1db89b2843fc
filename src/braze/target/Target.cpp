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

std::string Target::fingerprint() const {
  return name + ";vec=" + std::to_string(vectorBytes) + ";l2=" + std::to_string(onChipBytes) +
         ";minwork=" + std::to_string(minParallelWork);
}

} // namespace braze
