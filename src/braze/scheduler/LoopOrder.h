#pragma once
/// The order and shape of a kernel's loops once fusion has chosen its members.
#include "braze/scheduler/Schedule.h"

namespace braze::sched {

/// Adjacent loop variables that every index uses as one (the H and W of a contiguous NCHW
/// tensor) become one loop. On the CPU the innermost loop (the `omp simd` one) is then long: a
/// W of 32 is two vectors; innermost pairs of the inner loops, and of the outer loops (in
/// store order) of a kernel without inner loops. On CUDA (`innerOnly`), the inner loops: a
/// thread's row loop then steps one index, where it split the row into its variables with a
/// division and a remainder per variable at every step (a channels-last batch norm's sums
/// over N, H and W of [32, 56, 56, 256] split 16 ways, a column kernel, walk rows 256 apart).
void flattenLoops(Schedule &s, bool innerOnly);

} // namespace braze::sched
