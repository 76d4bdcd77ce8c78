// The measuring switches' parsing: what an A/B run's environment turns on, and what it cannot.
#include "core/env_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>

namespace di {
namespace {

constexpr const char* kName = "DEEPINFER_TEST_ENV_SWITCH";

TEST(EnvSwitch, OnUnlessZero) {
  unsetenv(kName);
  EXPECT_TRUE(env_switch_on(kName));
  EXPECT_FALSE(env_opt_in(kName));
  setenv(kName, "0", 1);
  EXPECT_FALSE(env_switch_on(kName));
  EXPECT_FALSE(env_opt_in(kName));
  setenv(kName, "1", 1);
  EXPECT_TRUE(env_switch_on(kName));
  EXPECT_TRUE(env_opt_in(kName));
  unsetenv(kName);
}

TEST(EnvSwitch, CountTakesWholeNumbersOnly) {
  unsetenv(kName);
  EXPECT_EQ(env_count(kName, 7), 7);
  for (const auto& [text, want] : {std::pair{"0", 0}, {"132", 132}, {"", 7}, {"-3", 7}, {"8x", 7}, {"x", 7},
                                   {"99999999999", 7}}) {
    setenv(kName, text, 1);
    EXPECT_EQ(env_count(kName, 7), want) << "value '" << text << "'";
  }
  unsetenv(kName);
}

}  // namespace
}  // namespace di
