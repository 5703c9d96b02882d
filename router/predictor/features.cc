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
    uint32_t cp = 0;
    const int n = DecodeUtf8(text, i, &cp);
    if (n <= 0) {  // an invalid or cut-off byte counts as one non-alphanumeric character
      ++counted;
      ++non_alnum;
      ++i;
      continue;
    }
    i += static_cast<size_t>(n);
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') continue;
    ++counted;
    if (cp < 0x80 ? !std::isalnum(static_cast<int>(cp)) : IsSymbol(cp)) ++non_alnum;
  }
  return counted ? static_cast<double>(non_alnum) / counted : 0.0;
}

}  // namespace tailserve
