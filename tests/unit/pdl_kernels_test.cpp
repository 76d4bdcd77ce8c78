// Programmatic dependent launch is only safe if every kernel launched with it waits for the previous
// grid before touching memory (src/backend/cuda/pdl_launch.cuh). This reads the CUDA sources, so CI
// (no GPU) catches a kernel added without the wait: on the device such a race would show up only
// now and then.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text after the opening brace of the body of the __global__ function that starts at `at`.
std::string body_start(const std::string& src, size_t at) {
  int depth = 0;
  for (size_t i = at; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ';' && depth == 0) return "";  // a declaration, not a definition
    if (c == '{' && depth == 0) return src.substr(i + 1, 200);
  }
  return "";
}

TEST(PdlKernels, EveryKernelOfAPdlFileWaitsFirst) {
  const std::filesystem::path dir = std::filesystem::path(DEEPINFER_SOURCE_DIR) / "src" / "backend" / "cuda";
  int kernels = 0, files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    const std::string src = read_all(entry.path());
    const bool uses_pdl = src.find("::di::cuda::launch(") != std::string::npos;
    if (!uses_pdl) continue;
    ++files;
    EXPECT_EQ(src.find("<<<"), std::string::npos)
        << entry.path() << " mixes PDL launches with <<< >>> launches: launch every kernel through cuda::launch";
    for (size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) {
      const std::string body = body_start(src, at);
      if (body.empty()) continue;
      ++kernels;
      // the wait itself, or a *_then_wait function (reads that the rule in pdl_launch.cuh allows, then
      // the wait)
      static const std::regex wait_first(R"(^\s*::di::cuda::grid_dependency_wait\(\);)");
      static const std::regex then_wait_first(R"(^[^;]*_then_wait\b)");
      EXPECT_TRUE(std::regex_search(body, wait_first) || std::regex_search(body, then_wait_first))
          << entry.path() << ": the kernel at offset " << at
          << " does not start with ::di::cuda::grid_dependency_wait(); it is launched with PDL and would race "
             "with the kernel before it";
    }
  }
  EXPECT_GE(files, 10);
  EXPECT_GE(kernels, 40);
}

}  // namespace
