#include "common/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/status/status.h"

namespace tailserve {

using nlohmann::json;

namespace {

// Ids above this are refused: a corrupt file must not make us allocate gigabytes.
constexpr int64_t kMaxTokenId = 1 << 24;

// The pattern HF's ByteLevel pre-tokenizer splits with when use_regex is true (GPT-2's).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Oniguruma's \s (what HF's regexes use) is Unicode White_Space; PCRE2's \s also matches
// U+180E, so patterns are rewritten to spell the set out.
constexpr std::string_view kWhiteSpaceSet =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

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

// Decodes a vocab string ("Ġthe") to raw bytes (" the"); false when a character is outside the
// byte-level alphabet (such tokens can never come out of byte-level BPE).
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

// Length of the character at s[i]; invalid bytes count as one.
size_t CharLength(std::string_view s, size_t i) {
  uint32_t cp;
  const int n = DecodeUtf8(s, i, &cp);
  return n > 0 ? static_cast<size_t>(n) : 1;
}

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

// Start of the whitespace run that ends at s[end] (end itself when there is none).
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

// End of the whitespace run that starts at s[start].
size_t WhiteSpaceEndAfter(std::string_view s, size_t start) {
  uint32_t cp;
  while (start < s.size()) {
    const int n = DecodeUtf8(s, start, &cp);
    if (n <= 0 || !IsWhiteSpace(cp)) break;
    start += static_cast<size_t>(n);
  }
  return start;
}

// HF's single_word test: no word character touches the match on either side.
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

std::string JsonTypeName(const json& j) { return j.is_null() ? "null" : j.type_name(); }

// The "type" field of a component, or "" when absent.
std::string ComponentType(const json& j) {
  const auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(std::string(field) + ": " + std::string(what));
}

// The member `name` of `j` by reference (the model object is large: never copy it), or null.
const json& Field(const json& j, const char* name) {
  static const json* const kNull = new json();
  if (!j.is_object()) return *kNull;
  const auto it = j.find(name);
  return it == j.end() ? *kNull : *it;
}

bool BoolField(const json& j, const char* name, bool default_value) {
  const auto it = j.find(name);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : default_value;
}

}  // namespace

namespace bpe_internal {

// A compiled PCRE2 pattern; matching is thread-safe given per-call match data.
class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal) {
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

  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [start, end) of each match in `subject`, iterating like Oniguruma's find_iter
  // (which HF uses): an empty match right where the previous one ended is skipped.
  void FindAll(std::string_view subject, pcre2_match_data* match_data,
               std::vector<std::pair<size_t, size_t>>* matches) const {
    if (subject.empty() || match_data == nullptr) return;
    size_t pos = 0;
    std::optional<size_t> last_match_end;
    while (pos <= subject.size()) {
      size_t start, end;
      if (!MatchAt(subject, pos, match_data, &start, &end)) return;
      if (start == end && last_match_end == end) {
        pos += CharLength(subject, pos);
        continue;
      }
      matches->emplace_back(start, end);
      pos = end;
      last_match_end = end;
    }
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}

  bool MatchAt(std::string_view subject, size_t pos, pcre2_match_data* match_data, size_t* start,
               size_t* end) const {
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

  pcre2_code* code_;
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // Split's pattern, or GPT-2's for ByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only
};

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

struct Symbol {
  int32_t id;
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
  bool alive;
};

// A candidate merge of the symbol at `pos` with its right neighbour.
struct MergeCandidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// Orders the heap so the lowest rank, then the leftmost position, is on top (HF's order).
struct CandidateAfter {
  bool operator()(const MergeCandidate& a, const MergeCandidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

struct Segment {
  size_t start;
  size_t end;
  bool is_match;
};

struct EncodeScratch {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data{
      pcre2_match_data_create(1, nullptr)};
  std::vector<std::string_view> pieces;
  std::vector<std::string_view> next_pieces;
  std::deque<std::string> owned;  // pieces that got a prefix space
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Segment> segments;
  std::vector<Segment> merged;
  std::vector<Symbol> symbols;
  std::vector<MergeCandidate> heap;
};

}  // namespace bpe_internal

using bpe_internal::CandidateAfter;
using bpe_internal::EncodeScratch;
using bpe_internal::MergeCandidate;
using bpe_internal::PreTokenizerStep;
using bpe_internal::Regex;
using bpe_internal::Segment;
using bpe_internal::SplitBehavior;
using bpe_internal::Symbol;

namespace {

// HF's split behaviours, applied to the alternating match / non-match segments of one piece.
void ApplySplitBehavior(SplitBehavior behavior, const std::vector<Segment>& segments,
                        std::vector<Segment>* out) {
  out->clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      *out = segments;
      return;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) out->push_back(s);
      }
      return;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !out->empty()) {
          out->back().end = s.end;
        } else {
          out->push_back(s);
        }
        previous_match = s.is_match;
      }
      return;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !out->empty()) {
          out->back().start = it->start;
        } else {
          out->push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out->begin(), out->end());
      return;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !out->empty()) {
          out->back().end = s.end;
        } else {
          out->push_back(s);
        }
        previous_match = s.is_match;
      }
      return;
  }
}

