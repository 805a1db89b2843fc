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

/// Bytes of a buffer, rounded up to 64.
SymExpr alignedBytes(sym::SymContext &ctx, const Buffer &b);

} // namespace braze::sched
