#include "braze/runtime/Package.h"

#include "braze/runtime/CudaModule.h"
#include "braze/runtime/Files.h"
#include "braze/runtime/PackageArchive.h"
#include "braze/runtime/Safetensors.h"
#include "braze/support/Hashing.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace braze::runtime {

namespace {

bool sameType(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

std::string typeName(DLDataType t) {
  for (const DTypeNames &d : dtypeNames())
    if (sameType(d.type, t))
      return d.package;
  return "code " + std::to_string(t.code) + " bits " + std::to_string(t.bits);
}

/// The whole file, or nothing when it cannot be read.
std::vector<std::string> words(const std::string &line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;)
    out.push_back(w);
  return out;
}

int64_t number(const std::string &w, const std::string &what) {
  char *end = nullptr;
  errno = 0;
  long long v = std::strtoll(w.c_str(), &end, 10);
  if (w.empty() || *end != '\0' || errno != 0)
    throw RunError("a malformed " + what + ": '" + w + "'");
  return v;
}

bool isNumber(const std::string &w) {
  return !w.empty() && (std::isdigit(static_cast<unsigned char>(w[0])) ||
                        (w[0] == '-' && w.size() > 1));
}

/// input/output records: <name> <dtype> <rank> <dim>... (rest)
PackageTensor tensorRecord(const std::vector<std::string> &w, size_t &next) {
  if (w.size() < 4)
    throw RunError("a malformed " + w[0] + " record");
  PackageTensor t;
  t.name = w[1];
  t.dtype = w[2];
  packageDType(t.dtype); // an unknown dtype is an error now
  int64_t rank = number(w[3], "rank");
  if (rank < 0 || w.size() < 4 + static_cast<size_t>(rank))
    throw RunError("a malformed " + w[0] + " record for " + t.name);
  for (int64_t i = 0; i < rank; ++i) {
    const std::string &d = w[4 + i];
    PackageDim dim;
    if (isNumber(d))
      dim.value = number(d, "dim");
    else
      dim.symbol = d;
    t.shape.push_back(dim);
  }
  next = 4 + rank;
  return t;
}

std::string shapeText(const int64_t *shape, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t elementBytes(DLDataType t) { return (t.bits * t.lanes + 7) / 8; }

std::string deviceText(DLDevice d) {
  return d.device_type == kDLCUDA ? "CUDA device " + std::to_string(d.device_id) : "the CPU";
}

/// Where a CUDA library the package calls is loaded from: $env, else where it was at export,
/// else its file name (the dynamic loader's search path).
std::string cudaLibrary(const std::string &recorded, const char *env) {
  if (const char *v = std::getenv(env); v && *v)
    return v;
  std::error_code ec;
  if (std::filesystem::exists(recorded, ec))
    return recorded;
  return std::filesystem::path(recorded).filename().string();
}

} // namespace

DLDataType packageDType(const std::string &name) {
  for (const DTypeNames &d : dtypeNames())
    if (name == d.package)
      return d.type;
  throw RunError("unknown dtype '" + name + "'");
}

RuntimeFile runtimeFile() {
  RuntimeFile f;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&runtimeFile), &info) && info.dli_fname) {
    f.path = info.dli_fname;
    std::ifstream in(f.path, std::ios::binary | std::ios::ate);
    if (in)
      f.bytes = static_cast<int64_t>(in.tellg());
  }
  return f;
}

std::vector<std::string> cpuFeatures() {
  std::vector<std::string> out;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
#define BRAZE_FEATURE(name)                                                                       \
  if (__builtin_cpu_supports(name))                                                               \
    out.push_back(name);
  BRAZE_FEATURE("sse4.2")
  BRAZE_FEATURE("avx")
  BRAZE_FEATURE("avx2")
  BRAZE_FEATURE("fma")
  BRAZE_FEATURE("bmi2")
  BRAZE_FEATURE("avx512f")
  BRAZE_FEATURE("avx512bw")
  BRAZE_FEATURE("avx512dq")
  BRAZE_FEATURE("avx512vl")
  BRAZE_FEATURE("avx512vnni")
  BRAZE_FEATURE("avx512bf16")
#undef BRAZE_FEATURE
#endif
  return out;
}

