#include "common/jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "common/jinja/unicode.h"

namespace tailserve::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

absl::Status Error(int line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", std::string(what)));
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    // keep_trailing_newline off: one newline at the very end goes.
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();
    bool strip_next = false;  // the previous tag ended with "-": strip the text's leading whitespace
    bool trim_next = false;   // ... ended a block or comment: drop one leading newline (trim_blocks)
    while (pos_ < s_.size()) {
      const size_t open = FindTagStart(pos_);
      std::string text = s_.substr(pos_, open - pos_);
      // Whether the text begins a line, as Jinja's lexer decides it: at the template's start, or
      // when what the previous tag consumed after itself ended with a newline.
      bool line_starting = pos_ == 0;
      if (strip_next) {
        const size_t n = static_cast<size_t>(
            std::find_if(text.begin(), text.end(), [](char c) { return !IsSpace(c); }) - text.begin());
        line_starting = n > 0 && text[n - 1] == '\n';
        text.erase(0, n);
      } else if (trim_next && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
        line_starting = true;
      }
      strip_next = trim_next = false;
      const int text_line = line_;
      line_ += static_cast<int>(std::count(s_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                           s_.begin() + static_cast<std::ptrdiff_t>(open), '\n'));
      pos_ = open;
      if (open < s_.size()) {
        const char kind = s_[open + 1];  // '{', '%' or '#'
        const char modifier = open + 2 < s_.size() ? s_[open + 2] : '\0';
        if (modifier == '-') {
          text.erase(std::find_if(text.rbegin(), text.rend(), [](char c) { return !IsSpace(c); }).base(), text.end());
        } else if (kind != '{' && modifier != '+') {
          // lstrip_blocks: the spaces and tabs between the line's start and the tag, if only they.
          const size_t nl = text.find_last_of('\n');
          const size_t from = nl == std::string::npos ? 0 : nl + 1;
          const bool line_start = nl != std::string::npos || line_starting;
          if (line_start && text.find_first_not_of(" \t", from) == std::string::npos) text.erase(from);
        }
      }
      if (!text.empty()) out_.push_back({TokenKind::kText, std::move(text), text_line});
      if (open >= s_.size()) break;
      const char kind = s_[open + 1];
      pos_ = open + 2;
      if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
      absl::StatusOr<bool> stripped = kind == '#' ? SkipComment() : Tag(kind);
      if (!stripped.ok()) return stripped.status();
      strip_next = *stripped;
      trim_next = kind != '{';
    }
    return std::move(out_);
  }

 private:
  // The next "{{", "{%" or "{#" at or after `from`; s_.size() if none.
  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i) {
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return s_.size();
  }

  // A comment up to "#}"; returns whether it closed with "-#}".
  absl::StatusOr<bool> SkipComment() {
    const int start = line_;
    const size_t end = s_.find("#}", pos_);
    if (end == std::string::npos) return Error(start, "unterminated comment");
    line_ += static_cast<int>(std::count(s_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         s_.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
    const bool strip = end > pos_ && s_[end - 1] == '-';
    pos_ = end + 2;
    return strip;
  }

  // The tokens of a "{{ }}" or "{% %}" tag; returns whether it closed with "-}}" / "-%}".
  absl::StatusOr<bool> Tag(char kind) {
    const int start = line_;
    const char close = kind == '{' ? '}' : '%';
    out_.push_back({kind == '{' ? TokenKind::kExprStart : TokenKind::kBlockStart, "", start});
    while (true) {
      while (pos_ < s_.size() && IsSpace(s_[pos_])) line_ += s_[pos_++] == '\n';
      if (pos_ >= s_.size()) return Error(start, kind == '{' ? "unterminated {{" : "unterminated {%");
      const char c = s_[pos_];
      const auto at = [&](size_t k) { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; };
      if (c == '-' && at(1) == close && at(2) == '}') {
        pos_ += 3;
        out_.push_back({kind == '{' ? TokenKind::kExprEnd : TokenKind::kBlockEnd, "", line_});
        return true;
      }
      if (c == close && at(1) == '}') {
        pos_ += 2;
        out_.push_back({kind == '{' ? TokenKind::kExprEnd : TokenKind::kBlockEnd, "", line_});
        return false;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t b = pos_;
        while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
        out_.push_back({TokenKind::kName, s_.substr(b, pos_ - b), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        const size_t b = pos_;
        while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
        bool is_float = false;
        if (pos_ + 1 < s_.size() && s_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(s_[pos_ + 1]))) {
          is_float = true;
          ++pos_;
          while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
        }
        // An exponent, with or without a fraction (1e16, 2.5e-3), as Jinja's float pattern has it.
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
          size_t q = pos_ + 1;
          if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
          if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
            is_float = true;
            pos_ = q;
            while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
          }
        }
        std::string number = s_.substr(b, pos_ - b);
        number.erase(std::remove(number.begin(), number.end(), '_'), number.end());
        out_.push_back({is_float ? TokenKind::kFloat : TokenKind::kInteger, std::move(number), line_});
      } else if (c == '\'' || c == '"') {
        absl::StatusOr<std::string> str = String(c);
        if (!str.ok()) return str.status();
        out_.push_back({TokenKind::kString, *std::move(str), start});
      } else {
        static constexpr std::string_view kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
        const std::string_view rest(s_.data() + pos_, std::min<size_t>(2, s_.size() - pos_));
        if (std::find(std::begin(kTwo), std::end(kTwo), rest) != std::end(kTwo)) {
          out_.push_back({TokenKind::kOperator, std::string(rest), line_});
          pos_ += 2;
        } else if (std::string_view("<>+-*/%~|.,:()[]{}=").find(c) != std::string_view::npos) {
          out_.push_back({TokenKind::kOperator, std::string(1, c), line_});
          ++pos_;
        } else {
          return Error(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
      }
    }
  }

  // A quoted literal from pos_ (at its quote), escapes decoded as Jinja decodes them (Python's
  // unicode-escape codec): \n \t \r \a \b \f \v \\ \' \", octal \ooo, \xhh, \uhhhh,
  // \Uhhhhhhhh; others stay as written.
  absl::StatusOr<std::string> String(char quote) {
    const int start = line_;
    std::string out;
    for (++pos_; pos_ < s_.size(); ++pos_) {
      const char c = s_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c == '\n') ++line_;
      if (c != '\\' || pos_ + 1 >= s_.size()) {
        out.push_back(c);
        continue;
      }
      const char e = s_[++pos_];
      auto hex = [&](int digits) -> absl::Status {
        uint32_t cp = 0;
        for (int k = 0; k < digits; ++k) {
          const size_t at = pos_ + 1 + static_cast<size_t>(k);
          if (at >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[at]))) {
            return Error(line_, absl::StrCat("truncated \\", std::string(1, e), " escape in a string"));
          }
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(s_[at])) ? s_[at] - '0'
                                                                                                : (s_[at] | 0x20) - 'a' + 10);
        }
        if (cp > 0x10FFFF) return Error(line_, "illegal Unicode character in a string");
        pos_ += static_cast<size_t>(digits);
        AppendUtf8(static_cast<char32_t>(cp), &out);
        return absl::OkStatus();
      };
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case '\\': case '\'': case '"': out.push_back(e); break;
        case '\n': ++line_; break;  // a line continuation
        case 'x': case 'u': case 'U':
          if (absl::Status st = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8); !st.ok()) return st;
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(s_[++pos_] - '0');
            }
            AppendUtf8(static_cast<char32_t>(cp), &out);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return Error(start, "unterminated string");
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r' && i + 1 < source.size() && source[i + 1] == '\n') continue;  // \r\n -> \n
    s.push_back(source[i]);
  }
  return Lexer(std::move(s)).Run();
}

}  // namespace tailserve::jinja
