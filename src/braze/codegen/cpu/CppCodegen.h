#pragma once
/// C++/OpenMP code generation for a Schedule: one translation unit per graph exposing the
/// module ABI that runtime/Executable loads (see runtime/ModuleAbi.h).
#include "braze/scheduler/Schedule.h"

#include <string>

namespace braze::codegen {

struct GeneratedSource {
  std::string source;
  int numKernels = 0;
};

GeneratedSource generateCpu(const sched::Schedule &s);

} // namespace braze::codegen
