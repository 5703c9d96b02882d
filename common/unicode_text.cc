#include "common/unicode_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common/tokenizer.h"

namespace tailserve::bpe_internal {
namespace {

// Unicode White_Space, as Rust's regex \s (used by HF for added-token lstrip/rstrip).
bool IsWhiteSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Approximates Rust's regex \w (Alphabetic, marks, digits, connector punctuation, joiners).
bool IsWordChar(uint32_t cp) {
  if (cp == '_' || cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// Applies one of the four Unicode normalization forms; invalid UTF-8 runs are kept as they are.
std::string NormalizeValidUtf8(std::string_view text, utf8proc_option_t options) {
  if (text.empty()) return {};
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped, options);
  if (n < 0) {
    std::free(mapped);
    return std::string(text);
  }
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

std::string NormalizeUtf8(std::string_view text, utf8proc_option_t options) {
  bool invalid = false;
  size_t valid = ValidUtf8Prefix(text, &invalid);
  if (valid == text.size()) return NormalizeValidUtf8(text, options);
  // Normalize each valid run separately and pass invalid bytes through untouched.
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    valid = ValidUtf8Prefix(text.substr(i), &invalid);
    out += NormalizeValidUtf8(text.substr(i, valid), options);
    i += valid;
    if (i < text.size()) out += text[i++];
  }
  return out;
}

}  // namespace

std::string Normalize(std::string_view text, NormalizationForm form) {
  switch (form) {
    case NormalizationForm::kNone:
      return std::string(text);
    case NormalizationForm::kNfc:
      return NormalizeUtf8(text,
                           static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    case NormalizationForm::kNfd:
      return NormalizeUtf8(text,
                           static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    case NormalizationForm::kNfkc:
      return NormalizeUtf8(text, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                                                UTF8PROC_COMPAT));
    case NormalizationForm::kNfkd:
      return NormalizeUtf8(text, static_cast<utf8proc_option_t>(
                                     UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  return std::string(text);
}

size_t CharLength(std::string_view s, size_t i) {
  uint32_t cp;
  const int n = DecodeUtf8(s, i, &cp);
  return n > 0 ? static_cast<size_t>(n) : 1;
}

size_t WhiteSpaceStartBefore(std::string_view s, size_t end) {
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
      --start;
    uint32_t cp;
    if (DecodeUtf8(s, start, &cp) != static_cast<int>(end - start) || !IsWhiteSpace(cp)) break;
    end = start;
  }
  return end;
}

size_t WhiteSpaceEndAfter(std::string_view s, size_t start) {
  uint32_t cp;
  while (start < s.size()) {
    const int n = DecodeUtf8(s, start, &cp);
    if (n <= 0 || !IsWhiteSpace(cp)) break;
    start += static_cast<size_t>(n);
  }
  return start;
}

bool IsSingleWord(std::string_view s, size_t start, size_t stop) {
  uint32_t cp;
  if (stop < s.size() && DecodeUtf8(s, stop, &cp) > 0 && IsWordChar(cp)) return false;
  if (start == 0) return true;
  size_t prev = start - 1;
  while (prev > 0 && start - prev < 4 && (static_cast<unsigned char>(s[prev]) & 0xC0) == 0x80)
    --prev;
  return !(DecodeUtf8(s, prev, &cp) == static_cast<int>(start - prev) && IsWordChar(cp));
}

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

}  // namespace tailserve::bpe_internal
