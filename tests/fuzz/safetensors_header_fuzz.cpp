// libFuzzer target for everything that parses untrusted checkpoint metadata. The first input byte
// picks what the rest is fed to:
//   0: a whole safetensors file, opened through Checkpoint::open_file (length prefix, mmap, header)
//   1: a bare header, through parse_safetensors_header (the next 2 bytes give the data-section size)
//   2: model.safetensors.index.json, through parse_safetensors_index
//   3: config.json, through parse_model_config (with the schedule derivation)
// Only di::Error may escape the library; anything else (crash, sanitizer report, other exception,
// hang) is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace {

// One in-memory file for the whole run; /proc/self/fd/N reopens it like a path on disk.
int memory_file() {
  static int fd = [] {
    int f = memfd_create("di_fuzz.safetensors", 0);
    if (f < 0) std::abort();
    return f;
  }();
  return fd;
}

void run_file(const uint8_t* data, size_t size) {
  const int fd = memory_file();
  if (ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  std::unique_ptr<di::Checkpoint> ck = di::Checkpoint::open_file(path);
  // Touch every byte the reader claims is there: ASan reports any out-of-range view.
  volatile uint8_t sink = 0;
  for (const auto& [name, view] : ck->tensors()) {
    if (view.nbytes > 0) sink = sink ^ view.data[0] ^ view.data[view.nbytes - 1];
    if (static_cast<uint64_t>(view.numel()) * di::dtype_size(view.dtype) != view.nbytes) std::abort();
  }
}

void run_header(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const uint64_t data_size = static_cast<uint64_t>(data[0]) | (static_cast<uint64_t>(data[1]) << 8);
  std::string_view header(reinterpret_cast<const char*>(data + 2), size - 2);
  for (const di::TensorView& v : di::parse_safetensors_header(header, data_size, "fuzz.safetensors")) {
    if (v.data_offset + v.nbytes > data_size) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;
  ++data;
  --size;
  try {
    switch (mode) {
      case 0: run_file(data, size); break;
      case 1: run_header(data, size); break;
      case 2: di::parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size), "index.json"); break;
      default: di::parse_model_config(std::string(reinterpret_cast<const char*>(data), size), "", "fuzz"); break;
    }
  } catch (const di::Error&) {
    // expected for bad input
  }
  return 0;
}
