#include <gtest/gtest.h>

#include "cli/args.h"
#include "core/error.h"

namespace di::cli {

TEST(Args, ParsesValuesAndFlags) {
  Args a({"--model", "dir", "--chat", "--max-tokens=7"}, {"model", "max-tokens"}, {"chat"});
  EXPECT_EQ(a.get("model"), "dir");
  EXPECT_TRUE(a.flag("chat"));
  EXPECT_EQ(a.get_int_or("max-tokens", 0), 7);
  EXPECT_EQ(a.get_or("missing", "x"), "x");
}

TEST(Args, RejectsUnknownAndMissingValues) {
  EXPECT_THROW(Args({"--nope"}, {"model"}, {}), Error);
  EXPECT_THROW(Args({"--model"}, {"model"}, {}), Error);
  Args a({"--n", "x1"}, {"n"}, {});
  EXPECT_THROW(a.get_int_or("n", 0), Error);
}

TEST(Args, IntList) {
  EXPECT_EQ(parse_int_list("ids", "0,5,9"), (std::vector<int>{0, 5, 9}));
  EXPECT_TRUE(parse_int_list("ids", "").empty());
  EXPECT_THROW(parse_int_list("ids", "1,,2"), Error);
  EXPECT_THROW(parse_int_list("ids", "-3"), Error);
}

}  // namespace di::cli
