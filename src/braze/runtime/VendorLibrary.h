#pragma once
/// A vendor library loaded at run time with dlopen (cuBLASLt, cuDNN), so that braze builds
/// without the CUDA toolkit. RTLD_LOCAL keeps its symbols its own. Every failure is a RunError
/// naming the library and its path.
#include "braze/runtime/Executable.h"

#include <cstdint>
#include <dlfcn.h>
#include <mutex>
#include <string>

namespace braze::runtime {

/// The largest power of two, at most 16, that divides the address: vendor kernels (cuBLASLt,
/// cuDNN) are chosen for their operands' alignment, up to 16 bytes; nullptr counts as aligned.
inline uint32_t alignmentOf(const void *ptr) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  uint32_t align = 16;
  while (align > 1 && address % align != 0)
    align /= 2;
  return align;
}

/// The process's one T (a vendor library's wrapper), made by `make` (returning a
/// std::unique_ptr<T>) in the first call that succeeds, under a lock, and never destroyed: it
/// lives as long as the process. A make that throws leaves the next call to try again.
template <typename T, typename Make> T &loadedOnce(Make make) {
  static std::mutex mutex;
  static T *instance = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (!instance)
    instance = make().release();
  return *instance;
}

class VendorLibrary {
public:
  /// Loads `path`; throws "cannot load <what> library <path>: <dlerror()>".
  VendorLibrary(std::string what, std::string path) : what_(std::move(what)), path_(std::move(path)) {
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char *why = dlerror();
      throw RunError("cannot load " + what_ + " library " + path_ + ": " +
                     (why ? why : "unknown error"));
    }
  }

  /// fn = the entry point `name`; throws "<what> library <path> lacks entry point <name>".
  template <typename Fn> void bind(Fn &fn, const char *name) const {
    void *p = find(name);
    if (!p)
      throw RunError(what_ + " library " + path_ + " lacks entry point " + name);
    fn = reinterpret_cast<Fn>(p);
  }

  /// The entry point `name`, or nullptr (for optional ones).
  void *find(const char *name) const { return dlsym(handle_, name); }

  /// Unloads the library (a load that failed after opening it). The object is then unusable.
  void close() {
    if (handle_)
      dlclose(handle_);
    handle_ = nullptr;
  }

  void *handle() const { return handle_; }

private:
  std::string what_, path_;
  void *handle_ = nullptr;
};

} // namespace braze::runtime
