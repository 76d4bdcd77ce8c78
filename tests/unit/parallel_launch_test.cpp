// Multi-GPU launch (src/parallel): the --dp/--ep layout checks, the DEEPINFER_* bootstrap variables,
// and the TCP broadcast that hands NCCL's unique id to every rank -- as threads and as processes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "core/error.h"
#include "parallel/bootstrap.h"
#include "parallel/parallel_config.h"
#include "test_util.h"

namespace di {
namespace {

using parallel::BootstrapConfig;
using parallel::ParallelOptions;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelConfig, LayoutAndResources) {
  EXPECT_EQ(parallel::parallel_world_size({1, 1}), 1);
  EXPECT_EQ(parallel::parallel_world_size({1, 4}), 4);
  EXPECT_EQ(parallel::parallel_world_size({8, 1}), 8);
  EXPECT_EQ(parallel::parallel_world_size({2, 2}), 2);
  EXPECT_NE(error_of([] { parallel::parallel_world_size({2, 4}); }).find("give equal values"), std::string::npos);
  EXPECT_NE(error_of([] { parallel::parallel_world_size({0, 1}); }).find("--dp"), std::string::npos);
  // One rank: always fine.
  EXPECT_EQ(error_of([] { parallel::check_parallel_resources({1, 1}, "cpu", 0, std::nullopt); }), "");
  EXPECT_EQ(error_of([] { parallel::check_parallel_resources({1, 4}, "cpu", 0, std::nullopt); }),
            "--ep 4 needs --device cuda and 4 CUDA devices (got --device cpu); the CPU backend runs one rank");
  EXPECT_EQ(error_of([] { parallel::check_parallel_resources({1, 4}, "cuda", 0, std::nullopt); }),
            "--ep 4 needs 4 CUDA devices; this machine has 0");
  EXPECT_EQ(error_of([] { parallel::check_parallel_resources({2, 1}, "cuda", 1, std::nullopt); }),
            "--dp 2 needs 2 CUDA devices; this machine has 1");
  EXPECT_EQ(error_of([] { parallel::check_parallel_resources({4, 4}, "cuda", 8, std::nullopt); }), "");
  // One process per GPU: each process needs one device, and the world sizes must agree.
  BootstrapConfig launch;
  launch.world_size = 16;
  EXPECT_EQ(error_of([&] { parallel::check_parallel_resources({16, 16}, "cuda", 8, launch); }), "");
  EXPECT_NE(error_of([&] { parallel::check_parallel_resources({1, 8}, "cuda", 8, launch); }).find("DEEPINFER_WORLD_SIZE=16"),
            std::string::npos);
}

TEST(Bootstrap, Environment) {
  ::unsetenv("DEEPINFER_WORLD_SIZE");
  EXPECT_FALSE(parallel::bootstrap_from_env().has_value());
  ::setenv("DEEPINFER_WORLD_SIZE", "4", 1);
  ::setenv("DEEPINFER_RANK", "3", 1);
  ::setenv("DEEPINFER_MASTER_ADDR", "node0.example", 1);
  ::setenv("DEEPINFER_MASTER_PORT", "4000", 1);
  ::unsetenv("DEEPINFER_LOCAL_RANK");
  std::optional<BootstrapConfig> c = parallel::bootstrap_from_env();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->world_size, 4);
  EXPECT_EQ(c->rank, 3);
  EXPECT_EQ(c->local_rank, -1);
  EXPECT_EQ(c->master_addr, "node0.example");
  EXPECT_EQ(c->master_port, 4000);
  ::setenv("DEEPINFER_RANK", "4", 1);
  EXPECT_NE(error_of([] { parallel::bootstrap_from_env(); }).find("DEEPINFER_RANK"), std::string::npos);
  ::unsetenv("DEEPINFER_RANK");
  EXPECT_NE(error_of([] { parallel::bootstrap_from_env(); }).find("DEEPINFER_RANK: not set"), std::string::npos);
  ::setenv("DEEPINFER_RANK", "1", 1);
  ::setenv("DEEPINFER_MASTER_PORT", "http", 1);
  EXPECT_NE(error_of([] { parallel::bootstrap_from_env(); }).find("DEEPINFER_MASTER_PORT"), std::string::npos);
  for (const char* v : {"DEEPINFER_WORLD_SIZE", "DEEPINFER_RANK", "DEEPINFER_MASTER_ADDR", "DEEPINFER_MASTER_PORT"})
    ::unsetenv(v);
}

// A port nobody listens on right now (the kernel's pick for port 0).
int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

std::vector<uint8_t> random_blob(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> blob(128);  // the size of an ncclUniqueId
  for (uint8_t& b : blob) b = static_cast<uint8_t>(rng());
  return blob;
}

TEST(Bootstrap, BroadcastToThreads) {
  const uint64_t seed = testing_util::fresh_seed("BroadcastToThreads");
  const std::vector<uint8_t> blob = random_blob(seed);
  const int world = 5, port = free_port();
  std::vector<std::vector<uint8_t>> got(world);
  std::vector<std::thread> ranks;
  // Ranks start before rank 0 listens: they retry.
  for (int r = world - 1; r >= 0; --r)
    ranks.emplace_back([&, r] {
      BootstrapConfig c;
      c.rank = r;
      c.world_size = world;
      c.master_port = port;
      c.timeout_s = 20;
      got[r] = parallel::bootstrap_broadcast(c, r == 0 ? blob : std::vector<uint8_t>{});
    });
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], blob) << "rank " << r;
}

TEST(Bootstrap, BroadcastToProcesses) {
  const uint64_t seed = testing_util::fresh_seed("BroadcastToProcesses");
  const std::vector<uint8_t> blob = random_blob(seed);
  const int world = 4, port = free_port();
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // a rank process: exit 0 iff it got rank 0's blob
      BootstrapConfig c;
      c.rank = r;
      c.world_size = world;
      c.master_port = port;
      c.timeout_s = 20;
      int ok = 0;
      try {
        ok = parallel::bootstrap_broadcast(c, {}) == blob;
      } catch (...) {
      }
      ::_exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  BootstrapConfig c;
  c.world_size = world;
  c.master_port = port;
  c.timeout_s = 20;
  EXPECT_EQ(parallel::bootstrap_broadcast(c, blob), blob);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

TEST(Bootstrap, TimesOutWithoutRankZero) {
  BootstrapConfig c;
  c.rank = 1;
  c.world_size = 2;
  c.master_port = free_port();
  c.timeout_s = 0.3;
  EXPECT_NE(error_of([&] { parallel::bootstrap_broadcast(c, {}); }).find("could not reach rank 0"), std::string::npos);
}

}  // namespace
}  // namespace di
