/// braze-opt: reads a tensor graph or a loop program in text form, runs graph passes on it or
/// prints one stage of the pipeline, and writes the result to stdout. The text tests (tests/lit)
/// drive it.
///
///   braze-opt FILE [--print=graph|decomposed|loops|schedule|code] [--passes=cse,dce,...]
///             [--disable-passes=cse,...]
///             [--no-fuse] [--cuda] [--dnnl] [--blas[=mkl]] [--onednn-half=LIST] [--cudnn] [--tf32]
///             [--sm=NN] [--kernel-arg-bytes=N] [--launch=SCHEDULE] [--forms] [--run=TENSORS [--atol=X] [--rtol=X]]
///             [--help]
///
/// 1. Parse the arguments; FILE `-` is stdin.
/// 2. Parse and verify the input: a graph (`graph(...) {...}`), or a loop program (`sizes ..`,
///    `buffer ..` and `compute ..` lines, as --print=loops writes them), which starts the
///    pipeline at its loops stage (default print: loops).
/// 3. Run the --passes (graph passes and `decompose`, each verified after it runs), then print
///    the --print stage (default: the graph).
/// With --run, the graph (or loop program) is compiled for the CPU and run instead: its inputs
/// are the tensors of a safetensors file named as the graph's inputs, and its outputs are compared with the
/// file's `expected:<k>` tensors (output k) within --atol/--rtol (default: the file's metadata
/// `atol`/`rtol`, else 1e-5 and 0). The accuracy checker writes such files (BRAZE_ACCURACY=minify).
/// Exit status: 0 on success, 1 on a user error (bad flag, unreadable file, Diagnostic), 2 on an
/// internal error (InternalError, or any other exception: braze let something escape), 3 when
/// --run finds an output beyond its tolerance.
#include "braze/driver/Compile.h"
#include "braze/ir/graph/GraphText.h"
#include "braze/ir/loop/LoopText.h"
#include "braze/lowering/decompose/Decompose.h"
#include "braze/passes/PassManager.h"
#include "braze/runtime/Safetensors.h"
#include "braze/scheduler/Schedule.h"
#include "braze/support/Check.h"
#include "braze/support/CommaList.h"
#include "braze/support/Diagnostic.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr std::string_view kToolName = "braze-opt";

struct ToolOptions {
  std::string file;
  std::optional<braze::StageKind> stage; ///< default: the input's first stage
  std::vector<std::string> passes;
  std::vector<std::string> disabledPasses; ///< --disable-passes: graph passes the stages skip
  bool fuse = true;
  bool pairedEpilogues = false;
  bool cuda = false; ///< schedule and generate code for a CUDA device (sm_90) instead of the CPU
  bool dnnl = false; ///< CPU f32 convolutions stay whole and call oneDNN
  bool blas = false; ///< CPU f32/f64 matrix products call BLAS (OpenBLAS's cblas names)
  bool mkl = false;  ///< with blas: PyTorch's MKL (Fortran's ILP64 gemm) instead
  std::vector<braze::DType> oneDnnHalf; ///< half dtypes eager's CPU kernels run through oneDNN
  bool cudnn = false; ///< with --cuda: convolutions stay whole and call cuDNN
  bool tf32 = false;  ///< with --cuda: f32 GEMMs and convolutions may use TF32
  std::optional<int64_t> kernelArgBytes; ///< with --cuda: a launch's argument space
  std::optional<int> sm;                 ///< with --cuda: the compute capability (default 90)
  std::string runFile;                   ///< --run: inputs and expected outputs
  std::string launchFile;                ///< --launch: a schedule whose launch records to use
  bool forms = false;                    ///< --forms: the autotuner's forms of each kernel
  std::optional<double> atol, rtol;      ///< --run's tolerances
  bool help = false;
};


