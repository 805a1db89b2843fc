#include "braze/passes/PassManager.h"

namespace braze {

void eliminateDeadCode(Graph &g) { g.removeDeadNodes(); }

} // namespace braze
