#include "braze/jit/CacheFiles.h"

#include "braze/support/Diagnostic.h"
#include "braze/support/Hashing.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <sys/file.h>
#include <unistd.h>

namespace braze::jit {

namespace fs = std::filesystem;

namespace {

std::mutex replacedMutex;
std::map<std::string, fs::path> replaced; // cache dirs this process no longer uses -> scratch

/// Creates `dir` and a file in it; the error text if either fails.
std::string probeWritable(const fs::path &dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return ec.message();
  fs::path probe = dir / ("probe" + temporaryTag());
  std::string why = writeFile(probe, "braze");
  fs::remove(probe, ec);
  return why;
}

/// Stops using `cacheDir` for the rest of the process, saying so (with `why`) the first time;
/// returns the folder that takes its place.
fs::path useScratchInstead(const std::string &cacheDir, const std::string &why) {
  fs::path scratch = scratchDir();
  std::lock_guard<std::mutex> lock(replacedMutex);
  if (replaced.emplace(cacheDir, scratch).second)
    std::fprintf(stderr,
                 "braze: the cache directory %s cannot be used (%s); compiling without it, into "
                 "%s\n",
                 cacheDir.c_str(), why.c_str(), scratch.string().c_str());
  return scratch;
}

/// `dir`, created; a Diagnostic naming it if it cannot be.
fs::path created(const fs::path &dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    BRAZE_USER_ERROR("compile", "") << "cannot create the folder " << dir.string() << ": "
                                    << ec.message();
  return dir;
}

std::mutex &keyMutex(const std::string &key) {
  static std::mutex mapMutex;
  static std::map<std::string, std::unique_ptr<std::mutex>> locks; // one per key, kept
  std::lock_guard<std::mutex> guard(mapMutex);
  std::unique_ptr<std::mutex> &slot = locks[key];
  if (!slot)
    slot = std::make_unique<std::mutex>();
  return *slot;
}

} // namespace

fs::path scratchDir() {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec)
    BRAZE_USER_ERROR("compile", "") << "no temporary folder: " << ec.message();
  fs::path dir = tmp / ("braze-cache-" + std::to_string(::getpid()));
  /// Cleared at exit: the entries stored here in place of an unusable cache (its bucket
  /// folders; no later process looks here) go, and so does the folder once empty. The source
  /// of a compile that failed stays, since its error names it.
  struct ClearedAtExit {
    fs::path dir;
    ~ClearedAtExit() {
      std::error_code ec;
      for (const fs::directory_entry &e : fs::directory_iterator(dir, ec))
        if (e.is_directory(ec))
          fs::remove_all(e.path(), ec);
      fs::remove(dir, ec); // removes only an empty folder
    }
  };
  static const ClearedAtExit cleared{dir};
  return created(dir);
}

fs::path entryDir(const std::string &cacheDir, const std::string &key) {
  std::string bucket = key.substr(0, 2);
  {
    std::lock_guard<std::mutex> lock(replacedMutex);
    if (auto it = replaced.find(cacheDir); it != replaced.end())
      return created(it->second / bucket);
  }
  fs::path dir = fs::path(cacheDir) / bucket;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string why = ec ? ec.message() : "";
  if (why.empty()) {
    // Creating the folder succeeds on a folder that exists read-only: probe a write once.
    static std::mutex probeMu;
    static std::map<std::string, std::string> probed;
    std::lock_guard<std::mutex> lock(probeMu);
    auto it = probed.find(cacheDir);
    if (it == probed.end())
      it = probed.emplace(cacheDir, probeWritable(dir)).first;
    why = it->second;
  }
  if (why.empty())
    return dir;
  return created(useScratchInstead(cacheDir, why) / bucket);
}

std::string temporaryTag() {
  static std::atomic<uint64_t> next{0};
  return ".tmp" + std::to_string(::getpid()) + "." + std::to_string(next++);
}

EntryLock::EntryLock(const fs::path &dir, const std::string &key)
    : thread_(keyMutex(key)) {
  fd_ = ::open((dir / (key + ".lock")).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    return;
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

EntryLock::~EntryLock() {
  if (fd_ >= 0)
    ::close(fd_); // releases the flock
}

std::string readFile(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string writeFile(const fs::path &p, const std::string &data) {
  auto failed = [&](const char *what) {
    return std::string("cannot ") + what + " " + p.string() + ": " + std::strerror(errno);
  };
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return failed("create");
  for (size_t done = 0; done < data.size();) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = ENOSPC;
      std::string why = failed("write");
      ::close(fd);
      return why;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0)
    return failed("write");
  return "";
}

std::string writeFileAtomically(const fs::path &p, const std::string &data) {
  fs::path tmp = p;
  tmp += temporaryTag();
  std::string why = writeFile(tmp, data);
  std::error_code ec;
  if (why.empty()) {
    fs::rename(tmp, p, ec);
    if (ec)
      why = "cannot rename " + tmp.string() + " to " + p.string() + ": " + ec.message();
  }
  if (!why.empty())
    fs::remove(tmp, ec);
  return why;
}

bool cacheEntryIsValid(const fs::path &entry, const fs::path &sum) {
  std::error_code ec;
  if (!fs::exists(entry, ec) || !fs::exists(sum, ec))
    return false;
  return readFile(sum) == sha256Hex(readFile(entry));
}

fs::path storeEntry(const std::string &cacheDir, const fs::path &entry, const fs::path &sum,
                    const std::string &data) {
  std::string checksum = sha256Hex(data);
  std::string why = writeFileAtomically(entry, data);
  if (why.empty())
    why = writeFileAtomically(sum, checksum);
  if (why.empty())
    return entry;
  std::error_code ec;
  fs::remove(entry, ec); // half an entry is no entry (the caller holds its EntryLock)
  fs::remove(sum, ec);
  fs::path dir = created(useScratchInstead(cacheDir, why) / entry.parent_path().filename());
  if (dir == entry.parent_path()) // the scratch folder itself failed
    BRAZE_USER_ERROR("compile", "") << "cannot store the compiled code: " << why;
  fs::path moved = dir / entry.filename();
  why = writeFileAtomically(moved, data);
  if (why.empty())
    why = writeFileAtomically(dir / sum.filename(), checksum);
  if (!why.empty())
    BRAZE_USER_ERROR("compile", "") << "cannot store the compiled code: " << why;
  return moved;
}

std::filesystem::path checksumPath(const std::filesystem::path &entry) {
  if (entry.extension() == ".so")
    return std::filesystem::path(entry).replace_extension(".sha256");
  return entry.string() + ".sha256";
}

} // namespace braze::jit
