#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/numpy_pcg64.h"

namespace di {
namespace {

// Spec §2.7: 2 * default_rng(10007 * layer).integers(0, (INT64_MAX // 99092) // 2, 4) + 1 for layers
// 1 and 14 (values from a converter test run against the official engram.py).
TEST(NumpyPcg64, EngramMultiplierVector) {
  const std::vector<int64_t> expected = {76632096046245, 4839876093313,  35959672319349, 73987337458391,
                                         67716810739261, 51510806800915, 30921347202721, 82619226485591};
  const int64_t bound = (std::numeric_limits<int64_t>::max() / 99092) / 2;
  std::vector<int64_t> got;
  for (int layer : {1, 14}) {
    NumpyPcg64 rng(static_cast<uint64_t>(10007 * layer));
    for (int64_t v : rng.integers(0, bound, 4)) got.push_back(2 * v + 1);
  }
  EXPECT_EQ(got, expected);
}

// np.random.default_rng(42).random(3) == [0.77395605, 0.43887844, 0.85859792] (numpy docs).
TEST(NumpyPcg64, RandomDoublesSeed42) {
  NumpyPcg64 rng(42);
  EXPECT_DOUBLE_EQ(rng.next_double(), 0.7739560485559633);
  EXPECT_NEAR(rng.next_double(), 0.43887844, 5e-9);
  EXPECT_NEAR(rng.next_double(), 0.85859792, 5e-9);
}

// np.random.SeedSequence(42).generate_state(4, np.uint64) and
// np.random.default_rng(42).integers(0, 10, size=10) (the 32-bit Lemire path).
TEST(NumpyPcg64, Seed42StateAndSmallIntegers) {
  EXPECT_EQ(NumpySeedSequence(42).generate_state_u64(4),
            (std::vector<uint64_t>{11465652750463011511ull, 15382171918060459190ull, 9018504550953525431ull,
                                   3703499796004394495ull}));
  NumpyPcg64 rng(42);
  EXPECT_EQ(rng.integers(0, 10, 10), (std::vector<int64_t>{0, 7, 6, 4, 4, 8, 0, 6, 2, 0}));
}

// Properties that hold for any seed: same seed, same stream; integers stay in range; a range of
// width 1 draws nothing; the 32-bit path consumes one 64-bit output per two values.
TEST(NumpyPcg64, StreamProperties) {
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 gen(seed);
  for (int trial = 0; trial < 50; ++trial) {
    const uint64_t s = gen() >> (gen() % 64);
    NumpyPcg64 a(s), b(s);
    EXPECT_EQ(a.next_u64(), b.next_u64());
    const int64_t low = static_cast<int64_t>(gen() % 1000) - 500;
    const int64_t width = trial % 2 ? static_cast<int64_t>(gen() % 100 + 1)
                                    : static_cast<int64_t>(gen() >> 2) + 1;
    for (int64_t v : a.integers(low, low + width, 64)) {
      EXPECT_GE(v, low);
      EXPECT_LT(v, low + width);
    }
    NumpyPcg64 c(s), d(s);
    EXPECT_EQ(c.integers(low, low + 1, 10), std::vector<int64_t>(10, low));
    EXPECT_EQ(c.next_u64(), d.next_u64());
    // Two small draws take the low then the high half of one output.
    NumpyPcg64 e(s), f(s);
    const uint64_t raw = f.next_u64();
    EXPECT_EQ(e.next_u32(), static_cast<uint32_t>(raw));
    EXPECT_EQ(e.next_u32(), static_cast<uint32_t>(raw >> 32));
  }
}

TEST(NumpyPcg64, SeedWordsAndErrors) {
  // A seed below 2^32 is one entropy word; above, two (low word first).
  EXPECT_EQ(NumpySeedSequence(7).pool(), NumpySeedSequence(std::vector<uint32_t>{7}).pool());
  const uint64_t big = 0x123456789abcdefull;
  EXPECT_EQ(NumpySeedSequence(big).pool(), NumpySeedSequence(std::vector<uint32_t>{0x89abcdefu, 0x1234567u}).pool());
  EXPECT_NE(NumpySeedSequence(1).pool(), NumpySeedSequence(2).pool());
  NumpyPcg64 r(1);
  EXPECT_THROW(r.integers(5, 5, 1), Error);
  EXPECT_THROW(r.integers(0, 5, -1), Error);
}

}  // namespace
}  // namespace di
