// plan-cpu: each CPU loop kernel's record (sched::CpuLaunch) from its shape and loads, and the
// check of records given by hand (braze-opt --launch): which outer loops the threads share,
// which run as simd lanes, and whether independent members get loops of their own.
#include "braze/codegen/cpu/CpuEmitter.h"

#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>

namespace braze::codegen {

namespace cpu {

using Shape = sched::CpuLaunch::Shape;

bool CpuEmitter::hasGroups(const Kernel &k) {
  return k.outerVars.size() == 1 && k.innerVars.empty() && k.steps.size() == 1 &&
         independentMembers(k.steps[0], k.outerVars).size() >= 2;
}

sched::CpuLaunch CpuEmitter::planLaunch(const Kernel &k) {
  sched::CpuLaunch l;
  if (k.outerVars.empty()) {
    l.shape = Shape::Region;
    return l;
  }
  if (std::optional<size_t> lane = laneVar(k)) {
    l.shape = Shape::Lanes;
    l.along = static_cast<int>(*lane);
    l.lanes = kLanes;
    return l;
  }
  // Without inner loops, the innermost outer loop vectorizes: it is the parallel loop itself
  // (`parallel for simd`) when it is the only one, else it runs inside the others.
  const bool scalarOnly = k.innerVars.empty();
  const int n = static_cast<int>(k.outerVars.size());
  l.parallel = scalarOnly && n > 1 ? n - 1 : n;
  l.simd = scalarOnly && n == 1;
  if (hasGroups(k))
    l.shape = Shape::Groups;
  return l;
}

void CpuEmitter::planLaunches(sched::Schedule &s) {
  for (Kernel &k : s.kernels)
    if (!k.attention() && !k.scatter())
      k.cpuLaunch = planLaunch(k);
}

std::string CpuEmitter::checkLaunch(const Kernel &k, const sched::CpuLaunch &l) {
  const int n = static_cast<int>(k.outerVars.size());
  if ((l.shape == Shape::Region) != (n == 0))
    return n == 0 ? "a kernel without outer loops runs as a parallel region: cpu{region}"
                  : "region is for kernels without outer loops";
  switch (l.shape) {
  case Shape::Region:
    return "";
  case Shape::Groups:
    return hasGroups(k) ? ""
                        : "groups needs one outer loop, no inner loop, one step, and members "
                          "in at least two independent groups";
  case Shape::Lanes:
    if (k.innerVars.empty() || k.standsAlone())
      return "lanes apply to loop kernels with an inner loop";
    if (l.along >= n)
      return "along must be an outer variable, x0 to x" + std::to_string(n - 1);
    if (l.lanes < 2 || l.lanes > 64 || (l.lanes & (l.lanes - 1)) != 0)
      return "lanes must be a power of two from 2 to 64";
    return "";
  case Shape::Outer:
    break;
  }
  if (l.parallel > n)
    return "parallel must be at most " + std::to_string(n) + " (the outer loops)";
  if (l.simd && (!k.innerVars.empty() || l.parallel != n))
    return "simd needs every outer loop parallel (parallel=" + std::to_string(n) +
           ") and no inner loop";
  return "";
}

std::vector<sched::CpuLaunch> CpuEmitter::launchCandidates(const Kernel &k) {
  const sched::CpuLaunch base = k.cpuLaunch ? *k.cpuLaunch : planLaunch(k);
  const int n = static_cast<int>(k.outerVars.size());
  std::vector<sched::CpuLaunch> raw{base};
  for (int p = n; p >= 0; --p)
    for (bool simd : {false, true}) {
      sched::CpuLaunch l;
      l.parallel = p;
      l.simd = simd;
      raw.push_back(l);
    }
  for (int lanes : {4, 8, 16, 32})
    for (int along = 0; along < n; ++along) {
      sched::CpuLaunch l;
      l.shape = Shape::Lanes;
      l.along = along;
      l.lanes = lanes;
      if (base.shape == Shape::Lanes ? along == base.along : laneVar(k) == size_t(along))
        raw.push_back(l);
    }
  sched::CpuLaunch groups;
  groups.shape = Shape::Groups;
  groups.parallel = base.parallel;
  groups.simd = base.simd;
  raw.push_back(groups);
  std::vector<sched::CpuLaunch> out;
  for (const sched::CpuLaunch &l : raw) {
    if (!checkLaunch(k, l).empty())
      continue;
    auto same = [&](const sched::CpuLaunch &o) {
      return o.shape == l.shape && o.parallel == l.parallel && o.simd == l.simd &&
             o.along == l.along && o.lanes == l.lanes;
    };
    if (std::none_of(out.begin(), out.end(), same))
      out.push_back(l);
  }
  return out;
}

void CpuEmitter::applyLaunches(sched::Schedule &s,
                               const std::map<std::string, sched::CpuLaunch> &records) {
  for (const auto &entry : records) {
    const std::string &name = entry.first; // not a structured binding: the lambda captures it
    const sched::CpuLaunch &record = entry.second;
    auto k = std::find_if(s.kernels.begin(), s.kernels.end(),
                          [&](const Kernel &x) { return x.name == name; });
    if (k == s.kernels.end() || !k->cpuLaunch)
      BRAZE_USER_ERROR("--launch", "")
          << (k == s.kernels.end() ? "the schedule has no kernel " + name
                                   : name + " is not written as loops (no cpu record)");
    if (std::string why = checkLaunch(*k, record); !why.empty())
      BRAZE_USER_ERROR("--launch", "") << "the record of " << name << ": " << why;
    k->cpuLaunch = record;
  }
}

} // namespace cpu

void planCpuLaunches(sched::Schedule &s) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cpu) << "plan-cpu needs a CPU target";
  cpu::CpuEmitter(s, {}).planLaunches(s);
}

std::vector<sched::CpuLaunch> cpuKernelForms(const sched::Schedule &s, const std::string &kernel) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cpu) << "cpu forms need a CPU target";
  auto k = std::find_if(s.kernels.begin(), s.kernels.end(),
                        [&](const sched::Kernel &x) { return x.name == kernel; });
  if (k == s.kernels.end() || !k->cpuLaunch || k->standsAlone())
    return {};
  return cpu::CpuEmitter(s, {}).launchCandidates(*k);
}

void applyCpuLaunches(sched::Schedule &s, const std::map<std::string, sched::CpuLaunch> &records) {
  BRAZE_CHECK(s.target.kind == TargetKind::Cpu) << "cpu records need a CPU target";
  cpu::CpuEmitter(s, {}).applyLaunches(s, records);
}

} // namespace braze::codegen
