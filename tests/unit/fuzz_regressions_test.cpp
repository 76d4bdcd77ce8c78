// Replays the fuzz seed corpus and every input the safetensors/config fuzzer ever found
// (tests/fuzz/{corpus,regressions}) through the same entry points as the fuzz target, without
// sanitizers: each must either parse or throw di::Error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace di {
namespace {

namespace fs = std::filesystem;

void replay(const std::string& bytes, const fs::path& scratch) {
  if (bytes.empty()) return;
  const std::string rest = bytes.substr(1);
  switch (static_cast<uint8_t>(bytes[0]) % 4) {
    case 0: {
      std::ofstream(scratch, std::ios::binary).write(rest.data(), static_cast<std::streamsize>(rest.size()));
      Checkpoint::open_file(scratch);
      break;
    }
    case 1: {
      if (rest.size() < 2) return;
      uint64_t data_size = static_cast<uint8_t>(rest[0]) | (static_cast<uint64_t>(static_cast<uint8_t>(rest[1])) << 8);
      parse_safetensors_header(std::string_view(rest).substr(2), data_size, "fuzz.safetensors");
      break;
    }
    case 2: parse_safetensors_index(rest, "index.json"); break;
    default: parse_model_config(rest, "", "fuzz"); break;
  }
}

TEST(FuzzRegressions, ReplayCorpusAndFindings) {
  const fs::path root = fs::path(DI_TEST_DATA).parent_path() / "fuzz";
  const fs::path scratch = fs::temp_directory_path() / ("di_fuzz_replay_" + std::to_string(::getpid()));
  size_t n = 0;
  for (const char* sub : {"corpus", "regressions"}) {
    if (!fs::is_directory(root / sub)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(root / sub)) {
      std::ifstream in(e.path(), std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      try {
        replay(bytes, scratch);
      } catch (const Error&) {
      }
      ++n;
    }
  }
  fs::remove(scratch);
  EXPECT_GE(n, 7u);
}

}  // namespace
}  // namespace di
