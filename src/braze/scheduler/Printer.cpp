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

std::string cpuLaunchText(const CpuLaunch &l, const std::vector<SymExpr> &outer) {
  switch (l.shape) {
  case CpuLaunch::Shape::Region:
    return "cpu{region}";
  case CpuLaunch::Shape::Groups:
    return "cpu{groups}";
  case CpuLaunch::Shape::Lanes:
    return "cpu{lanes=" + std::to_string(l.lanes) + " along=" + outer.at(l.along)->name() + "}";
  case CpuLaunch::Shape::Outer:
    break;
  }
  return "cpu{parallel=" + std::to_string(l.parallel) + (l.simd ? " simd}" : "}");
}

std::string launchText(const CudaLaunch &l, bool rows) {
  std::string s = "launch{block=" + std::to_string(l.block);
  if (rows)
    s += " threads=" + std::to_string(l.threads);
  s += " vec=" + std::to_string(l.vec);
  if (l.spread > 1)
    s += " spread=" + std::to_string(l.spread);
  if (l.groups > 1)
    s += " groups=" + std::to_string(l.groups);
  if (l.columns)
    s += " columns=" + std::to_string(l.columnRows);
  if (l.persistent)
    s += " persistent iters=" + std::to_string(l.iters) + (l.ragged ? " ragged" : "");
  return s + "}";
}

