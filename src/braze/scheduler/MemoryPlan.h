#pragma once
/// Memory planning: every stored intermediate gets an offset in one arena. Liveness is by
/// kernel index (from the first kernel that writes a buffer to the last kernel that reads it).
/// With constant sizes, buffers are placed largest first, each at the lowest offset free of
/// the buffers live with it; with symbolic sizes, a dead buffer's slot is reused by a later
/// buffer whose size is provably no larger.
#include "braze/scheduler/Schedule.h"

namespace braze::sched {

/// Fills s.placement and s.arenaBytes from the members' store decisions.
void planMemory(Schedule &s);

/// The independent groups of a pointwise step's members, as each member's group number (0, 1,
/// .. in the order of each group's first member): two members share a group when one reads
/// what the other computes or both read one buffer (directly or through members between). A
/// load that no variable of `vars` moves is one value for the whole kernel and joins nothing,
/// unless a member of the step makes it. Codegen may run the groups apart (CudaLaunch::groups,
/// CpuLaunch::Shape::Groups), so no two groups may share memory.
std::vector<size_t> independentGroups(const Step &st, const std::vector<SymExpr> &vars);

/// Bytes of a buffer, rounded up to 64.
SymExpr alignedBytes(sym::SymContext &ctx, const Buffer &b);

} // namespace braze::sched