std::shared_ptr<Package> Package::load(const std::string &given, int device, bool cudaGraphs) {
  std::error_code ec;
  const std::string path =
      std::filesystem::is_regular_file(given, ec) ? extractPackageArchive(given) : given;
  std::shared_ptr<Package> p(new Package());
  p->path_ = path;
  auto fail = [&](const std::string &why) -> RunError {
    return RunError("braze package " + given + ": " + why);
  };
  std::string text;
  if (!readWholeFile(path + "/package.txt", text))
    throw fail("package.txt is missing (not a package written by braze.export?)");
  // The manifest's own checksum: its last line covers everything before it.
  size_t last = text.rfind("\nchecksum ");
  if (last == std::string::npos)
    throw fail("package.txt is damaged (no checksum line)");
  std::string body = text.substr(0, last + 1);
  std::vector<std::string> sumLine = words(text.substr(last + 1));
  if (sumLine.size() != 2 || sumLine[1] != sha256Hex(body))
    throw fail("package.txt is damaged (its checksum does not match)");

  std::vector<std::string> lines;
  {
    std::istringstream in(body);
    for (std::string l; std::getline(in, l);)
      if (!l.empty())
        lines.push_back(l);
  }
  std::vector<std::string> head = lines.empty() ? std::vector<std::string>{} : words(lines[0]);
  if (head.size() != 2 || head[0] != "braze-package")
    throw fail("package.txt does not start with 'braze-package <format>'");
  try {
    p->format_ = static_cast<int>(number(head[1], "format version"));
  } catch (const RunError &e) {
    throw fail(e.what());
  }
  if (p->format_ > kFormatVersion || p->format_ < 1)
    throw fail("format version " + std::to_string(p->format_) +
               " is not one this runtime reads (1 to " + std::to_string(kFormatVersion) +
               "); load it with the braze that wrote it, or a newer one");

  std::string library, librarySum, weightsFile, weightsSum;
  int64_t weightsStart = 0, moduleSymbols = -1;
  std::vector<std::pair<std::string, std::string>> vendors; // path, checksum (empty: not bundled)
  std::vector<std::string> isa;
  // CUDA packages
  bool cuda = false;
  int computeCapability = 0;
  std::vector<std::pair<std::string, std::string>> cubins; // file, checksum
  std::vector<std::string> kernels;
  std::string cublasLt, cudnn;
  try {
    for (size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> w = words(lines[i]);
      const std::string &k = w[0];
      if (k == "braze" || k == "target") {
        continue;
      } else if (k == "module-symbols" && w.size() == 2) {
        moduleSymbols = number(w[1], "symbol count");
        if (moduleSymbols < 0 || moduleSymbols > (1 << 20))
          throw RunError("a symbol count out of range: " + w[1]);
      } else if (k == "device" && w.size() == 2 && w[1] == "cpu") {
        cuda = false;
      } else if (k == "device" && w.size() == 3 && w[1] == "cuda") {
        cuda = true;
        computeCapability = static_cast<int>(number(w[2], "compute capability"));
      } else if (k == "device") {
        throw RunError("device " + (w.size() > 1 ? w[1] : std::string("?")) +
                       " is not one this runtime runs (cpu, cuda)");
      } else if (k == "cubin" && w.size() == 3) {
        cubins.emplace_back(path + "/" + w[1], w[2]);
      } else if (k == "kernel" && w.size() == 2) {
        kernels.push_back(w[1]);
      } else if (k == "cuda-library" && w.size() == 3 && (w[1] == "cublaslt" || w[1] == "cudnn")) {
        (w[1] == "cublaslt" ? cublasLt : cudnn) = w[2];
      } else if (k == "checks-indices" && w.size() == 1) {
        p->checksIndices_ = true;
      } else if (k == "isa") {
        isa.assign(w.begin() + 1, w.end());
      } else if (k == "library" && w.size() == 3) {
        library = w[1];
        librarySum = w[2];
      } else if (k == "vendor" && w.size() == 3) {
        vendors.emplace_back(path + "/" + w[1], w[2]);
      } else if (k == "vendor-path" && w.size() == 2) {
        vendors.emplace_back(w[1], "");
      } else if (k == "weights" && w.size() == 4) {
        weightsFile = w[1];
        weightsSum = w[2];
        weightsStart = number(w[3], "weights offset");
      } else if (k == "symbol" && w.size() == 4) {
        p->signature_.symbols.push_back({w[1], number(w[2], "range"), number(w[3], "range")});
      } else if (k == "input") {
        size_t next = 0;
        PackageTensor t = tensorRecord(w, next);
        // After the kind's own words, optionally `strides <one per dim>`.
        auto strides = [&](size_t at) {
          size_t rest = w.size() - at;
          if (rest != 0 && (rest != t.shape.size() + 1 || w[at] != "strides"))
            throw RunError("a malformed input record for " + t.name);
          for (size_t d = 0; rest && d < t.shape.size(); ++d)
            t.strides.push_back(number(w[at + 1 + d], "stride"));
        };
        if (next < w.size() && w[next] == "user") {
          strides(next + 1);
          p->signature_.inputs.push_back(t);
        } else if (next + 3 <= w.size() && w[next] == "weight") {
          t.weight = true;
          t.begin = number(w[next + 1], "weight offset");
          t.end = number(w[next + 2], "weight offset");
          strides(next + 3);
        } else {
          throw RunError("a malformed input record for " + t.name);
        }
        p->moduleInputs_.push_back(t);
      } else if (k == "output") {
        size_t next = 0;
        p->signature_.outputs.push_back(tensorRecord(w, next));
      } else {
        throw RunError("an unknown record '" + lines[i] + "'");
      }
    }
  } catch (const RunError &e) {
    throw fail(std::string("package.txt: ") + e.what());
  }
  if (library.empty() || moduleSymbols < 0)
    throw fail("package.txt names no library or no module-symbols");
  if (cuda) {
    if (cubins.empty() && !kernels.empty())
      throw fail("package.txt names kernels but no cubin");
    if (!cudaDriverAvailable())
      throw fail("it runs on a CUDA GPU (compute capability " +
                 std::to_string(computeCapability / 10) + "." +
                 std::to_string(computeCapability % 10) +
                 "), and this machine has no CUDA driver or device");
    int have = cudaComputeCapability(device);
    // A cubin runs on its own architecture and later minor versions of it.
    if (have / 10 != computeCapability / 10 || have % 10 < computeCapability % 10)
      throw fail("its kernels were compiled for compute capability " +
                 std::to_string(computeCapability / 10) + "." +
                 std::to_string(computeCapability % 10) + ", and CUDA device " +
                 std::to_string(device) + " is " + std::to_string(have / 10) + "." +
                 std::to_string(have % 10) + "; export it again on this GPU");
    p->device_ = DLDevice{kDLCUDA, device};
  }

  // The CPU must have what the library was compiled for.
  std::vector<std::string> have = cpuFeatures();
  for (const std::string &f : isa)
    if (std::find(have.begin(), have.end(), f) == have.end())
      throw fail("it was compiled for a CPU with " + f + ", which this CPU lacks");

  // Every file against its checksum.
  auto verified = [&](const std::string &file, const std::string &sum) {
    std::string data;
    if (!readWholeFile(file, data))
      throw fail(file + " is missing");
    if (sha256Hex(data) != sum)
      throw fail(file + " is damaged (its checksum does not match)");
    return data;
  };
  verified(path + "/" + library, librarySum);
  for (const auto &[file, sum] : vendors) {
    if (!sum.empty())
      verified(file, sum);
  }
  for (const auto &[file, sum] : cubins)
    verified(file, sum);
  if (!weightsFile.empty()) {
    std::string data = verified(path + "/" + weightsFile, weightsSum);
    if (weightsStart < 8 || weightsStart > static_cast<int64_t>(data.size()))
      throw fail(weightsFile + " is shorter than its header says");
    p->weightBytes_ = data.size() - weightsStart;
    const char *bytes = data.data() + weightsStart;
    if (cuda) { // straight from the file's bytes to the device, where the weights live
      try {
        p->weights_ = cudaAllocate(device, p->weightBytes_);
        cudaCopy(device, p->weights_, bytes, p->weightBytes_, /*toDevice=*/true);
      } catch (const RunError &e) {
        throw fail(std::string("loading its weights: ") + e.what());
      }
    } else {
      p->weights_ = std::aligned_alloc(64, (p->weightBytes_ + 63) / 64 * 64 + 64);
      if (!p->weights_)
        throw fail("out of memory for " + std::to_string(p->weightBytes_) + " bytes of weights");
      std::memcpy(p->weights_, bytes, p->weightBytes_);
    }
  }
  for (const PackageTensor &t : p->moduleInputs_) {
    if (!t.weight)
      continue;
    int64_t n = 1;
    for (const PackageDim &d : t.shape) {
      if (!d.symbol.empty())
        throw fail("weight " + t.name + " has a symbolic size");
      if (d.value < 0 || (d.value > 0 && n > (int64_t(1) << 56) / d.value))
        throw fail("weight " + t.name + " has a size no file holds");
      n *= d.value;
    }
    if (!t.strides.empty()) { // dense in some order: sorted by stride, each the span of those after
      std::vector<size_t> order(t.shape.size());
      for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return t.strides[a] > t.strides[b];
      });
      int64_t span = 1;
      for (size_t i = order.size(); i-- > 0;) {
        const int64_t size = t.shape[order[i]].value;
        if (size != 1 && t.strides[order[i]] != span)
          throw fail("weight " + t.name + " has strides that are not a dense layout");
        span *= size;
      }
    }
    int64_t bytes = n * static_cast<int64_t>(elementBytes(packageDType(t.dtype)));
    if (t.begin < 0 || t.end != t.begin + bytes || t.end > static_cast<int64_t>(p->weightBytes_))
      throw fail("weight " + t.name + " does not fit the weights file");
  }

  // Bundled vendor libraries first, so that the host library's dependencies resolve to them.
  for (const auto &[file, sum] : vendors) {
    void *h = dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h)
      throw fail("cannot load " + file + ": " + dlerror());
    p->vendors_.push_back(h);
  }
  ModuleSpec spec;
  spec.libraryPath = path + "/" + library;
  spec.numSymbols = static_cast<int>(moduleSymbols);
  for (const PackageTensor &t : p->moduleInputs_)
    spec.inputs.push_back({packageDType(t.dtype), static_cast<int>(t.shape.size())});
  for (const PackageTensor &t : p->signature_.outputs)
    spec.outputs.push_back({packageDType(t.dtype), static_cast<int>(t.shape.size())});
  if (cuda) {
    spec.cuda = true;
    spec.device = device;
    for (const auto &[file, sum] : cubins)
      spec.cubinPaths.push_back(file);
    spec.kernels = kernels;
    spec.checksIndices = p->checksIndices_;
    if (!cublasLt.empty())
      spec.cublasLtLibrary = cudaLibrary(cublasLt, "BRAZE_CUBLASLT");
    if (!cudnn.empty())
      spec.cudnnLibrary = cudaLibrary(cudnn, "BRAZE_CUDNN");
  }
  try {
    p->exe_ = Executable::load(spec);
  } catch (const RunError &e) {
    throw fail(e.what());
  }
  if (cuda) {
    const char *env = std::getenv("BRAZE_CUDA_GRAPHS");
    // A package whose kernels check indices replays too, then waits and checks (runInto).
    std::string off = !cudaGraphs ? "turned off at load"
                      : env && std::string(env) == "0" ? "BRAZE_CUDA_GRAPHS=0"
                                                        : cudaGraphsUnavailable();
    p->graphs_ = std::make_unique<PackageGraphs>(device, std::move(off));
  }
  return p;
}

