#include "common/byte_level.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "common/tokenizer.h"

namespace tailserve::bpe_internal {
namespace {

// GPT-2's bytes_to_unicode: every byte gets a printable code point, so byte strings can be
// vocab strings. Printable Latin-1 maps to itself; the rest to U+0100 onwards.
struct ByteLevelAlphabet {
  uint32_t byte_to_cp[256];
  int16_t cp_to_byte[0x144];  // -1 where the code point is not in the alphabet

  ByteLevelAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : next_extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace

bool ByteLevelDecode(std::string_view token, std::string* bytes) {
  bytes->clear();
  const ByteLevelAlphabet& alphabet = Alphabet();
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    const int n = DecodeUtf8(token, i, &cp);
    if (n <= 0 || cp >= std::size(alphabet.cp_to_byte) || alphabet.cp_to_byte[cp] < 0) return false;
    bytes->push_back(static_cast<char>(alphabet.cp_to_byte[cp]));
    i += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace tailserve::bpe_internal
