#include "router/predictor/features.h"

#include <cctype>
#include <cmath>

#include "common/tokenizer.h"

namespace tailserve {

FeatureVector MakeFeatures(const FeatureInput& in) {
  return {static_cast<float>(in.prompt_tokens),
          static_cast<float>(std::log1p(static_cast<double>(in.prompt_tokens))),
          static_cast<float>(in.non_alnum_ratio),
          static_cast<float>(in.max_tokens),
          static_cast<float>(std::log1p(static_cast<double>(in.max_tokens))),
          static_cast<float>(in.priority),
          in.has_stop ? 1.0f : 0.0f,
          in.temperature};
}

namespace {

// Symbols and pictographs: General Punctuation .. Misc Symbols and Arrows, CJK symbols and
// punctuation, variation selectors, and the emoji planes.
bool IsSymbol(uint32_t cp) {
  return (cp >= 0x2000 && cp <= 0x2BFF) || (cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFE00 && cp <= 0xFE0F) ||
         (cp >= 0x1F000 && cp <= 0x1FAFF) || cp == 0x200D || (cp >= 0xFF00 && cp <= 0xFF20);
}

}  // namespace

double NonAlnumRatio(std::string_view text) {
  size_t counted = 0, non_alnum = 0, i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    if (c < 0x80) {
      ++i;
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
      ++counted;
      if (!std::isalnum(c)) ++non_alnum;
      continue;
    }
    bool invalid = false;
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    const size_t ok = ValidUtf8Prefix(text.substr(i, len), &invalid);
    ++counted;
    if (ok != len || len == 1) {
      ++non_alnum;
      ++i;
      continue;
    }
    uint32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    if (IsSymbol(cp)) ++non_alnum;
    i += len;
  }
  return counted ? static_cast<double>(non_alnum) / counted : 0.0;
}

}  // namespace tailserve
