#include "braze/driver/Autotune.h"

#include "braze/jit/CacheFiles.h"
#include "braze/runtime/CublasLt.h"
#include "braze/runtime/CudaModule.h"
#include "braze/runtime/CudaTuning.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>

namespace braze {

namespace {

using Clock = std::chrono::steady_clock;

/// A form wins only where it takes under this fraction of the planned form's time (the noise
/// of one timing is a few percent).
constexpr double kBetter = 0.97;
/// About how long each form's timing takes, in ms.
constexpr double kTimingMs = 20;
/// Bytes written between two timed launches, to take the kernel's operands out of L2.
constexpr size_t kFlushBytes = size_t(128) << 20;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Calls `f` when it goes out of scope (an observer or tuner cleared, however the run ends).
struct Finally {
  std::function<void()> f;
  ~Finally() { f(); }
};

/// The tuner's own memory (scratch inputs, outputs, arena, saved buffers): on CUDA `device`,
/// or on the host (kHost), 64-byte aligned as the generated kernels' own buffers are.
class Scratch {
public:
  static constexpr int kHost = -1;
  Scratch(int device, size_t bytes)
      : device_(device), bytes_(bytes),
        p_(device == kHost ? std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64)
                           : runtime::cudaAllocate(device, bytes)) {
    if (!p_)
      throw std::bad_alloc();
  }
  ~Scratch() { device_ == kHost ? std::free(p_) : runtime::cudaRelease(device_, p_); }
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  void *get() const { return p_; }
  size_t bytes() const { return bytes_; }

private:
  int device_;
  size_t bytes_;
  void *p_;
};

/// Bytes from a buffer's first element to past its last (0 when it has none); -1 when a size
/// or stride is symbolic.
int64_t spanBytes(DType t, const std::vector<sym::SymExpr> &shape,
                  const std::vector<sym::SymExpr> &strides) {
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!shape[i]->isConst() || !strides[i]->isConst())
      return -1;
    if (shape[i]->value() == 0)
      return 0;
    last += (shape[i]->value() - 1) * std::abs(strides[i]->value());
  }
  return (last + 1) * dtypeSize(t);
}

int64_t spanBytes(DType t, const std::vector<int64_t> &shape, const std::vector<int64_t> &strides) {
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0)
      return 0;
    last += (shape[i] - 1) * std::abs(strides[i]);
  }
  return (last + 1) * dtypeSize(t);
}

/// The tuner's device work beside the forms: scratch inputs (floats uniform in [-1, 1) from a
/// hash of their position, bools at random, integers 0: always a valid index), and the check of
/// a form's results: the largest finite magnitude of what the
/// planned form wrote, then the first element where the form's differs from it by more than
/// the dtype's tolerance scaled by that (a sum whose terms cancel may move by an ulp of its
/// terms); nan where nan, infinities equal. Integers and bools compare as bytes.
const char *kCheckerSource = R"CHECK(
typedef unsigned long long u64;
__device__ unsigned braze_hash(u64 i, unsigned seed) {
  u64 x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33;
  return (unsigned)x;
}
template <int K> __device__ double braze_value(const void *p, long long i) {
  if (K == 0) return ((const float *)p)[i];
  if (K == 1) return ((const double *)p)[i];
  unsigned short h = ((const unsigned short *)p)[i];
  if (K == 2) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
  return __uint_as_float(((unsigned)h) << 16);
}
template <int K> __device__ void braze_maxabs(const void *want, long long n, u64 *out) {
  double m = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    double v = fabs(braze_value<K>(want, i));
    if (v <= 1.7976931348623157e308) m = fmax(m, v);
  }
  for (int o = 16; o > 0; o /= 2) m = fmax(m, __shfl_down_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(out, (u64)__double_as_longlong(m));
}
template <int K> __device__ void braze_compare(const void *got, const void *want, long long n,
                                               double rtol, const u64 *scale, u64 *bad) {
  double s = __longlong_as_double((long long)*scale);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    double a = braze_value<K>(got, i), b = braze_value<K>(want, i);
    bool same = (a != a) ? (b != b) : (b != b) ? false
              : (fabs(a) > 1.7976931348623157e308 || fabs(b) > 1.7976931348623157e308) ? a == b
              : fabs(a - b) <= rtol * (fabs(b) + s);
    if (!same) atomicMin(bad, (u64)i);
  }
}
extern "C" __global__ void braze_tune_fill(void *p, long long n, int kind, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned h = braze_hash((u64)i, seed);
    float v = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if (kind == 0) ((float *)p)[i] = v;
    else if (kind == 1) ((double *)p)[i] = v;
    else if (kind == 2) { unsigned short b; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v)); ((unsigned short *)p)[i] = b; }
    else if (kind == 3) ((unsigned short *)p)[i] = (unsigned short)(__float_as_uint(v) >> 16);
    else ((unsigned char *)p)[i] = (unsigned char)(h & 1);
  }
}
extern "C" __global__ void braze_tune_bytes(const unsigned char *g, const unsigned char *w, long long n, u64 *bad) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    if (g[i] != w[i]) atomicMin(bad, (u64)i);
}
)CHECK";

} // namespace

