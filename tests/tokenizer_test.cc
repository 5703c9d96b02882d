#include "common/tokenizer.h"

#include <gtest/gtest.h>

namespace tailserve {
namespace {

std::string DecodeAll(const std::vector<int32_t>& ids) {
  ByteTokenizer tok;
  StreamingDecoder d(tok);
  std::string out;
  for (int32_t id : ids) out += d.Add(id);
  return out + d.Flush();
}

TEST(ByteTokenizerTest, RoundTripsUtf8) {
  ByteTokenizer tok;
  const std::string text = "héllo, 世界 🙂!";
  EXPECT_EQ(tok.Encode(text).size(), text.size());
  EXPECT_EQ(DecodeAll(tok.Encode(text)), text);
}

TEST(StreamingDecoderTest, NeverSplitsACharacter) {
  ByteTokenizer tok;
  StreamingDecoder d(tok);
  const std::string smile = "🙂";  // 4 bytes
  std::string out;
  for (size_t i = 0; i + 1 < smile.size(); ++i) {
    EXPECT_EQ(d.Add(static_cast<unsigned char>(smile[i])), "") << "byte " << i;
  }
  EXPECT_EQ(d.Add(static_cast<unsigned char>(smile.back())), smile);
}

TEST(StreamingDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(DecodeAll({'a', 0xFF, 'b'}), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(DecodeAll({0xC3, 'x'}), "\xEF\xBF\xBD" "x");      // lead byte without continuation
  EXPECT_EQ(DecodeAll({0xC0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong NUL
  EXPECT_EQ(DecodeAll({'z', 0xE4, 0xB8}), "z\xEF\xBF\xBD");    // truncated at the end
  EXPECT_EQ(DecodeAll({300, 'q'}), "q");                       // out of range id: no bytes
}

TEST(Utf8Test, ValidPrefix) {
  bool invalid;
  EXPECT_EQ(ValidUtf8Prefix("ab\xE4\xB8", &invalid), 2u);
  EXPECT_FALSE(invalid);
  EXPECT_EQ(ValidUtf8Prefix("\xED\xA0\x80", &invalid), 0u);  // surrogate
  EXPECT_TRUE(invalid);
}

}  // namespace
}  // namespace tailserve
