#pragma once
// PCRE2 regexes that behave like the Oniguruma ones HF tokenizers are written for: patterns are
// rewritten where the two dialects differ, and matches are iterated like Oniguruma's find_iter.
#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

// pcre2.h's 8-bit pcre2_code and pcre2_match_data, declared here so that pcre2.h (and its
// PCRE2_CODE_UNIT_WIDTH) stays out of the headers.
struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace tailserve::bpe_internal {

// Scratch space of matching: a Regex is shared between threads, match data is not.
class RegexMatchData {
 public:
  RegexMatchData();
  ~RegexMatchData();
  RegexMatchData(const RegexMatchData&) = delete;
  RegexMatchData& operator=(const RegexMatchData&) = delete;

 private:
  friend class Regex;
  pcre2_real_match_data_8* data_;  // null when PCRE2 could not allocate it: nothing matches
};

// A compiled PCRE2 pattern; matching is thread-safe given per-call match data.
class Regex {
 public:
  // `literal`: the pattern is a plain string (HF's {"String": ...}), else an Oniguruma regex.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [start, end) of each match in `subject`, iterating like Oniguruma's find_iter
  // (which HF uses): an empty match right where the previous one ended is skipped.
  void FindAll(std::string_view subject, RegexMatchData& match_data,
               std::vector<std::pair<size_t, size_t>>* matches) const;

 private:
  explicit Regex(pcre2_real_code_8* code) : code_(code) {}

  bool MatchAt(std::string_view subject, size_t pos, pcre2_real_match_data_8* match_data,
               size_t* start, size_t* end) const;

  pcre2_real_code_8* code_;
};

}  // namespace tailserve::bpe_internal
