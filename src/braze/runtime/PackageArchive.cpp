/// Reading a package archive: a zip file whose entries are stored (method 0). Only what
/// braze.export writes is read: no compression, no ZIP64 (archives under 4 GiB), no
/// encryption. Layout (little-endian), from the end:
///   end of central directory   PK\5\6, ..., entry count (2 bytes at 10), directory size (4 at
///                              12), directory offset (4 at 16), comment length (2 at 20)
///   central directory entries  PK\1\2, ..., method (2 at 10), CRC-32 (4 at 16), sizes (4 at 20
///                              and 24), name length (2 at 28), extra (2 at 30), comment (2 at
///                              32), local header offset (4 at 42), then the name
///   local headers              PK\3\4, ..., name length (2 at 26), extra (2 at 28), then the
///                              name, the extra field and the data
#include "braze/runtime/PackageArchive.h"

#include "braze/runtime/Executable.h"
#include "braze/runtime/Files.h"
#include "braze/support/Hashing.h"

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <vector>

namespace braze::runtime {

namespace {

uint32_t crc32(const std::string &data, size_t begin, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = begin; i < begin + size; ++i)
    c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/// The archive's bytes with bounds-checked little-endian reads: a read past the end throws.
struct Bytes {
  const std::string &data;
  const std::string &path;

  RunError fail(const std::string &why) const {
    return RunError("braze package " + path + ": " + why);
  }
  uint64_t at(size_t offset, int width) const {
    if (offset > data.size() || data.size() - offset < static_cast<size_t>(width))
      throw fail("the archive is truncated or damaged (a record runs past its end)");
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i)
      v = v << 8 | static_cast<uint8_t>(data[offset + i]);
    return v;
  }
};

struct Entry {
  std::string name;
  uint32_t crc = 0;
  size_t size = 0, data = 0; ///< bytes, and where they start in the archive
};

/// Whether `name` stays inside the package directory: relative, no "..", no backslash.
bool safeName(const std::string &name) {
  if (name.empty() || name[0] == '/' || name.find('\\') != std::string::npos ||
      name.find('\0') != std::string::npos)
    return false;
  std::istringstream parts(name);
  for (std::string part; std::getline(parts, part, '/');)
    if (part == "..")
      return false;
  return true;
}

std::vector<Entry> readEntries(const Bytes &b) {
  const std::string &d = b.data;
  // The end record: its signature within the last 22 + 65535 bytes (a comment may follow).
  size_t end = std::string::npos;
  for (size_t i = d.size() >= 22 ? d.size() - 22 : std::string::npos;
       i != std::string::npos && d.size() - i <= 22 + 65535; --i) {
    if (b.at(i, 4) == 0x06054b50u) {
      end = i;
      break;
    }
    if (i == 0)
      break;
  }
  if (end == std::string::npos)
    throw b.fail("not a package directory or a zip archive (no end of central directory)");
  uint64_t count = b.at(end + 10, 2), offset = b.at(end + 16, 4);
  if (count == 0xFFFF || offset == 0xFFFFFFFFu)
    throw b.fail("a ZIP64 archive, which braze does not read (braze.export writes plain zip)");
  std::vector<Entry> entries;
  size_t at = offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (b.at(at, 4) != 0x02014b50u)
      throw b.fail("the archive is damaged (a central directory entry is missing)");
    uint64_t method = b.at(at + 10, 2), flags = b.at(at + 8, 2);
    Entry e;
    e.crc = static_cast<uint32_t>(b.at(at + 16, 4));
    uint64_t packed = b.at(at + 20, 4), size = b.at(at + 24, 4);
    uint64_t nameLen = b.at(at + 28, 2), extra = b.at(at + 30, 2), comment = b.at(at + 32, 2);
    uint64_t local = b.at(at + 42, 4);
    b.at(at + 46 + nameLen - 1, 1); // the name is inside the archive
    e.name = d.substr(at + 46, nameLen);
    if (method != 0 || packed != size)
      throw b.fail("entry " + e.name + " is compressed (method " + std::to_string(method) +
                   "); a package archive stores its files (braze.export writes one)");
    if (flags & 1)
      throw b.fail("entry " + e.name + " is encrypted");
    if (!safeName(e.name))
      throw b.fail("entry '" + e.name + "' is named outside the package");
    if (b.at(local, 4) != 0x04034b50u)
      throw b.fail("the archive is damaged (entry " + e.name + " has no local header)");
    e.data = local + 30 + b.at(local + 26, 2) + b.at(local + 28, 2);
    e.size = size;
    if (size)
      b.at(e.data + size - 1, 1); // the data is inside the archive
    entries.push_back(std::move(e));
    at += 46 + nameLen + extra + comment;
  }
  return entries;
}

} // namespace

std::string extractPackageArchive(const std::string &archivePath) {
  std::string data;
  if (!readWholeFile(archivePath, data))
    throw RunError("braze package " + archivePath + ": cannot be read");
  Bytes b{data, archivePath};
  std::vector<Entry> entries = readEntries(b);
  for (const Entry &e : entries)
    if (e.name.back() != '/' && crc32(data, e.data, e.size) != e.crc)
      throw b.fail("entry " + e.name + " is damaged (its CRC-32 does not match)");
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path base = fs::temp_directory_path(ec);
  if (ec)
    base = "/tmp";
  fs::path dir = base / ("braze-package-" + sha256Hex(data).substr(0, 32));
  if (fs::is_regular_file(dir / "package.txt", ec))
    return dir.string(); // extracted before (the loader checks every file's checksum)
  fs::path work = dir;
  work += ".tmp-" + std::to_string(::getpid());
  fs::remove_all(work, ec);
  for (const Entry &e : entries) {
    fs::path out = work / e.name;
    if (e.name.back() == '/') {
      fs::create_directories(out, ec);
      continue;
    }
    fs::create_directories(out.parent_path(), ec);
    std::ofstream f(out, std::ios::binary);
    f.write(data.data() + e.data, static_cast<std::streamsize>(e.size));
    if (!f)
      throw b.fail("cannot extract entry " + e.name + " into " + work.string());
  }
  fs::rename(work, dir, ec);
  if (ec) { // another process extracted the same archive first: use its copy
    fs::remove_all(work, ec);
    if (!fs::is_regular_file(dir / "package.txt", ec))
      throw b.fail("cannot extract the archive into " + dir.string());
  }
  return dir.string();
}

} // namespace braze::runtime