std::string autotuneCheckerSource() {
  std::string s = kCheckerSource;
  for (char k : {'0', '1', '2', '3'})
    s += std::string("extern \"C\" __global__ void braze_tune_maxabs") + k +
         "(const void *w, long long n, u64 *o) { braze_maxabs<" + k + ">(w, n, o); }\n"
         "extern \"C\" __global__ void braze_tune_compare" + k +
         "(const void *g, const void *w, long long n, double r, const u64 *s, u64 *b) {\n"
         "  braze_compare<" + k + ">(g, w, n, r, s, b);\n}\n";
  return s;
}

namespace {

class Checker {
public:
  Checker(int device, const jit::NvrtcOptions &nvrtc)
      : device_(device), set_(device, jit::compileCuda(autotuneCheckerSource(), nvrtc).paths),
        flags_(device, 2 * sizeof(uint64_t)) {}

  /// Fills `bytes` at p (device memory) with scratch values of dtype t.
  void fill(void *p, size_t bytes, DType t, unsigned seed, void *stream) {
    int kind = t == DType::Float32 ? 0 : t == DType::Float64 ? 1 : t == DType::Float16 ? 2
               : t == DType::BFloat16 ? 3 : t == DType::Bool ? 4 : -1;
    if (kind < 0) {
      runtime::cudaFillOn(device_, p, 0, bytes, stream);
      return;
    }
    long long n = static_cast<long long>(bytes / dtypeSize(t));
    int64_t blocks = std::clamp<int64_t>((n + 255) / 256, 1, 4096);
    std::vector<void *> args{&p, &n, &kind, &seed};
    if (std::string why = set_.launch(set_.function("braze_tune_fill"), blocks, 256, args.data(),
                                      stream);
        !why.empty())
      throw runtime::RunError("the autotuner's fill did not launch: " + why);
  }