// Splits `piece` with the step's regex, appending the non-empty resulting pieces to `out`.
void SplitPiece(const PreTokenizerStep& step, std::string_view piece, EncodeScratch& scratch,
                std::vector<std::string_view>* out) {
  scratch.matches.clear();
  step.regex->FindAll(piece, scratch.match_data.get(), &scratch.matches);
  scratch.segments.clear();
  size_t prev = 0;
  for (const auto& [start, end] : scratch.matches) {
    if (prev != start) scratch.segments.push_back({prev, start, false});
    scratch.segments.push_back({start, end, true});
    prev = end;
  }
  if (prev != piece.size()) scratch.segments.push_back({prev, piece.size(), false});
  if (step.invert) {
    for (Segment& s : scratch.segments) s.is_match = !s.is_match;
  }
  ApplySplitBehavior(step.behavior, scratch.segments, &scratch.merged);
  for (const Segment& s : scratch.merged) {
    if (s.end > s.start) out->push_back(piece.substr(s.start, s.end - s.start));
  }
}

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const json& j, const std::string& field) {
  const std::string name = j.is_string() ? j.get<std::string>() : "";
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return FieldError(field, "unsupported split behavior " + j.dump());
}

absl::StatusOr<std::unique_ptr<PreTokenizerStep>> ParseSplitStep(const json& j,
                                                                 const std::string& field) {
  auto step = std::make_unique<PreTokenizerStep>();
  step->kind = PreTokenizerStep::Kind::kSplit;
  const auto pattern = j.find("pattern");
  if (pattern == j.end() || !pattern->is_object()) return FieldError(field + ".pattern", "missing");
  absl::StatusOr<std::unique_ptr<Regex>> regex;
  if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
    regex = Regex::Compile((*pattern)["Regex"].get<std::string>(), /*literal=*/false);
  } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
    regex = Regex::Compile((*pattern)["String"].get<std::string>(), /*literal=*/true);
  } else {
    return FieldError(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  if (!regex.ok()) return FieldError(field + ".pattern", std::string(regex.status().message()));
  step->regex = *std::move(regex);
  absl::StatusOr<SplitBehavior> behavior =
      ParseSplitBehavior(Field(j, "behavior"), field + ".behavior");
  if (!behavior.ok()) return behavior.status();
  step->behavior = *behavior;
  step->invert = BoolField(j, "invert", false);
  return step;
}

absl::StatusOr<std::unique_ptr<PreTokenizerStep>> ParseByteLevelStep(const json& j,
                                                                     const std::string& field) {
  auto step = std::make_unique<PreTokenizerStep>();
  step->kind = PreTokenizerStep::Kind::kByteLevel;
  step->add_prefix_space = BoolField(j, "add_prefix_space", true);  // HF's defaults
  if (BoolField(j, "use_regex", true)) {
    absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(kGpt2Pattern, false);
    if (!regex.ok()) return FieldError(field, std::string(regex.status().message()));
    step->regex = *std::move(regex);
  }
  return step;
}

absl::StatusOr<std::unique_ptr<PreTokenizerStep>> ParsePreTokenizerStep(const json& j,
                                                                        const std::string& field) {
  if (!j.is_object()) return FieldError(field, "expected an object, got " + JsonTypeName(j));
  const std::string type = ComponentType(j);
  if (type == "Split") return ParseSplitStep(j, field);
  if (type == "ByteLevel") return ParseByteLevelStep(j, field);
  return FieldError(field + ".type", "pre-tokenizer \"" + type + "\" is not supported");
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(path + ": cannot open file");
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(path + ": read error");
  return std::move(contents).str();
}

}  // namespace

