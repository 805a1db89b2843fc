#pragma once
/// File helpers of the on-disk compile caches: whole-file reads, atomic writes (temporary name
/// + rename) and the checksum test that decides whether an entry can be used.
#include <filesystem>
#include <mutex>
#include <string>

namespace braze::jit {

/// Part of every cache key: a new braze never reuses an old one's entries.
inline constexpr const char *kBrazeVersion = "braze-0.1.0";

/// The folder of cache entry `key` under `cacheDir`, created. When `cacheDir` cannot be
/// created or written (read-only, under a file, removed and not re-creatable), braze compiles
/// into a temporary folder of this process instead and says so once on stderr.
std::filesystem::path entryDir(const std::string &cacheDir, const std::string &key);

/// ".tmp<pid>.<n>", a fresh n per call: temporary names no other process or thread uses.
std::string temporaryTag();

/// Held while this process builds the cache entry `key`: threads that compile the same source
/// at once build it once, and the others then find it in the cache.
std::unique_lock<std::mutex> lockEntry(const std::string &key);

std::string readFile(const std::filesystem::path &p);
void writeFileAtomically(const std::filesystem::path &p, const std::string &data);
/// Both files exist and `sum` holds the SHA-256 of `entry`.
bool cacheEntryIsValid(const std::filesystem::path &entry, const std::filesystem::path &sum);

} // namespace braze::jit