std::string usageText() {
  std::ostringstream os;
  os << "usage: " << kToolName
     << " FILE [--print=graph|decomposed|loops|schedule|code] [--passes=NAME,...]"
        " [--disable-passes=NAME,...] [--no-fuse]"
        " [--paired-epilogues] [--cuda]"
        " [--dnnl] [--blas[=mkl]] [--onednn-half=LIST] [--cudnn] [--tf32] [--kernel-arg-bytes=N]"
        " [--launch=SCHEDULE] [--help]\n"
        "\n"
        "Reads a tensor graph in text form (FILE '-' is stdin), runs the given graph passes and\n"
        "prints the graph, or prints one stage of the compilation pipeline. A loop program\n"
        "(the text --print=loops writes) starts at the loops stage.\n"
        "\n"
        "options:\n"
        "  --print=STAGE   graph (default; loops for a loop program), decomposed, loops,\n"
        "                  schedule or code\n"
        "  --passes=LIST   graph passes (or decompose) to run in order, comma-separated,\n"
        "                  before printing\n"
        "  --disable-passes=LIST  graph passes of the pipeline that the stages skip\n"
        "                  (BRAZE_DISABLE_PASSES, Options(disabled_passes=...))\n"
        "  --no-fuse       schedule one kernel per computation\n"
        "  --paired-epilogues  CUDA: a gated activation over a grouped product in its kernel\n"
        "  --cuda          schedule for and print the CUDA code of an sm_90 GPU\n"
        "  --dnnl          keep CPU f32 convolutions whole and call oneDNN for them\n"
        "  --blas          let CPU f32 and f64 matrix products call BLAS (cblas_sgemm/dgemm)\n"
        "  --blas=mkl      the same through PyTorch's MKL (libtorch_cpu's sgemm_64_/dgemm_64_)\n"
        "  --onednn-half=LIST  half dtypes (bf16,f16) the machine's eager kernels run through\n"
        "                  oneDNN: braze rounds them as those kernels do\n"
        "  --cudnn         with --cuda: keep convolutions whole and call cuDNN for them and for\n"
        "                  f16/bf16 attention\n"
        "  --tf32          with --cuda: let f32 GEMMs and convolutions use TF32\n"
        "  --sm=NN         with --cuda: the GPU's compute capability (90, the default, is\n"
        "                  sm_90; 80 sm_80)\n"
        "  --kernel-arg-bytes=N  with --cuda: the bytes of arguments a launch passes (4096,\n"
        "                  the default, or up to 32764 with CUDA 12.1): bounds the buffers a\n"
        "                  kernel names\n"
        "  --forms         each loop kernel's forms the autotuner times (its planned record\n"
        "                  first; with --cuda, with their blocks)\n"
        "  --launch=SCHEDULE  take the records of a --print=schedule text, written or edited\n"
        "                  by hand, for the kernels it names: with --cuda their launch records\n"
        "                  (`launch{block=.. threads=.. vec=.. ...}`), else their CPU records\n"
        "                  (`cpu{parallel=..}`, `cpu{lanes=.. along=x..}`, `cpu{region}`,\n"
        "                  `cpu{groups}`); each is checked against its kernel's code\n"
        "  --run=TENSORS   compile the graph (or loop program) for the CPU and run it on the\n"
        "                  tensors of a safetensors file (named as its inputs); compare output k\n"
        "                  with its 'expected:k' tensor (exit status 3 when one differs)\n"
        "  --atol=X, --rtol=X  --run's tolerances (default: the file's metadata, else 1e-5, 0)\n"
        "  --help          show this message\n"
        "\n"
        "passes:\n";
  size_t width = 0;
  for (const braze::PassInfo &p : braze::registeredPasses())
    width = std::max(width, p.name.size());
  for (const braze::PassInfo &p : braze::registeredPasses())
    os << "  " << p.name << std::string(width - p.name.size() + 2, ' ') << p.description
       << "\n";
  for (const braze::GraphStep &s : braze::graphSteps())
    if (s.lowering)
      os << "  " << s.name << std::string(width - std::min(width, s.name.size()) + 2, ' ')
         << s.description << "\n";
  os << "\nthe pipeline's graph steps (what --print=decomposed runs, in this order):\n  ";
  for (size_t i = 0; i < braze::graphSteps().size(); ++i)
    os << (i ? "," : "") << braze::graphSteps()[i].name;
  os << "\n\nthe back half's steps, after to_loops (--print=schedule and code run them):\n";
  for (const braze::LoopStepInfo &s : braze::loopSteps())
    os << "  " << s.name << std::string(width - std::min(width, s.name.size()) + 2, ' ')
       << s.description << "\n";
  return os.str();
}

