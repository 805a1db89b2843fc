#pragma once
/// A library call whose implementation the autotuner may choose among those the library's
/// heuristics offer: cuBLASLt's algorithms for a product (CublasLt::setTuner), cuDNN's engine
/// configs for a convolution or a fused attention (Cudnn::setTuner). Its results are written,
/// never read (beta = 0), so each choice may run over the call's own memory.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace braze::runtime {

/// Whose choice it is: cuBLASLt's algorithm for a matrix product (CublasLt::prefer restores
/// it) or cuDNN's engine for a convolution or an attention, forward or backward (Cudnn::prefer).
enum class LibraryKind { Gemm, Convolution, Attention };

/// One tensor a library call writes: `bytes` bytes of `kind` values at `at`.
struct LibraryResult {
  void *at = nullptr;
  size_t bytes = 0;
  int kind = 0; ///< 0 f32, 1 f64, 2 f16, 3 bf16
};

/// The choice a tuned module keeps for one problem, restored in the process that loads it.
struct LibraryChoice {
  LibraryKind kind = LibraryKind::Gemm;
  std::string key; ///< LibraryTuning::key
  /// cuBLASLt: the algorithm's position among those its heuristics offer. cuDNN: the engine's
  /// global index, which names it whatever list a later process's heuristics give.
  int64_t id = 0;
  bool operator==(const LibraryChoice &o) const {
    return kind == o.kind && key == o.key && id == o.id;
  }
};

struct LibraryTuning {
  LibraryKind kind = LibraryKind::Gemm;
  /// The problem (sizes, strides, dtypes, alignments) as one word, beginning with its kind:
  /// "gemm_...", "conv_..." or "attention_...". A tuned module records its choices by it.
  std::string key;
  int choices = 0; ///< offered, the heuristics' own first
  /// What a tuned module keeps of each choice (LibraryChoice::id; -1: nothing names it, so it
  /// serves this process only); empty: its position.
  std::vector<int64_t> ids;
  /// Enqueues the call with choice i (< choices) on the call's stream: "" or why not.
  std::function<std::string(int)> run;
  /// What the call writes, each compared with what the heuristics' first choice wrote (an
  /// attention backward writes three gradients).
  std::vector<LibraryResult> results;
  void *stream = nullptr;
};

} // namespace braze::runtime
