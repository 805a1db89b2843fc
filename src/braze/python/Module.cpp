// braze._C: a thin nanobind layer over the C++ library. Python refers to graph nodes and
// symbolic sizes by integer handles; all compiler logic stays in C++.
#include "braze/driver/Autotune.h"
#include "braze/driver/Compile.h"
#include "braze/runtime/CudaModule.h"
#include "braze/ir/graph/Builder.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/python/Arrays.h"
#include "braze/support/Check.h"
#include "braze/support/Diagnostic.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;

namespace braze {
namespace {

/// CompileOptions::Cuda from the Python backend's description of the device.
CompileOptions::Cuda cudaOptions(const nb::dict &d) {
  CompileOptions::Cuda c;
  if (d.contains("device"))
    c.device = nb::cast<int>(d["device"]);
  if (d.contains("cc"))
    c.computeCapability = nb::cast<int>(d["cc"]);
  if (d.contains("sms"))
    c.multiprocessors = nb::cast<int>(d["sms"]);
  if (d.contains("registers"))
    c.registerBytesPerSm = nb::cast<int64_t>(d["registers"]);
  if (d.contains("kernel_arg_bytes"))
    c.kernelArgBytes = nb::cast<int64_t>(d["kernel_arg_bytes"]);
  if (d.contains("nvrtc"))
    c.nvrtcLibrary = nb::cast<std::string>(d["nvrtc"]);
  if (d.contains("cublaslt"))
    c.cublasLtLibrary = nb::cast<std::string>(d["cublaslt"]);
  if (d.contains("cudnn"))
    c.cudnnLibrary = nb::cast<std::string>(d["cudnn"]);
  if (d.contains("matmul_tf32"))
    c.matmulTf32 = nb::cast<bool>(d["matmul_tf32"]);
  if (d.contains("conv_tf32"))
    c.convTf32 = nb::cast<bool>(d["conv_tf32"]);
  if (d.contains("cudnn_attention"))
    c.cudnnAttention = nb::cast<bool>(d["cudnn_attention"]);
  return c;
}

DType dtypeFromName(const std::string &name) {
  auto t = parseDType(name);
  if (!t)
    BRAZE_USER_ERROR("dtype", "") << "unknown dtype '" << name << "'";
  return *t;
}

OpKind opFromName(const std::string &name) {
  OpKind k;
  if (!parseOpKind(name, k))
    BRAZE_USER_ERROR(name, "") << "unknown op";
  return k;
}

/// A graph under construction plus handle tables.
class PyGraph {
public:
  PyGraph() : g_(std::make_unique<Graph>()), b_(*g_) {}

  int sym(SymExpr e) {
    syms_.push_back(e);
    return static_cast<int>(syms_.size()) - 1;
  }
  SymExpr symAt(int h) const {
    live();
    return syms_.at(h);
  }
  std::vector<SymExpr> shape(const std::vector<int> &hs) const {
    std::vector<SymExpr> out;
    for (int h : hs)
      out.push_back(symAt(h));
    return out;
  }
  int node(Node *n) {
    nodes_.push_back(n);
    return static_cast<int>(nodes_.size()) - 1;
  }
  Node *at(int h) const {
    live();
    return nodes_.at(h);
  }

  Graph &graph() {
    live();
    return *g_;
  }
  GraphBuilder &builder() {
    live();
    return b_;
  }
  std::unique_ptr<Graph> take() { return std::move(g_); }
  bool consumed() const { return !g_; }

private:
  /// compile() and generate_cuda() consume the graph: every later use is a user error.
  void live() const {
    if (!g_)
      BRAZE_USER_ERROR("graph", "")
          << "this graph was consumed by compile() or generate_cuda(); build a new Graph";
  }

  std::unique_ptr<Graph> g_;
  GraphBuilder b_;
  std::vector<SymExpr> syms_;
  std::vector<Node *> nodes_;
};

struct PyCompiled {
  std::shared_ptr<runtime::Executable> exe;
  std::string source;
  int numKernels = 0;
  bool cacheHit = false;
  CompileTimes times;
};

/// Buffer addresses passed from Python as ints (torch's data_ptr()).
template <typename T> std::vector<T *> addressesOf(const std::vector<uintptr_t> &addresses) {
  std::vector<T *> out(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i)
    out[i] = reinterpret_cast<T *>(addresses[i]);
  return out;
}

std::vector<TorchArray> runCompiled(PyCompiled &c, std::vector<CpuArray> inputs) {
  return runOnArrays(inputs, [&](const std::vector<const DLTensor *> &ptrs) {
    return c.exe->run(ptrs);
  });
}

} // namespace

/// The Package class and the package functions (PackageModule.cpp).
void bindPackage(nb::module_ &m);

} // namespace braze

