#include "util/utf8.h"

#include <gtest/gtest.h>

#include "server/auth.h"

namespace kvmesh {
namespace {

TEST(Utf8, CompletePrefixHoldsBackOnlyAnUnfinishedCharacter) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3"), 1u);              // é's first byte
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3\xA9"), 3u);          // é complete
  EXPECT_EQ(CompleteUtf8Prefix("\xE2\x82"), 0u);           // € missing its last byte
  EXPECT_EQ(CompleteUtf8Prefix("x\xF0\x9F\x98\x80"), 5u);  // an emoji, complete
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
}

TEST(Utf8, ValidUtf8ReplacesOnlyInvalidSequences) {
  EXPECT_EQ(ValidUtf8("caf\xC3\xA9 \xE2\x82\xAC"), "caf\xC3\xA9 \xE2\x82\xAC");
  EXPECT_EQ(ValidUtf8("a\x80z"), "a\xEF\xBF\xBDz");              // stray continuation byte
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(ValidUtf8("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // truncated
}

TEST(Auth, ConstantTimeEqualsComparesWholeKeys) {
  EXPECT_TRUE(server::ConstantTimeEquals("Bearer k", "Bearer k"));
  EXPECT_FALSE(server::ConstantTimeEquals("Bearer k", "Bearer kk"));
  EXPECT_FALSE(server::ConstantTimeEquals("", "Bearer k"));
  EXPECT_FALSE(server::ConstantTimeEquals("Bearer j", "Bearer k"));
}

}  // namespace
}  // namespace kvmesh
