#include "braze/runtime/Executable.h"

#include "braze/runtime/CudaModule.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <mutex>

namespace braze::runtime {

namespace {
size_t elementBytes(DLDataType t) { return (t.bits * t.lanes + 7) / 8; }

std::string dtypeText(DLDataType t) {
  const char *code = t.code == kDLFloat ? "float" : t.code == kDLBfloat ? "bfloat"
                     : t.code == kDLInt  ? "int"   : t.code == kDLUInt ? "uint" : "bool";
  return std::string(code) + std::to_string(t.bits);
}

bool sameType(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/// Kernel error codes (set by generated code) to messages.
std::string kernelError(int code) {
  if (code == 1)
    return "an index is out of bounds (gather/indexing/scatter with an index outside the dim)";
  return "kernel failed with code " + std::to_string(code);
}
} // namespace

OwnedTensor::OwnedTensor(DLDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                         DLDevice device)
    : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)), device_(device) {
  if (strides_.empty()) {
    strides_.resize(shape_.size());
    int64_t s = 1;
    for (size_t i = shape_.size(); i-- > 0;) {
      strides_[i] = s;
      s *= shape_[i];
    }
  }
  // Elements spanned: 1 + sum((size - 1) * stride), or none for an empty tensor.
  size_t n = 1;
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] == 0) {
      n = 0;
      break;
    }
    n += static_cast<size_t>((shape_[i] - 1) * strides_[i]);
  }
  bytes_ = n * elementBytes(dtype);
  size_t alloc = ((bytes_ + 63) / 64) * 64;
  if (device_.device_type == kDLCUDA) {
    data_ = cudaAllocate(device_.device_id, alloc == 0 ? 64 : alloc);
    return;
  }
  data_ = std::aligned_alloc(64, alloc == 0 ? 64 : alloc);
  if (!data_)
    throw RunError("out of memory allocating " + std::to_string(alloc) + " bytes");
}

OwnedTensor::~OwnedTensor() {
  if (device_.device_type == kDLCUDA)
    cudaRelease(device_.device_id, data_);
  else
    std::free(data_);
}

DLManagedTensor *OwnedTensor::release(std::unique_ptr<OwnedTensor> t) {
  auto *m = new DLManagedTensor{};
  OwnedTensor *raw = t.release();
  m->dl_tensor.data = raw->data_;
  m->dl_tensor.device = raw->device_;
  m->dl_tensor.ndim = static_cast<int32_t>(raw->shape_.size());
  m->dl_tensor.dtype = raw->dtype_;
  m->dl_tensor.shape = raw->shape_.data();
  m->dl_tensor.strides = raw->strides_.data();
  m->dl_tensor.byte_offset = 0;
  m->manager_ctx = raw;
  m->deleter = [](DLManagedTensor *self) {
    delete static_cast<OwnedTensor *>(self->manager_ctx);
    delete self;
  };
  return m;
}

