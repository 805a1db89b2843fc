#include "braze/driver/Autotune.h"

#include "braze/driver/AutotuneParts.h"
#include "braze/jit/CacheFiles.h"
#include "braze/runtime/CublasLt.h"
#include "braze/runtime/Cudnn.h"
#include "braze/runtime/CudaModule.h"
#include "braze/runtime/CudaTuning.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <sstream>
#include <string_view>

namespace braze {

using namespace tune;

namespace {

/// About how long each form's timing takes, in ms.
constexpr double kTimingMs = 20;
/// Bytes written between two timed launches, to take the kernel's operands out of L2.
constexpr size_t kFlushBytes = size_t(128) << 20;

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
  /// `cubins`: autotuneCheckerSource() compiled.
  Checker(int device, const std::vector<std::string> &cubins)
      : device_(device), set_(device, cubins), flags_(device, 2 * sizeof(uint64_t)) {}

  /// The check kernels' number for float dtype t (their K), or -1 for any other.
  static int floatKind(DType t) {
    return t == DType::Float32 ? 0 : t == DType::Float64 ? 1 : t == DType::Float16 ? 2
           : t == DType::BFloat16 ? 3 : -1;
  }

  /// Fills `bytes` at p (device memory) with scratch values of dtype t.
  void fill(void *p, size_t bytes, DType t, unsigned seed, void *stream) {
    int kind = t == DType::Bool ? 4 : floatKind(t);
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
    int kind = floatKind(t);
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
      double rtol = relativeTolerance(t);
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
  return median(samples);
}

/// What no form of a kernel can beat: the GPU time of the smallest launch (a 4-byte memset,
/// timed as forms are), and the memory's theoretical bandwidth (0: not known).
struct Bounds {
  double floorMs = 0;
  double bytesPerMs = 0;
};

Bounds measureBounds(const Scratch &flush, int device, void *stream) {
  runtime::CudaTimer timer(device);
  Scratch word(device, 4);
  Bounds b;
  b.floorMs = medianMs([&] { runtime::cudaFillOn(device, word.get(), 0, 4, stream); }, 0.0,
                       flush, timer, device, stream);
  b.bytesPerMs = runtime::cudaPeakBandwidth(device) / 1e3;
  return b;
}

/// Why no form of f can gain enough to be worth its compile and timing, or "". One launch of
/// its planned form (its GPU time from a cold L2, as forms are timed) either
/// - takes under kLaunchBound times the launch floor, or under a microsecond more:
///   launch-bound, where forms differ by fractions of a microsecond. H200 (floor 2.0-2.1 us),
///   with every function's forms timed (BRAZE_AUTOTUNE_NEAR_BOUND=1) over the kernel suite and
///   five models: the best forms of the 7 functions under 2.5 floors (3.6-4.7 us) gained 0.16 us
///   once and nothing six times; above it, gains of 0.2-0.7 us start (5.2 us: 0.22 us; 6.5 us:
///   0.26 us), and one function's forms cost 0.25-0.84 s of NVRTC; or
/// - moves its buffers' bytes at kAtBandwidth of the theoretical bandwidth or more: about 90%
///   of what a copy reaches (H200: a copy 4.2-4.3 of 4.8 TB/s; the best forms of three kernels
///   at 0.86-0.88 of it gained nothing). A rate above the theoretical means the launch reads
///   less than its buffers' spans (a gather's table, say): no bound is known then.
constexpr double kLaunchBound = 2.5;
constexpr double kAtBandwidth = 0.8;

/// BRAZE_AUTOTUNE_NEAR_BOUND=1 times the functions near their bound too (the log still says
/// why each is near it): how the rule above is measured against what their forms gain.
bool tuneNearBound() {
  const char *v = std::getenv("BRAZE_AUTOTUNE_NEAR_BOUND");
  return v && std::string_view(v) == "1";
}

/// BRAZE_AUTOTUNE_ATTENTION=1 times each cuDNN attention (forward and backward) in every engine
/// its heuristics offer. Not by default: on an H200 (cuDNN 9.19) they offered two engines for
/// each of four problems of the GPU suite and models (a causal forward with 16 heads, one with
/// 16 query and 4 key heads, a backward, a forward with a bias at sequence 1024), the first
/// was the faster every time, by 1.36-2.65x, and planning the second cost the masked attention's
/// graph 0.75 s, with 0.27 s more for the checker's compile (tuning 1.03 s against 0.004 s).
bool tuneAttentions() {
  const char *v = std::getenv("BRAZE_AUTOTUNE_ATTENTION");
  return v && std::string_view(v) == "1";
}

std::string nearItsBound(const Function &f, const Bounds &b) {
  const double once = f.ms / static_cast<double>(std::max<size_t>(1, f.kernels.size()));
  if (once < kLaunchBound * b.floorMs || once < b.floorMs + 1e-3)
    return "a launch takes " + milliseconds(once) + ", launch-bound (the floor is " +
           milliseconds(b.floorMs) + ")";
  double bytes = 0;
  for (const loop::Buffer *buf : f.forms.buffers)
    bytes += static_cast<double>(
        std::max<int64_t>(0, spanBytes(buf->dtype, buf->shape, buf->strides)));
  const double share = b.bytesPerMs > 0 ? bytes / once / b.bytesPerMs : 0;
  if (share >= kAtBandwidth && share <= 1.05) {
    std::ostringstream o;
    o.precision(3);
    o << "moves " << bytes / 1e6 << " MB a launch in " << milliseconds(once) << ", at "
      << share << " of the theoretical bandwidth";
    return o.str();
  }
  return "";
}

/// The dtype of a library result's kind (LibraryResult::kind).
DType dtypeOfKind(int kind) {
  static const DType kinds[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};
  return kinds[kind];
}

/// Runs library call `t` with each choice its heuristics offered (`what`: "algorithm",
/// "engine"), checks each of its results against the first choice's and times it: the choice
/// to keep.
int tuneLibrary(const runtime::LibraryTuning &t, const char *what, Checker &checker,
                const Scratch &flush, int device, std::ostream &log) {
  std::vector<std::unique_ptr<Scratch>> planned;
  for (const runtime::LibraryResult &r : t.results)
    planned.push_back(std::make_unique<Scratch>(device, std::max<size_t>(r.bytes, 1)));
  runtime::CudaTimer timer(device);
  std::vector<double> times(t.choices, -1);
  std::vector<std::string> verdicts(t.choices);
  for (int i = 0; i < t.choices; ++i) {
    if (std::string why = t.run(i); !why.empty()) {
      verdicts[i] = "does not run: " + why;
      continue;
    }
    for (size_t j = 0; j < t.results.size() && verdicts[i].empty(); ++j) {
      const runtime::LibraryResult &r = t.results[j];
      if (i == 0)
        runtime::cudaCopyOn(device, planned[j]->get(), r.at, r.bytes, t.stream);
      else if (std::string why = checker.compare(r.at, planned[j]->get(), r.bytes,
                                                 dtypeOfKind(r.kind), t.stream);
               !why.empty())
        verdicts[i] = "differs from the heuristics' choice" +
                      (t.results.size() > 1 ? " in result " + std::to_string(j) : "") + ": " +
                      why;
    }
    if (!verdicts[i].empty())
      continue;
    double once = i == 0 ? 1.0 : times[0];
    times[i] = medianMs([&] { t.run(i); }, once, flush, timer, device, t.stream);
  }
  const int best = fastest(times);
  log << t.key << ":\n";
  for (int i = 0; i < t.choices; ++i)
    log << "  " << (i == best ? "* " : "  ") << what << " " << i << "  "
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
  // Scratch inputs of the graph's sizes, its outputs and its arena. Until something is to be
  // checked, the inputs' floats hold one value in (0, 1) as the varied values are (bytes 0x38:
  // 4.4e-5 in float32 and bfloat16, 0.53 in float16) and the rest zeros, which is all the
  // planned forms' timing needs. The checker's module (an NVRTC compile into an empty cache)
  // is built, and the inputs filled with varied values, only when a form or a library choice
  // is to be checked.
  std::vector<std::unique_ptr<Scratch>> owned;
  std::vector<const void *> inputs;
  std::vector<void *> outputs;
  for (const auto &[b, bytes] : io.inputs) {
    owned.push_back(std::make_unique<Scratch>(device, std::max<size_t>(bytes, 1)));
    const bool real = Checker::floatKind(b->dtype) >= 0;
    runtime::cudaFillOn(device, owned.back()->get(), real ? 0x38 : 0, bytes, nullptr);
    inputs.push_back(owned.back()->get());
  }
  // Its compile starts on a thread of its own once a check is sure to come, beside the forms'
  // compile (NVRTC compiles programs on several threads at once: on the H200's host, 10
  // one-kernel programs took 0.28 s on 10 threads and 0.7-1.0 s one after another).
  std::unique_ptr<Checker> made;
  std::future<jit::CompiledCubin> checkerCubin;
  auto startChecker = [&] {
    if (!made && !checkerCubin.valid())
      checkerCubin = std::async(std::launch::async, [&nvrtc] {
        return jit::compileCuda(autotuneCheckerSource(), nvrtc);
      });
  };
  auto checker = [&]() -> Checker & {
    if (made)
      return *made;
    const Clock::time_point built = Clock::now();
    startChecker();
    made = std::make_unique<Checker>(device, checkerCubin.get().paths);
    for (size_t i = 0; i < io.inputs.size(); ++i)
      made->fill(owned[i]->get(), io.inputs[i].second, io.inputs[i].first->dtype,
                 static_cast<unsigned>(i), nullptr);
    runtime::cudaSynchronize(device, nullptr);
    tuning.log << "checker ready and inputs filled in " << since(built) << " s\n";
    return *made;
  };
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

  // The planned forms' times, per launch: GPU time from a cold L2, as forms are timed (the
  // flush before each launch keeps the device busy while the host launches it).
  std::map<int, std::string> kernelAt; // launch index -> schedule kernel
  for (const auto &[kernel, index] : source.loopLaunches)
    kernelAt[index] = kernel;
  std::map<int, double> launchMs;
  Scratch flush(device, kFlushBytes);
  {
    // The median of three runs: one launch's time right after the flush can be several times
    // its usual (H200: 10.6 us once for a launch whose median is 4.0).
    std::map<int, std::unique_ptr<runtime::CudaTimer>> timers;
    std::map<int, std::vector<double>> samples;
    runGraph(); // warm: deferred kernels load, libraries plan
    for (int run = 0; run < 3; ++run) {
      runObserved([&](int kernel, int64_t, int, void **, void *st, bool after) {
        if (!kernelAt.count(kernel))
          return;
        std::unique_ptr<runtime::CudaTimer> &t = timers[kernel];
        if (!t)
          t = std::make_unique<runtime::CudaTimer>(device);
        if (!after)
          runtime::cudaFillOn(device, flush.get(), 0, flush.bytes(), st);
        after ? t->stop(st) : t->start(st);
      });
      for (auto &[kernel, t] : timers)
        samples[kernel].push_back(t->milliseconds());
    }
    for (auto &[kernel, times] : samples)
      launchMs[kernel] = median(times);
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
             << " a run (each launch from a cold L2); budget " << budget << " s\n";

  // Stored results first; the others, unless near their bound, in batches while the budget
  // lasts.
  const Bounds bounds = measureBounds(flush, device, stream);
  tuning.log << "launch floor " << milliseconds(bounds.floorMs) << ", theoretical bandwidth "
             << (bounds.bytesPerMs > 0 ? std::to_string(int(bounds.bytesPerMs / 1e6)) + " GB/s"
                                       : std::string("unknown"))
             << "\n";
  std::ostringstream near;
  const std::filesystem::path store =
      std::filesystem::path(nvrtc.cacheDir.empty() ? jit::scratchDir().string() : nvrtc.cacheDir) /
      "autotune";
  std::vector<Function *> pending, done;
  const bool anyway = tuneNearBound();
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
    if (std::string why = f->stored ? "" : nearItsBound(*f, bounds); !why.empty()) {
      near << "  " << f->name << ": " << why << (anyway ? " (timed anyway)" : "") << "\n";
      if (!anyway)
        continue;
    }
    (f->stored ? done : pending).push_back(f);
  }
  // The matrix products, the convolutions and the fused attentions, in one run of the graph.
  std::ostringstream gemmLog, convLog, attentionLog;
  {
    runtime::CublasLt *lt = source.usesGemm && !opts.cuda->cublasLtLibrary.empty()
                                ? &runtime::CublasLt::load(opts.cuda->cublasLtLibrary)
                                : nullptr;
    const bool attentions = tuneAttentions();
    const bool dnnCalls = std::any_of(s.kernels.begin(), s.kernels.end(), [&](const sched::Kernel &k) {
      return k.conv() || (attentions && k.attention());
    });
    runtime::Cudnn *dnn = source.usesCudnn && dnnCalls && !opts.cuda->cudnnLibrary.empty()
                              ? &runtime::Cudnn::load(opts.cuda->cudnnLibrary)
                              : nullptr;
    auto tuner = [&](const char *what) {
      return [&, what](const runtime::LibraryTuning &t) -> int {
        if (since(start) > budget)
          return 0;
        using runtime::LibraryKind;
        TuneResult &r = tuning.result;
        // Where each kind's log and counts go.
        struct Slot {
          std::ostream *log;
          int *timed, *changed;
        };
        const Slot slot = t.kind == LibraryKind::Gemm ? Slot{&gemmLog, &r.gemms, &r.gemmsChanged}
                          : t.kind == LibraryKind::Convolution
                              ? Slot{&convLog, &r.convolutions, &r.convolutionsChanged}
                              : Slot{&attentionLog, &r.attentions, &r.attentionsChanged};
        std::ostream &log = *slot.log;
        const int chosen = tuneLibrary(t, what, checker(), flush, device, log);
        ++*slot.timed;
        *slot.changed += chosen != 0;
        const int64_t id = t.ids.empty() ? chosen : t.ids.at(size_t(chosen));
        if (id >= 0)
          r.libraryChoices.push_back({t.kind, t.key, id});
        else
          log << "  (no engine index: the choice is not stored)\n";
        return chosen;
      };
    };
    if (lt)
      lt->setTuner(tuner("algorithm"));
    if (dnn)
      dnn->setTuner(tuner("engine"), [&] { return since(start) <= budget; }, attentions);
    Finally clear{[&] {
      if (lt)
        lt->setTuner(nullptr);
      if (dnn)
        dnn->setTuner(nullptr);
    }};
    if (lt || dnn) {
      checker(); // before the run: the library calls are checked on its varied inputs
      runGraph();
    }
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
    startChecker();
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
    Checker &check = checker(); // waits for its compile, said in its own line
    runObserved([&](int kernel, int64_t, int, void **args, void *st, bool after) {
      auto f = at.find(kernel);
      if (after || f == at.end())
        return;
      timeForms(*f->second, set, check, flush, device, args, st);
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
    if (!f->stored)
      f->winner = fastest(f->times);
    tuning.log << f->name << " (" << f->kernels.size() << " launch"
               << (f->kernels.size() > 1 ? "es" : "") << ", " << milliseconds(f->ms) << " a run)"
               << (f->stored ? ": stored choice\n" : ":\n");
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
  const TuneResult &r = tuning.result;
  tuning.log << "not tuned, near their bound:\n" << near.str() << "matrix products:\n"
             << gemmLog.str() << "convolutions:\n" << convLog.str() << "attentions:\n"
             << attentionLog.str() << "batches:\n"
             << batches.str() << "timed " << r.functionsTimed << " functions ("
             << r.functionsCached << " more stored), " << r.functionsChanged << " changed; "
             << r.gemms << " matrix products, " << r.gemmsChanged << " changed; "
             << r.convolutions << " convolutions, " << r.convolutionsChanged << " changed; "
             << r.attentions << " attentions, " << r.attentionsChanged << " changed; in "
             << since(start) << " s\n";
  tuning.result.records = records.str();
  return tuning.finish();
}

} // namespace braze
