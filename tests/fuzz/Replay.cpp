/// braze-fuzz-replay: the fuzz target's checks (GraphTextFuzz.cpp) over given inputs, in the
/// ordinary build, without libFuzzer or sanitizers: ctest runs it over the regression inputs
/// and the text tests' graphs, so each input a fuzzer ever crashed braze with is tried again
/// by `make test`. `make test-fuzz` runs the same target under ASan and UBSan, with a seeded
/// campaign. Arguments: files, or directories whose .txt files are read in sorted order. A bug
/// aborts (GraphTextFuzz.cpp's bug()); a path that cannot be read is an error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry &e : fs::directory_iterator(argv[i], ec))
        if (e.is_regular_file() && e.path().extension() == ".txt")
          files.push_back(e.path());
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(argv[i], ec)) {
      inputs.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "braze-fuzz-replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: braze-fuzz-replay FILE|DIR...\n");
    return 2;
  }
  for (const fs::path &p : inputs) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) {
      std::fprintf(stderr, "braze-fuzz-replay: cannot read %s\n", p.c_str());
      return 2;
    }
    const std::string s = text.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(s.data()), s.size());
  }
  std::printf("braze-fuzz-replay: %zu inputs, none failed\n", inputs.size());
  return 0;
}