std::shared_ptr<Executable> Executable::load(const ModuleSpec &spec) {
  std::shared_ptr<Executable> e(new Executable());
  e->spec_ = spec;
  e->handle_ = dlopen(spec.libraryPath.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!e->handle_)
    throw RunError("cannot load compiled module " + spec.libraryPath + ": " + dlerror());
  // The module brings in the OpenMP runtime when the program has none of its own. Its worker
  // threads outlive the module, so the runtime must stay loaded after dlclose (GCC's and
  // LLVM's; NOLOAD leaves one the module did not load alone).
  for (const char *openmp : {"libgomp.so.1", "libomp.so", "libomp.so.5"})
    dlopen(openmp, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  auto sym = [&](const char *name) {
    void *p = dlsym(e->handle_, name);
    if (!p)
      throw RunError(std::string("compiled module lacks entry point ") + name);
    return p;
  };
  auto version = reinterpret_cast<int (*)()>(sym("braze_abi_version"));
  if (version() != 2)
    throw RunError("compiled module has ABI version " + std::to_string(version()) + ", expected 2");
  e->bind_ = reinterpret_cast<BindFn>(sym("braze_bind"));
  e->shapes_ = reinterpret_cast<ShapesFn>(sym("braze_output_shapes"));
  e->arena_ = reinterpret_cast<ArenaFn>(sym("braze_arena_bytes"));
  e->run_ = reinterpret_cast<RunFn>(sym("braze_run"));
  if (spec.cuda)
    e->cuda_ = CudaModule::load(spec);
  return e;
}

Executable::~Executable() {
  if (handle_)
    dlclose(handle_);
}

std::vector<int64_t> Executable::bind(const std::vector<const DLTensor *> &inputs) {
  if (inputs.size() != spec_.inputs.size())
    throw RunError("expected " + std::to_string(spec_.inputs.size()) + " inputs, got " +
                   std::to_string(inputs.size()));
  std::vector<const int64_t *> shapes, strides;
  std::vector<std::vector<int64_t>> rowMajor(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DLTensor *t = inputs[i];
    const TensorSpec &want = spec_.inputs[i];
    if (t->device.device_type != (spec_.cuda ? kDLCUDA : kDLCPU))
      throw RunError("input " + std::to_string(i) + " is not on the " +
                     (spec_.cuda ? "GPU" : "CPU"));
    if (t->ndim != want.rank)
      throw RunError("input " + std::to_string(i) + " has rank " + std::to_string(t->ndim) +
                     ", expected " + std::to_string(want.rank));
    if (!sameType(t->dtype, want.dtype))
      throw RunError("input " + std::to_string(i) + " has dtype " + dtypeText(t->dtype) +
                     ", expected " + dtypeText(want.dtype));
    shapes.push_back(t->shape);
    if (t->strides) {
      strides.push_back(t->strides);
    } else {
      rowMajor[i].resize(t->ndim);
      int64_t s = 1;
      for (int d = t->ndim; d-- > 0;) {
        rowMajor[i][d] = s;
        s *= t->shape[d];
      }
      strides.push_back(rowMajor[i].data());
    }
  }
  return bindPointers(shapes.data(), strides.data());
}

std::vector<int64_t> Executable::bindPointers(const int64_t *const *shapes,
                                              const int64_t *const *strides) {
  std::vector<int64_t> syms(std::max(1, spec_.numSymbols), 0);
  char msg[512] = {};
  if (bind_(shapes, strides, syms.data(), msg, sizeof msg) != 0)
    throw RunError(msg);
  return syms;
}

std::vector<Executable::Layout> Executable::layoutsFor(const std::vector<int64_t> &syms) {
  size_t total = 0;
  for (const TensorSpec &o : spec_.outputs)
    total += o.rank;
  std::vector<int64_t> shapes(std::max<size_t>(total, 1)), strides(shapes.size());
  shapes_(syms.data(), shapes.data(), strides.data());
  std::vector<Layout> out;
  size_t k = 0;
  for (const TensorSpec &o : spec_.outputs) {
    out.push_back(Layout{{shapes.begin() + k, shapes.begin() + k + o.rank},
                         {strides.begin() + k, strides.begin() + k + o.rank}});
    k += o.rank;
  }
  return out;
}

std::vector<std::vector<int64_t>>
Executable::outputShapes(const std::vector<const DLTensor *> &inputs) {
  std::vector<std::vector<int64_t>> shapes;
  for (Layout &l : layoutsFor(bind(inputs)))
    shapes.push_back(std::move(l.shape));
  return shapes;
}

std::vector<int64_t> Executable::bindShapes(const std::vector<std::vector<int64_t>> &shapes,
                                            const std::vector<std::vector<int64_t>> &strides) {
  if (shapes.size() != spec_.inputs.size() || strides.size() != shapes.size())
    throw RunError("expected " + std::to_string(spec_.inputs.size()) + " inputs, got " +
                   std::to_string(shapes.size()));
  std::vector<const int64_t *> sp, st;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (static_cast<int>(shapes[i].size()) != spec_.inputs[i].rank ||
        strides[i].size() != shapes[i].size())
      throw RunError("input " + std::to_string(i) + " has rank " +
                     std::to_string(shapes[i].size()) + ", expected " +
                     std::to_string(spec_.inputs[i].rank));
    sp.push_back(shapes[i].data());
    st.push_back(strides[i].data());
  }
  return bindPointers(sp.data(), st.data());
}

int64_t Executable::arenaBytes(const std::vector<int64_t> &syms) { return arena_(syms.data()); }

void Executable::runCuda(const std::vector<const void *> &inputs, const std::vector<void *> &outputs,
                         void *arena, const std::vector<int64_t> &syms, void *stream) {
  if (!cuda_)
    throw RunError("runCuda on a CPU module");
  std::vector<int64_t> padded = boundSymbols(inputs.size(), outputs.size(), syms);
  cuda_->run(reinterpret_cast<CudaRunFn>(run_),
             const_cast<void *const *>(reinterpret_cast<const void *const *>(inputs.data())),
             outputs.data(), static_cast<char *>(arena), padded.data(), stream);
}

void Executable::synchronizeAndCheck(void *stream) {
  if (cuda_)
    cuda_->synchronizeAndCheck(stream);
}

void Executable::setAssertIndices(bool on) {
  if (cuda_)
    cuda_->setAssertIndices(on);
}

