#pragma once
/// The DLPack ABI (https://dmlc.github.io/dlpack), the structs every framework exchanges
/// tensors through. Layout-compatible with dlpack.h v0.8.
#include <cstdint>

extern "C" {

enum DLDeviceType { kDLCPU = 1, kDLCUDA = 2 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
enum DLDataTypeCode { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; ///< in elements; may be null for row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(DLManagedTensor *self);
};
}