  /// "" when `got` holds `want`'s values (`bytes` of dtype t, on the device), else the first
  /// element that differs.
  std::string compare(void *got, void *want, size_t bytes, DType t, void *stream) {
    int kind = t == DType::Float32 ? 0 : t == DType::Float64 ? 1 : t == DType::Float16 ? 2
               : t == DType::BFloat16 ? 3 : -1;
    uint64_t init[2] = {0, ~uint64_t(0)}; // the scale's bits (0.0), the first bad element
    runtime::cudaCopy(device_, flags_.get(), init, sizeof(init), true);
    uint64_t *scale = static_cast<uint64_t *>(flags_.get()), *bad = scale + 1;
    long long n = static_cast<long long>(kind < 0 ? bytes : bytes / dtypeSize(t));
    int64_t blocks = std::clamp<int64_t>((n + 255) / 256, 1, 4096);
    auto run = [&](const std::string &name, std::vector<void *> args) {
      if (std::string why = set_.launch(set_.function(name), blocks, 256, args.data(), stream);
          !why.empty())
        throw runtime::RunError("the autotuner's check " + name + " did not launch: " + why);
    };
    if (kind < 0) {
      run("braze_tune_bytes", {&got, &want, &n, &bad});
    } else {
      double rtol = kind == 1 ? 1e-9 : kind == 0 ? 1e-4 : kind == 2 ? 4e-3 : 3e-2;
      std::string k = std::to_string(kind);
      run("braze_tune_maxabs" + k, {&want, &n, &scale});
      run("braze_tune_compare" + k, {&got, &want, &n, &rtol, &scale, &bad});
    }
    uint64_t out[2];
    runtime::cudaSynchronize(device_, stream);
    runtime::cudaCopy(device_, out, flags_.get(), sizeof(out), false);
    return out[1] == ~uint64_t(0) ? "" : "element " + std::to_string(out[1]) + " differs";
  }

private:
  int device_;
  runtime::CudaKernelSet set_;
  Scratch flags_;
};

std::string milliseconds(double ms) {
  std::ostringstream o;
  o.precision(4);
  o << ms * 1000 << " us";
  return o.str();
}

/// One function of the graph to tune: its launches' kernels, the first of which is timed in
/// its forms.
struct Function {
  std::string name;                 ///< the __global__ function (shared by its kernels)
  std::vector<std::string> kernels; ///< schedule kernels launching it, in launch order
  int firstLaunch = -1;             ///< launch index of kernels[0]
  double ms = 0;                    ///< its launches' time in one run (the planned form)
  codegen::CudaKernelForms forms;
  bool rows = false; ///< its kernels have an inner loop (their records say threads)
  std::string key;   ///< of its stored result
  int winner = 0;    ///< the chosen form
  bool stored = false; ///< the choice came from the cache
  std::vector<double> times;        ///< per form, ms; < 0: failed or differs
  std::vector<std::string> verdicts; ///< per form: "" or why it cannot win
};

/// The median time of `launch` over about kTimingMs of launches (5 to 25), each from a cold L2.
double medianMs(const std::function<void()> &launch, double onceMs, const Scratch &flush,
                runtime::CudaTimer &timer, int device, void *stream) {
  int reps = static_cast<int>(std::clamp(kTimingMs / (onceMs + 0.1), 5.0, 25.0));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    runtime::cudaFillOn(device, flush.get(), static_cast<unsigned char>(r), flush.bytes(), stream);
    timer.start(stream);
    launch();
    timer.stop(stream);
    samples.push_back(timer.milliseconds());
  }
  std::nth_element(samples.begin(), samples.begin() + reps / 2, samples.end());
  return samples[reps / 2];
}

DType dtypeOf(runtime::GemmDType t) {
  switch (t) {
  case runtime::GemmDType::Float64: return DType::Float64;
  case runtime::GemmDType::Float16: return DType::Float16;
  case runtime::GemmDType::BFloat16: return DType::BFloat16;
  default: return DType::Float32;
  }
}

/// Runs product `t` in each algorithm the heuristics offered, checks each result against the
/// first's and times it: the algorithm to keep.
int tuneGemm(const runtime::GemmTuning &t, Checker &checker, const Scratch &flush, int device,
             std::ostream &log) {
  Scratch planned(device, std::max<size_t>(t.cBytes, 1));
  runtime::CudaTimer timer(device);
  std::vector<double> times(t.algorithms, -1);
  std::vector<std::string> verdicts(t.algorithms);
  for (int i = 0; i < t.algorithms; ++i) {
    if (std::string why = t.run(i); !why.empty()) {
      verdicts[i] = "does not run: " + why;
      continue;
    }
    if (i == 0)
      runtime::cudaCopyOn(device, planned.get(), t.c, t.cBytes, t.stream);
    else if (std::string why = checker.compare(t.c, planned.get(), t.cBytes, dtypeOf(t.cDtype),
                                               t.stream);
             !why.empty()) {
      verdicts[i] = "differs from the heuristics' choice: " + why;
      continue;
    }
    double once = i == 0 ? 1.0 : times[0];
    times[i] = medianMs([&] { t.run(i); }, once, flush, timer, device, t.stream);
  }
  int best = 0;
  for (int i = 1; i < t.algorithms; ++i)
    if (times[i] >= 0 && times[0] > 0 && times[i] < kBetter * times[0] &&
        (best == 0 || times[i] < times[best]))
      best = i;
  log << t.key << ":\n";
  for (int i = 0; i < t.algorithms; ++i)
    log << "  " << (i == best ? "* " : "  ") << "algorithm " << i << "  "
        << (times[i] >= 0 ? milliseconds(times[i]) : verdicts[i]) << "\n";
  return best;
}

