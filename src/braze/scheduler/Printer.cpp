#include "braze/scheduler/Schedule.h"

#include "braze/support/Diagnostic.h"

#include <cstdlib>
#include <sstream>

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
      if (k.attentionGradQ)
        out += std::string(" and ") + loop::attentionPartName(k.attentionGradQ->attention->part);
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

namespace braze::sched {

std::map<std::string, CudaLaunch> parseLaunchRecords(const std::string &text) {
  std::map<std::string, CudaLaunch> out;
  std::istringstream lines(text);
  std::string line;
  for (int no = 1; std::getline(lines, line); ++no) {
    size_t at = line.find("launch{");
    if (at == std::string::npos || !line.starts_with("kernel"))
      continue;
    std::string where = "line " + std::to_string(no);
    std::string name = line.substr(0, line.find(' '));
    size_t close = line.find('}', at);
    if (close == std::string::npos)
      BRAZE_USER_ERROR("--launch", "") << where << ": the record of " << name
                                       << " has no closing '}'";
    if (out.count(name))
      BRAZE_USER_ERROR("--launch", "") << where << ": a second record for " << name;
    CudaLaunch l;
    l.threads = 0; // rows say theirs; pointwise kernels have none
    std::istringstream fields(line.substr(at + 7, close - at - 7));
    std::string f;
    bool sawBlock = false, sawVec = false;
    while (fields >> f) {
      size_t eq = f.find('=');
      std::string key = f.substr(0, eq);
      if (eq == std::string::npos) {
        if (key == "persistent")
          l.persistent = true;
        else if (key == "ragged")
          l.ragged = true;
        else
          BRAZE_USER_ERROR("--launch", "") << where << ": unknown word '" << f << "' in the "
                                           << "record of " << name;
        continue;
      }
      std::string value = f.substr(eq + 1);
      char *end = nullptr;
      long long v = std::strtoll(value.c_str(), &end, 10);
      long long least = key == "iters" ? 0 : 1; // a row of no elements takes no iterations
      if (value.empty() || *end != '\0' || v < least || v > (1 << 20))
        BRAZE_USER_ERROR("--launch", "")
            << where << ": " << key << " of " << name << " must be a "
            << (least ? "positive" : "non-negative") << " number, got '" << value << "'";
      int n = static_cast<int>(v);
      if (key == "block")
        l.block = n, sawBlock = true;
      else if (key == "threads")
        l.threads = n;
      else if (key == "vec")
        l.vec = n, sawVec = true;
      else if (key == "spread")
        l.spread = n;
      else if (key == "columns")
        l.columns = true, l.columnRows = n;
      else if (key == "iters")
        l.iters = v;
      else
        BRAZE_USER_ERROR("--launch", "") << where << ": unknown field '" << key << "' in the "
                                         << "record of " << name;
    }
    if (!sawBlock || !sawVec)
      BRAZE_USER_ERROR("--launch", "") << where << ": the record of " << name
                                       << " needs block= and vec=";
    out[name] = l;
  }
  return out;
}

} // namespace braze::sched
