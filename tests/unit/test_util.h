// Small helpers shared by the unit tests: a fresh, printed random seed and a temporary directory.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace di::testing_util {

// A seed from the clock, printed so a failing run can be replayed (DI_SEED=<seed> replays it).
inline uint64_t fresh_seed(const char* test) {
  const char* env = std::getenv("DI_SEED");
  uint64_t seed = env ? std::strtoull(env, nullptr, 10)
                      : static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  std::printf("[%s] seed %llu (DI_SEED=%llu replays)\n", test, static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  return seed;
}

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "di_test") {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace di::testing_util