BpeTokenizer::BpeTokenizer() {
  std::fill(std::begin(byte_token_id_), std::end(byte_token_id_), -1);
}
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(const std::string& path) {
  std::unique_ptr<BpeTokenizer> tokenizer(new BpeTokenizer());
  try {
    absl::StatusOr<std::string> contents = ReadFile(path);
    if (!contents.ok()) return contents.status();
    const json root = json::parse(*contents);
    contents->clear();
    contents->shrink_to_fit();
    absl::Status status = tokenizer->ParseRoot(root);
    if (!status.ok()) {
      return absl::Status(status.code(), path + ": " + std::string(status.message()));
    }
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(path + ": invalid JSON: " + e.what());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(path + ": unexpected JSON content: " + e.what());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(path + ": out of memory while loading");
  } catch (const std::exception& e) {
    return absl::InternalError(path + ": " + e.what());
  }
  return tokenizer;
}

absl::Status BpeTokenizer::ParseRoot(const json& root) {
  if (!root.is_object())
    return FieldError("(root)", "expected an object, got " + JsonTypeName(root));
  // The normalizer comes first: normalized added tokens are stored in normalized form.
  absl::Status status = ParseNormalizer(Field(root, "normalizer"));
  if (status.ok()) status = ParsePreTokenizer(Field(root, "pre_tokenizer"));
  if (status.ok()) status = ParseDecoder(Field(root, "decoder"));
  if (status.ok()) status = ParseModel(Field(root, "model"));
  if (status.ok()) status = ParseAddedTokens(Field(root, "added_tokens"));
  return status;
}

absl::Status BpeTokenizer::ParseNormalizer(const json& normalizer) {
  if (normalizer.is_null()) return absl::OkStatus();
  if (!normalizer.is_object()) return FieldError("normalizer", "expected an object");
  std::string type = ComponentType(normalizer);
  const json* single = &normalizer;
  if (type == "Sequence") {  // a sequence of at most one form is that form
    const json& list = Field(normalizer, "normalizers");
    if (!list.is_array() || list.size() > 1) {
      return FieldError("normalizer.normalizers",
                        "only a Sequence of at most one normalizer is supported");
    }
    if (list.empty()) return absl::OkStatus();
    single = &list[0];
    type = ComponentType(*single);
  }
  static constexpr std::pair<std::string_view, Normalization> kForms[] = {
      {"NFC", Normalization::kNfc},
      {"NFD", Normalization::kNfd},
      {"NFKC", Normalization::kNfkc},
      {"NFKD", Normalization::kNfkd},
  };
  for (const auto& [name, form] : kForms) {
    if (type == name) {
      normalization_ = form;
      return absl::OkStatus();
    }
  }
  return FieldError("normalizer.type", "normalizer \"" + type + "\" is not supported");
}

