#include "braze/support/Log.h"

#include "braze/support/Diagnostic.h"

#include <cstdio>
#include <string>

namespace braze {

LogSet LogSet::parse(std::string_view spec) {
  static const struct {
    const char *name;
    LogStage stage;
  } kNames[] = {{"graph", LogStage::Graph},       {"decomposed", LogStage::Decomposed},
                {"loops", LogStage::Loops},       {"schedule", LogStage::Schedule},
                {"output_code", LogStage::OutputCode}, {"cache", LogStage::Cache},
                {"fallback", LogStage::Fallback}, {"cudagraphs", LogStage::CudaGraphs},
                {"compile_time", LogStage::CompileTime}, {"accuracy", LogStage::Accuracy},
                {"autotune", LogStage::Autotune}};
  LogSet set;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos)
      end = spec.size();
    std::string_view name = spec.substr(pos, end - pos);
    while (!name.empty() && name.front() == ' ')
      name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ')
      name.remove_suffix(1);
    if (name == "all") {
      for (const auto &n : kNames)
        set.add(n.stage);
    } else if (!name.empty()) {
      bool found = false;
      for (const auto &n : kNames)
        if (name == n.name) {
          set.add(n.stage);
          found = true;
        }
      if (!found) {
        std::string known;
        for (const auto &n : kNames)
          known += std::string(n.name) + ", ";
        BRAZE_USER_ERROR("BRAZE_LOG", "")
            << "unknown stage '" << name << "'; expected " << known << "or all";
      }
    }
    pos = end + 1;
  }
  return set;
}

void logBlock(std::string_view title, std::string_view text) {
  std::fprintf(stderr, "===== braze: %.*s =====\n%.*s", static_cast<int>(title.size()),
               title.data(), static_cast<int>(text.size()), text.data());
  if (!text.empty() && text.back() != '\n')
    std::fputc('\n', stderr);
  std::fflush(stderr);
}

} // namespace braze