PackageGraphs::Stats Package::cudaGraphStats() const {
  return graphs_ ? graphs_->stats() : PackageGraphs::Stats{0, 0, 0, "a CPU package"};
}

Package::~Package() {
  graphs_.reset(); // its graphs launch the module's kernels: gone before the module is
  exe_.reset();
  for (auto it = vendors_.rbegin(); it != vendors_.rend(); ++it)
    dlclose(*it);
  if (device_.device_type == kDLCUDA)
    cudaRelease(device_.device_id, weights_);
  else
    std::free(weights_);
}

std::vector<const DLTensor *>
Package::moduleInputs(const std::vector<const DLTensor *> &inputs, std::vector<DLTensor> &weights,
                      std::vector<std::vector<int64_t>> &shapes) const {
  const std::vector<PackageTensor> &user = signature_.inputs;
  if (inputs.size() != user.size())
    throw RunError("the package takes " + std::to_string(user.size()) + " inputs, got " +
                   std::to_string(inputs.size()));
  std::map<std::string, int64_t> bound;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DLTensor &x = *inputs[i];
    const PackageTensor &s = user[i];
    const std::string what = "input " + std::to_string(i) + " (" + s.name + ")";
    if (x.device.device_type != device_.device_type ||
        (device_.device_type == kDLCUDA && x.device.device_id != device_.device_id))
      throw RunError(what + " is not on " + deviceText(device_) + ", where this package runs");
    if (!sameType(x.dtype, packageDType(s.dtype)))
      throw RunError(what + " is " + typeName(x.dtype) + ", the package takes " + s.dtype);
    if (x.ndim != static_cast<int>(s.shape.size()))
      throw RunError(what + " has rank " + std::to_string(x.ndim) + ", the package takes " +
                     std::to_string(s.shape.size()));
    for (int d = 0; d < x.ndim; ++d) {
      const PackageDim &dim = s.shape[d];
      int64_t n = x.shape[d];
      if (dim.symbol.empty()) {
        if (n != dim.value)
          throw RunError(what + " has shape " + shapeText(x.shape, x.ndim) + ": dim " +
                         std::to_string(d) + " must be " + std::to_string(dim.value));
        continue;
      }
      for (const PackageSymbol &sym : signature_.symbols) {
        if (sym.name == dim.symbol && (n < sym.min || n > sym.max))
          throw RunError(what + " has shape " + shapeText(x.shape, x.ndim) + ": dim " +
                         std::to_string(d) + " (" + sym.name + ") is " + std::to_string(n) +
                         ", outside the range [" + std::to_string(sym.min) + ", " +
                         std::to_string(sym.max) + "] the package was exported for");
      }
      auto [it, fresh] = bound.emplace(dim.symbol, n);
      if (!fresh && it->second != n)
        throw RunError(what + " has shape " + shapeText(x.shape, x.ndim) + ": dim " +
                       std::to_string(d) + " (" + dim.symbol + ") is " + std::to_string(n) +
                       ", but an earlier input has " + dim.symbol + " = " +
                       std::to_string(it->second));
    }
    // An input exported in another layout than row-major (channels-last) is taken in it.
    if (!s.strides.empty()) {
      std::vector<int64_t> have(x.ndim);
      int64_t span = 1;
      for (int d = x.ndim; d-- > 0; span *= x.shape[d])
        have[d] = x.strides ? x.strides[d] : span;
      for (int d = 0; d < x.ndim; ++d)
        if (x.shape[d] != 1 && have[d] != s.strides[d])
          throw RunError(what + " has strides " + shapeText(have.data(), x.ndim) +
                         "; the package takes it laid out as it was exported, with strides " +
                         shapeText(s.strides.data(), x.ndim));
    }
  }
  // Reserved whole first: the returned pointers point into both vectors.
  weights.clear();
  weights.reserve(moduleInputs_.size());
  shapes.clear();
  shapes.reserve(moduleInputs_.size());
  std::vector<const DLTensor *> all;
  size_t next = 0;
  for (const PackageTensor &t : moduleInputs_) {
    if (!t.weight) {
      all.push_back(inputs[next++]);
      continue;
    }
    std::vector<int64_t> shape;
    for (const PackageDim &d : t.shape)
      shape.push_back(d.value);
    shapes.push_back(std::move(shape));
    DLTensor w{};
    w.data = static_cast<char *>(weights_) + t.begin;
    w.device = device_;
    w.ndim = static_cast<int32_t>(t.shape.size());
    w.dtype = packageDType(t.dtype);
    w.shape = shapes.back().data();
    w.strides = t.strides.empty() ? nullptr : const_cast<int64_t *>(t.strides.data());
    weights.push_back(w);
    all.push_back(&weights.back());
  }
  return all;
}