absl::Status BpeTokenizer::ParsePreTokenizer(const json& pre_tokenizer) {
  if (!pre_tokenizer.is_object()) {
    return FieldError("pre_tokenizer",
                      "a ByteLevel pre-tokenizer is required, got " + JsonTypeName(pre_tokenizer));
  }
  std::vector<std::pair<const json*, std::string>> steps;
  if (ComponentType(pre_tokenizer) == "Sequence") {
    const json& list = Field(pre_tokenizer, "pretokenizers");
    if (!list.is_array()) return FieldError("pre_tokenizer.pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      steps.emplace_back(&list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
    }
  } else {
    steps.emplace_back(&pre_tokenizer, "pre_tokenizer");
  }
  for (const auto& [step_json, field] : steps) {
    absl::StatusOr<std::unique_ptr<PreTokenizerStep>> step =
        ParsePreTokenizerStep(*step_json, field);
    if (!step.ok()) return step.status();
    pre_tokenizer_.push_back(*std::move(step));
  }
  // Later steps would see byte-level characters, which this implementation does not model.
  if (pre_tokenizer_.empty() || pre_tokenizer_.back()->kind != PreTokenizerStep::Kind::kByteLevel) {
    return FieldError("pre_tokenizer", "the last pre-tokenizer must be ByteLevel");
  }
  for (size_t i = 0; i + 1 < pre_tokenizer_.size(); ++i) {
    if (pre_tokenizer_[i]->kind == PreTokenizerStep::Kind::kByteLevel) {
      return FieldError("pre_tokenizer", "only one ByteLevel step, the last, is supported");
    }
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::ParseDecoder(const json& decoder) {
  const std::string type = decoder.is_object() ? ComponentType(decoder) : JsonTypeName(decoder);
  if (type != "ByteLevel")
    return FieldError("decoder", "decoder \"" + type + "\" is not supported");
  return absl::OkStatus();
}

absl::Status BpeTokenizer::ParseModel(const json& model) {
  if (!model.is_object())
    return FieldError("model", "expected an object, got " + JsonTypeName(model));
  const auto type = model.find("type");
  if (type != model.end() && (!type->is_string() || type->get<std::string>() != "BPE")) {
    return FieldError("model.type", "model type " + type->dump() + " is not supported (only BPE)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return FieldError("model.dropout", "dropout is not supported");
  }
  if (BoolField(model, "byte_fallback", false)) {
    return FieldError("model.byte_fallback", "byte_fallback is not supported");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& value = Field(model, affix);
    if (!value.is_null() && !(value.is_string() && value.get<std::string>().empty())) {
      return FieldError(std::string("model.") + affix, "a non-empty value is not supported");
    }
  }
  ignore_merges_ = BoolField(model, "ignore_merges", false);
  fuse_unk_ = BoolField(model, "fuse_unk", false);
  absl::Status status = ParseVocab(Field(model, "vocab"));
  if (!status.ok()) return status;
  const json& unk = Field(model, "unk_token");
  if (unk.is_string()) unk_id_ = TokenId(unk.get<std::string>());
  return ParseMerges(Field(model, "merges"));
}

absl::Status BpeTokenizer::ParseVocab(const json& vocab) {
  if (!vocab.is_object())
    return FieldError("model.vocab", "expected an object, got " + JsonTypeName(vocab));
  std::string bytes;
  raw_vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > kMaxTokenId) {
      return FieldError("model.vocab", "bad id for token \"" + token + "\": " + id_json.dump());
    }
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (id >= static_cast<int32_t>(token_bytes_.size())) token_bytes_.resize(id + 1);
    if (ByteLevelDecode(token, &bytes)) {
      raw_vocab_[bytes] = id;
      if (bytes.size() == 1) byte_token_id_[static_cast<unsigned char>(bytes[0])] = id;
      token_bytes_[id] = bytes;
    } else {
      // HF's ByteLevel decoder passes such tokens through as their UTF-8 text.
      other_vocab_[token] = id;
      token_bytes_[id] = token;
    }
  }
  vocab_size_ = static_cast<int32_t>(token_bytes_.size());
  return absl::OkStatus();
}

std::optional<int32_t> BpeTokenizer::VocabId(std::string_view token) const {
  std::string bytes;
  const bool byte_level = ByteLevelDecode(token, &bytes);
  const bpe_internal::StringIdMap& map = byte_level ? raw_vocab_ : other_vocab_;
  const auto it = map.find(byte_level ? std::string_view(bytes) : token);
  if (it == map.end()) return std::nullopt;
  return it->second;
}

absl::Status BpeTokenizer::ParseMerges(const json& merges) {
  if (!merges.is_array())
    return FieldError("model.merges", "expected an array, got " + JsonTypeName(merges));
  std::vector<std::pair<uint64_t, Merge>> parsed;
  parsed.reserve(merges.size());
  int32_t rank = 0;
  for (const json& merge : merges) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;  // HF skips the legacy header line
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return FieldError("model.merges",
                          "bad merge \"" + line + "\" at rank " + std::to_string(rank));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return FieldError("model.merges",
                        "bad merge " + merge.dump() + " at rank " + std::to_string(rank));
    }
    const std::optional<int32_t> left_id = VocabId(left);
    const std::optional<int32_t> right_id = VocabId(right);
    const std::optional<int32_t> new_id = VocabId(left + right);
    if (!left_id || !right_id || !new_id) {
      return FieldError("model.merges", "merge \"" + left + " " + right + "\" at rank " +
                                            std::to_string(rank) +
                                            " uses a token missing from the vocab");
    }
    parsed.emplace_back(MergeKey(*left_id, *right_id), Merge{rank, *new_id});
    ++rank;
  }
  BuildMergeTable(parsed);
  return absl::OkStatus();
}