/// Times every form of `f` at its launch with arguments `args` on `stream`, from the state
/// its written buffers have now, which they have again afterwards.
void timeForms(Function &f, const runtime::CudaKernelSet &set, Checker &checker,
               const Scratch &flush, int device, void **args, void *stream) {
  const size_t n = f.forms.forms.size();
  f.times.assign(n, -1);
  f.verdicts.assign(n, "");
  struct Saved {
    void *at;
    size_t bytes;
    DType dtype;
    std::unique_ptr<Scratch> before, planned; ///< the state before, what the planned form wrote
  };
  std::vector<Saved> saved;
  for (size_t i = 0; i < f.forms.buffers.size(); ++i) {
    if (!f.forms.written[i])
      continue;
    const loop::Buffer *b = f.forms.buffers[i];
    int64_t bytes = spanBytes(b->dtype, b->shape, b->strides);
    if (bytes <= 0)
      continue;
    size_t size = static_cast<size_t>(bytes);
    Saved s{*static_cast<void **>(args[i]), size, b->dtype, std::make_unique<Scratch>(device, size),
            std::make_unique<Scratch>(device, size)};
    runtime::cudaCopyOn(device, s.before->get(), s.at, s.bytes, stream);
    saved.push_back(std::move(s));
  }
  auto restore = [&] {
    for (Saved &s : saved)
      runtime::cudaCopyOn(device, s.at, s.before->get(), s.bytes, stream);
  };
  runtime::CudaTimer timer(device);
  for (size_t i = 0; i < n; ++i) {
    const codegen::CudaKernelForm &form = f.forms.forms[i];
    void *fn = set.function(form.name);
    restore();
    if (std::string why = set.launch(fn, form.blocks, form.threads, args, stream); !why.empty()) {
      f.verdicts[i] = "does not launch: " + why;
      continue;
    }
    for (Saved &s : saved) {
      if (i == 0)
        runtime::cudaCopyOn(device, s.planned->get(), s.at, s.bytes, stream);
      else if (std::string why = checker.compare(s.at, s.planned->get(), s.bytes, s.dtype, stream);
               !why.empty() && f.verdicts[i].empty())
        f.verdicts[i] = "differs from the planned form: " + why;
    }
    if (!f.verdicts[i].empty())
      continue;
    // Each launch from a cold L2 (the flush buffer written first: a kernel's operands in the
    // graph's run were mostly written long before), timed alone; the median of them.
    double once = f.ms / std::max<size_t>(1, f.kernels.size());
    double best = medianMs([&] { set.launch(fn, form.blocks, form.threads, args, stream); },
                           once, flush, timer, device, stream);
    f.times[i] = best;
  }
  restore();
}

/// The key of f's stored result: its forms' functions (named alike) and the target.
std::string resultKey(const Function &f, const sched::Schedule &s) {
  std::string text = "autotune\n" + s.target.fingerprint() + "\n" + jit::kBrazeVersion + "\n";
  for (const codegen::CudaKernelForm &form : f.forms.forms) {
    std::string body = form.function;
    for (size_t at = body.find(form.name); at != std::string::npos; at = body.find(form.name, at))
      body.replace(at, form.name.size(), "form");
    text += body + "\n";
  }
  return sha256Hex(text);
}

const sched::Kernel &kernelNamed(const sched::Schedule &s, const std::string &name) {
  for (const sched::Kernel &k : s.kernels)
    if (k.name == name)
      return k;
  BRAZE_CHECK(false) << "no kernel " << name;
  return s.kernels.front();
}

