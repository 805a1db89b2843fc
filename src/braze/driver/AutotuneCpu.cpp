// The CPU's autotuner (Autotune.h, autotuneCpu): a tuning module of the chosen kernels' forms
// beside the graph's code, a hook before each kernel, each form checked and timed on the host.
#include "braze/driver/Autotune.h"

#include "braze/driver/AutotuneParts.h"
#include "braze/support/Check.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace braze {

using namespace tune;

namespace {

/// The position hash of braze_tune_fill (kCheckerSource), on the host.
uint32_t positionHash(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

float fromHalfBits(uint16_t h) {
  int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
            : exp == 31 ? (man ? NAN : INFINITY)
                        : std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  return (h & 0x8000) ? -v : v;
}

/// v in [-1, 1) as f16, truncated (scratch data needs no rounding).
uint16_t toHalfBits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  return exp <= 0 ? sign : static_cast<uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3ff));
}

/// What braze_tune_fill writes, on the host: floats in [-1, 1) from a hash of each element's
/// position, bools at random, integers 0.
void fillHost(void *p, size_t bytes, DType t, uint32_t seed) {
  std::memset(p, 0, bytes);
  if (!isFloating(t) && t != DType::Bool)
    return;
  size_t n = bytes / dtypeSize(t);
  char *out = static_cast<char *>(p);
  for (size_t i = 0; i < n; ++i) {
    uint32_t h = positionHash(i, seed);
    float v = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    switch (t) {
    case DType::Float32: std::memcpy(out + 4 * i, &v, 4); break;
    case DType::Float64: { double d = v; std::memcpy(out + 8 * i, &d, 8); break; }
    case DType::Float16: { uint16_t b = toHalfBits(v); std::memcpy(out + 2 * i, &b, 2); break; }
    case DType::BFloat16: {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out + 2 * i, &b, 2);
      break;
    }
    default: out[i] = static_cast<char>(h & 1); break;
    }
  }
}

double hostValue(const char *p, DType t, size_t i) {
  switch (t) {
  case DType::Float32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
  case DType::Float64: { double d; std::memcpy(&d, p + 8 * i, 8); return d; }
  default: {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    if (t == DType::Float16)
      return fromHalfBits(b);
    uint32_t bits = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  }
}

/// braze_tune_compare's rule on the host: "" when `got` holds `want`'s values.
std::string compareHost(const void *got, const void *want, size_t bytes, DType t) {
  if (!isFloating(t))
    return std::memcmp(got, want, bytes) == 0 ? "" : "its values differ";
  const char *a = static_cast<const char *>(got), *b = static_cast<const char *>(want);
  size_t n = bytes / dtypeSize(t);
  const double rtol = relativeTolerance(t);
  double scale = 0;
  for (size_t i = 0; i < n; ++i)
    if (double v = std::abs(hostValue(b, t, i)); std::isfinite(v))
      scale = std::max(scale, v);
  for (size_t i = 0; i < n; ++i) {
    double x = hostValue(a, t, i), y = hostValue(b, t, i);
    bool same = std::isnan(x) ? std::isnan(y) : std::isnan(y) ? false
                : (std::isinf(x) || std::isinf(y)) ? x == y
                : std::abs(x - y) <= rtol * (std::abs(y) + scale);
    if (!same)
      return "element " + std::to_string(i) + " differs";
  }
  return "";
}

using CpuHook = void (*)(int, void *const *, const int64_t *, int *);
using CpuForm = int (*)(int, int, void *const *, const int64_t *, int *);

/// What the tuning module's hook calls (one CPU tuning at a time: autotuneCpu holds a lock).
std::function<void(int, void *const *, const int64_t *, int *)> *gCpuHook = nullptr;
void cpuHook(int kernel, void *const *bufs, const int64_t *syms, int *err) {
  if (gCpuHook)
    (*gCpuHook)(kernel, bufs, syms, err);
}

/// A CPU kernel to tune: its forms, the buffers it writes, what each form took.
struct CpuKernel {
  int index = 0;
  const sched::Kernel *kernel = nullptr;
  std::vector<sched::CpuLaunch> forms;
  int64_t points = 0;
  std::vector<const loop::Buffer *> written;
  std::vector<double> times;
  std::vector<std::string> verdicts;
  int winner = 0;
};

constexpr size_t kMaxCpuForms = 48; ///< forms in one tuning module, over all its kernels
constexpr int kCpuReps = 5;         ///< timed runs of a CPU form; the median counts

double millisecondsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

} // namespace

