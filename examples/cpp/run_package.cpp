// Runs a package written by braze.export, with braze's runtime alone (no Python, no PyTorch, no
// compiler), on the cases a test saved beside it, and compares the outputs with eager's:
//
//   run_package <package dir or .zip archive> <cases file> [repeats]
//
// The cases file (written by examples/export_packages.py) is a list of records:
//   case <name>
//   in <dtype> <rank> <dims>... <raw file>     one per input, in order
//   out <dtype> <rank> <dims>... <raw file>    one per output: eager's result
//   tol <atol> <rtol>
// Raw files hold row-major elements. Each case runs twice: into outputs the runtime allocates
// (Package::run) and into buffers this program owns (Package::runRaw). A CUDA package runs on
// device 0: the inputs are copied there and the outputs back (through braze's runtime, which
// needs only the CUDA driver). With `repeats`, each case then runs that many more times and
// the median time of a run (waiting for the GPU) is printed. Exits 1 on a mismatch.
#include "braze/runtime/CudaModule.h"
#include "braze/runtime/Package.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using braze::runtime::Package;

namespace {

struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

size_t elementBytes(const std::string &dtype) {
  if (dtype == "f64" || dtype == "i64")
    return 8;
  if (dtype == "f32" || dtype == "i32")
    return 4;
  if (dtype == "f16" || dtype == "bf16" || dtype == "i16")
    return 2;
  return 1;
}

double element(const Tensor &t, size_t i) {
  const char *p = t.data.data() + i * elementBytes(t.dtype);
  if (t.dtype == "f16" || t.dtype == "bf16") {
    uint16_t h;
    std::memcpy(&h, p, 2);
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    if (t.dtype == "f16") { // sign, 5-bit exponent, 10-bit mantissa
      uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
      if (exp == 0) // zero or subnormal
        return (sign ? -1.0 : 1.0) * std::ldexp(static_cast<double>(man), -24);
      bits = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    }
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }
  if (t.dtype == "f32") {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  if (t.dtype == "f64") {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  if (t.dtype == "i64") {
    int64_t v;
    std::memcpy(&v, p, 8);
    return static_cast<double>(v);
  }
  if (t.dtype == "i32") {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  return static_cast<unsigned char>(*p);
}

Tensor readTensor(std::istringstream &in, const std::string &dir) {
  Tensor t;
  int rank = 0;
  in >> t.dtype >> rank;
  size_t n = 1;
  for (int i = 0; i < rank; ++i) {
    int64_t d = 0;
    in >> d;
    t.shape.push_back(d);
    n *= static_cast<size_t>(d);
  }
  std::string file;
  in >> file;
  t.data.resize(n * elementBytes(t.dtype));
  std::ifstream f(dir + "/" + file, std::ios::binary);
  if (!f.read(t.data.data(), static_cast<std::streamsize>(t.data.size())))
    throw std::runtime_error("cannot read " + file);
  return t;
}

/// The largest |got - want| beyond atol + rtol |want|, or 0 when all are within it.
double worst(const Tensor &want, const void *got, double atol, double rtol) {
  Tensor g{want.dtype, want.shape, {}};
  g.data.assign(static_cast<const char *>(got),
                static_cast<const char *>(got) + want.data.size());
  double bad = 0;
  for (size_t i = 0; i < want.data.size() / elementBytes(want.dtype); ++i) {
    double a = element(g, i), b = element(want, i);
    double err = std::fabs(a - b);
    if (!(err <= atol + rtol * std::fabs(b)))
      bad = std::max(bad, std::isnan(err) ? INFINITY : err);
  }
  return bad;
}

} // namespace

/// Device copies of host buffers, freed with the object (a CUDA package's inputs and outputs).
struct DeviceCopies {
  std::vector<void *> ptrs;
  ~DeviceCopies() {
    for (void *p : ptrs)
      braze::runtime::cudaRelease(0, p);
  }
  void *add(const std::vector<char> &host, bool copy) {
    ptrs.push_back(braze::runtime::cudaAllocate(0, host.size()));
    if (copy)
      braze::runtime::cudaCopy(0, ptrs.back(), host.data(), host.size(), true);
    return ptrs.back();
  }
};

double millisSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr,
                 "usage: run_package <package dir or .zip archive> <cases file> [repeats]\n");
    return 2;
  }
  const std::string pkgDir = argv[1], casesPath = argv[2];
  const int repeats = argc == 4 ? std::atoi(argv[3]) : 0;
  const std::string casesDir = casesPath.substr(0, casesPath.find_last_of('/'));
  try {
    auto start = std::chrono::steady_clock::now();
    std::shared_ptr<Package> pkg = Package::load(pkgDir);
    double loadMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              start).count();
    braze::runtime::RuntimeFile runtime = braze::runtime::runtimeFile();
    const bool cuda = pkg->device().device_type == kDLCUDA;
    std::printf("%s: loaded in %.1f ms (format %d, %s, %zu inputs, %zu outputs; the runtime is "
                "in %s, %lld bytes)\n",
                pkgDir.c_str(), loadMs, pkg->formatVersion(), cuda ? "CUDA" : "CPU",
                pkg->signature().inputs.size(), pkg->signature().outputs.size(),
                runtime.path.c_str(), static_cast<long long>(runtime.bytes));
    std::ifstream cases(casesPath);
    if (!cases)
      throw std::runtime_error("cannot read " + casesPath);
    std::vector<std::string> lines;
    for (std::string l; std::getline(cases, l);)
      lines.push_back(l);
    if (lines.empty())
      throw std::runtime_error(casesPath + " has no case (a cases directory's file is "
                               "cases.txt)");
    int failures = 0, count = 0;
    for (size_t i = 0; i < lines.size();) {
      std::istringstream head(lines[i++]);
      std::string word, name;
      head >> word >> name;
      if (word != "case")
        throw std::runtime_error("expected 'case' in " + casesPath);
      std::vector<Tensor> ins, outs;
      double atol = 1e-5, rtol = 1e-5;
      for (; i < lines.size() && lines[i].rfind("case ", 0) != 0; ++i) {
        std::istringstream in(lines[i]);
        in >> word;
        if (word == "in")
          ins.push_back(readTensor(in, casesDir));
        else if (word == "out")
          outs.push_back(readTensor(in, casesDir));
        else if (word == "tol")
          in >> atol >> rtol;
      }
      // 1. Outputs the runtime allocates, from DLPack views of the inputs.
      DeviceCopies device;
      std::vector<DLTensor> views(ins.size());
      std::vector<const DLTensor *> ptrs;
      for (size_t k = 0; k < ins.size(); ++k) {
        views[k].data = cuda ? device.add(ins[k].data, true) : ins[k].data.data();
        views[k].device = pkg->device();
        views[k].ndim = static_cast<int32_t>(ins[k].shape.size());
        views[k].dtype = braze::runtime::packageDType(ins[k].dtype);
        views[k].shape = ins[k].shape.data();
        ptrs.push_back(&views[k]);
      }
      auto t0 = std::chrono::steady_clock::now();
      auto got = pkg->run(ptrs);
      if (cuda)
        braze::runtime::cudaSynchronize(0);
      double runMs = millisSince(t0);
      // 2. Into buffers this program owns.
      std::vector<std::vector<char>> mine;
      std::vector<void *> minePtrs;
      std::vector<const void *> inPtrs;
      std::vector<std::vector<int64_t>> inShapes;
      for (size_t k = 0; k < ins.size(); ++k) {
        inPtrs.push_back(views[k].data);
        inShapes.push_back(ins[k].shape);
      }
      for (const Tensor &t : outs) {
        mine.emplace_back(t.data.size());
        minePtrs.push_back(cuda ? device.add(mine.back(), false) : mine.back().data());
      }
      pkg->runRaw(inPtrs, inShapes, minePtrs);
      if (got.size() != outs.size())
        throw std::runtime_error("output count differs from eager's");
      // Steady state: the median of `repeats` runs, each waited for.
      double steadyMs = 0;
      if (repeats > 0) {
        std::vector<double> times;
        for (int r = 0; r < repeats; ++r) {
          auto t1 = std::chrono::steady_clock::now();
          auto again = pkg->run(ptrs);
          if (cuda)
            braze::runtime::cudaSynchronize(0);
          times.push_back(millisSince(t1));
        }
        std::sort(times.begin(), times.end());
        steadyMs = times[times.size() / 2];
      }
      std::vector<std::vector<char>> gotHost(outs.size());
      for (size_t k = 0; k < outs.size() && cuda; ++k) {
        gotHost[k].resize(outs[k].data.size());
        braze::runtime::cudaCopy(0, gotHost[k].data(), got[k]->data(), gotHost[k].size(), false);
        braze::runtime::cudaCopy(0, mine[k].data(), minePtrs[k], mine[k].size(), false);
      }
      bool caseBad = false;
      for (size_t k = 0; k < outs.size(); ++k) {
        if (got[k]->shape() != outs[k].shape)
          throw std::runtime_error(name + ": output " + std::to_string(k) + " has another shape");
        double a = worst(outs[k], cuda ? gotHost[k].data() : got[k]->data(), atol, rtol);
        double b = worst(outs[k], mine[k].data(), atol, rtol);
        ++count;
        if (a > 0 || b > 0) {
          ++failures;
          caseBad = true;
          std::printf("  %s output %zu: MISMATCH (worst error %g, own buffers %g)\n", name.c_str(),
                      k, a, b);
        }
      }
      if (!caseBad && repeats > 0)
        std::printf("  %s: ok (first run %.2f ms, then %.3f ms a run, median of %d)\n",
                    name.c_str(), runMs, steadyMs, repeats);
      else if (!caseBad)
        std::printf("  %s: ok (first run %.2f ms)\n", name.c_str(), runMs);
    }
    if (cuda) {
      braze::runtime::PackageGraphs::Stats g = pkg->cudaGraphStats();
      std::printf("CUDA graphs: %d captured, %lld runs replayed, %lld not%s%s\n", g.captures,
                  static_cast<long long>(g.replays), static_cast<long long>(g.uncaptured),
                  g.off.empty() ? "" : "; none made: ", g.off.c_str());
    }
    if (failures) {
      std::printf("%d of %d outputs differ from eager's\n", failures, count);
      return 1;
    }
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "run_package: %s\n", e.what());
    return 1;
  }
}
