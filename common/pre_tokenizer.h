#pragma once
// HF's pre-tokenizer: splits normalized text into the pieces that BPE merges within. Supports
// Split steps (regex or string pattern, HF's split behaviours) followed by one ByteLevel step
// (optional prefix space, GPT-2's regex).
#include <cstddef>
#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer_regex.h"

namespace tailserve::bpe_internal {

// HF's SplitDelimiterBehavior: what becomes of the pattern's matches.
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // Split's pattern, or GPT-2's for ByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only
};

// A [start, end) of a piece that the pattern matched or not.
struct Segment {
  size_t start;
  size_t end;
  bool is_match;
};

// Per-call buffers of PreTokenizer::Split, so that it stays const and thread-safe.
struct PreTokenizerScratch {
  std::vector<std::string_view> pieces;  // Split's result
  std::vector<std::string_view> next_pieces;
  std::deque<std::string> owned;  // pieces that got a prefix space
  RegexMatchData match_data;
  std::vector<std::pair<size_t, size_t>> matches;
  std::vector<Segment> segments;
  std::vector<Segment> merged;
};

class PreTokenizer {
 public:
  // Parses tokenizer.json's "pre_tokenizer"; errors name the field.
  static absl::StatusOr<PreTokenizer> Parse(const nlohmann::json& pre_tokenizer);

  // Leaves the pieces of `segment` in scratch.pieces, each step applied to every piece in turn.
  void Split(std::string_view segment, PreTokenizerScratch& scratch) const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

}  // namespace tailserve::bpe_internal