/// `text` as a decimal integer in [lo, hi]; nothing when it is not one (empty, trailing
/// characters, out of range).
std::optional<int64_t> integerIn(std::string_view text, int64_t lo, int64_t hi) {
  std::string n(text);
  char *end = nullptr;
  long long v = std::strtoll(n.c_str(), &end, 10);
  if (n.empty() || *end != '\0' || v < lo || v > hi)
    return std::nullopt;
  return v;
}

/// Parses argv; a bad argument is a Diagnostic.
ToolOptions parseArguments(int argc, char **argv) {
  ToolOptions o;
  bool haveFile = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
    } else if (arg.starts_with("--print=")) {
      std::string_view name = arg.substr(8);
      std::optional<braze::StageKind> stage = braze::stageByName(name);
      if (!stage) {
        std::string known;
        std::vector<std::string_view> names = braze::stageNames();
        for (size_t i = 0; i < names.size(); ++i)
          known += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") +
                   std::string(names[i]);
        BRAZE_USER_ERROR("--print", "") << "unknown stage '" << name << "'; expected " << known;
      }
      o.stage = *stage;
    } else if (arg.starts_with("--passes=")) {
      for (std::string &name : braze::splitCommas(arg.substr(9))) {
        bool step = std::any_of(braze::graphSteps().begin(), braze::graphSteps().end(),
                                [&](const braze::GraphStep &s) { return s.name == name; });
        if (!braze::findPass(name) && !step)
          BRAZE_USER_ERROR("--passes", "") << "unknown pass '" << name << "' (see --help)";
        o.passes.push_back(std::move(name));
      }
    } else if (arg.starts_with("--disable-passes=")) {
      for (std::string &name : braze::splitCommas(arg.substr(17)))
        o.disabledPasses.push_back(std::move(name));
      braze::checkDisabledPasses(o.disabledPasses, "--disable-passes");
    } else if (arg == "--no-fuse") {
      o.fuse = false;
    } else if (arg == "--paired-epilogues") {
      o.pairedEpilogues = true;
    } else if (arg == "--cuda") {
      o.cuda = true;
    } else if (arg == "--dnnl") {
      o.dnnl = true;
    } else if (arg == "--blas") {
      o.blas = true;
    } else if (arg == "--blas=mkl") {
      o.blas = o.mkl = true;
    } else if (arg.starts_with("--onednn-half=")) {
      for (const std::string &name : braze::splitCommas(arg.substr(14))) {
        std::optional<braze::DType> t = braze::parseDType(name);
        if (!t || (*t != braze::DType::Float16 && *t != braze::DType::BFloat16))
          BRAZE_USER_ERROR("--onednn-half", "") << "expected f16 or bf16, got '" << name << "'";
        o.oneDnnHalf.push_back(*t);
      }
    } else if (arg == "--cudnn") {
      o.cudnn = true;
    } else if (arg == "--tf32") {
      o.tf32 = true;
    } else if (arg.starts_with("--launch=")) {
      o.launchFile = std::string(arg.substr(9));
      if (o.launchFile.empty())
        BRAZE_USER_ERROR("--launch", "") << "expected a file";
    } else if (arg == "--forms") {
      o.forms = true;
    } else if (arg.starts_with("--run=")) {
      o.runFile = std::string(arg.substr(6));
    } else if (arg.starts_with("--atol=") || arg.starts_with("--rtol=")) {
      std::string value(arg.substr(7));
      char *end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v >= 0))
        BRAZE_USER_ERROR(std::string(arg.substr(0, 6)), "") << "expected a tolerance, got '"
                                                            << value << "'";
      (arg[2] == 'a' ? o.atol : o.rtol) = v;
    } else if (arg.starts_with("--sm=")) {
      std::optional<int64_t> v = integerIn(arg.substr(5), 70, 129);
      if (!v)
        BRAZE_USER_ERROR("--sm", "") << "expected a compute capability from 70 to 129 (90 for "
                                     << "sm_90), got '" << arg.substr(5) << "'";
      o.sm = static_cast<int>(*v);
    } else if (arg.starts_with("--kernel-arg-bytes=")) {
      std::optional<int64_t> v = integerIn(arg.substr(19), 1024, 32764);
      if (!v)
        BRAZE_USER_ERROR("--kernel-arg-bytes", "")
            << "expected a number of bytes from 1024 to 32764, got '" << arg.substr(19) << "'";
      o.kernelArgBytes = *v;
    } else if (arg.size() > 1 && arg.front() == '-') {
      BRAZE_USER_ERROR("arguments", "") << "unknown option '" << arg << "' (see --help)";
    } else if (haveFile) {
      BRAZE_USER_ERROR("arguments", "") << "more than one input file: '" << o.file << "' and '"
                                        << arg << "'";
    } else {
      o.file = std::string(arg);
      haveFile = true;
    }
  }
  if (!haveFile && !o.help)
    BRAZE_USER_ERROR("arguments", "") << "no input file (see --help)";
  return o;
}

