#pragma once
/// The graph verifier's class, shared by the files that hold its checks: Verifier.cpp (the
/// graph's structure, types, the op schema, primitives and the composite dispatch),
/// VerifierNN.cpp (convolution, pooling, grid sampling, attention) and VerifierOps.cpp (sort,
/// scan, search, distances, scatter). Only those files include it; the API is verifyGraph
/// (GraphText.h).
#include "braze/ir/graph/GraphText.h"

#include "braze/ir/graph/Builder.h"

#include <array>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace braze::detail {

/// Checks one node at a time; the first violation is kept in error_ and stops the walk.
class GraphVerifier {
public:
  explicit GraphVerifier(const Graph &g) : g_(g), ctx_(*g.symShared()) {}

  std::string run();
  bool isDenseLayout(const std::vector<SymExpr> &shape, const std::vector<SymExpr> &strides);

private:
  // Verifier.cpp
  bool fail(const std::string &message);
  bool checkSizeSymbols();
  bool checkOperandsDefined();
  bool checkType();
  bool checkSchema();
  bool checkStoredMark();
  std::optional<int64_t> intAttr(const std::string &name);
  bool checkDim(const std::string &attr, int64_t rank);
  bool checkReduction(bool hasKeepdim);
  bool checkElementwise();
  bool checkView();
  bool checkNode();
  bool checkConcat();
  bool checkComposite();
  // VerifierNN.cpp
  bool checkConvolution();
  bool checkWindow(const IntList &stride, const IntList &padding, const IntList &dilation,
                   size_t spatial);
  bool sharesNumericDtype();
  bool checkConvTranspose();
  bool checkConvWeightGrad();
  bool checkConvInputGrad();
  bool checkConvGradient(const char *names, std::array<std::vector<int64_t>, 3> &sizes);
  int64_t convWindows(size_t i, int64_t n, int64_t k);
  bool checkPooling();
  bool checkAdaptivePooling();
  bool checkGridSample();
  bool checkAttention();
  bool checkAttentionBias(const Node *b, const Node *q, const Node *k);
  bool checkAttentionDropout(size_t at);
  bool checkAttentionSaved();
  // VerifierOps.cpp
  bool checkSort();
  bool checkScan();
  bool checkSearch();
  bool checkDistances();
  bool checkScatter();
  bool checkScatterLike();
  bool checkEmbeddingBag();
  bool checkArithmetic();

  const Graph &g_;
  sym::SymContext &ctx_;
  const Node *node_ = nullptr;
  std::unordered_set<const Node *> defined_;
  std::string error_;
};

} // namespace braze::detail