void BpeTokenizer::BuildMergeTable(const std::vector<std::pair<uint64_t, Merge>>& merges) {
  size_t size = 2;
  merge_shift_ = 63;
  while (size < 2 * merges.size()) {
    size *= 2;
    --merge_shift_;
  }
  merge_slots_.assign(size, MergeSlot{});
  for (const auto& [key, merge] : merges) {
    size_t i = MergeSlotIndex(key);
    while (merge_slots_[i].key != MergeSlot::kEmpty && merge_slots_[i].key != key)
      i = (i + 1) & (size - 1);
    // A repeated pair takes its later rank, as HF's map insertion does.
    merge_slots_[i] = MergeSlot{key, merge};
  }
}

absl::Status BpeTokenizer::ParseAddedTokens(const json& added_tokens) {
  if (added_tokens.is_null()) return absl::OkStatus();  // no added tokens at all
  if (!added_tokens.is_array()) return FieldError("added_tokens", "expected an array");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const json& t = added_tokens[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
        !t["content"].is_string() || !t["id"].is_number_integer()) {
      return FieldError(field, "expected an object with integer \"id\" and string \"content\"");
    }
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id > kMaxTokenId) return FieldError(field + ".id", "out of range");
    AddedToken token;
    token.content = t["content"].get<std::string>();
    token.id = static_cast<int32_t>(id);
    token.special = BoolField(t, "special", false);  // HF's AddedToken defaults
    token.lstrip = BoolField(t, "lstrip", false);
    token.rstrip = BoolField(t, "rstrip", false);
    token.single_word = BoolField(t, "single_word", false);
    token.normalized = BoolField(t, "normalized", true);
    if (token.content.empty()) continue;  // HF ignores empty added tokens
    if (token.id >= static_cast<int32_t>(token_bytes_.size())) token_bytes_.resize(token.id + 1);
    token_bytes_[token.id] = token.content;
    if (is_special_.size() < token_bytes_.size()) is_special_.resize(token_bytes_.size(), 0);
    is_special_[token.id] = token.special ? 1 : 0;
    added_by_content_.emplace(token.content, token.id);
    added_tokens_.push_back(std::move(token));
  }
  vocab_size_ = static_cast<int32_t>(token_bytes_.size());
  is_special_.resize(token_bytes_.size(), 0);
  BuildAddedTries();
  return absl::OkStatus();
}

void BpeTokenizer::BuildAddedTries() {
  raw_trie_.nodes.assign(1, TrieNode{});
  normalized_trie_.nodes.assign(1, TrieNode{});
  for (size_t i = 0; i < added_tokens_.size(); ++i) {
    const AddedToken& token = added_tokens_[i];
    // Normalized tokens match the normalized text, so they are stored normalized too.
    if (token.normalized) {
      AddToTrie(normalized_trie_, Normalize(token.content), static_cast<int32_t>(i));
    } else {
      AddToTrie(raw_trie_, token.content, static_cast<int32_t>(i));
    }
  }
}