std::string printSchedule(const Schedule &s) {
  std::string out;
  for (const Kernel &k : s.kernels) {
    out += k.name + " outer " + varList(k.outerVars);
    if (!k.innerVars.empty())
      out += " inner " + varList(k.innerVars);
    if (k.attention()) {
      std::string names;
      for (const loop::AttentionOperand *o : k.attention()->attention()->operands())
        names += (names.empty() ? "%" : ", %") + o->buffer->name;
      out += std::string(" ") + loop::attentionPartName(k.attention()->attention()->part) + "(" +
             names + ")";
      if (k.attentionPair())
        out += std::string(" and ") + loop::attentionPartName(k.attentionPair()->attention()->part);
      if (k.attentionGradQ())
        out += std::string(" and ") +
               loop::attentionPartName(k.attentionGradQ()->attention()->part);
    }
    if (const loop::Computation *conv = k.conv())
      out += std::string(" ") + conv->conv()->name() + "(%" + conv->conv()->operands()[0]->name +
             ", %" + conv->conv()->operands()[1]->name + ")";
    if (k.gemm())
      out += std::string(" gemm(") + (k.gemm()->transA ? "A^T" : "A") + ", " +
             (k.gemm()->transB ? "B^T" : "B") + ")" +
             (k.gemm()->bias ? " + bias %" + k.gemm()->bias->name : "") +
             (k.gemm()->group ? " grouped by rows" : "") +
             (k.gemm()->rowOf ? " of gathered rows" : "") +
             (k.gemm()->rowZero.empty() ? "" : " with masked rows") +
             (k.gemm()->epilogue ? " with paired epilogue %" + k.gemm()->epilogue->out->name
                                 : "");
    if (k.scatter())
      out += " scatter " + std::string(loop::scatterCombineName(k.scatter()->scatterCombine()));
    if (k.cudaLaunch)
      out += " " + launchText(*k.cudaLaunch, !k.innerVars.empty());
    if (k.cpuLaunch)
      out += " " + cpuLaunchText(*k.cpuLaunch, k.outerVars);
    out += "\n";
    for (const Step &st : k.steps) {
      out += st.kind == StepKind::Loop ? "  loop:\n" : "  scalar:\n";
      for (const Member &m : st.members) {
        out += "    %" + m.comp->out->name + "[" + sym::toString(m.storeIndex) + "] = ";
        out += k.scatter()           ? std::string("added at a position ")
               : m.comp->attention()   ? std::string("attention ")
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

namespace {
/// Calls `read(name, where, fields)` for each kernel line of `text` with a record opened by
/// `open` (`launch{`, `cpu{`): its words between the braces. A record without its closing brace,
/// or a second one for a kernel, is a user error naming the line.
template <typename Record, typename Read>
std::map<std::string, Record> readRecords(const std::string &text, const std::string &open,
                                          Read read) {
  std::map<std::string, Record> out;
  std::istringstream lines(text);
  std::string line;
  for (int no = 1; std::getline(lines, line); ++no) {
    size_t at = line.find(open);
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
    std::istringstream fields(line.substr(at + open.size(), close - at - open.size()));
    out[name] = read(name, where, fields);
  }
  return out;
}

/// A record's `key=value` number, in [least, 2^20]; a user error naming the field otherwise.
int64_t recordNumber(const std::string &key, const std::string &value, long long least,
                     const std::string &name, const std::string &where) {
  char *end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < least || v > (1 << 20))
    BRAZE_USER_ERROR("--launch", "")
        << where << ": " << key << " of " << name << " must be a "
        << (least ? "positive" : "non-negative") << " number, got '" << value << "'";
  return v;
}
} // namespace

std::map<std::string, CudaLaunch> parseLaunchRecords(const std::string &text) {
  return readRecords<CudaLaunch>(text, "launch{", [](const std::string &name,
                                                     const std::string &where,
                                                     std::istringstream &fields) {
    CudaLaunch l;
    l.threads = 0; // rows say theirs; pointwise kernels have none
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
      // A row of no elements takes no iterations.
      int64_t v = recordNumber(key, f.substr(eq + 1), key == "iters" ? 0 : 1, name, where);
      int n = static_cast<int>(v);
      if (key == "block")
        l.block = n, sawBlock = true;
      else if (key == "threads")
        l.threads = n;
      else if (key == "vec")
        l.vec = n, sawVec = true;
      else if (key == "spread")
        l.spread = n;
      else if (key == "groups")
        l.groups = n;
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
    return l;
  });
}

std::map<std::string, CpuLaunch> parseCpuLaunchRecords(const std::string &text) {
  return readRecords<CpuLaunch>(text, "cpu{", [](const std::string &name,
                                                 const std::string &where,
                                                 std::istringstream &fields) {
    CpuLaunch l;
    std::string f, alongName;
    bool sawParallel = false, sawLanes = false, sawShape = false;
    while (fields >> f) {
      size_t eq = f.find('=');
      std::string key = f.substr(0, eq);
      if (eq == std::string::npos) {
        if (key == "region" || key == "groups") {
          l.shape = key == "region" ? CpuLaunch::Shape::Region : CpuLaunch::Shape::Groups;
          sawShape = true;
        } else if (key == "simd") {
          l.simd = true;
        } else {
          BRAZE_USER_ERROR("--launch", "") << where << ": unknown word '" << f << "' in the "
                                           << "record of " << name;
        }
        continue;
      }
      std::string value = f.substr(eq + 1);
      if (key == "parallel") {
        l.parallel = static_cast<int>(recordNumber(key, value, 0, name, where));
        sawParallel = true;
      } else if (key == "lanes") {
        l.lanes = static_cast<int>(recordNumber(key, value, 1, name, where));
        sawLanes = true;
      } else if (key == "along") {
        // x<i>: the kernel's outer variable i
        if (value.size() < 2 || value[0] != 'x')
          BRAZE_USER_ERROR("--launch", "") << where << ": along of " << name
                                           << " must name an outer variable (x0, x1, ..), got '"
                                           << value << "'";
        l.along = static_cast<int>(recordNumber(key, value.substr(1), 0, name, where));
      } else {
        BRAZE_USER_ERROR("--launch", "") << where << ": unknown field '" << key << "' in the "
                                         << "record of " << name;
      }
    }
    if (sawLanes)
      l.shape = CpuLaunch::Shape::Lanes;
    if (int(sawShape) + int(sawParallel) + int(sawLanes) != 1 || (sawLanes && l.along < 0))
      BRAZE_USER_ERROR("--launch", "")
          << where << ": the record of " << name
          << " needs exactly one of region, groups, parallel= and lanes= (with along=)";
    if ((l.simd && !sawParallel) || (l.along >= 0 && !sawLanes))
      BRAZE_USER_ERROR("--launch", "") << where << ": in the record of " << name
                                       << ", simd goes with parallel= and along= with lanes=";
    return l;
  });
}

} // namespace braze::sched
