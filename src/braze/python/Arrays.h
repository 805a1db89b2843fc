#pragma once
/// Arrays between Python and braze's runtime (internal to the nanobind module): DLTensor views
/// of nanobind arrays on any device, and a run on CPU arrays whose outputs go to torch without
/// copies.
#include "braze/runtime/Executable.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <vector>

namespace braze {

namespace nb = nanobind;

using CpuArray = nb::ndarray<nb::device::cpu>;
using TorchArray = nb::ndarray<nb::pytorch, nb::device::cpu>;

/// DLTensor views of arrays on any device (they point into the arrays).
template <typename Array> inline std::vector<DLTensor> dlViews(std::vector<Array> &arrays) {
  std::vector<DLTensor> views(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    Array &a = arrays[i];
    DLTensor &v = views[i];
    v.data = const_cast<void *>(static_cast<const void *>(a.data()));
    v.device = DLDevice{static_cast<DLDeviceType>(a.device_type()), a.device_id()};
    v.ndim = static_cast<int32_t>(a.ndim());
    nb::dlpack::dtype t = a.dtype();
    v.dtype = DLDataType{t.code, t.bits, t.lanes};
    v.shape = const_cast<int64_t *>(a.shape_ptr());
    v.strides = const_cast<int64_t *>(a.stride_ptr());
    v.byte_offset = 0;
  }
  return views;
}

template <typename T> inline std::vector<T *> viewPointers(std::vector<DLTensor> &views) {
  std::vector<T *> out;
  for (DLTensor &v : views)
    out.push_back(&v);
  return out;
}

/// Runs `call` (DLTensor inputs -> owned outputs) on CPU arrays, without the GIL, and hands
/// the outputs to torch without copies.
template <typename Call>
inline std::vector<TorchArray> runOnArrays(std::vector<CpuArray> &inputs, Call &&call) {
  std::vector<DLTensor> views = dlViews(inputs);
  std::vector<const DLTensor *> ptrs = viewPointers<const DLTensor>(views);
  std::vector<std::unique_ptr<runtime::OwnedTensor>> outs;
  {
    nb::gil_scoped_release release;
    outs = call(ptrs);
  }
  std::vector<TorchArray> result;
  for (auto &o : outs) {
    runtime::OwnedTensor *raw = o.release();
    nb::capsule owner(raw, [](void *p) noexcept { delete static_cast<runtime::OwnedTensor *>(p); });
    std::vector<size_t> shape(raw->shape().begin(), raw->shape().end());
    DLDataType t = raw->dtype();
    result.emplace_back(raw->data(), shape.size(), shape.data(), owner, raw->strides().data(),
                        nb::dlpack::dtype{t.code, t.bits, t.lanes});
  }
  return result;
}

} // namespace braze
