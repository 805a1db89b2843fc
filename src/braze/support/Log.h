#pragma once
/// Stage logging. Which stages print is part of CompileOptions (`LogSet`), never global state;
/// the environment variable BRAZE_LOG is read once, in driver/Options.
#include <cstdint>
#include <string>
#include <string_view>

namespace braze {

enum class LogStage : uint32_t {
  Graph = 1u << 0,      ///< the imported tensor graph
  Decomposed = 1u << 1, ///< after decomposition and graph passes
  Loops = 1u << 2,      ///< the loop IR
  Schedule = 1u << 3,   ///< kernels, fusion groups and the memory plan
  OutputCode = 1u << 4, ///< generated source
  Cache = 1u << 5,      ///< cache hits and misses
  Fallback = 1u << 6,   ///< ops that fell back to eager (printed by the Python layer)
  CudaGraphs = 1u << 7, ///< which graphs are replayed as CUDA graphs, and why not (Python layer)
  CompileTime = 1u << 8, ///< where each graph's compile spent its time (Python layer)
  Accuracy = 1u << 9,   ///< the accuracy checker's reports, with the kernel (Python layer)
  Autotune = 1u << 10,  ///< the autotuner's forms of each kernel, their times and its choice
};

class LogSet {
public:
  LogSet() = default;
  /// Parses "graph,loops,…" or "all"; unknown names are a user error naming them.
  static LogSet parse(std::string_view spec);
  bool has(LogStage s) const { return (bits_ & static_cast<uint32_t>(s)) != 0; }
  void add(LogStage s) { bits_ |= static_cast<uint32_t>(s); }
  bool empty() const { return bits_ == 0; }

private:
  uint32_t bits_ = 0;
};

/// Writes one titled block to stderr.
void logBlock(std::string_view title, std::string_view text);

} // namespace braze