/// One tuning's clock, budget and log, and the result it returns.
struct Tuning {
  explicit Tuning(double seconds) : budget(seconds) {}
  TuneResult result;
  const Clock::time_point start = Clock::now();
  const double budget;
  std::ostringstream log;
  TuneResult finish() {
    result.seconds = since(start);
    result.log = log.str();
    return result;
  }
};

/// The bytes of a graph's inputs and outputs as the caller lays them out, or why they are not
/// known (symbolic sizes).
struct IoBytes {
  std::vector<std::pair<const loop::Buffer *, size_t>> inputs, outputs;
  std::string unknown;
};

IoBytes ioBytes(const sched::Schedule &s, runtime::Executable &exe) {
  IoBytes io;
  if (!s.program->sizeSymbols().empty()) {
    io.unknown = "the graph has symbolic sizes";
    return io;
  }
  for (const loop::Buffer *b : s.program->inputs()) {
    int64_t bytes = spanBytes(b->dtype, b->seenShape(), b->seenStrides());
    if (bytes < 0) {
      io.unknown = "input " + b->name + " has a symbolic layout";
      return io;
    }
    io.inputs.push_back({b, static_cast<size_t>(bytes)});
  }
  std::vector<runtime::Executable::Layout> layouts = exe.layoutsFor({});
  const std::vector<loop::Buffer *> outs = s.program->outputs();
  for (size_t i = 0; i < layouts.size(); ++i)
    io.outputs.push_back({outs.at(i), static_cast<size_t>(std::max<int64_t>(
                                          spanBytes(outs.at(i)->dtype, layouts[i].shape,
                                                    layouts[i].strides), 1))});
  return io;
}

} // namespace