std::vector<std::unique_ptr<OwnedTensor>>
Package::run(const std::vector<const DLTensor *> &inputs, void *stream) const {
  std::vector<DLTensor> weights;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const DLTensor *> all = moduleInputs(inputs, weights, shapes);
  if (device_.device_type != kDLCUDA)
    return exe_->run(all);
  std::vector<int64_t> syms = exe_->bind(all);
  std::vector<Executable::Layout> layouts = exe_->layoutsFor(syms);
  std::vector<std::unique_ptr<OwnedTensor>> outs;
  std::vector<DLTensor> views(layouts.size());
  std::vector<DLTensor *> ptrs;
  for (size_t i = 0; i < layouts.size(); ++i) {
    outs.push_back(std::make_unique<OwnedTensor>(packageDType(signature_.outputs[i].dtype),
                                                 layouts[i].shape, layouts[i].strides, device_));
    OwnedTensor &o = *outs.back();
    views[i].data = o.data();
    views[i].device = device_;
    views[i].ndim = static_cast<int32_t>(o.shape().size());
    views[i].dtype = o.dtype();
    views[i].shape = const_cast<int64_t *>(o.shape().data());
    views[i].strides = const_cast<int64_t *>(o.strides().data());
    ptrs.push_back(&views[i]);
  }
  runInto(all, syms, layouts, ptrs, stream);
  return outs;
}

