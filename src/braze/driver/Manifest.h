#pragma once
/// The compile manifest: an on-disk cache entry that maps a graph, as printed, and the options
/// that shape its code to what compiling it produced (the host library, the cubins, the
/// kernel names, the deferred kernels' sources, the generated text). A process that finds it
/// loads the module without lowering the graph again, so a warm start compiles nothing.
///
/// Key: SHA-256 of the graph's text (printGraph, which prints every node, attribute, type
/// and layout, doubles to the last bit), the options that reach lowering and code generation,
/// the target's fingerprint and the identity of this braze build (the SHA-256 of its module: a
/// rebuilt braze never reads an older build's manifests, and two installs of one build share
/// them). Entries are
/// written atomically and verified on load, as the other cache entries are; an entry that does
/// not parse, or whose files are gone or fail their checksums, is a miss. Paths are stored
/// relative to the cache (a cache copied whole still serves); a compile whose files went
/// elsewhere (a cache that could not take them) records no manifest. A compile that logs a
/// stage of the lowering (BRAZE_LOG=graph, ..., output_code) does not read one. With a shared
/// cache (CompileOptions::remoteCacheDir), a local miss copies the shared entry in (copyEntry)
/// and a compile copies its entry out.
#include "braze/driver/Compile.h"

#include <optional>
#include <string>
#include <vector>

namespace braze {

/// What a manifest records: CompileResult's fields and the part of ModuleSpec that lowering
/// decides (the rest comes from the graph and the options).
struct ManifestEntry {
  std::string libraryPath;
  bool cuda = false;
  std::vector<std::string> cubinPaths, kernels;
  std::vector<std::pair<std::string, std::string>> deferred; ///< kernel name, NVRTC program
  bool usesGemm = false, usesCudnn = false, checksIndices = false;
  std::string source;
  int numKernels = 0;
  /// The autotuner's cuBLASLt algorithms and cuDNN engines (runtime::ModuleSpec::libraryChoices).
  std::vector<runtime::LibraryChoice> libraryChoices;
};

/// The manifest key of `g` compiled with `opts` (before any pass rewrites g).
std::string manifestKey(const Graph &g, const CompileOptions &opts);

/// The entry stored under `key`, when it is valid and every file it names exists.
std::optional<ManifestEntry> readManifest(const std::string &cacheDir, const std::string &key,
                                          bool logCache);

/// Stores `e` under `key` (a cache that cannot take it is left alone: the next process lowers
/// the graph again).
void writeManifest(const std::string &cacheDir, const std::string &key, const ManifestEntry &e,
                   bool logCache);

/// Copies the entry stored under `key` in cache `from` (its manifest and every file it names,
/// each with its checksum, at the same paths) into cache `to`, unless `to` has it already:
/// whether `to` now has it. A shared cache's entries reach the local one this way, and a local
/// compile reaches the shared one. Writes are atomic (a temporary name, then a rename), so
/// processes copying one entry at once each leave it whole. A damaged or missing entry copies
/// nothing; a shared cache that cannot be used is said once (as a local one is) and left alone.
bool copyEntry(const std::string &from, const std::string &to, const std::string &key,
               bool logCache);

/// The shared cache in Redis (BRAZE_REMOTE_CACHE=redis://host:port): copies the entry stored
/// under `key` at `address` into the local cache `to` (every file with its checksum, checked;
/// the manifest last), unless `to` has it already: whether `to` now has it. A server that does
/// not answer is said once and left alone for the rest of the process (jit::RedisCache).
bool fetchRedisEntry(const std::string &address, const std::string &to, const std::string &key,
                     bool logCache);
/// Stores the local entry under `key` in cache `from` at the Redis server `address`.
void storeRedisEntry(const std::string &from, const std::string &address, const std::string &key,
                     bool logCache);

/// The entry as text and back (exposed for the tests): nothing when `text` is not a whole
/// entry.
std::string manifestText(const ManifestEntry &e);
std::optional<ManifestEntry> parseManifest(const std::string &text);

} // namespace braze