NB_MODULE(_C, m) {
  using namespace braze;
  // Compiled graphs stay referenced from torch.compile caches until interpreter exit.
  nb::set_leak_warnings(false);
  // One translator for braze's three error kinds, with the Python types owned by the module.
  static PyObject *compileError = PyErr_NewException("braze._C.CompileError", nullptr, nullptr);
  static PyObject *internalError = PyErr_NewException("braze._C.InternalError", nullptr, nullptr);
  static PyObject *runError = PyErr_NewException("braze._C.RunError", nullptr, nullptr);
  m.attr("CompileError") = nb::borrow(compileError);
  m.attr("InternalError") = nb::borrow(internalError);
  m.attr("RunError") = nb::borrow(runError);
  m.attr("MAX_SCATTER_HITS") = GraphBuilder::kMaxScatterHits;
  m.attr("MAX_SCATTER_PAIRS") = GraphBuilder::kMaxScatterPairs;
  m.attr("MAX_SCAN") = GraphBuilder::kMaxScan;
  nb::register_exception_translator([](const std::exception_ptr &p, void *) {
    try {
      std::rethrow_exception(p);
    } catch (const Diagnostic &e) {
      PyErr_SetString(compileError, e.what());
    } catch (const InternalError &e) {
      PyErr_SetString(internalError, e.what());
    } catch (const runtime::RunError &e) {
      PyErr_SetString(runError, e.what());
    }
  });

  // The op kinds of Ops.def, and each one's schema: (min operands, max operands or -1,
  // [(attribute, type, optional)]).
  nb::enum_<OpKind> opKind(m, "OpKind");
#define BRAZE_OP(E, cat, text, lo, hi, attrs) opKind.value(#E, OpKind::E);
#include "braze/ir/graph/Ops.def"
  m.def("op_name", [](OpKind k) { return std::string(opName(k)); });
  m.def("op_kind", &opFromName, "The op kind whose Ops.def text is `name` (an error if none).");
  m.def("op_schema", [](OpKind k) {
    const OpSchema &s = opSchema(k);
    std::vector<std::tuple<std::string, std::string, bool>> attrs;
    for (const AttrSpec &a : s.attrs)
      attrs.emplace_back(a.name, std::string(attrKindText(a.kind)), a.optional);
    return std::make_tuple(s.minOperands, s.maxOperands, attrs);
  });

  nb::class_<PyGraph>(m, "Graph")
      .def(nb::init<>())
      .def("size_symbol", [](PyGraph &g, const std::string &n) { return g.sym(g.builder().sizeSymbol(n)); })
      .def("sym_const", [](PyGraph &g, int64_t v) { return g.sym(g.graph().sym().constant(v)); })
      .def("sym_binary", [](PyGraph &g, const std::string &op, int a, int b) {
        sym::SymContext &s = g.graph().sym();
        SymExpr x = g.symAt(a), y = g.symAt(b);
        if (op == "add") return g.sym(s.add(x, y));
        if (op == "mul") return g.sym(s.mul(x, y));
        if (op == "floordiv") return g.sym(s.floordiv(x, y));
        if (op == "mod") return g.sym(s.mod(x, y));
        if (op == "min") return g.sym(s.min(x, y));
        if (op == "max") return g.sym(s.max(x, y));
        BRAZE_USER_ERROR("sym", "") << "unknown symbolic op '" << op << "'";
      })
      .def("sym_str", [](PyGraph &g, int h) { return sym::toString(g.symAt(h)); })
      .def("set_name", [](PyGraph &g, const std::string &n) { g.builder().setName(n); })
      .def("input", [](PyGraph &g, const std::string &name, const std::string &dt,
                       const std::vector<int> &shape, const std::vector<int> &strides) {
        return g.node(g.builder().input(name, dtypeFromName(dt), g.shape(shape), g.shape(strides)));
      })
      .def("full", [](PyGraph &g, double v, const std::string &dt, const std::vector<int> &shape) {
        return g.node(g.builder().full(v, dtypeFromName(dt), g.shape(shape)));
      })
      .def("iota", [](PyGraph &g, const std::string &dt, const std::vector<int> &shape, int64_t dim) {
        return g.node(g.builder().iota(dtypeFromName(dt), g.shape(shape), dim));
      })
      .def("arange", [](PyGraph &g, const std::string &dt, int length, double start,
                        double step) {
        return g.node(g.builder().arange(dtypeFromName(dt), g.symAt(length), start, step));
      })
      .def("elementwise", [](PyGraph &g, OpKind op, const std::vector<int> &xs) {
        std::vector<Node *> ns;
        for (int h : xs)
          ns.push_back(g.at(h));
        return g.node(g.builder().elementwise(op, ns));
      })
      .def("convert", [](PyGraph &g, int x, const std::string &dt) {
        return g.node(g.builder().convert(g.at(x), dtypeFromName(dt)));
      })
      .def("reduce", [](PyGraph &g, OpKind op, int x, std::vector<int64_t> dims, bool keepdim,
                        std::optional<std::string> dt) {
        std::optional<DType> t;
        if (dt)
          t = dtypeFromName(*dt);
        return g.node(g.builder().reduce(op, g.at(x), dims, keepdim, t));
      })
      .def("reshape", [](PyGraph &g, int x, const std::vector<int> &shape) {
        return g.node(g.builder().reshape(g.at(x), g.shape(shape)));
      })
      .def("permute", [](PyGraph &g, int x, std::vector<int64_t> d) { return g.node(g.builder().permute(g.at(x), d)); })
      .def("expand", [](PyGraph &g, int x, const std::vector<int> &shape) {
        return g.node(g.builder().expand(g.at(x), g.shape(shape)));
      })
      .def("slice", [](PyGraph &g, int x, int64_t dim, int64_t start, int64_t end, int64_t step) {
        return g.node(g.builder().slice(g.at(x), dim, start, end, step));
      })
      .def("slice_length", [](PyGraph &g, int x, int64_t dim, int64_t start, int length,
                              int64_t step) {
        return g.node(g.builder().sliceLength(g.at(x), dim, start, g.symAt(length), step));
      })
      .def("pad", [](PyGraph &g, int x, int64_t dim, int64_t lo, int64_t hi, double value) {
        return g.node(g.builder().pad(g.at(x), dim, lo, hi, value));
      })
      .def("constant_pad", [](PyGraph &g, int x, IntList pads, double value) {
        return g.node(g.builder().constantPad(g.at(x), pads, value));
      })
      .def("select", [](PyGraph &g, int x, int64_t dim, int64_t i) { return g.node(g.builder().select(g.at(x), dim, i)); })
      .def("unsqueeze", [](PyGraph &g, int x, int64_t d) { return g.node(g.builder().unsqueeze(g.at(x), d)); })
      .def("squeeze", [](PyGraph &g, int x, std::vector<int64_t> d) { return g.node(g.builder().squeeze(g.at(x), d)); })
      .def("flip", [](PyGraph &g, int x, std::vector<int64_t> d) { return g.node(g.builder().flip(g.at(x), d)); })
      .def("size_scalar", [](PyGraph &g, int n) { return g.node(g.builder().sizeScalar(g.symAt(n))); })
      .def("concat", [](PyGraph &g, const std::vector<int> &xs, int64_t d) {
        std::vector<Node *> ns;
        for (int h : xs)
          ns.push_back(g.at(h));
        return g.node(g.builder().concat(ns, d));
      })
      .def("matmul", [](PyGraph &g, int a, int b) { return g.node(g.builder().matmul(g.at(a), g.at(b))); })
      .def("convolution", [](PyGraph &g, int x, int w, std::optional<int> b, IntList stride,
                             IntList padding, IntList dilation, int64_t groups) {
        return g.node(g.builder().convolution(g.at(x), g.at(w), b ? g.at(*b) : nullptr, stride,
                                              padding, dilation, groups));
      })
      .def("convolution_backward", [](PyGraph &g, int gradOut, int x, int w, IntList stride,
                                      IntList padding, IntList dilation, bool transposed,
                                      int64_t groups, std::array<bool, 3> mask) {
        std::array<Node *, 3> grads = g.builder().convolutionBackward(
            g.at(gradOut), g.at(x), g.at(w), stride, padding, dilation, transposed, groups, mask);
        std::array<std::optional<int>, 3> out;
        for (size_t i = 0; i < 3; ++i)
          if (grads[i])
            out[i] = g.node(grads[i]);
        return out;
      })
      .def("cdist", [](PyGraph &g, int a, int b, double p, bool matmulForm) {
        return g.node(g.builder().cdist(g.at(a), g.at(b), p, matmulForm));
      })
      .def("pdist", [](PyGraph &g, int x, double p) { return g.node(g.builder().pdist(g.at(x), p)); })
      .def("cross", [](PyGraph &g, int a, int b, int64_t d) {
        return g.node(g.builder().cross(g.at(a), g.at(b), d));
      })
      .def("signbit", [](PyGraph &g, int x) { return g.node(g.builder().signbit(g.at(x))); })
      .def("add_matmul", [](PyGraph &g, int bias, int a, int b, double beta, double alpha,
                            bool batchSum) {
        return g.node(g.builder().addMatMul(g.at(bias), g.at(a), g.at(b), beta, alpha, batchSum));
      })
      .def("trilinear", [](PyGraph &g, int x1, int x2, int x3, IntList e1, IntList e2,
                           IntList e3, IntList sumdim) {
        return g.node(g.builder().trilinear(g.at(x1), g.at(x2), g.at(x3), e1, e2, e3, sumdim));
      })
      .def("ldexp", [](PyGraph &g, int x, int e) {
        return g.node(g.builder().ldexp(g.at(x), g.at(e)));
      })
      .def("angle", [](PyGraph &g, int x) { return g.node(g.builder().angle(g.at(x))); })
      .def("soft_margin_loss", [](PyGraph &g, int x, int y, const std::string &reduction) {
        return g.node(g.builder().softMarginLoss(g.at(x), g.at(y), reduction));
      })
      .def("add_scaled", [](PyGraph &g, int x, int y, std::optional<int> alpha, bool subtract) {
        return g.node(g.builder().addScaled(g.at(x), g.at(y), alpha ? g.at(*alpha) : nullptr,
                                            subtract));
      })
      .def("copy_like", [](PyGraph &g, int src, int like) {
        return g.node(g.builder().copyLike(g.at(src), g.at(like)));
      })
      .def("frexp", [](PyGraph &g, int x) {
        auto [m, e] = g.builder().frexp(g.at(x));
        return std::make_pair(g.node(m), g.node(e));
      })
      .def("clamp", [](PyGraph &g, int x, std::optional<int> lo, std::optional<int> hi) {
        return g.node(g.builder().clamp(g.at(x), lo ? g.at(*lo) : nullptr,
                                        hi ? g.at(*hi) : nullptr));
      })
      .def("trunc_div", [](PyGraph &g, int a, int b) {
        return g.node(g.builder().truncDiv(g.at(a), g.at(b)));
      })
      .def("fmax", [](PyGraph &g, int a, int b, bool max) {
        return g.node(g.builder().fmax(g.at(a), g.at(b), max));
      })
      .def("round_decimals", [](PyGraph &g, int x, int64_t decimals) {
        return g.node(g.builder().roundDecimals(g.at(x), decimals));
      })
      .def("embedding_bag", [](PyGraph &g, int weight, int indices, std::optional<int> offsets,
                               std::optional<int> weights, const std::string &mode,
                               int64_t paddingIdx, bool includeLastOffset) {
        return g.node(g.builder().embeddingBag(g.at(weight), g.at(indices),
                                               offsets ? g.at(*offsets) : nullptr,
                                               weights ? g.at(*weights) : nullptr, mode,
                                               paddingIdx, includeLastOffset));
      })
      .def("fft", [](PyGraph &g, int x, const std::string &mode, IntList dims, int64_t norm,
                     bool flag, int64_t lastSize) {
        return g.node(g.builder().fft(g.at(x), mode, dims, norm, flag, lastSize));
      })
      .def("complex", [](PyGraph &g, int re, std::optional<int> im) {
        return g.node(g.builder().complex(g.at(re), im ? g.at(*im) : nullptr));
      })
      .def("conj", [](PyGraph &g, int x) { return g.node(g.builder().conj(g.at(x))); })
      .def("argsort", [](PyGraph &g, int x, int64_t dim, bool descending) {
        return g.node(g.builder().argsort(g.at(x), dim, descending));
      })
      .def("mode", [](PyGraph &g, int x, int64_t dim, bool keepdim) {
        auto [v, i] = g.builder().mode(g.at(x), dim, keepdim);
        return std::make_pair(g.node(v), g.node(i));
      })
      .def("sort", [](PyGraph &g, int x, int64_t dim, bool descending) {
        auto [v, i] = g.builder().sort(g.at(x), dim, descending);
        return std::make_pair(g.node(v), g.node(i));
      })
      .def("median", [](PyGraph &g, int x, std::optional<int64_t> dim, bool keepdim,
                        bool ignoreNan) {
        auto [v, i] = g.builder().median(g.at(x), dim, keepdim, ignoreNan);
        return std::make_pair(g.node(v), g.node(i));
      })
      .def("conv_transpose", [](PyGraph &g, int x, int w, std::optional<int> b, IntList stride,
                                IntList padding, IntList dilation, IntList outputPadding,
                                int64_t groups) {
        return g.node(g.builder().convTranspose(g.at(x), g.at(w), b ? g.at(*b) : nullptr, stride,
                                                padding, dilation, outputPadding, groups));
      })
      .def("attention", [](PyGraph &g, int q, int k, int v, std::optional<int> bias, double scale,
                           bool causal, double dropout, std::optional<int> seed) {
        return g.node(g.builder().attention(g.at(q), g.at(k), g.at(v),
                                            bias ? g.at(*bias) : nullptr, scale, causal, true,
                                            dropout, seed ? g.at(*seed) : nullptr));
      }, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("bias").none(), nb::arg("scale"),
         nb::arg("causal"), nb::arg("dropout") = 0.0, nb::arg("seed").none() = nb::none())
      .def("attention_lse", [](PyGraph &g, int q, int k, std::optional<int> bias, double scale,
                               bool causal) {
        return g.node(g.builder().attentionLse(g.at(q), g.at(k), bias ? g.at(*bias) : nullptr,
                                               scale, causal));
      })
      .def("lse_in_layout", [](PyGraph &g, int lse, const std::vector<int> &shape) {
        return g.node(g.builder().lseInLayout(g.at(lse), g.shape(shape)));
      })
      .def("lse_from_layout", [](PyGraph &g, int saved, int q) {
        return g.node(g.builder().lseFromLayout(g.at(saved), g.at(q)));
      })
      .def("attention_grad", [](PyGraph &g, const std::string &wrt, int dout, int q, int k, int v,
                                int out, int lse, std::optional<int> bias, double scale,
                                bool causal, double dropout, std::optional<int> seed) {
        return g.node(g.builder().attentionGrad(wrt, g.at(dout), g.at(q), g.at(k), g.at(v),
                                                g.at(out), g.at(lse),
                                                bias ? g.at(*bias) : nullptr, scale, causal,
                                                dropout, seed ? g.at(*seed) : nullptr));
      }, nb::arg("wrt"), nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
         nb::arg("out"), nb::arg("lse"), nb::arg("bias").none(), nb::arg("scale"),
         nb::arg("causal"), nb::arg("dropout") = 0.0, nb::arg("seed").none() = nb::none())
      .def("max_pool", [](PyGraph &g, int x, int64_t spatial, IntList k, IntList s, IntList p,
                          IntList d, bool ceil) {
        auto [v, i] = g.builder().maxPool(g.at(x), spatial, k, s, p, d, ceil);
        return std::make_pair(g.node(v), g.node(i));
      })
      .def("max_pool_grad", [](PyGraph &g, int grad, int x, int indices, IntList k, IntList s,
                               IntList p, IntList d, bool ceil) {
        return g.node(
            g.builder().maxPoolGrad(g.at(grad), g.at(x), g.at(indices), k, s, p, d, ceil));
      })
      .def("adaptive_max_pool", [](PyGraph &g, int x, IntList size) {
        auto [v, i] = g.builder().adaptiveMaxPool(g.at(x), size);
        return std::make_pair(g.node(v), g.node(i));
      })
      .def("adaptive_avg_pool", [](PyGraph &g, int x, IntList size) {
        return g.node(g.builder().adaptiveAvgPool(g.at(x), size));
      })
      .def("adaptive_avg_pool_grad", [](PyGraph &g, int grad, int x, int64_t spatial) {
        return g.node(g.builder().adaptiveAvgPoolGrad(g.at(grad), g.at(x), spatial));
      })
      .def("adaptive_max_pool_grad", [](PyGraph &g, int grad, int x, int indices,
                                        int64_t spatial) {
        return g.node(
            g.builder().adaptiveMaxPoolGrad(g.at(grad), g.at(x), g.at(indices), spatial));
      })
      .def("grid_sample", [](PyGraph &g, int x, int grid, const std::string &mode,
                             const std::string &padding, bool alignCorners) {
        return g.node(g.builder().gridSample(g.at(x), g.at(grid), mode, padding, alignCorners));
      })
      .def("scan", [](PyGraph &g, OpKind op, int x, int64_t d, std::optional<std::string> dt) {
        std::optional<DType> t;
        if (dt)
          t = dtypeFromName(*dt);
        return g.node(g.builder().scan(op, g.at(x), d, t));
      })
      .def("cum_extreme", [](PyGraph &g, int x, int64_t d, bool max) {
        auto [v, i] = g.builder().cumExtreme(g.at(x), d, max);
        return std::make_pair(g.node(v), g.node(i));
      })
      .def("search_sorted", [](PyGraph &g, int seq, int values, std::optional<int> sorter,
                               bool right, const std::string &out) {
        return g.node(g.builder().searchSorted(g.at(seq), g.at(values),
                                               sorter ? g.at(*sorter) : nullptr, right,
                                               dtypeFromName(out)));
      })
      .def("histogram", [](PyGraph &g, int x, int64_t bins, double lo, double hi) {
        return g.node(g.builder().histogram(g.at(x), bins, lo, hi));
      })
      .def("random", [](PyGraph &g, const std::string &dist, const std::string &dt,
                        const std::vector<int> &shape, int seed) {
        return g.node(g.builder().random(dist, dtypeFromName(dt), g.shape(shape), g.at(seed)));
      })
      .def("random_uniform", [](PyGraph &g, const std::string &dt, const std::vector<int> &shape,
                                int seed, double low, double high) {
        return g.node(g.builder().randomUniform(dtypeFromName(dt), g.shape(shape), g.at(seed),
                                                low, high));
      })
      .def("random_normal", [](PyGraph &g, const std::string &dt, const std::vector<int> &shape,
                               int seed, int mean, int std) {
        return g.node(g.builder().randomNormal(dtypeFromName(dt), g.shape(shape), g.at(seed),
                                               g.at(mean), g.at(std)));
      })
      .def("random_integer", [](PyGraph &g, const std::string &dt, const std::vector<int> &shape,
                                int seed, int64_t low, int64_t high) {
        return g.node(g.builder().randomInteger(dtypeFromName(dt), g.shape(shape), g.at(seed),
                                                low, high));
      })
      .def("random_geometric", [](PyGraph &g, const std::string &dt,
                                  const std::vector<int> &shape, int seed, double p) {
        return g.node(g.builder().randomGeometric(dtypeFromName(dt), g.shape(shape), g.at(seed),
                                                  p));
      })
      .def("random_bernoulli", [](PyGraph &g, const std::string &dt,
                                  const std::vector<int> &shape, int seed, double p) {
        return g.node(g.builder().randomBernoulli(dtypeFromName(dt), g.shape(shape), g.at(seed),
                                                  p));
      })
      .def("avg_pool", [](PyGraph &g, int x, int64_t spatial, IntList k, IntList s, IntList p,
                          bool ceil, bool include, int64_t divisor) {
        return g.node(g.builder().avgPool(g.at(x), spatial, k, s, p, ceil, include, divisor));
      })
      .def("diagonal", [](PyGraph &g, int x, int64_t o, int64_t d1, int64_t d2) {
        return g.node(g.builder().diagonal(g.at(x), o, d1, d2));
      })
      .def("unfold", [](PyGraph &g, int x, int64_t d, int64_t size, int64_t step) {
        return g.node(g.builder().unfold(g.at(x), d, size, step, 1));
      })
      .def("take", [](PyGraph &g, int x, int64_t d, int i) { return g.node(g.builder().take(g.at(x), d, g.at(i))); })
      .def("gather", [](PyGraph &g, int x, int64_t d, int i) { return g.node(g.builder().gather(g.at(x), d, g.at(i))); })
      .def("softmax", [](PyGraph &g, int x, int64_t d) { return g.node(g.builder().softmax(g.at(x), d)); })
      .def("log_softmax", [](PyGraph &g, int x, int64_t d) { return g.node(g.builder().logSoftmax(g.at(x), d)); })
      .def("mean", [](PyGraph &g, int x, std::vector<int64_t> d, bool k) { return g.node(g.builder().mean(g.at(x), d, k)); })
      .def("var", [](PyGraph &g, int x, std::vector<int64_t> d, double c, bool k) {
        return g.node(g.builder().var(g.at(x), d, c, k));
      })
      .def("layer_norm", [](PyGraph &g, int x, int64_t axis, std::optional<int> w, std::optional<int> b, double eps) {
        return g.node(g.builder().layerNorm(g.at(x), axis, w ? g.at(*w) : nullptr, b ? g.at(*b) : nullptr, eps));
      })
      .def("layer_norm_stats", [](PyGraph &g, int x, int64_t axis, double eps) {
        auto [mean, rstd] = g.builder().layerNormStats(g.at(x), axis, eps);
        return std::make_pair(g.node(mean), g.node(rstd));
      })
      .def("gelu", [](PyGraph &g, int x, const std::string &a) { return g.node(g.builder().gelu(g.at(x), a)); })
      .def("silu", [](PyGraph &g, int x) { return g.node(g.builder().silu(g.at(x))); })
      // scatter family
      .def("advanced_index", [](PyGraph &g, int x, IntList dims, const std::vector<int> &is) {
        std::vector<Node *> ns;
        for (int h : is)
          ns.push_back(g.at(h));
        return g.node(g.builder().advancedIndex(g.at(x), std::vector<int64_t>(dims.begin(),
                                                                             dims.end()), ns));
      })
      .def("scatter", [](PyGraph &g, int self, int target, int src, const std::string &mode,
                         bool includeSelf, int64_t maxHits) {
        return g.node(g.builder().scatter(g.at(self), g.at(target), g.at(src), mode, includeSelf,
                                          maxHits));
      }, "self"_a, "target"_a, "src"_a, "mode"_a, "include_self"_a, "max_hits"_a = 0)
      .def("scatter_dim", [](PyGraph &g, int self, int64_t dim, int index, int src,
                             const std::string &mode, bool includeSelf) {
        return g.node(g.builder().scatterDim(g.at(self), dim, g.at(index), g.at(src), mode,
                                             includeSelf));
      })
      .def("index_reduce", [](PyGraph &g, int self, int64_t dim, int index, int source,
                              const std::string &mode, bool includeSelf) {
        return g.node(g.builder().indexReduce(g.at(self), dim, g.at(index), g.at(source), mode,
                                              includeSelf));
      })
      .def("put", [](PyGraph &g, int self, int index, int source, bool accumulate) {
        return g.node(g.builder().put(g.at(self), g.at(index), g.at(source), accumulate));
      })
      .def("diagonal_scatter", [](PyGraph &g, int self, int src, int64_t offset, int64_t dim1,
                                  int64_t dim2) {
        return g.node(g.builder().diagonalScatter(g.at(self), g.at(src), offset, dim1, dim2));
      })
      .def("index_put", [](PyGraph &g, int self, IntList dims, const std::vector<int> &indices,
                           int values, bool accumulate) {
        std::vector<Node *> ix;
        for (int i : indices)
          ix.push_back(g.at(i));
        return g.node(g.builder().indexPut(g.at(self), dims, ix, g.at(values), accumulate));
      })
      .def("mask_put", [](PyGraph &g, int self, int mask, int values, bool accumulate) {
        return g.node(g.builder().maskPut(g.at(self), g.at(mask), g.at(values), accumulate));
      })
      .def("masked_scatter", [](PyGraph &g, int self, int mask, int source) {
        return g.node(g.builder().maskedScatter(g.at(self), g.at(mask), g.at(source)));
      })
      .def("as_strided_scatter", [](PyGraph &g, int self, int src, IntList size, IntList stride,
                                    int64_t offset) {
        return g.node(g.builder().asStridedScatter(g.at(self), g.at(src), size, stride, offset));
      })
      .def("as_strided", [](PyGraph &g, int x, IntList size, IntList stride, int64_t offset) {
        return g.node(g.builder().asStrided(g.at(x), size, stride, offset));
      })
      .def("nonzero_static", [](PyGraph &g, int x, int64_t size, int64_t fill) {
        return g.node(g.builder().nonzeroStatic(g.at(x), size, fill));
      })
      .def("dtype", [](PyGraph &g, int x) { return std::string(dtypeName(g.at(x)->dtype())); })
      .def("node_name", [](PyGraph &g, int x) { return g.at(x)->name(); })
      .def("shape", [](PyGraph &g, int x) {
        std::vector<int> hs;
        for (SymExpr e : g.at(x)->shape())
          hs.push_back(g.sym(e));
        return hs;
      })
      .def("output", [](PyGraph &g, const std::vector<int> &xs,
                        const std::vector<std::vector<int>> &strides) {
        std::vector<Node *> ns;
        for (int h : xs)
          ns.push_back(g.at(h));
        g.builder().output(ns);
        for (size_t k = 0; k < strides.size() && k < ns.size(); ++k)
          g.graph().setOutputStrides(k, g.shape(strides[k]));
      }, "outputs"_a, "strides"_a = std::vector<std::vector<int>>{})
      .def("print", [](PyGraph &g) { return printGraph(g.graph()); })
      .def("print_stage", [](PyGraph &g, const std::string &stage, bool cuda) {
        // A copy through the text form: printing a stage lowers the graph it is given.
        std::optional<StageKind> kind = stageByName(stage);
        if (!kind)
          BRAZE_USER_ERROR("print_stage", "") << "no stage '" << stage << "'";
        std::unique_ptr<Graph> copy = parseGraph(printGraph(g.graph()));
        CompileOptions o = CompileOptions::fromEnvironment();
        if (cuda)
          o.cuda = CompileOptions::Cuda{};
        return printStage(*copy, *kind, o);
      }, "stage"_a, "cuda"_a = false)
      .def("check_supported", [](PyGraph &g) { checkSupported(g.graph()); })
      .def("supports", [](PyGraph &g, bool cuda, const std::vector<std::string> &oneDnnHalf) {
        CompileOptions o;
        if (cuda)
          o.cuda = CompileOptions::Cuda{};
        for (const std::string &t : oneDnnHalf)
          o.oneDnnHalf.push_back(dtypeFromName(t));
        Support s = supports(g.graph(), o);
        return std::make_pair(s.ok, s.reason);
      }, "cuda"_a = false, "one_dnn_half"_a = std::vector<std::string>{})
      .def("compile", [](PyGraph &g, std::optional<std::string> log, bool fuse,
                         std::optional<std::string> blas, std::optional<nb::dict> cuda,
                         std::optional<std::string> dnnl,
                         const std::vector<std::string> &oneDnnHalf,
                         std::optional<double> autotune,
                         std::optional<std::vector<std::string>> disabledPasses) {
        if (g.consumed())
          BRAZE_USER_ERROR("compile", "") << "this graph was compiled already";
        CompileOptions o = CompileOptions::fromEnvironment();
        if (log)
          o.log = LogSet::parse(*log);
        o.fuse = fuse;
        if (blas && o.blasLibrary.empty())
          o.blasLibrary = *blas;
        if (dnnl && o.dnnlLibrary.empty())
          o.dnnlLibrary = *dnnl;
        for (const std::string &t : oneDnnHalf)
          o.oneDnnHalf.push_back(dtypeFromName(t));
        if (cuda)
          o.cuda = cudaOptions(*cuda);
        if (autotune) {
          if (!(*autotune >= 0) || !std::isfinite(*autotune))
            BRAZE_USER_ERROR("autotune", "") << "expected seconds, at least 0";
          o.autotuneSeconds = *autotune;
        }
        if (disabledPasses) {
          o.disabledPasses = *disabledPasses;
          checkDisabledPasses(o.disabledPasses, "Options(disabled_passes=...)");
        }
        std::unique_ptr<Graph> graph = g.take();
        CompileResult r;
        {
          // Compiles of different graphs may run on several threads at once (partitions).
          nb::gil_scoped_release unlocked;
          r = braze::compile(*graph, o);
        }
        return PyCompiled{r.executable, r.source, r.numKernels, r.cacheHit, r.times};
      }, "log"_a = nb::none(), "fuse"_a = true, "blas"_a = nb::none(), "cuda"_a = nb::none(),
         "dnnl"_a = nb::none(), "one_dnn_half"_a = std::vector<std::string>{},
         "autotune"_a = nb::none(), "disabled_passes"_a = nb::none())
      .def("generate_cuda", [](PyGraph &g, std::optional<nb::dict> cuda) {
        if (g.consumed())
          BRAZE_USER_ERROR("compile", "") << "this graph was compiled already";
        CompileOptions o = CompileOptions::fromEnvironment();
        o.cuda = cuda ? cudaOptions(*cuda) : CompileOptions::Cuda{};
        std::unique_ptr<Graph> graph = g.take();
        CudaSources c = generateCudaSources(*graph, o);
        return std::make_tuple(c.device, c.host, c.deferred);
      }, "cuda"_a = nb::none());

  nb::class_<PyCompiled>(m, "Compiled")
      .def_ro("source", &PyCompiled::source)
      .def_ro("num_kernels", &PyCompiled::numKernels)
      .def_ro("cache_hit", &PyCompiled::cacheHit)
      .def_prop_ro("times", [](const PyCompiled &c) {
        // seconds: lower (C++ passes and codegen), host_compile, nvrtc, load
        nb::dict d;
        d["lower"] = c.times.lower;
        d["host_compile"] = c.times.hostCompile;
        d["nvrtc"] = c.times.nvrtc;
        d["load"] = c.times.load;
        d["autotune"] = c.times.autotune;
        return d;
      })
      .def("run", &runCompiled)
      // CUDA modules. Pointers are device addresses as ints (torch's data_ptr()); the stream is
      // a cudaStream_t as an int (0: the legacy default stream).
      .def("bind_shapes", [](PyCompiled &c, const std::vector<std::vector<int64_t>> &shapes,
                             const std::vector<std::vector<int64_t>> &strides) {
        return c.exe->bindShapes(shapes, strides);
      })
      .def("output_layouts", [](PyCompiled &c, const std::vector<int64_t> &syms) {
        std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
        for (auto &l : c.exe->layoutsFor(syms))
          out.emplace_back(l.shape, l.strides);
        return out;
      })
      .def("arena_bytes", [](PyCompiled &c, const std::vector<int64_t> &syms) {
        return c.exe->arenaBytes(syms);
      })
      .def("run_cuda", [](PyCompiled &c, const std::vector<uintptr_t> &inputs,
                          const std::vector<uintptr_t> &outputs, uintptr_t arena,
                          const std::vector<int64_t> &syms, uintptr_t stream) {
        c.exe->runCuda(addressesOf<const void>(inputs), addressesOf<void>(outputs),
                       reinterpret_cast<void *>(arena), syms, reinterpret_cast<void *>(stream));
      })
      // CPU modules, the lean call: buffers as addresses (torch's data_ptr()), sizes from
      // bind_shapes, outputs laid out as output_layouts says.
      .def("run_bound", [](PyCompiled &c, const std::vector<uintptr_t> &inputs,
                           const std::vector<uintptr_t> &outputs, const std::vector<int64_t> &syms) {
        std::vector<const void *> in = addressesOf<const void>(inputs);
        std::vector<void *> out = addressesOf<void>(outputs);
        nb::gil_scoped_release release;
        c.exe->runBound(in, out, syms);
      })
      .def("synchronize", [](PyCompiled &c, uintptr_t stream) {
        nb::gil_scoped_release release;
        c.exe->synchronizeAndCheck(reinterpret_cast<void *>(stream));
      }, "stream"_a = 0)
      .def_prop_ro("checks_indices", [](PyCompiled &c) { return c.exe->spec().checksIndices; })
      .def("set_assert_indices", [](PyCompiled &c, bool on) { c.exe->setAssertIndices(on); })
      .def_prop_ro("library_path", [](PyCompiled &c) { return c.exe->spec().libraryPath; })
      // What a CUDA package holds of this module: its cubins (the deferred kernels compiled
      // now, each into a cubin of its own), its kernels in launch order, and the libraries it
      // calls.
      .def("cuda_package_files", [](PyCompiled &c) {
        const runtime::ModuleSpec &spec = c.exe->spec();
        if (!spec.cuda)
          throw runtime::RunError("cuda_package_files: not a CUDA module");
        nb::dict d;
        std::vector<std::string> cubins = spec.cubinPaths;
        for (const runtime::DeferredCubin &k : spec.deferred)
          cubins.push_back(k.compile());
        d["cubins"] = cubins;
        d["kernels"] = spec.kernels;
        d["cublaslt"] = spec.cublasLtLibrary;
        d["cudnn"] = spec.cudnnLibrary;
        d["checks_indices"] = spec.checksIndices;
        return d;
      })
      .def_prop_ro("num_symbols", [](PyCompiled &c) { return c.exe->spec().numSymbols; });

  bindPackage(m);

  m.def("counters", []() {
    Counters &c = counters();
    nb::dict d;
    d["graphs_compiled"] = c.graphsCompiled.load();
    d["kernels_generated"] = c.kernelsGenerated.load();
    d["cache_hits"] = c.cacheHits.load();
    d["cache_misses"] = c.cacheMisses.load();
    d["deferred_kernels_loaded"] = c.deferredKernelsLoaded.load();
    return d;
  });
  m.def("cuda_driver_available", []() { return runtime::cudaDriverAvailable(); });
  m.def("cuda_preload", &runtime::CudaModule::preload, nb::arg("device"),
        nb::arg("cublaslt"), nb::arg("cudnn"), nb::call_guard<nb::gil_scoped_release>());
  m.def("nvrtc_compile", &compileCudaSource);
  m.def("autotune_checker_source", &autotuneCheckerSource);
  m.def("nvrtc_version", [](const std::string &library) { return nvrtcVersion(library); });
  m.def("strict_from_environment", []() { return CompileOptions::fromEnvironment().strict; });
  m.def("log_fallback_from_environment",
        []() { return CompileOptions::fromEnvironment().log.has(LogStage::Fallback); });
  m.def("log_compile_time_from_environment",
        []() { return CompileOptions::fromEnvironment().log.has(LogStage::CompileTime); });
  m.def("log_cudagraphs_from_environment",
        []() { return CompileOptions::fromEnvironment().log.has(LogStage::CudaGraphs); });
  m.def("log_accuracy_from_environment",
        []() { return CompileOptions::fromEnvironment().log.has(LogStage::Accuracy); });
}