void *Executable::symbol(const char *name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

void Executable::setLaunchObserver(
    std::function<void(int, int64_t, int, void **, void *, bool)> observer) {
  if (!cuda_)
    throw RunError("launch observers are for CUDA modules");
  cuda_->setLaunchObserver(std::move(observer));
}

void Executable::runBound(const std::vector<const void *> &inputs,
                          const std::vector<void *> &outputs, const std::vector<int64_t> &syms) {
  launch(inputs, outputs, boundSymbols(inputs.size(), outputs.size(), syms));
}

std::vector<int64_t> Executable::boundSymbols(size_t inputs, size_t outputs,
                                              const std::vector<int64_t> &syms) const {
  if (inputs != spec_.inputs.size() || outputs != spec_.outputs.size())
    throw RunError("expected " + std::to_string(spec_.inputs.size()) + " inputs and " +
                   std::to_string(spec_.outputs.size()) + " outputs");
  std::vector<int64_t> padded = syms;
  if (padded.empty())
    padded.push_back(0);
  return padded;
}

namespace {
/// Arenas of finished CPU calls, kept for the next calls of any graph: a fresh arena of a few
/// megabytes comes from mmap, and every call would fault in and zero its pages again (about 8%
/// of a small CNN's training step on 2 cores). A call takes the smallest kept arena that is
/// large enough; arenas past kKeptArenaBytes in all are freed, largest first.
class ArenaPool {
public:
  struct Block {
    char *data = nullptr;
    size_t bytes = 0;
  };

  Block take(size_t bytes) {
    {
      std::lock_guard<std::mutex> hold(mu_);
      auto best = kept_.end();
      for (auto it = kept_.begin(); it != kept_.end(); ++it)
        if (it->bytes >= bytes && (best == kept_.end() || it->bytes < best->bytes))
          best = it;
      if (best != kept_.end()) {
        Block b = *best;
        keptBytes_ -= b.bytes;
        kept_.erase(best);
        return b;
      }
    }
    size_t rounded = (bytes + 63) / 64 * 64;
    auto *data = static_cast<char *>(std::aligned_alloc(64, rounded));
    if (!data)
      throw RunError("out of memory allocating the " + std::to_string(bytes) + "-byte arena");
    return {data, rounded};
  }

  void give(Block b) {
    std::vector<char *> freed;
    {
      std::lock_guard<std::mutex> hold(mu_);
      kept_.push_back(b);
      keptBytes_ += b.bytes;
      while (keptBytes_ > kKeptArenaBytes) {
        auto largest = std::max_element(kept_.begin(), kept_.end(), [](const Block &x,
                                                                       const Block &y) {
          return x.bytes < y.bytes;
        });
        keptBytes_ -= largest->bytes;
        freed.push_back(largest->data);
        kept_.erase(largest);
      }
    }
    for (char *p : freed)
      std::free(p);
  }

private:
  static constexpr size_t kKeptArenaBytes = size_t(256) << 20;
  std::mutex mu_;
  std::vector<Block> kept_;
  size_t keptBytes_ = 0;
};

ArenaPool &arenaPool() {
  static ArenaPool *pool = new ArenaPool; // never destroyed: calls may run during exit
  return *pool;
}
} // namespace

void Executable::launch(const std::vector<const void *> &inputs, const std::vector<void *> &outputs,
                        const std::vector<int64_t> &syms) {
  if (cuda_)
    throw RunError("this graph was compiled for CUDA: run it with runCuda on device buffers");
  int64_t arenaBytes = arena_(syms.data());
  ArenaPool::Block arena;
  if (arenaBytes > 0)
    arena = arenaPool().take(static_cast<size_t>(arenaBytes));
  int code = run_(const_cast<void *const *>(reinterpret_cast<const void *const *>(inputs.data())),
                  outputs.data(), arena.data, syms.data());
  if (arena.data)
    arenaPool().give(arena);
  if (code != 0)
    throw RunError(kernelError(code));
}

std::vector<std::unique_ptr<OwnedTensor>>
Executable::run(const std::vector<const DLTensor *> &inputs) {
  std::vector<int64_t> syms = bind(inputs);
  std::vector<Layout> layouts = layoutsFor(syms);
  std::vector<std::unique_ptr<OwnedTensor>> outs;
  std::vector<void *> outPtrs;
  for (size_t i = 0; i < layouts.size(); ++i) {
    outs.push_back(std::make_unique<OwnedTensor>(spec_.outputs[i].dtype,
                                                 std::move(layouts[i].shape),
                                                 std::move(layouts[i].strides)));
    outPtrs.push_back(outs.back()->data());
  }
  std::vector<const void *> inPtrs;
  for (const DLTensor *t : inputs)
    inPtrs.push_back(static_cast<const char *>(t->data) + t->byte_offset);
  launch(inPtrs, outPtrs, syms);
  return outs;
}

void Executable::runRaw(const std::vector<const void *> &inputs,
                        const std::vector<std::vector<int64_t>> &inputShapes,
                        const std::vector<void *> &outputs) {
  std::vector<DLTensor> views(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    views[i].data = const_cast<void *>(inputs[i]);
    views[i].device = DLDevice{kDLCPU, 0};
    views[i].ndim = static_cast<int32_t>(inputShapes.at(i).size());
    views[i].dtype = i < spec_.inputs.size() ? spec_.inputs[i].dtype : DLDataType{};
    views[i].shape = const_cast<int64_t *>(inputShapes[i].data());
    views[i].strides = nullptr;
    views[i].byte_offset = 0;
  }
  std::vector<const DLTensor *> ptrs;
  for (const DLTensor &v : views)
    ptrs.push_back(&v);
  std::vector<int64_t> syms = bind(ptrs);
  if (outputs.size() != spec_.outputs.size())
    throw RunError("expected " + std::to_string(spec_.outputs.size()) + " output buffers, got " +
                   std::to_string(outputs.size()));
  launch(inputs, outputs, syms);
}

} // namespace braze::runtime
