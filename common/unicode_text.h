#pragma once
// Unicode text helpers of the BPE tokenizer: the normalization forms of HF's normalizers (via
// utf8proc), and the character tests of HF's added-token matching (White_Space for lstrip/rstrip,
// word characters for single_word). Text is UTF-8 that may hold invalid bytes.
#include <cstddef>
#include <string>
#include <string_view>

namespace tailserve::bpe_internal {

enum class NormalizationForm { kNone, kNfc, kNfd, kNfkc, kNfkd };

// Applies `form` to `text`; invalid UTF-8 bytes pass through untouched.
std::string Normalize(std::string_view text, NormalizationForm form);

// Length of the character at s[i]; invalid bytes count as one.
size_t CharLength(std::string_view s, size_t i);

// Start of the whitespace run that ends at s[end] (end itself when there is none).
size_t WhiteSpaceStartBefore(std::string_view s, size_t end);

// End of the whitespace run that starts at s[start].
size_t WhiteSpaceEndAfter(std::string_view s, size_t start);

// HF's single_word test for a match at s[start, stop): no word character touches it on either
// side.
bool IsSingleWord(std::string_view s, size_t start, size_t stop);

bool IsAscii(std::string_view s);

}  // namespace tailserve::bpe_internal