std::string readInput(const std::string &file) {
  std::ostringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
    return text.str();
  }
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    BRAZE_USER_ERROR(file, "") << "is a directory";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    BRAZE_USER_ERROR(file, "") << "cannot open the file";
  text << in.rdbuf();
  if (in.bad())
    BRAZE_USER_ERROR(file, "") << "cannot read the file";
  return text.str();
}

/// The first word of `text` after whitespace and `#` comment lines.
std::string_view firstWord(std::string_view text) {
  size_t at = 0;
  while (at < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[at]))) {
      ++at;
    } else if (text[at] == '#') {
      size_t eol = text.find('\n', at);
      at = eol == std::string_view::npos ? text.size() : eol;
    } else {
      break;
    }
  }
  size_t end = at;
  while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
    ++end;
  return text.substr(at, end - at);
}

/// Element i of a tensor's bytes as a double.
double element(const braze::runtime::SafeTensor &t, const char *data, size_t i) {
  const DLDataType d = t.dtype;
  const char *p = data + i * (d.bits / 8);
  auto load = [&](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  if (d.code == kDLFloat && d.bits == 32)
    return load(float{});
  if (d.code == kDLFloat && d.bits == 64)
    return load(double{});
  if (d.code == kDLFloat && d.bits == 16)
    return static_cast<double>(load(_Float16{}));
  if (d.code == kDLBfloat) {
    uint32_t bits = static_cast<uint32_t>(load(uint16_t{})) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  if (d.code == kDLInt && d.bits == 64)
    return static_cast<double>(load(int64_t{}));
  if (d.code == kDLInt && d.bits == 32)
    return load(int32_t{});
  if (d.code == kDLInt && d.bits == 16)
    return load(int16_t{});
  if (d.code == kDLInt && d.bits == 8)
    return load(int8_t{});
  return static_cast<unsigned char>(*p);
}

/// --run: compiles the graph, or the loop program, for the CPU and runs it on --run's tensors (by
/// input name), comparing output k with 'expected:k'.
int runOnTensors(std::unique_ptr<braze::Graph> g, std::unique_ptr<braze::loop::LoopProgram> p,
                 const braze::CompileOptions &opts, const ToolOptions &tool) {
  namespace rt = braze::runtime;
  if (opts.cuda)
    BRAZE_USER_ERROR("--run", "") << "runs on the CPU only (leave out --cuda)";
  rt::SafetensorsFile file;
  try {
    file = rt::readSafetensors(tool.runFile);
  } catch (const rt::RunError &e) {
    BRAZE_USER_ERROR("--run", "") << e.what();
  }
  auto meta = [&](const char *key, std::optional<double> flag, double fallback) {
    if (flag)
      return *flag;
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? fallback : std::strtod(it->second.c_str(), nullptr);
  };
  const double atol = meta("atol", tool.atol, 1e-5), rtol = meta("rtol", tool.rtol, 0);
  std::vector<std::string> names;
  if (g)
    for (const braze::Node *in : g->inputs())
      names.push_back(in->name());
  else
    for (const braze::loop::Buffer *in : p->inputs())
      names.push_back(in->name);
  braze::CompileResult r = g ? braze::compile(*g, opts) : braze::compile(std::move(p), opts);
  std::vector<DLTensor> views(names.size());
  std::vector<const DLTensor *> ptrs;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = file.tensors.find(names[i]);
    if (it == file.tensors.end())
      BRAZE_USER_ERROR("--run", "") << tool.runFile << " has no tensor for input '" << names[i]
                                    << "'";
    rt::SafeTensor &t = it->second;
    views[i].data = t.data.data();
    views[i].device = DLDevice{kDLCPU, 0};
    views[i].ndim = static_cast<int32_t>(t.shape.size());
    views[i].dtype = t.dtype;
    views[i].shape = t.shape.data();
    ptrs.push_back(&views[i]);
  }
  std::vector<std::unique_ptr<rt::OwnedTensor>> outs;
  try {
    outs = r.executable->run(ptrs);
  } catch (const rt::RunError &e) {
    BRAZE_USER_ERROR("--run", "") << e.what();
  }
  int diverged = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const rt::OwnedTensor &o = *outs[k];
    std::cout << "output " << k << ": [";
    for (size_t d = 0; d < o.shape().size(); ++d)
      std::cout << (d ? ", " : "") << o.shape()[d];
    std::cout << "]";
    auto it = file.tensors.find("expected:" + std::to_string(k));
    if (it == file.tensors.end()) {
      std::cout << " (no expected tensor)\n";
      continue;
    }
    const rt::SafeTensor &want = it->second;
    if (want.shape != o.shape()) {
      std::cout << ": shape differs from the expected one: DIVERGES\n";
      ++diverged;
      continue;
    }
    rt::SafeTensor got{o.dtype(), o.shape(), {}};
    size_t count = 1;
    for (int64_t d : o.shape())
      count *= static_cast<size_t>(d);
    // Outputs are dense; walk them in row-major order through their strides.
    double worst = 0, worstGot = 0, worstWant = 0;
    size_t worstAt = 0;
    bool bad = false;
    for (size_t i = 0; i < count; ++i) {
      size_t rest = i, offset = 0;
      for (size_t d = o.shape().size(); d-- > 0;) {
        offset += (rest % o.shape()[d]) * o.strides()[d];
        rest /= o.shape()[d];
      }
      double a = element(got, static_cast<const char *>(o.data()), offset);
      double b = element(want, want.data.data(), i);
      double err = std::fabs(a - b);
      bool same = a == b || (std::isnan(a) && std::isnan(b));
      if (!same && !(err <= atol + rtol * std::fabs(b))) {
        bad = true;
        if (!(err <= worst)) {
          worst = err;
          worstAt = i;
          worstGot = a;
          worstWant = b;
        }
      }
    }
    if (bad) {
      ++diverged;
      std::cout << ": DIVERGES: element " << worstAt << " is " << worstGot << ", expected "
                << worstWant << " (error " << worst << ", tolerance " << atol << " + " << rtol
                << " |expected|)\n";
    } else {
      std::cout << ": ok (within " << atol << " + " << rtol << " |expected|)\n";
    }
  }
  return diverged ? 3 : 0;
}

