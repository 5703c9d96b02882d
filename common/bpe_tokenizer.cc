#include "common/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "common/byte_level.h"
#include "common/status_macros.h"
#include "common/tokenizer_json.h"

namespace tailserve {

using nlohmann::json;

namespace bpe_internal {

struct EncodeScratch {
  PreTokenizerScratch pre_tokenizer;
  MergeScratch merge;
};

}  // namespace bpe_internal

using bpe_internal::AppendSymbol;
using bpe_internal::BoolField;
using bpe_internal::ByteLevelDecode;
using bpe_internal::ComponentType;
using bpe_internal::EncodeScratch;
using bpe_internal::Field;
using bpe_internal::FieldError;
using bpe_internal::IsAscii;
using bpe_internal::IsSingleWord;
using bpe_internal::JsonTypeName;
using bpe_internal::MergeRule;
using bpe_internal::PreTokenizer;
using bpe_internal::WhiteSpaceEndAfter;
using bpe_internal::WhiteSpaceStartBefore;

namespace {

// Ids above this are refused: a corrupt file must not make us allocate gigabytes.
constexpr int64_t kMaxTokenId = 1 << 24;

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
  TAILSERVE_ASSIGN_OR_RETURN(std::string contents, ReadFile(path));
  return Parse(std::move(contents), path);
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Parse(std::string contents, const std::string& source) {
  std::unique_ptr<BpeTokenizer> tokenizer(new BpeTokenizer());
  try {
    const json root = json::parse(contents);
    contents.clear();
    contents.shrink_to_fit();
    absl::Status status = tokenizer->ParseRoot(root);
    if (!status.ok()) {
      return absl::Status(status.code(), source + ": " + std::string(status.message()));
    }
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(source + ": invalid JSON: " + e.what());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(source + ": unexpected JSON content: " + e.what());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(source + ": out of memory while loading");
  } catch (const std::exception& e) {
    return absl::InternalError(source + ": " + e.what());
  }
  return tokenizer;
}

absl::Status BpeTokenizer::ParseRoot(const json& root) {
  if (!root.is_object())
    return FieldError("(root)", "expected an object, got " + JsonTypeName(root));
  // The normalizer comes first: normalized added tokens are stored in normalized form.
  TAILSERVE_RETURN_IF_ERROR(ParseNormalizer(Field(root, "normalizer")));
  TAILSERVE_RETURN_IF_ERROR(ParsePreTokenizer(Field(root, "pre_tokenizer")));
  TAILSERVE_RETURN_IF_ERROR(ParseDecoder(Field(root, "decoder")));
  TAILSERVE_RETURN_IF_ERROR(ParseModel(Field(root, "model")));
  TAILSERVE_RETURN_IF_ERROR(ParseAddedTokens(Field(root, "added_tokens")));
  return ParsePostProcessor(Field(root, "post_processor"), "post_processor");
}

// ByteLevel post-processing only trims offsets, which the router does not use; TemplateProcessing's
// "single" template is what HuggingFace puts around one input (special tokens before and after
// "$A"); a Sequence applies its processors in order. Others (Bert, Roberta) are refused by name.
absl::Status BpeTokenizer::ParsePostProcessor(const json& pp, const std::string& field) {
  if (pp.is_null()) return absl::OkStatus();
  if (!pp.is_object()) return FieldError(field, "expected an object");
  const std::string type = ComponentType(pp);
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence") {
    const json& list = Field(pp, "processors");
    if (!list.is_array()) return FieldError(field + ".processors", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      TAILSERVE_RETURN_IF_ERROR(ParsePostProcessor(list[i], field + ".processors[" + std::to_string(i) + "]"));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return FieldError(field + ".type", "post-processor \"" + type + "\" is not supported");
  }
  const json& single = Field(pp, "single");
  const json& specials = Field(pp, "special_tokens");
  if (!single.is_array()) return FieldError(field + ".single", "expected an array");
  bool seen_input = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string at = field + ".single[" + std::to_string(i) + "]";
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_input) return FieldError(at, "a second input in a single template");
      seen_input = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object() ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return FieldError(at, "expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": name}}");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    const json* ids = specials.is_object() && specials.contains(name) ? &specials[name]["ids"] : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      return FieldError(field + ".special_tokens", "no ids for \"" + name + "\"");
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size_) {
        return FieldError(field + ".special_tokens." + name, "id out of the vocabulary");
      }
      (seen_input ? prompt_suffix_ : prompt_prefix_).push_back(id.get<int32_t>());
    }
  }
  if (!seen_input) return FieldError(field + ".single", "no input (\"$A\") in the template");
  return absl::OkStatus();
}

std::vector<int32_t> BpeTokenizer::EncodePrompt(std::string_view text) const {
  std::vector<int32_t> ids = prompt_prefix_;
  const std::vector<int32_t> body = Encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), prompt_suffix_.begin(), prompt_suffix_.end());
  return ids;
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
  TAILSERVE_ASSIGN_OR_RETURN(pre_tokenizer_, PreTokenizer::Parse(pre_tokenizer));
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
  TAILSERVE_RETURN_IF_ERROR(ParseVocab(Field(model, "vocab")));
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
  std::vector<MergeRule> parsed;
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
    parsed.push_back(MergeRule{*left_id, *right_id, rank, *new_id});
    ++rank;
  }
  merges_.Build(parsed);
  return absl::OkStatus();
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
  return bpe_internal::Normalize(text, normalization_);
}

void BpeTokenizer::EncodeNormalizedSegment(std::string_view segment, EncodeScratch& scratch,
                                           std::vector<int32_t>* ids) const {
  pre_tokenizer_.Split(segment, scratch.pre_tokenizer);
  for (const std::string_view piece : scratch.pre_tokenizer.pieces) EncodeWord(piece, scratch, ids);
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
  BuildSymbols(word, scratch.merge);
  bpe_internal::MergeSymbols(merges_, scratch.merge, ids);
}

// One symbol per byte. Bytes missing from the vocab become unk (fused if fuse_unk) or vanish,
// as in HF.
void BpeTokenizer::BuildSymbols(std::string_view word, bpe_internal::MergeScratch& scratch) const {
  scratch.symbols.clear();
  bool last_is_unk = false;
  for (const char c : word) {
    const int32_t id = byte_token_id_[static_cast<unsigned char>(c)];
    if (id < 0) {
      if (!unk_id_ || (fuse_unk_ && last_is_unk)) continue;
      last_is_unk = true;
      AppendSymbol(*unk_id_, scratch);
    } else {
      last_is_unk = false;
      AppendSymbol(id, scratch);
    }
  }
}

}  // namespace tailserve
