#pragma once
/// File helpers of the on-disk compile caches: whole-file reads, atomic writes (temporary name
/// + rename), the checksum test that decides whether an entry can be used, and the lock that
/// lets one thread or process build an entry while the others wait for it.
///
/// A cache that cannot be used (read-only, full, removed and not re-creatable) never stops a
/// compile: braze then compiles into this process's temporary folder and says so once on stderr.
#include <filesystem>
#include <mutex>
#include <string>

namespace braze::jit {

/// Part of every cache key: a new braze never reuses an old one's entries.
inline constexpr const char *kBrazeVersion = "braze-0.1.0";

/// This process's temporary folder, created: compilers write their inputs and outputs here,
/// and entries go here when the cache cannot be used. Throws a Diagnostic if it cannot be made.
std::filesystem::path scratchDir();

/// The folder of cache entry `key` under `cacheDir`, created. When `cacheDir` cannot be
/// created or written, or a write into it failed earlier in this process (storeEntry), it is a
/// folder under scratchDir() instead.
std::filesystem::path entryDir(const std::string &cacheDir, const std::string &key);

/// ".tmp<pid>.<n>", a fresh n per call: temporary names no other process or thread uses.
std::string temporaryTag();

/// Held while this process builds cache entry `key` in `dir`: threads (a mutex per key) and
/// processes (flock on <dir>/<key>.lock) that compile the same source at once build it once,
/// and the others then find it in the cache. Where the lock file cannot be made, only this
/// process's threads are kept apart.
class EntryLock {
public:
  EntryLock(const std::filesystem::path &dir, const std::string &key);
  ~EntryLock();
  EntryLock(const EntryLock &) = delete;
  EntryLock &operator=(const EntryLock &) = delete;

private:
  std::unique_lock<std::mutex> thread_;
  int fd_ = -1;
};

/// The whole file; "" when it cannot be read.
std::string readFile(const std::filesystem::path &p);
/// Writes `data` to `p`; the error text, or "" when every byte reached the file.
std::string writeFile(const std::filesystem::path &p, const std::string &data);
/// writeFile to a temporary name, then a rename onto `p`; the error text, or "" on success.
/// On failure `p` is untouched and the temporary file is removed.
std::string writeFileAtomically(const std::filesystem::path &p, const std::string &data);
/// Both files exist and `sum` holds the SHA-256 of `entry`.
bool cacheEntryIsValid(const std::filesystem::path &entry, const std::filesystem::path &sum);
/// The checksum file of a compiled entry: <key>.sha256 for a host library (<key>.so), else
/// the entry's name with ".sha256" appended (<key>.cubin.sha256).
std::filesystem::path checksumPath(const std::filesystem::path &entry);

/// Stores `data` as the entry `entry` (from entryDir(cacheDir, ...)) with its checksum file
/// `sum`, and returns where the entry now is: `entry`, or, when the cache cannot take it (full,
/// read-only, removed), the same name under scratchDir(); `cacheDir` is then not used again by
/// this process (said once). Throws a Diagnostic if the entry cannot be written anywhere.
std::filesystem::path storeEntry(const std::string &cacheDir, const std::filesystem::path &entry,
                                 const std::filesystem::path &sum, const std::string &data);

} // namespace braze::jit
