#include "common/tokenizer.h"

namespace tailserve {

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= 256) return {};
  return std::string(1, static_cast<char>(id));
}

int DecodeUtf8(std::string_view s, size_t i, uint32_t* cp) {
  const unsigned char c = s[i];
  size_t len;
  uint32_t min_cp;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, min_cp = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, min_cp = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, min_cp = 0x10000;
  } else {
    return -1;
  }
  uint32_t v = c & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char cc = s[i + k];
    if ((cc & 0xC0) != 0x80) return -1;
    v = (v << 6) | (cc & 0x3F);
  }
  if (v < min_cp || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return -1;
  *cp = v;
  return static_cast<int>(len);
}

size_t ValidUtf8Prefix(std::string_view s, bool* invalid) {
  *invalid = false;
  size_t i = 0;
  uint32_t cp;
  while (i < s.size()) {
    const int n = DecodeUtf8(s, i, &cp);
    if (n <= 0) {
      *invalid = n < 0;
      return i;
    }
    i += static_cast<size_t>(n);
  }
  return i;
}

bool IsValidUtf8(std::string_view s) {
  bool invalid = false;
  return ValidUtf8Prefix(s, &invalid) == s.size();
}

std::string StreamingDecoder::Add(int32_t id) {
  pending_ += tokenizer_.TokenBytes(id);
  std::string out;
  while (!pending_.empty()) {
    bool invalid = false;
    const size_t n = ValidUtf8Prefix(pending_, &invalid);
    out.append(pending_, 0, n);
    pending_.erase(0, n);
    if (!invalid) break;
    out += "\xEF\xBF\xBD";  // U+FFFD for the offending byte
    pending_.erase(0, 1);
  }
  return out;
}

std::string StreamingDecoder::Flush() {
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

}  // namespace tailserve
