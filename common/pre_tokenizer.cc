#include "common/pre_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "common/tokenizer_json.h"

namespace tailserve::bpe_internal {

using nlohmann::json;

namespace {

// The pattern HF's ByteLevel pre-tokenizer splits with when use_regex is true (GPT-2's).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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
void SplitPiece(const PreTokenizerStep& step, std::string_view piece, PreTokenizerScratch& scratch,
                std::vector<std::string_view>* out) {
  scratch.matches.clear();
  step.regex->FindAll(piece, scratch.match_data, &scratch.matches);
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

absl::StatusOr<PreTokenizerStep> ParseSplitStep(const json& j, const std::string& field) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kSplit;
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
  step.regex = *std::move(regex);
  TAILSERVE_ASSIGN_OR_RETURN(step.behavior, ParseSplitBehavior(Field(j, "behavior"), field + ".behavior"));
  step.invert = BoolField(j, "invert", false);
  return step;
}

absl::StatusOr<PreTokenizerStep> ParseByteLevelStep(const json& j, const std::string& field) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  step.add_prefix_space = BoolField(j, "add_prefix_space", true);  // HF's defaults
  if (BoolField(j, "use_regex", true)) {
    absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(kGpt2Pattern, false);
    if (!regex.ok()) return FieldError(field, std::string(regex.status().message()));
    step.regex = *std::move(regex);
  }
  return step;
}

absl::StatusOr<PreTokenizerStep> ParseStep(const json& j, const std::string& field) {
  if (!j.is_object()) return FieldError(field, "expected an object, got " + JsonTypeName(j));
  const std::string type = ComponentType(j);
  if (type == "Split") return ParseSplitStep(j, field);
  if (type == "ByteLevel") return ParseByteLevelStep(j, field);
  return FieldError(field + ".type", "pre-tokenizer \"" + type + "\" is not supported");
}

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizer::Parse(const json& pre_tokenizer) {
  if (!pre_tokenizer.is_object()) {
    return FieldError("pre_tokenizer",
                      "a ByteLevel pre-tokenizer is required, got " + JsonTypeName(pre_tokenizer));
  }
  std::vector<std::pair<const json*, std::string>> step_jsons;
  if (ComponentType(pre_tokenizer) == "Sequence") {
    const json& list = Field(pre_tokenizer, "pretokenizers");
    if (!list.is_array()) return FieldError("pre_tokenizer.pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      step_jsons.emplace_back(&list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
    }
  } else {
    step_jsons.emplace_back(&pre_tokenizer, "pre_tokenizer");
  }
  PreTokenizer result;
  std::vector<PreTokenizerStep>& steps = result.steps_;
  for (const auto& [step_json, field] : step_jsons) {
    TAILSERVE_ASSIGN_OR_RETURN(PreTokenizerStep step, ParseStep(*step_json, field));
    steps.push_back(std::move(step));
  }
  // Later steps would see byte-level characters, which this implementation does not model.
  if (steps.empty() || steps.back().kind != PreTokenizerStep::Kind::kByteLevel) {
    return FieldError("pre_tokenizer", "the last pre-tokenizer must be ByteLevel");
  }
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    if (steps[i].kind == PreTokenizerStep::Kind::kByteLevel) {
      return FieldError("pre_tokenizer", "only one ByteLevel step, the last, is supported");
    }
  }
  return result;
}

void PreTokenizer::Split(std::string_view segment, PreTokenizerScratch& scratch) const {
  scratch.pieces.clear();
  scratch.owned.clear();
  if (segment.empty()) return;
  scratch.pieces.push_back(segment);
  for (const PreTokenizerStep& step : steps_) {
    if (step.add_prefix_space) {
      for (std::string_view& piece : scratch.pieces) {
        if (piece.front() != ' ') piece = scratch.owned.emplace_back(" " + std::string(piece));
      }
    }
    if (step.regex == nullptr) continue;
    scratch.next_pieces.clear();
    for (const std::string_view piece : scratch.pieces)
      SplitPiece(step, piece, scratch, &scratch.next_pieces);
    std::swap(scratch.pieces, scratch.next_pieces);
  }
}

}  // namespace tailserve::bpe_internal