void Package::run(const std::vector<const DLTensor *> &inputs,
                  const std::vector<DLTensor *> &outputs, void *stream) const {
  std::vector<DLTensor> weights;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const DLTensor *> all = moduleInputs(inputs, weights, shapes);
  std::vector<int64_t> syms = exe_->bind(all);
  runInto(all, syms, exe_->layoutsFor(syms), outputs, stream);
}

std::vector<Executable::Layout>
Package::outputLayouts(const std::vector<const DLTensor *> &inputs) const {
  std::vector<DLTensor> weights;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const DLTensor *> all = moduleInputs(inputs, weights, shapes);
  return exe_->layoutsFor(exe_->bind(all));
}

namespace {
/// t's stride along dim d in elements (row-major where t has no strides).
int64_t strideOf(const DLTensor &t, int d) {
  if (t.strides)
    return t.strides[d];
  int64_t stride = 1;
  for (int e = d + 1; e < t.ndim; ++e)
    stride *= t.shape[e];
  return stride;
}

/// The bytes between t's first and last element (at `data`), and whether its elements fill
/// them (strides that are not positive count as not dense).
PackageGraphs::Buffer span(const DLTensor &t, const void *data) {
  int64_t elems = 1, extent = 1;
  bool positive = true;
  for (int d = 0; d < t.ndim; ++d) {
    elems *= t.shape[d];
    const int64_t stride = strideOf(t, d);
    if (t.shape[d] > 1) {
      positive = positive && stride > 0;
      extent += (t.shape[d] - 1) * stride;
    }
  }
  if (elems == 0)
    extent = 0;
  const size_t bytes = static_cast<size_t>(extent) * elementBytes(t.dtype);
  return {const_cast<void *>(data), bytes, positive && extent == elems};
}
} // namespace

