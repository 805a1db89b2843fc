#pragma once
/// A library call whose implementation the autotuner may choose among those the library's
/// heuristics offer: cuBLASLt's algorithms for a product (CublasLt::setTuner), cuDNN's engine
/// configs for a convolution (Cudnn::setTuner). Its result is written, never read (beta = 0),
/// so each choice may run over the call's own memory.
#include <cstddef>
#include <functional>
#include <string>

namespace braze::runtime {

struct LibraryTuning {
  /// The problem (sizes, strides, dtypes, alignments) as one word, beginning with its kind:
  /// "gemm_..." or "conv_...". A tuned module records its choices by it.
  std::string key;
  int choices = 0; ///< offered, the heuristics' own first
  /// Enqueues the call with choice i (< choices) on the call's stream: "" or why not.
  std::function<std::string(int)> run;
  void *out = nullptr; ///< the result's memory: `outBytes` bytes of `outKind` values
  size_t outBytes = 0;
  int outKind = 0; ///< 0 f32, 1 f64, 2 f16, 3 bf16
  void *stream = nullptr;
};

} // namespace braze::runtime
