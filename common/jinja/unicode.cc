#include "common/jinja/unicode.h"

#include <algorithm>

#include <utf8proc.h>

namespace tailserve::jinja {

std::vector<char32_t> DecodeUtf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + static_cast<size_t>(n) > s.size()) n = 1;  // truncated: keep the byte as it is
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

bool IsPythonSpace(char32_t cp) {
  // Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

namespace {

bool IsCased(char32_t cp) {
  const utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

template <typename F>
std::string MapCodePoints(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  const std::vector<char32_t> cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) AppendUtf8(f(i, cps[i], i ? cps[i - 1] : 0), &out);
  return out;
}

char32_t ToUpper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t ToLower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t ToTitle(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

}  // namespace

std::string Upper(std::string_view s) { return MapCodePoints(s, [](size_t, char32_t c, char32_t) { return ToUpper(c); }); }
std::string Lower(std::string_view s) { return MapCodePoints(s, [](size_t, char32_t c, char32_t) { return ToLower(c); }); }

std::string Title(std::string_view s) {
  // Python: a cased character after an uncased one starts a word.
  bool previous_cased = false;
  return MapCodePoints(s, [&](size_t, char32_t c, char32_t) {
    const bool cased = IsCased(c);
    const char32_t r = cased ? (previous_cased ? ToLower(c) : ToTitle(c)) : c;
    previous_cased = cased;
    return r;
  });
}

std::string Capitalize(std::string_view s) {
  return MapCodePoints(s, [](size_t i, char32_t c, char32_t) { return i == 0 ? ToTitle(c) : ToLower(c); });
}

bool IsPythonPrintable(char32_t cp) {
  // Not printable: categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than the space. The common
  // ones; unassigned code points (Cn) are not tracked.
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
  if ((cp >= 0x205F && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB) || cp >= 0xF0000) return false;
  return true;
}

std::string Strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  const std::vector<char32_t> set = chars ? DecodeUtf8(*chars) : std::vector<char32_t>{};
  auto strip = [&](char32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : IsPythonSpace(cp);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b),
                                          cps.begin() + static_cast<std::ptrdiff_t>(e)));
}

}  // namespace tailserve::jinja
