// The compile manifest: its text reads back to the same entry, anything else is not an entry,
// and a graph compiled once loads from it, without lowering, in the next compile of the same
// graph and options (and only then).
#include "braze/driver/Manifest.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/jit/CacheFiles.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

namespace braze {
namespace {

ManifestEntry cudaEntry() {
  ManifestEntry e;
  e.libraryPath = "ab/ab12.so";
  e.cuda = true;
  e.cubinPaths = {"cd/cd34.cubin", "ef/ef56.cubin"};
  e.kernels = {"kernel0", "kernel1", "kernel0"};
  e.deferred = {{"kernel1", "extern \"C\" __global__ void kernel1() {}\n// 7 2\n"}};
  e.usesGemm = true;
  e.checksIndices = true;
  e.source = "line one\nsource 12\n\nwith a record's look\n";
  e.numKernels = 2;
  using runtime::LibraryKind;
  // A convolution's choice is an engine's global index, which may run past two digits.
  e.libraryChoices = {{LibraryKind::Gemm, "gemm_64_128_32_1", 3},
                      {LibraryKind::Gemm, "gemm_8_8_8_0", 0},
                      {LibraryKind::Convolution, "conv_0_4_1_0_16", 1301},
                      {LibraryKind::Attention, "attention_-1_3_1_4_16", 8}};
  return e;
}

TEST(ManifestTest, TextReadsBack) {
  ManifestEntry e = cudaEntry();
  std::optional<ManifestEntry> back = parseManifest(manifestText(e));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->libraryPath, e.libraryPath);
  EXPECT_TRUE(back->cuda);
  EXPECT_EQ(back->cubinPaths, e.cubinPaths);
  EXPECT_EQ(back->kernels, e.kernels);
  EXPECT_EQ(back->deferred, e.deferred);
  EXPECT_TRUE(back->usesGemm);
  EXPECT_FALSE(back->usesCudnn);
  EXPECT_TRUE(back->checksIndices);
  EXPECT_EQ(back->source, e.source);
  EXPECT_EQ(back->numKernels, 2);
  EXPECT_EQ(back->libraryChoices, e.libraryChoices);
}

TEST(ManifestTest, AnythingButAWholeEntryIsNone) {
  const std::string text = manifestText(cudaEntry());
  for (size_t cut = 0; cut < text.size(); ++cut)
    EXPECT_FALSE(parseManifest(text.substr(0, cut))) << "cut at " << cut;
  EXPECT_FALSE(parseManifest(text + "x"));
  EXPECT_FALSE(parseManifest("braze-manifest 2" + text.substr(text.find('\n'))));
  std::string unknown = text;
  unknown.replace(unknown.find("gemm 1"), 6, "gamm 1");
  EXPECT_FALSE(parseManifest(unknown));
  std::string badChoice = text;
  badChoice.replace(badChoice.find("gemm_8_8_8_0 0"), 14, "gemm_8_8_8_0 x");
  EXPECT_FALSE(parseManifest(badChoice));
  // The kind is the line's name, not read from the key: a line of an older manifest (its
  // choices were positions in a list) is not taken for an engine.
  std::string older = text;
  older.replace(older.find("conv_engine"), 11, "library_choice");
  EXPECT_FALSE(parseManifest(older));
  std::string misnamed = text;
  misnamed.replace(misnamed.find("attention_engine"), 16, "attention_engines");
  EXPECT_FALSE(parseManifest(misnamed));
  std::string longer = text;
  longer.replace(longer.find("library 10"), 10, "library 11");
  EXPECT_FALSE(parseManifest(longer));
  // Random byte flips never crash the parser.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string t = text;
    t[rng() % t.size()] = static_cast<char>(rng() % 256);
    (void)parseManifest(t);
  }
}

std::unique_ptr<Graph> graphOf(const std::string &factor) {
  return parseGraph("graph(%x: f32[4, 8]) {\n"
                    "  %c = full() {value=" + factor + "} : f32[]\n"
                    "  %y = mul(%x, %c) : f32[4, 8]\n"
                    "  %s = sum(%y) {dims=[1], keepdim=false} : f32[4]\n"
                    "  return %s\n}\n");
}

TEST(ManifestTest, SecondCompileLoadsWithoutLowering) {
  namespace fs = std::filesystem;
  fs::path cache = fs::temp_directory_path() / ("braze-manifest-test-" + jit::temporaryTag());
  CompileOptions o;
  o.cacheDir = cache.string();
  int64_t before = counters().cacheHits.load();
  std::unique_ptr<Graph> g = graphOf("3.0");
  std::string key = manifestKey(*g, o);
  EXPECT_FALSE(readManifest(o.cacheDir, key, false));
  CompileResult first = compile(*g, o);
  EXPECT_FALSE(first.cacheHit);
  std::optional<ManifestEntry> stored = readManifest(o.cacheDir, key, false);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->source, first.source);
  EXPECT_EQ(stored->libraryPath.rfind(o.cacheDir, 0), 0u) << stored->libraryPath;

  // The next compile of the graph returns what the manifest records (a source marked here,
  // which lowering would not produce).
  stored->source = "// recorded\n" + stored->source;
  writeManifest(o.cacheDir, key, *stored, false);
  g = graphOf("3.0");
  CompileResult second = compile(*g, o);
  EXPECT_TRUE(second.cacheHit);
  EXPECT_EQ(second.source, stored->source);
  EXPECT_EQ(counters().cacheHits.load(), before + 1);
  // It runs: 3 * x summed over 8 ones.
  std::vector<float> x(32, 1.0f);
  std::vector<int64_t> xs{4, 8};
  DLTensor in{x.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs.data(), nullptr, 0};
  std::vector<std::unique_ptr<runtime::OwnedTensor>> out = second.executable->run({&in});
  ASSERT_EQ(out.size(), 1u);
  for (int i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(static_cast<const float *>(out[0]->data())[i], 24.0f);

  // Another constant, another option, a log of a stage: no manifest of the first graph serves.
  std::unique_ptr<Graph> other = graphOf("3.0000000000000004");
  EXPECT_NE(manifestKey(*other, o), key);
  CompileOptions unfused = o;
  unfused.fuse = false;
  EXPECT_NE(manifestKey(*graphOf("3.0"), unfused), key);
  // The tuned module is another module, on the CPU as on CUDA.
  CompileOptions tuned = o;
  tuned.autotuneSeconds = 1;
  EXPECT_NE(manifestKey(*graphOf("3.0"), tuned), key);
  CompileOptions logged = o;
  logged.log.add(LogStage::Schedule);
  g = graphOf("3.0");
  int64_t hits = counters().cacheHits.load();
  testing::internal::CaptureStderr();
  CompileResult third = compile(*g, logged);
  std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("kernel0"), std::string::npos) << said;
  EXPECT_EQ(third.source, first.source); // lowered again
  EXPECT_EQ(counters().cacheHits.load(), hits + 1); // the library, found in the cache
  fs::remove_all(cache);
}

} // namespace
} // namespace braze
