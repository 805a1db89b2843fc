#include "braze/scheduler/Schedule.h"

namespace braze::sched {

namespace {
std::string varList(const std::vector<SymExpr> &vars) {
  std::string s = "[";
  for (size_t i = 0; i < vars.size(); ++i)
    s += (i ? ", " : "") + vars[i]->name() + " < " + sym::toString(vars[i]->extent());
  return s + "]";
}

/// A CUDA kernel's launch record, as `launch{block=B threads=T vec=V ...}`: spread, columns
/// and persistent (iters, ragged) where they apply.
std::string launchText(const CudaLaunch &l, bool rows) {
  std::string s = "launch{block=" + std::to_string(l.block);
  if (rows)
    s += " threads=" + std::to_string(l.threads);
  s += " vec=" + std::to_string(l.vec);
  if (l.spread > 1)
    s += " spread=" + std::to_string(l.spread);
  if (l.columns)
    s += " columns=" + std::to_string(l.columnRows);
  if (l.persistent)
    s += " persistent iters=" + std::to_string(l.iters) + (l.ragged ? " ragged" : "");
  return s + "}";
}

std::string_view placementName(PlacementKind k) {
  switch (k) {
  case PlacementKind::Input:
    return "input";
  case PlacementKind::Output:
    return "output";
  case PlacementKind::Arena:
    return "arena";
  case PlacementKind::Local:
    return "register";
  }
  return "?";
}
} // namespace

std::string printSchedule(const Schedule &s) {
  std::string out;
  for (const Kernel &k : s.kernels) {
    out += k.name + " outer " + varList(k.outerVars);
    if (!k.innerVars.empty())
      out += " inner " + varList(k.innerVars);
    if (k.attention) {
      std::string names;
      for (const loop::AttentionOperand *o : k.attention->attention->operands())
        names += (names.empty() ? "%" : ", %") + o->buffer->name;
      out += std::string(" ") + loop::attentionPartName(k.attention->attention->part) + "(" +
             names + ")";
      if (k.attentionPair)
        out += std::string(" and ") + loop::attentionPartName(k.attentionPair->attention->part);
    }
    if (k.conv)
      out += std::string(" ") + k.conv->conv->name() + "(%" +
             k.conv->conv->operands()[0]->name + ", %" + k.conv->conv->operands()[1]->name + ")";
    if (k.gemm)
      out += std::string(" gemm(") + (k.gemm->transA ? "A^T" : "A") + ", " +
             (k.gemm->transB ? "B^T" : "B") + ")" +
             (k.gemm->bias ? " + bias %" + k.gemm->bias->name : "") +
             (k.gemm->group ? " grouped by rows" : "") +
             (k.gemm->rowOf ? " of gathered rows" : "");
    if (k.scatter)
      out += " scatter " + std::string(loop::scatterCombineName(k.scatter->scatterCombine));
    if (k.cudaLaunch)
      out += " " + launchText(*k.cudaLaunch, !k.innerVars.empty());
    out += "\n";
    for (const Step &st : k.steps) {
      out += st.kind == StepKind::Loop ? "  loop:\n" : "  scalar:\n";
      for (const Member &m : st.members) {
        out += "    %" + m.comp->out->name + "[" + sym::toString(m.storeIndex) + "] = ";
        out += k.scatter             ? std::string("added at a position ")
               : m.comp->attention     ? std::string("attention ")
               : m.comp->isReduction() ? std::string(loop::reduceKindName(m.comp->reduce)) + " "
                                       : std::string("pointwise ");
        out += m.store ? "(stored)\n" : "(register)\n";
      }
      for (const Stash &sh : st.stashes)
        out += "    %" + sh.buffer->name + "[" + sym::toString(sh.index) + "] = stash\n";
    }
  }
  out += "buffers:\n";
  for (const auto &b : s.program->buffers()) {
    const Placement &pl = s.placement.at(b->id);
    out += "  %" + b->name + " " + std::string(placementName(pl.kind));
    if (pl.kind == PlacementKind::Arena)
      out += " +" + sym::toString(pl.offsetBytes);
    out += "\n";
  }
  out += "arena bytes: " + sym::toString(s.arenaBytes) + "\n";
  return out;
}

} // namespace braze::sched
