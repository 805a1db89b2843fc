// braze._C's package bindings: braze::runtime::Package (load, run on CPU arrays, run into
// caller-allocated arrays on any device, the signature) and the package functions.
#include "braze/python/Arrays.h"
#include "braze/runtime/Package.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

using namespace nanobind::literals;

namespace braze {

namespace {

/// A package's tensor record as a dict: name, dtype, shape (ints and symbol names).
nb::dict packageTensor(const runtime::PackageTensor &t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = t.dtype;
  nb::list shape;
  for (const runtime::PackageDim &dim : t.shape) {
    if (dim.symbol.empty())
      shape.append(dim.value);
    else
      shape.append(dim.symbol);
  }
  d["shape"] = shape;
  if (!t.strides.empty())
    d["strides"] = t.strides;
  return d;
}

} // namespace

void bindPackage(nb::module_ &m) {
  nb::class_<runtime::Package>(m, "Package")
      .def_static("load", &runtime::Package::load, "path"_a, "device"_a = 0,
                  "cuda_graphs"_a = true,
                  "Loads a package written by braze.export (a CUDA one onto CUDA device "
                  "`device`, replaying CUDA graphs unless `cuda_graphs` is false).")
      .def_prop_ro("cuda_graph_stats", [](runtime::Package &p) {
        runtime::PackageGraphs::Stats s = p.cudaGraphStats();
        nb::dict d;
        d["captures"] = s.captures;
        d["replays"] = s.replays;
        d["uncaptured"] = s.uncaptured;
        d["off"] = s.off;
        return d;
      })
      .def_prop_ro("device", [](runtime::Package &p) {
        DLDevice d = p.device();
        return nb::make_tuple(d.device_type == kDLCUDA ? "cuda" : "cpu", d.device_id);
      })
      // Any device: the outputs' (shape, strides) for these inputs, and a run into outputs the
      // caller allocated so (torch tensors), enqueued on `stream` (a cudaStream_t as an int).
      .def("output_layouts", [](runtime::Package &p, std::vector<nb::ndarray<>> inputs) {
        std::vector<DLTensor> views = dlViews(inputs);
        std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
        for (auto &l : p.outputLayouts(viewPointers<const DLTensor>(views)))
          out.emplace_back(l.shape, l.strides);
        return out;
      })
      .def("run_into", [](runtime::Package &p, std::vector<nb::ndarray<>> inputs,
                          std::vector<nb::ndarray<>> outputs, uintptr_t stream) {
        std::vector<DLTensor> in = dlViews(inputs), out = dlViews(outputs);
        nb::gil_scoped_release release;
        p.run(viewPointers<const DLTensor>(in), viewPointers<DLTensor>(out),
              reinterpret_cast<void *>(stream));
      }, "inputs"_a, "outputs"_a, "stream"_a = 0)
      .def("run", [](runtime::Package &p, std::vector<CpuArray> inputs) {
        return runOnArrays(inputs, [&](const std::vector<const DLTensor *> &ptrs) {
          return p.run(ptrs);
        });
      })
      .def_prop_ro("format_version", &runtime::Package::formatVersion)
      .def_prop_ro("signature", [](runtime::Package &p) {
        nb::dict d;
        nb::list inputs, outputs;
        for (const runtime::PackageTensor &t : p.signature().inputs)
          inputs.append(packageTensor(t));
        for (const runtime::PackageTensor &t : p.signature().outputs)
          outputs.append(packageTensor(t));
        nb::dict symbols;
        for (const runtime::PackageSymbol &s : p.signature().symbols)
          symbols[s.name.c_str()] = nb::make_tuple(s.min, s.max);
        d["inputs"] = inputs;
        d["outputs"] = outputs;
        d["symbols"] = symbols;
        return d;
      });
  m.def("cpu_features", &runtime::cpuFeatures,
        "The CPU features of this machine that a package records (GCC's names).");
  m.def("package_format_version", [] { return runtime::Package::kFormatVersion; });
}

} // namespace braze