void BpeTokenizer::AddToTrie(AddedTrie& trie, std::string_view content, int32_t token_index) {
  if (content.empty()) return;
  int32_t node = 0;
  for (const char c : content) {
    const auto byte = static_cast<unsigned char>(c);
    auto& children = trie.nodes[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [&](const auto& e) { return e.first == byte; });
    if (it != children.end()) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<int32_t>(trie.nodes.size());
    children.emplace_back(byte, child);
    trie.nodes.emplace_back();  // invalidates `children`; not used after this
    node = child;
  }
  if (trie.nodes[node].token < 0) trie.nodes[node].token = token_index;  // first one wins
}

std::optional<int32_t> BpeTokenizer::TokenId(std::string_view token) const {
  const auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return VocabId(token);
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < is_special_.size() && is_special_[id] != 0;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= token_bytes_.size()) return {};
  return token_bytes_[id];
}

std::string BpeTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id >= 0 && static_cast<size_t>(id) < token_bytes_.size()) out += token_bytes_[id];
  }
  return out;
}

// ---- Encoding ----

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  EncodeScratch scratch;
  SplitOnAddedTokens(text, raw_trie_, /*normalized_phase=*/false, scratch, &ids);
  return ids;
}

// Like HF's AddedVocabulary: the raw text is split on non-normalized added tokens, each gap is
// normalized and split on normalized added tokens, and what remains goes to the model.
void BpeTokenizer::SplitOnAddedTokens(std::string_view text, const AddedTrie& trie,
                                      bool normalized_phase, EncodeScratch& scratch,
                                      std::vector<int32_t>* ids) const {
  size_t start_offset = 0;  // end of the last accepted added token
  size_t pos = 0;
  while (!trie.empty() && pos < text.size()) {
    size_t length = 0;
    const int32_t index = LongestAddedMatch(trie, text, pos, &length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added_tokens_[index];
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;  // matches never overlap, even a discarded one
    if (token.single_word && !IsSingleWord(text, start, stop)) continue;
    // lstrip/rstrip swallow the whitespace around the token (never into the previous token).
    if (token.lstrip) start = std::max(WhiteSpaceStartBefore(text, start), start_offset);
    if (token.rstrip) pos = stop = WhiteSpaceEndAfter(text, stop);
    if (start_offset < start)
      EncodeGap(text.substr(start_offset, start - start_offset), normalized_phase, scratch, ids);
    ids->push_back(token.id);
    start_offset = stop;
  }
  if (start_offset < text.size())
    EncodeGap(text.substr(start_offset), normalized_phase, scratch, ids);
}

int32_t BpeTokenizer::LongestAddedMatch(const AddedTrie& trie, std::string_view text, size_t pos,
                                        size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const auto& children = trie.nodes[node].children;
    const auto it = std::find_if(children.begin(), children.end(),
                                 [&](const auto& e) { return e.first == byte; });
    if (it == children.end()) break;
    node = it->second;
    if (trie.nodes[node].token >= 0) {
      best = trie.nodes[node].token;
      *length = i + 1 - pos;
    }
  }
  return best;
}

// Text between added tokens: normalized and searched for normalized added tokens in the first
// phase; handed to the pre-tokenizer and model in the second.
void BpeTokenizer::EncodeGap(std::string_view gap, bool normalized_phase, EncodeScratch& scratch,
                             std::vector<int32_t>* ids) const {
  if (normalized_phase) {
    EncodeNormalizedSegment(gap, scratch, ids);
  } else if (normalization_ == Normalization::kNone || IsAscii(gap)) {
    SplitOnAddedTokens(gap, normalized_trie_, /*normalized_phase=*/true, scratch, ids);
  } else {
    const std::string normalized = Normalize(gap);
    SplitOnAddedTokens(normalized, normalized_trie_, /*normalized_phase=*/true, scratch, ids);
  }
}