TuneResult autotuneCuda(const sched::Schedule &s, const codegen::CudaGeneratedSource &source,
                        runtime::Executable &exe, const CompileOptions &opts,
                        const jit::NvrtcOptions &nvrtc) {
  Tuning tuning(opts.autotuneSeconds);
  const Clock::time_point start = tuning.start;
  const double budget = tuning.budget;
  if (!runtime::cudaTimingAvailable()) {
    tuning.log << "not tuned: the CUDA driver lacks event timing\n";
    return tuning.finish();
  }
  IoBytes io = ioBytes(s, exe);
  if (!io.unknown.empty()) {
    tuning.log << "not tuned: " << io.unknown << "\n";
    return tuning.finish();
  }
  const int device = opts.cuda->device;
  // Scratch inputs of the graph's sizes, its outputs and its arena.
  Checker checker(device, nvrtc);
  std::vector<std::unique_ptr<Scratch>> owned;
  std::vector<const void *> inputs;
  std::vector<void *> outputs;
  for (const auto &[b, bytes] : io.inputs) {
    owned.push_back(std::make_unique<Scratch>(device, std::max<size_t>(bytes, 1)));
    checker.fill(owned.back()->get(), bytes, b->dtype, static_cast<unsigned>(inputs.size()),
                 nullptr);
    inputs.push_back(owned.back()->get());
  }
  const std::vector<int64_t> syms;
  for (const auto &out : io.outputs) {
    owned.push_back(std::make_unique<Scratch>(device, out.second));
    outputs.push_back(owned.back()->get());
  }
  owned.push_back(std::make_unique<Scratch>(
      device, static_cast<size_t>(std::max<int64_t>(exe.arenaBytes(syms), 1))));
  void *arena = owned.back()->get();
  void *stream = nullptr;
  auto runGraph = [&] {
    exe.runCuda(inputs, outputs, arena, syms, stream);
    runtime::cudaSynchronize(device, stream);
  };
  // One run with `observer` watching the launches.
  auto runObserved = [&](std::function<void(int, int64_t, int, void **, void *, bool)> observer) {
    exe.setLaunchObserver(std::move(observer));
    Finally clear{[&] { exe.setLaunchObserver(nullptr); }};
    runGraph();
  };

  // The planned forms' times, per launch.
  std::map<int, std::string> kernelAt; // launch index -> schedule kernel
  for (const auto &[kernel, index] : source.loopLaunches)
    kernelAt[index] = kernel;
  std::map<int, double> launchMs;
  {
    std::map<int, std::unique_ptr<runtime::CudaTimer>> timers;
    runGraph(); // warm: deferred kernels load, libraries plan
    runObserved([&](int kernel, int64_t, int, void **, void *st, bool after) {
      if (!kernelAt.count(kernel))
        return;
      std::unique_ptr<runtime::CudaTimer> &t = timers[kernel];
      if (!t)
        t = std::make_unique<runtime::CudaTimer>(device);
      after ? t->stop(st) : t->start(st);
    });
    for (auto &[kernel, t] : timers)
      launchMs[kernel] = t->milliseconds();
  }

  // The functions, by the time their launches take.
  std::map<std::string, Function> byName;
  for (const auto &[index, kernel] : kernelAt) {
    const std::string &fn = source.kernels.at(index);
    Function &f = byName[fn];
    f.name = fn;
    if (f.kernels.empty())
      f.firstLaunch = index;
    f.kernels.push_back(kernel);
    f.ms += launchMs.count(index) ? launchMs[index] : 0;
  }
  std::vector<Function *> ranked;
  double total = 0;
  for (auto &[name, f] : byName) {
    ranked.push_back(&f);
    total += f.ms;
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const Function *a, const Function *b) { return a->ms > b->ms; });
  tuning.log << byName.size() << " loop kernel functions, " << milliseconds(total)
      << " a run; budget " << budget << " s\n";

  // Stored results first; the others in batches while the budget lasts.
  const std::filesystem::path store =
      std::filesystem::path(nvrtc.cacheDir.empty() ? jit::scratchDir().string() : nvrtc.cacheDir) /
      "autotune";
  std::vector<Function *> pending, done;
  for (Function *f : ranked) {
    if (f->ms < 0.01 * total || f->ms < 2e-3) // under 1% of the run, or 2 us
      break;
    f->forms = codegen::cudaKernelForms(s, f->kernels.front(), f->name + "_form");
    if (f->forms.forms.size() < 2)
      continue;
    f->rows = !kernelNamed(s, f->kernels.front()).innerVars.empty();
    f->key = resultKey(*f, s);
    const std::string stored = jit::readFile(store / f->key);
    for (size_t i = 0; i < f->forms.forms.size() && !stored.empty(); ++i)
      if (sched::launchText(f->forms.forms[i].launch, f->rows) == stored)
        f->winner = static_cast<int>(i), f->stored = true;
    (f->stored ? done : pending).push_back(f);
  }
  Scratch flush(device, kFlushBytes);
  // The matrix products, in one run of the graph.
  std::ostringstream gemms;
  if (source.usesGemm && !opts.cuda->cublasLtLibrary.empty()) {
    runtime::CublasLt &lt = runtime::CublasLt::load(opts.cuda->cublasLtLibrary);
    lt.setTuner([&](const runtime::GemmTuning &t) -> int {
      if (since(start) > budget)
        return 0;
      int chosen = tuneGemm(t, checker, flush, device, gemms);
      tuning.result.gemmChoices.push_back({t.key, chosen});
      return chosen;
    });
    Finally clear{[&] { lt.setTuner(nullptr); }};
    runGraph();
  }
  double perFunction = 0; // seconds one function's forms took, compiled and timed
  std::ostringstream batches;
  size_t next = 0;
  while (next < pending.size()) {
    double left = budget - since(start);
    size_t batch = perFunction > 0 ? static_cast<size_t>(left / perFunction) : 2;
    batch = std::min<size_t>({batch, 16, pending.size() - next});
    if (batch == 0 || left <= 0)
      break;
    const Clock::time_point batchStart = Clock::now();
    std::string functions;
    std::map<int, Function *> at; // first launch -> function
    for (size_t i = next; i < next + batch; ++i) {
      for (const codegen::CudaKernelForm &form : pending[i]->forms.forms)
        functions += form.function;
      at[pending[i]->firstLaunch] = pending[i];
    }
    next += batch;
    jit::CompiledCubin cubin = jit::compileCuda(codegen::cudaProgram(functions), nvrtc);
    runtime::CudaKernelSet set(device, cubin.paths);
    const double compiled = since(batchStart);
    runObserved([&](int kernel, int64_t, int, void **args, void *st, bool after) {
      auto f = at.find(kernel);
      if (after || f == at.end())
        return;
      timeForms(*f->second, set, checker, flush, device, args, st);
      done.push_back(f->second);
      at.erase(f);
    });
    perFunction = since(batchStart) / static_cast<double>(batch);
    batches << "  " << batch << " function" << (batch > 1 ? "s" : "") << ": forms compiled in "
            << compiled << " s, timed in " << since(batchStart) - compiled << " s\n";
  }
  try { // a form's index check on scratch data is no error of the user's next call
    exe.synchronizeAndCheck(stream);
  } catch (const runtime::RunError &) {
  }

  // The winners, stored for the next compile of these functions.
  std::error_code ec;
  std::filesystem::create_directories(store, ec);
  std::ostringstream records;
  for (Function *f : done) {
    ++(f->stored ? tuning.result.functionsCached : tuning.result.functionsTimed);
    const double planned = f->times.empty() ? -1 : f->times[0];
    for (size_t i = 1; i < f->times.size(); ++i)
      if (f->times[i] >= 0 && planned > 0 && f->times[i] < kBetter * planned &&
          (f->winner == 0 || f->times[i] < f->times[f->winner]))
        f->winner = static_cast<int>(i);
    tuning.log << f->name << " (" << f->kernels.size() << " launch" << (f->kernels.size() > 1 ? "es" : "")
        << ", " << milliseconds(f->ms) << " a run)" << (f->stored ? ": stored choice\n" : ":\n");
    for (size_t i = 0; i < f->forms.forms.size(); ++i) {
      if (f->stored && static_cast<int>(i) != f->winner)
        continue;
      tuning.log << "  " << (static_cast<int>(i) == f->winner ? "* " : "  ")
          << sched::launchText(f->forms.forms[i].launch, f->rows);
      if (!f->stored)
        tuning.log << "  " << (f->times[i] >= 0 ? milliseconds(f->times[i]) : f->verdicts[i]);
      tuning.log << "\n";
    }
    const std::string text = sched::launchText(f->forms.forms[f->winner].launch, f->rows);
    if (!f->stored && !ec)
      jit::writeFileAtomically(store / f->key, text);
    if (f->winner == 0)
      continue;
    ++tuning.result.functionsChanged;
    for (const std::string &kernel : f->kernels)
      records << kernel << " " << text << "\n";
  }
  int gemmsChanged = 0;
  for (const auto &choice : tuning.result.gemmChoices)
    gemmsChanged += choice.second != 0;
  tuning.log << "matrix products:\n" << gemms.str() << "batches:\n" << batches.str() << "timed " << tuning.result.functionsTimed << " functions ("
      << tuning.result.functionsCached << " more stored), " << tuning.result.functionsChanged
      << " changed; " << tuning.result.gemmChoices.size() << " matrix products, " << gemmsChanged
      << " changed; in " << since(start) << " s\n";
  tuning.result.records = records.str();
  return tuning.finish();
}

} // namespace braze

// ---- The CPU ----------------------------------------------------------------------------------

namespace braze {

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
  double rtol = t == DType::Float64 ? 1e-9 : t == DType::Float32 ? 1e-4
                : t == DType::Float16 ? 4e-3 : 3e-2;
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
  tuning.log << chosen.size() << " kernels, " << forms << " forms, compiled in " << since(start)
      << " s; budget " << budget << " s\n";
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
          std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
          c.times[f] = samples[samples.size() / 2];
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
    for (size_t f = 1; f < c.times.size(); ++f)
      if (c.times[f] >= 0 && c.times[0] > 0 && c.times[f] < kBetter * c.times[0] &&
          (c.winner == 0 || c.times[f] < c.times[c.winner]))
        c.winner = static_cast<int>(f);
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
  tuning.log << "timed " << tuning.result.functionsTimed << " kernels, " << tuning.result.functionsChanged
      << " changed, in " << since(start) << " s\n";
  tuning.result.records = records.str();
  return tuning.finish();
}

} // namespace braze