void Package::runInto(const std::vector<const DLTensor *> &all, const std::vector<int64_t> &syms,
                      const std::vector<Executable::Layout> &layouts,
                      const std::vector<DLTensor *> &outputs, void *stream) const {
  if (outputs.size() != layouts.size())
    throw RunError("the package has " + std::to_string(layouts.size()) + " outputs, got " +
                   std::to_string(outputs.size()) + " buffers");
  std::vector<void *> outPtrs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const DLTensor &o = *outputs[i];
    const Executable::Layout &l = layouts[i];
    const std::string what = "output " + std::to_string(i) + " (" + signature_.outputs[i].name + ")";
    bool same = o.ndim == static_cast<int>(l.shape.size()) &&
                sameType(o.dtype, packageDType(signature_.outputs[i].dtype)) &&
                o.device.device_type == device_.device_type &&
                (device_.device_type != kDLCUDA || o.device.device_id == device_.device_id);
    for (int d = 0; same && d < o.ndim; ++d)
      same = o.shape[d] == l.shape[d] && (l.shape[d] == 1 || strideOf(o, d) == l.strides[d]);
    if (!same)
      throw RunError(what + " must be a " + signature_.outputs[i].dtype + " buffer on " +
                     deviceText(device_) + " of shape " +
                     shapeText(l.shape.data(), static_cast<int>(l.shape.size())) +
                     " laid out as the package writes it");
    outPtrs.push_back(static_cast<char *>(o.data) + o.byte_offset);
  }
  std::vector<const void *> inPtrs;
  for (const DLTensor *t : all)
    inPtrs.push_back(static_cast<const char *>(t->data) + t->byte_offset);
  if (device_.device_type != kDLCUDA) {
    exe_->runBound(inPtrs, outPtrs, syms);
    return;
  }
  // The user inputs (copied into a graph's own buffers when it replays) and the outputs, with
  // the layout that picks the graph.
  std::vector<int64_t> layout = syms;
  std::vector<size_t> user;
  std::vector<PackageGraphs::Buffer> ins, outs;
  for (size_t i = 0; i < all.size(); ++i)
    if (!moduleInputs_[i].weight) {
      user.push_back(i);
      ins.push_back(span(*all[i], inPtrs[i]));
      layout.push_back(all[i]->ndim);
      for (int d = 0; d < all[i]->ndim; ++d)
        layout.push_back(strideOf(*all[i], d));
    }
  for (size_t i = 0; i < outputs.size(); ++i)
    outs.push_back(span(*outputs[i], outPtrs[i]));
  graphs_->run(
      layout, ins, outs, static_cast<size_t>(exe_->arenaBytes(syms)),
      [&](const std::vector<const void *> &userIn, const std::vector<void *> &out, void *arena,
          void *s) {
        std::vector<const void *> in = inPtrs;
        for (size_t k = 0; k < user.size(); ++k)
          in[user[k]] = userIn[k];
        exe_->runCuda(in, out, arena, syms, s);
      },
      stream);
  if (checksIndices_)
    exe_->synchronizeAndCheck(stream);
}

