// The host compiler's precompiled header (GCC): built into the cache at a process's third
// cache miss, used by the compiles after it, rebuilt when its checksum fails, and dropped for
// the process when it fails a compile that the header's text passes. The tests run in this
// order in one process (the header's state is the process's).
#include "braze/jit/CacheFiles.h"
#include "braze/jit/HostCompiler.h"
#include "braze/support/Hashing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <dlfcn.h>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace braze::jit {
namespace {

namespace fs = std::filesystem;

/// A source that includes every precompiled header, as generated CPU modules do, and returns
/// max(n, 2) + sin(0).
std::string source(int n) {
  return "#include <algorithm>\n#include <cmath>\n#include <cstdint>\n#include <cstdio>\n"
         "#include <cstring>\n#include <limits>\n#include <omp.h>\n#include <vector>\n"
         "extern \"C\" double value() { std::vector<int> v{" +
         std::to_string(n) +
         ", 2}; return *std::max_element(v.begin(), v.end()) + std::sin(0.0); }\n";
}

double valueOf(const CompiledLibrary &lib) {
  void *h = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(h, nullptr) << dlerror();
  if (!h)
    return -1;
  auto f = reinterpret_cast<double (*)()>(dlsym(h, "value"));
  double v = f ? f() : -1;
  dlclose(h);
  return v;
}

/// The precompiled headers (*.h.gch) under `dir`.
std::vector<fs::path> headers(const fs::path &dir) {
  std::vector<fs::path> out;
  for (const auto &e : fs::recursive_directory_iterator(dir))
    if (e.path().string().size() > 6 &&
        e.path().string().compare(e.path().string().size() - 6, 6, ".h.gch") == 0)
      out.push_back(e.path());
  return out;
}

fs::path freshCache(const std::string &name) {
  fs::path dir = fs::temp_directory_path() / ("braze-host-compiler-test-" + name + "-" +
                                              std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

/// A cache holding one precompiled header (built by a compile of source(n) into it, this
/// process being past its third miss) and a copy of it named `name`-copy: (cache, copy, the
/// copy's header). The tests damage the copy: in a cache it has used, the process keeps what it
/// found there.
struct Copied {
  fs::path cache, copy, gch;
};

Copied cacheWithHeaderAndCopy(const std::string &name, int n, HostCompilerOptions &o) {
  Copied c{freshCache(name), freshCache(name + "-copy"), {}};
  o.cacheDir = c.cache.string();
  EXPECT_EQ(valueOf(compileCpp(source(n), o)), n);
  EXPECT_EQ(headers(c.cache).size(), 1u);
  fs::create_directories(c.copy);
  fs::copy(c.cache, c.copy, fs::copy_options::recursive);
  c.gch = headers(c.copy).at(0);
  o.cacheDir = c.copy.string();
  return c;
}

bool haveGcc() { return std::system("g++ --version > /dev/null 2>&1") == 0; }

TEST(HostCompilerTest, PrecompiledHeaderIsBuiltAtTheThirdMissAndServesTheRest) {
  if (!haveGcc())
    GTEST_SKIP() << "no g++";
  fs::path cache = freshCache("build");
  HostCompilerOptions o;
  o.cacheDir = cache.string();
  for (int n = 3; n <= 6; ++n) {
    CompiledLibrary lib = compileCpp(source(n), o);
    EXPECT_FALSE(lib.cacheHit);
    EXPECT_EQ(valueOf(lib), n);
    // Misses 1 and 2 build none; the third builds it and compiles with it.
    EXPECT_EQ(headers(cache).size(), n < 5 ? 0u : 1u) << "after the compile of " << n;
  }
  fs::path gch = headers(cache).at(0);
  EXPECT_TRUE(cacheEntryIsValid(gch, checksumPath(gch)));
  fs::path header = gch.parent_path() / gch.stem(); // <key>.h beside <key>.h.gch
  EXPECT_TRUE(fs::exists(header));
  // A cache hit is still a hit.
  EXPECT_TRUE(compileCpp(source(6), o).cacheHit);
  fs::remove_all(cache);
}

TEST(HostCompilerTest, AHeaderWhoseChecksumFailsIsBuiltAgain) {
  if (!haveGcc())
    GTEST_SKIP() << "no g++";
  HostCompilerOptions o;
  Copied c = cacheWithHeaderAndCopy("damaged", 7, o);
  // The copy's header cut in half: its checksum fails, so the next compile builds it again.
  std::string whole = readFile(c.gch);
  ASSERT_EQ(writeFile(c.gch, whole.substr(0, whole.size() / 2)), "");
  EXPECT_EQ(valueOf(compileCpp(source(8), o)), 8);
  EXPECT_TRUE(cacheEntryIsValid(c.gch, checksumPath(c.gch)));
  EXPECT_GT(readFile(c.gch).size(), whole.size() / 2);
  fs::remove_all(c.cache);
  fs::remove_all(c.copy);
}

TEST(HostCompilerTest, AHeaderThatStopsACompileIsDroppedAndTheCompileSucceeds) {
  if (!haveGcc())
    GTEST_SKIP() << "no g++";
  HostCompilerOptions o;
  o.logCache = true;
  Copied c = cacheWithHeaderAndCopy("stopping", 9, o);
  // The copy's header cut in half with a checksum that matches it: it passes the cache's test,
  // and the compiler stops at it ("cannot read PCH file"; a file that is no header at all, it
  // ignores).
  std::string whole = readFile(c.gch), half = whole.substr(0, whole.size() / 2);
  ASSERT_EQ(writeFile(c.gch, half), "");
  ASSERT_EQ(writeFile(checksumPath(c.gch), sha256Hex(half)), "");
  testing::internal::CaptureStderr();
  CompiledLibrary lib = compileCpp(source(10), o);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(valueOf(lib), 10);
  EXPECT_NE(err.find("failed a compile that its text passes"), std::string::npos) << err;
  // The process uses no header from now on.
  EXPECT_EQ(valueOf(compileCpp(source(11), o)), 11);
  fs::remove_all(c.cache);
  fs::remove_all(c.copy);
}

} // namespace
} // namespace braze::jit
