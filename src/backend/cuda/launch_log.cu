// launch_log.cuh: the launch log of DEEPINFER_LAUNCH_LOG.
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/launch_log.cuh"
#include "backend/cuda/side_stream.cuh"
#include "core/error.h"

namespace di::cuda {
namespace {

std::FILE* log_file() {
  static std::FILE* f = [] {
    const char* path = std::getenv("DEEPINFER_LAUNCH_LOG");
    if (!path || !*path) return static_cast<std::FILE*>(nullptr);
    std::FILE* opened = std::fopen(path, "w");
    if (!opened) throw Error(std::string("DEEPINFER_LAUNCH_LOG: cannot write ") + path);
    return opened;
  }();
  return f;
}

std::string kernel_name(const void* kernel) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || !mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && d ? d : mangled;
  std::free(d);
  for (const std::string anon = "(anonymous namespace)::";;) {
    const size_t at = name.find(anon);
    if (at == std::string::npos) break;
    name.erase(at, anon.size());
  }
  const size_t paren = name.find('(');  // the name without its parameter list
  return paren == std::string::npos ? name : name.substr(0, paren);
}

}  // namespace

bool launch_log_on() { return log_file() != nullptr; }

void log_launch(const void* kernel, dim3 grid, dim3 block, size_t smem,
                const std::vector<std::pair<const void*, size_t>>& params) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::FILE* f = log_file();
  std::string name = kernel_name(kernel);
  for (char& c : name)
    if (c == '\t' || c == '\n') c = ' ';
  std::fprintf(f, "%s\t%u,%u,%u\t%u,%u,%u\t%zu\t%d\t", name.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z,
               smem, stream_lane());
  for (const auto& [p, n] : params) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = n; i-- > 0;) std::fprintf(f, "%02x", b[i]);  // most significant byte first (little endian)
    std::fputc(' ', f);
  }
  std::fputc('\n', f);
}

}  // namespace di::cuda