TuneResult autotuneCpu(
    const sched::Schedule &s, const CompileOptions &opts,
    const std::function<std::shared_ptr<runtime::Executable>(const std::map<
        std::string, std::vector<sched::CpuLaunch>> &)> &compile) {
  static std::mutex one;
  std::lock_guard<std::mutex> lock(one);
  Tuning tuning(opts.autotuneSeconds);
  const Clock::time_point start = tuning.start;
  const double budget = tuning.budget;
  if (!s.program->sizeSymbols().empty()) {
    tuning.log << "not tuned: the graph has symbolic sizes\n";
    return tuning.finish();
  }
  // The kernels with the most points first, while the tuning module's forms stay few.
  std::vector<CpuKernel> kernels;
  for (size_t i = 0; i < s.kernels.size(); ++i) {
    const sched::Kernel &k = s.kernels[i];
    CpuKernel c;
    c.index = static_cast<int>(i);
    c.kernel = &k;
    c.forms = codegen::cpuKernelForms(s, k.name);
    if (c.forms.size() < 2)
      continue;
    c.points = 1;
    for (const auto *vars : {&k.outerVars, &k.innerVars})
      for (sym::SymExpr v : *vars)
        c.points *= v->extent()->isConst() ? v->extent()->value() : 1;
    for (const sched::Step &st : k.steps)
      for (const sched::Member &m : st.members)
        if (s.placement.at(m.comp->out->id).kind != sched::PlacementKind::Local &&
            std::find(c.written.begin(), c.written.end(), m.comp->out) == c.written.end())
          c.written.push_back(m.comp->out);
    kernels.push_back(std::move(c));
  }
  std::stable_sort(kernels.begin(), kernels.end(),
                   [](const CpuKernel &a, const CpuKernel &b) { return a.points > b.points; });
  std::map<std::string, std::vector<sched::CpuLaunch>> tuneForms;
  size_t forms = 0;
  std::vector<CpuKernel> chosen;
  for (CpuKernel &c : kernels) {
    if (forms + c.forms.size() > kMaxCpuForms)
      break;
    forms += c.forms.size();
    tuneForms[c.kernel->name] = c.forms;
    chosen.push_back(std::move(c));
  }
  if (chosen.empty()) {
    tuning.log << "not tuned: no loop kernel has other forms\n";
    return tuning.finish();
  }
  std::shared_ptr<runtime::Executable> exe = compile(tuneForms);
  tuning.log << chosen.size() << " kernels, " << forms << " forms, compiled in "
             << since(start) << " s; budget " << budget << " s\n";
  auto setHook = reinterpret_cast<void (*)(CpuHook)>(exe->symbol("braze_set_tune_hook"));
  auto runForm = reinterpret_cast<CpuForm>(exe->symbol("braze_tune_form"));
  BRAZE_CHECK(setHook && runForm) << "the CPU tuning module lacks its entry points";
  if (since(start) >= budget) {
    tuning.log << "not tuned: compiling the forms took the budget\n";
    return tuning.finish();
  }
  // Scratch inputs and outputs of the graph's sizes.
  IoBytes io = ioBytes(s, *exe);
  if (!io.unknown.empty()) {
    tuning.log << "not tuned: " << io.unknown << "\n";
    return tuning.finish();
  }
  std::vector<std::unique_ptr<Scratch>> owned;
  std::vector<const void *> inputs;
  std::vector<void *> outputs;
  for (const auto &[b, bytes] : io.inputs) {
    owned.push_back(std::make_unique<Scratch>(Scratch::kHost, bytes));
    fillHost(owned.back()->get(), bytes, b->dtype, static_cast<uint32_t>(inputs.size()));
    inputs.push_back(owned.back()->get());
  }
  for (const auto &out : io.outputs) {
    owned.push_back(std::make_unique<Scratch>(Scratch::kHost, out.second));
    outputs.push_back(owned.back()->get());
  }
  const std::vector<int64_t> syms;
  // One run: at each chosen kernel, every form from the kernel's saved state.
  std::map<int, CpuKernel *> at;
  for (CpuKernel &c : chosen)
    at[c.index] = &c;
  std::function<void(int, void *const *, const int64_t *, int *)> hook =
      [&](int index, void *const *bufs, const int64_t *sy, int *err) {
        auto found = at.find(index);
        if (found == at.end() || since(start) >= budget)
          return;
        CpuKernel &c = *found->second;
        at.erase(found);
        std::vector<std::pair<const loop::Buffer *, std::string>> before, planned;
        for (const loop::Buffer *b : c.written) {
          int64_t bytes = spanBytes(b->dtype, b->shape, b->strides);
          if (bytes > 0)
            before.push_back({b, std::string(static_cast<const char *>(bufs[b->id]),
                                             static_cast<size_t>(bytes))});
        }
        auto restore = [&] {
          for (const auto &[b, bytes] : before)
            std::memcpy(bufs[b->id], bytes.data(), bytes.size());
        };
        c.times.assign(c.forms.size(), -1);
        c.verdicts.assign(c.forms.size(), "");
        for (size_t f = 0; f < c.forms.size(); ++f) {
          if (since(start) >= budget) {
            c.verdicts[f] = "not timed: the budget is spent";
            continue;
          }
          restore();
          std::vector<double> samples;
          Clock::time_point t = Clock::now();
          runForm(c.index, static_cast<int>(f), bufs, sy, err);
          samples.push_back(millisecondsSince(t));
          if (f == 0)
            for (const auto &[b, bytes] : before)
              planned.push_back({b, std::string(static_cast<const char *>(bufs[b->id]),
                                                bytes.size())});
          for (size_t i = 0; f > 0 && i < before.size() && c.verdicts[f].empty(); ++i)
            if (std::string why = compareHost(bufs[before[i].first->id], planned[i].second.data(),
                                              planned[i].second.size(), before[i].first->dtype);
                !why.empty())
              c.verdicts[f] = "differs from the planned form: " + why;
          if (!c.verdicts[f].empty())
            continue;
          for (int r = 1; r < kCpuReps; ++r) {
            t = Clock::now();
            runForm(c.index, static_cast<int>(f), bufs, sy, err);
            samples.push_back(millisecondsSince(t));
          }
          c.times[f] = median(samples);
        }
        restore();
      };
  gCpuHook = &hook;
  setHook(&cpuHook);
  {
    Finally clear{[&] {
      setHook(nullptr);
      gCpuHook = nullptr;
    }};
    exe->runBound(inputs, outputs, syms);
  }
  std::ostringstream records;
  for (CpuKernel &c : chosen) {
    if (c.times.empty())
      continue;
    ++tuning.result.functionsTimed;
    c.winner = fastest(c.times);
    tuning.log << c.kernel->name << " (" << c.points << " points):\n";
    for (size_t f = 0; f < c.forms.size(); ++f)
      tuning.log << "  " << (static_cast<int>(f) == c.winner ? "* " : "  ")
                 << sched::cpuLaunchText(c.forms[f], c.kernel->outerVars) << "  "
                 << (c.times[f] >= 0 ? milliseconds(c.times[f]) : c.verdicts[f]) << "\n";
    if (c.winner == 0)
      continue;
    ++tuning.result.functionsChanged;
    records << c.kernel->name << " "
            << sched::cpuLaunchText(c.forms[c.winner], c.kernel->outerVars) << "\n";
  }
  tuning.log << "timed " << tuning.result.functionsTimed << " kernels, "
             << tuning.result.functionsChanged << " changed, in " << since(start) << " s\n";
  tuning.result.records = records.str();
  return tuning.finish();
}

} // namespace braze