int run(int argc, char **argv) {
  ToolOptions tool = parseArguments(argc, argv);
  if (tool.help) {
    std::cout << usageText();
    return 0;
  }
  std::string text = readInput(tool.file);
  // Both texts may open with a `sizes` line; a loop program's next word is `buffer`.
  std::string_view first = firstWord(text);
  if (first == "sizes") {
    std::string_view rest(text);
    rest.remove_prefix(rest.find("sizes"));
    size_t eol = rest.find('\n');
    first = firstWord(eol == std::string_view::npos ? std::string_view() : rest.substr(eol));
  }
  bool loops = first == "buffer";
  braze::CompileOptions opts = braze::CompileOptions::fromEnvironment();
  opts.fuse = tool.fuse;
  if (!tool.disabledPasses.empty())
    opts.disabledPasses = tool.disabledPasses;
  opts.pairedEpilogues = opts.pairedEpilogues || tool.pairedEpilogues;
  if (tool.cuda)
    opts.cuda = braze::CompileOptions::Cuda{};
  if ((tool.cudnn || tool.tf32 || tool.kernelArgBytes || tool.sm) && !tool.cuda)
    BRAZE_USER_ERROR(tool.cudnn  ? "--cudnn"
                     : tool.tf32 ? "--tf32"
                     : tool.sm   ? "--sm"
                                 : "--kernel-arg-bytes",
                     "")
        << "it needs --cuda";
  if (tool.sm)
    opts.cuda->computeCapability = *tool.sm;
  if (!tool.launchFile.empty() && tool.cuda) {
    opts.cuda->launchRecords = readInput(tool.launchFile);
    if (braze::sched::parseLaunchRecords(opts.cuda->launchRecords).empty())
      BRAZE_USER_ERROR("--launch", "") << tool.launchFile << " has no launch record (a line "
                                       << "`kernelN ... launch{...}` of --print=schedule --cuda)";
  } else if (!tool.launchFile.empty()) {
    opts.cpuLaunchRecords = readInput(tool.launchFile);
    if (braze::sched::parseCpuLaunchRecords(opts.cpuLaunchRecords).empty())
      BRAZE_USER_ERROR("--launch", "") << tool.launchFile << " has no cpu record (a line "
                                       << "`kernelN ... cpu{...}` of --print=schedule)";
  }
  if (tool.kernelArgBytes)
    opts.cuda->kernelArgBytes = *tool.kernelArgBytes;
  if (tool.cudnn)
    opts.cuda->cudnnLibrary = "libcudnn.so.9";
  if (tool.tf32)
    opts.cuda->matmulTf32 = opts.cuda->convTf32 = true;
  if (tool.dnnl)
    opts.dnnlLibrary = "libdnnl.so.3";
  if (tool.blas)
    opts.blasLibrary = tool.mkl ? "libtorch_cpu.so" : "libopenblas.so.0";
  opts.oneDnnHalf = tool.oneDnnHalf;
  std::unique_ptr<braze::Graph> g;
  if (!loops) {
    g = braze::parseGraph(text);
    std::string err = braze::verifyGraph(*g);
    if (!err.empty())
      BRAZE_USER_ERROR(tool.file, "") << "invalid graph: " << err;
    braze::checkCompositeTypes(*g); // before any stage prints it
    for (const std::string &name : tool.passes)
      braze::runGraphStep(*g, name, opts);
  } else if (!tool.passes.empty()) {
    BRAZE_USER_ERROR("--passes", "") << "the passes rewrite graphs; the input is a loop program";
  }
  if (!tool.runFile.empty()) {
    if (tool.stage)
      BRAZE_USER_ERROR("--run", "") << "prints nothing: leave out --print";
    return runOnTensors(std::move(g), loops ? braze::loop::parseProgram(text) : nullptr, opts,
                        tool);
  }
  if (tool.atol || tool.rtol)
    BRAZE_USER_ERROR("--atol", "") << "it needs --run";
  if (tool.forms) {
    if (loops || tool.stage)
      BRAZE_USER_ERROR("--forms", "") << "it needs a graph, and prints instead of --print";
    std::cout << braze::printKernelForms(*g, opts);
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  if (loops)
    std::cout << braze::printStage(braze::loop::parseProgram(text),
                                   tool.stage.value_or(braze::StageKind::Loops), opts);
  else
    std::cout << braze::printStage(*g, tool.stage.value_or(braze::StageKind::Graph), opts);
  std::cout.flush();
  return std::cout ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const braze::Diagnostic &d) {
    std::cerr << kToolName << ": " << d.what() << "\n";
    return 1;
  } catch (const braze::InternalError &e) {
    std::cerr << kToolName << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception &e) {
    std::cerr << kToolName << ": internal error: " << e.what() << "\n";
    return 2;
  }
}