namespace {
/// Row-major CPU views of buffers `data` (null: shapes only) with shapes `shapes` (which the
/// views point into) and the dtypes of `tensors`; RunError unless there is one per tensor.
std::vector<DLTensor> rowMajorViews(const std::vector<const void *> *data,
                                    const std::vector<std::vector<int64_t>> &shapes,
                                    const std::vector<PackageTensor> &tensors, const char *what,
                                    DLDevice device) {
  if (shapes.size() != tensors.size() || (data && data->size() != shapes.size())) {
    const std::string got = std::to_string(data ? data->size() : shapes.size());
    throw RunError(what == std::string("inputs")
                       ? "the package takes " + std::to_string(tensors.size()) + " inputs, got " + got
                       : "the package has " + std::to_string(tensors.size()) + " outputs, got " +
                             got + " buffers");
  }
  std::vector<DLTensor> views(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    views[i].data = data ? const_cast<void *>((*data)[i]) : nullptr;
    views[i].device = device;
    views[i].ndim = static_cast<int32_t>(shapes[i].size());
    views[i].dtype = packageDType(tensors[i].dtype);
    views[i].shape = const_cast<int64_t *>(shapes[i].data());
  }
  return views;
}

template <typename T> std::vector<T *> pointers(std::vector<DLTensor> &views) {
  std::vector<T *> out;
  for (DLTensor &v : views)
    out.push_back(&v);
  return out;
}
} // namespace

void Package::runRaw(const std::vector<const void *> &inputs,
                     const std::vector<std::vector<int64_t>> &inputShapes,
                     const std::vector<void *> &outputs, void *stream) const {
  std::vector<DLTensor> views =
      rowMajorViews(&inputs, inputShapes, signature_.inputs, "inputs", device_);
  std::vector<DLTensor> weights;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const DLTensor *> all =
      moduleInputs(pointers<const DLTensor>(views), weights, shapes);
  std::vector<int64_t> syms = exe_->bind(all);
  std::vector<Executable::Layout> layouts = exe_->layoutsFor(syms);
  std::vector<std::vector<int64_t>> outShapes;
  for (const Executable::Layout &l : layouts)
    outShapes.push_back(l.shape);
  const std::vector<const void *> outData(outputs.begin(), outputs.end());
  std::vector<DLTensor> outViews =
      rowMajorViews(&outData, outShapes, signature_.outputs, "outputs", device_);
  runInto(all, syms, layouts, pointers<DLTensor>(outViews), stream);
}

std::vector<std::vector<int64_t>>
Package::outputShapes(const std::vector<std::vector<int64_t>> &inputShapes) const {
  std::vector<DLTensor> views =
      rowMajorViews(nullptr, inputShapes, signature_.inputs, "inputs", device_);
  std::vector<std::vector<int64_t>> out;
  for (Executable::Layout &l : outputLayouts(pointers<const DLTensor>(views)))
    out.push_back(std::move(l.shape));
  return out;
}

} // namespace braze::runtime
