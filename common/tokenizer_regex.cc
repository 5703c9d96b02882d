#include "common/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "common/unicode_text.h"

namespace tailserve::bpe_internal {

static_assert(std::is_same_v<pcre2_code, pcre2_real_code_8> &&
                  std::is_same_v<pcre2_match_data, pcre2_real_match_data_8>,
              "the forward declarations in tokenizer_regex.h must name pcre2.h's types");

namespace {

// Oniguruma's \s (what HF's regexes use) is Unicode White_Space; PCRE2's \s also matches
// U+180E, so patterns are rewritten to spell the set out.
constexpr std::string_view kWhiteSpaceSet =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites Oniguruma-only escapes into PCRE2 syntax: \s/\S (White_Space, see kWhiteSpaceSet)
// and \h/\H (hex digit in Oniguruma, horizontal space in PCRE2).
std::string TranslateOnigurumaPattern(std::string_view p) {
  const std::string space(kWhiteSpaceSet);
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? space : "[" + space + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + space + "]";
      } else if (e == 'h') {
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (e == 'H' && !in_class) {
        out += "[^0-9a-fA-F]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

RegexMatchData::RegexMatchData() : data_(pcre2_match_data_create(1, nullptr)) {}
RegexMatchData::~RegexMatchData() { pcre2_match_data_free(data_); }

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  const std::string translated =
      literal ? std::string(pattern) : TranslateOnigurumaPattern(pattern);
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  if (literal) options = PCRE2_UTF | PCRE2_LITERAL | PCRE2_MATCH_INVALID_UTF;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                    &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError("cannot compile regex /" + std::string(pattern) +
                                      "/ at offset " + std::to_string(error_offset) + ": " +
                                      reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::FindAll(std::string_view subject, RegexMatchData& match_data,
                    std::vector<std::pair<size_t, size_t>>* matches) const {
  if (subject.empty() || match_data.data_ == nullptr) return;
  size_t pos = 0;
  std::optional<size_t> last_match_end;
  while (pos <= subject.size()) {
    size_t start, end;
    if (!MatchAt(subject, pos, match_data.data_, &start, &end)) return;
    if (start == end && last_match_end == end) {
      pos += CharLength(subject, pos);
      continue;
    }
    matches->emplace_back(start, end);
    pos = end;
    last_match_end = end;
  }
}

bool Regex::MatchAt(std::string_view subject, size_t pos, pcre2_match_data* match_data,
                    size_t* start, size_t* end) const {
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code_, data, subject.size(), pos, 0, match_data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // the interpreter keeps its frames on the heap
    rc = pcre2_match(code_, data, subject.size(), pos, PCRE2_NO_JIT, match_data, nullptr);
  }
  if (rc < 0) return false;  // no match, or a limit hit: the rest stays one piece
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
  *start = ovector[0];
  *end = ovector[1];
  return *start <= *end && *end <= subject.size();
}

}  // namespace tailserve::bpe_internal
