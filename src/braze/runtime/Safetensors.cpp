#include "braze/runtime/Safetensors.h"

#include "braze/runtime/Executable.h"
#include "braze/runtime/Files.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace braze::runtime {

namespace {

/// A small JSON reader for the header: objects, arrays, strings (with \" and \\ escapes) and
/// integers, which is all a safetensors header holds.
class Json {
public:
  explicit Json(const std::string &text) : s_(text) {}

  void expect(char c) {
    space();
    if (at_ >= s_.size() || s_[at_] != c)
      fail(std::string("expected '") + c + "'");
    ++at_;
  }
  bool consume(char c) {
    space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (at_ < s_.size() && s_[at_] != '"') {
      if (s_[at_] == '\\' && at_ + 1 < s_.size())
        ++at_;
      out += s_[at_++];
    }
    expect('"');
    return out;
  }
  int64_t integer() {
    space();
    size_t start = at_;
    if (at_ < s_.size() && s_[at_] == '-')
      ++at_;
    while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_])))
      ++at_;
    if (start == at_ || (s_[start] == '-' && start + 1 == at_))
      fail("expected an integer");
    errno = 0;
    long long v = std::strtoll(s_.substr(start, at_ - start).c_str(), nullptr, 10);
    if (errno == ERANGE)
      fail("an integer out of range");
    return v;
  }
  std::vector<int64_t> integers() {
    std::vector<int64_t> out;
    expect('[');
    if (consume(']'))
      return out;
    do
      out.push_back(integer());
    while (consume(','));
    expect(']');
    return out;
  }
  void end() {
    space();
    if (at_ != s_.size())
      fail("text after the header's object");
  }
  [[noreturn]] void fail(const std::string &why) {
    throw RunError("malformed safetensors header at byte " + std::to_string(at_) + ": " + why);
  }

private:
  void space() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_])))
      ++at_;
  }
  const std::string &s_;
  size_t at_ = 0;
};

std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

} // namespace

const std::vector<DTypeNames> &dtypeNames() {
  static const std::vector<DTypeNames> names = {
      {"bool", "BOOL", {kDLBool, 8, 1}},   {"u8", "U8", {kDLUInt, 8, 1}},
      {"i8", "I8", {kDLInt, 8, 1}},        {"i16", "I16", {kDLInt, 16, 1}},
      {"i32", "I32", {kDLInt, 32, 1}},     {"i64", "I64", {kDLInt, 64, 1}},
      {"f16", "F16", {kDLFloat, 16, 1}},   {"bf16", "BF16", {kDLBfloat, 16, 1}},
      {"f32", "F32", {kDLFloat, 32, 1}},   {"f64", "F64", {kDLFloat, 64, 1}}};
  return names;
}

std::string safetensorsDType(DLDataType t) {
  for (const DTypeNames &n : dtypeNames())
    if (n.type.code == t.code && n.type.bits == t.bits && n.type.lanes == t.lanes)
      return n.safetensors;
  throw RunError("a dtype safetensors cannot hold (code " + std::to_string(t.code) + ", " +
                 std::to_string(t.bits) + " bits)");
}

DLDataType fromSafetensorsDType(const std::string &name) {
  for (const DTypeNames &n : dtypeNames())
    if (name == n.safetensors)
      return n.type;
  throw RunError("unknown safetensors dtype '" + name + "'");
}

SafetensorsFile readSafetensors(const std::string &path) {
  std::string bytes;
  if (!readWholeFile(path, bytes))
    throw RunError("cannot read " + path);
  auto fail = [&](const std::string &why) { return RunError(path + ": " + why); };
  if (bytes.size() < 8)
    throw fail("shorter than a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8)
    throw fail("its header length runs past the file");
  const std::string header = bytes.substr(8, n);
  const size_t dataStart = 8 + n, dataBytes = bytes.size() - dataStart;
  SafetensorsFile file;
  try {
    Json j(header);
    j.expect('{');
    if (!j.consume('}')) {
      do {
        std::string name = j.string();
        j.expect(':');
        j.expect('{');
        if (name == "__metadata__") {
          if (!j.consume('}')) {
            do {
              std::string key = j.string();
              j.expect(':');
              file.metadata[key] = j.string();
            } while (j.consume(','));
            j.expect('}');
          }
          continue;
        }
        SafeTensor t;
        std::vector<int64_t> offsets;
        bool haveType = false;
        do {
          std::string key = j.string();
          j.expect(':');
          if (key == "dtype") {
            t.dtype = fromSafetensorsDType(j.string());
            haveType = true;
          } else if (key == "shape") {
            t.shape = j.integers();
          } else if (key == "data_offsets") {
            offsets = j.integers();
          } else {
            j.fail("unknown key '" + key + "'");
          }
        } while (j.consume(','));
        j.expect('}');
        if (!haveType || offsets.size() != 2)
          j.fail("tensor '" + name + "' lacks its dtype or data_offsets");
        int64_t count = 1;
        for (int64_t d : t.shape) {
          if (d < 0)
            j.fail("tensor '" + name + "' has a negative dim");
          if (d > 0 && count > (int64_t(1) << 56) / d)
            j.fail("tensor '" + name + "' is larger than any file");
          count *= d;
        }
        const int64_t size = count * ((t.dtype.bits * t.dtype.lanes + 7) / 8);
        if (offsets[0] < 0 || offsets[1] < offsets[0] ||
            static_cast<uint64_t>(offsets[1]) > dataBytes || offsets[1] - offsets[0] != size)
          j.fail("tensor '" + name + "' has offsets that do not fit its shape or the data");
        t.data = bytes.substr(dataStart + offsets[0], size);
        file.tensors[name] = std::move(t);
      } while (j.consume(','));
      j.expect('}');
    }
    j.end();
  } catch (const RunError &e) {
    throw fail(e.what());
  }
  return file;
}

void writeSafetensors(const std::string &path, const SafetensorsFile &file) {
  std::string header = "{", data;
  for (const auto &[name, t] : file.tensors) {
    header += (header.size() > 1 ? "," : "") + quoted(name) + ":{\"dtype\":" +
              quoted(safetensorsDType(t.dtype)) + ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i)
      header += (i ? "," : "") + std::to_string(t.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.data.size()) + "]}";
    data += t.data;
  }
  if (!file.metadata.empty()) {
    header += std::string(header.size() > 1 ? "," : "") + "\"__metadata__\":{";
    bool first = true;
    for (const auto &[k, v] : file.metadata) {
      header += (first ? "" : ",") + quoted(k) + ":" + quoted(v);
      first = false;
    }
    header += "}";
  }
  header += "}";
  header += std::string((8 - (header.size() % 8)) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out << header << data;
  if (!out)
    throw RunError("cannot write " + path);
}

} // namespace braze::runtime