std::string BpeTokenizer::Normalize(std::string_view text) const {
  switch (normalization_) {
    case Normalization::kNone:
      return std::string(text);
    case Normalization::kNfc:
      return NormalizeUtf8(text,
                           static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    case Normalization::kNfd:
      return NormalizeUtf8(text,
                           static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    case Normalization::kNfkc:
      return NormalizeUtf8(text, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                                                UTF8PROC_COMPAT));
    case Normalization::kNfkd:
      return NormalizeUtf8(text, static_cast<utf8proc_option_t>(
                                     UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  return std::string(text);
}

void BpeTokenizer::EncodeNormalizedSegment(std::string_view segment, EncodeScratch& scratch,
                                           std::vector<int32_t>* ids) const {
  PreTokenize(segment, scratch);
  for (const std::string_view piece : scratch.pieces) EncodeWord(piece, scratch, ids);
}

// Leaves the pieces of `segment` in scratch.pieces, each step applied to every piece in turn.
void BpeTokenizer::PreTokenize(std::string_view segment, EncodeScratch& scratch) const {
  scratch.pieces.clear();
  scratch.owned.clear();
  if (segment.empty()) return;
  scratch.pieces.push_back(segment);
  for (const auto& step : pre_tokenizer_) {
    if (step->add_prefix_space) {
      for (std::string_view& piece : scratch.pieces) {
        if (piece.front() != ' ') piece = scratch.owned.emplace_back(" " + std::string(piece));
      }
    }
    if (step->regex == nullptr) continue;
    scratch.next_pieces.clear();
    for (const std::string_view piece : scratch.pieces)
      SplitPiece(*step, piece, scratch, &scratch.next_pieces);
    std::swap(scratch.pieces, scratch.next_pieces);
  }
}

// BPE over one pre-tokenized piece (raw bytes; the byte-level alphabet is implicit in the ids).
void BpeTokenizer::EncodeWord(std::string_view word, EncodeScratch& scratch,
                              std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // a word that is itself a token is taken whole
    const auto it = raw_vocab_.find(word);
    if (it != raw_vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  BuildSymbols(word, scratch);
  MergeSymbols(scratch);
  for (const Symbol& s : scratch.symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

// One symbol per byte. Bytes missing from the vocab become unk (fused if fuse_unk) or vanish,
// as in HF.
void BpeTokenizer::BuildSymbols(std::string_view word, EncodeScratch& scratch) const {
  std::vector<Symbol>& symbols = scratch.symbols;
  symbols.clear();
  bool last_is_unk = false;
  for (const char c : word) {
    const int32_t id = byte_token_id_[static_cast<unsigned char>(c)];
    if (id < 0) {
      if (!unk_id_ || (fuse_unk_ && last_is_unk)) continue;
      last_is_unk = true;
      symbols.push_back(Symbol{*unk_id_, static_cast<int32_t>(symbols.size()) - 1, -1, true});
    } else {
      last_is_unk = false;
      symbols.push_back(Symbol{id, static_cast<int32_t>(symbols.size()) - 1, -1, true});
    }
  }
  for (size_t i = 0; i + 1 < symbols.size(); ++i) symbols[i].next = static_cast<int32_t>(i + 1);
}

// HF's Word::merge_all: repeatedly apply the lowest-ranked (then leftmost) adjacent merge, using
// a heap of candidates that are checked for staleness when popped. O(n log n).
void BpeTokenizer::MergeSymbols(EncodeScratch& scratch) const {
  std::vector<Symbol>& symbols = scratch.symbols;
  std::vector<MergeCandidate>& heap = scratch.heap;
  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), CandidateAfter{});
  const auto push = [&](int32_t pos, const Merge* m) {
    heap.push_back({m->rank, pos, m->new_id});
    std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandidateAfter{});
    const MergeCandidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = FindMerge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale candidate
    left.id = top.new_id;
    left.next = right.next;
    right.alive = false;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = FindMerge(symbols[left.prev].id, left.id)) push(left.prev, m);
    }
    if (left.next >= 0) {
      if (const Merge* m = FindMerge(left.id, symbols[left.next].id)) push(top.pos, m);
    }
  }
}

const BpeTokenizer::Merge* BpeTokenizer::FindMerge(int32_t left, int32_t right) const {
  if (merge_slots_.empty()) return nullptr;
  const uint64_t key = MergeKey(left, right);
  for (size_t i = MergeSlotIndex(key);; i = (i + 1) & (merge_slots_.size() - 1)) {
    const MergeSlot& slot = merge_slots_[i];
    if (slot.key == key) return &slot.merge;
    if (slot.key == MergeSlot::kEmpty) return nullptr;
  }
}

}  // namespace tailserve
