#pragma once
/// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON header
/// {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
/// "__metadata__": {"key": "value"}}, then the raw data. braze-opt --run reads its inputs and
/// reference outputs from one; the accuracy checker writes them.
#include "braze/runtime/DLPack.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace braze::runtime {

struct SafeTensor {
  DLDataType dtype{};
  std::vector<int64_t> shape;
  std::string data; ///< row-major bytes
};

struct SafetensorsFile {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads `path`; throws RunError naming what is wrong (a short file, a malformed header, a
/// tensor whose bytes do not match its shape and dtype, offsets outside the data).
SafetensorsFile readSafetensors(const std::string &path);

/// Writes `file` to `path` (tensors in name order).
void writeSafetensors(const std::string &path, const SafetensorsFile &file);

/// A dtype's names: a package's (Package.h: "f32", "bf16", ...) and safetensors' ("F32", ...).
struct DTypeNames {
  const char *package;
  const char *safetensors;
  DLDataType type;
};
/// Every dtype packages and safetensors files hold.
const std::vector<DTypeNames> &dtypeNames();

/// safetensors' dtype name for a DLPack type ("F32", "BF16", ...), and back (RunError if unknown).
std::string safetensorsDType(DLDataType t);
DLDataType fromSafetensorsDType(const std::string &name);

} // namespace braze::runtime
