#pragma once
// Byte-level BPE tokenizer read from a HuggingFace tokenizer.json, producing the same ids as
// HuggingFace `tokenizers` (encode with add_special_tokens=False): added tokens are split out
// first, the rest is normalized (NFC & co.), pre-tokenized (regex Split / ByteLevel) and merged
// by BPE merge rank.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/bpe_merge.h"
#include "common/pre_tokenizer.h"
#include "common/tokenizer.h"
#include "common/unicode_text.h"

namespace tailserve {

namespace bpe_internal {
struct EncodeScratch;  // per-call buffers, so Encode stays const and thread-safe

// Hash/equality that accept std::string_view, so lookups need no temporary std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
}  // namespace bpe_internal

class BpeTokenizer final : public Tokenizer {
 public:
  // Parses tokenizer.json. Errors name the file and what is wrong; never throws.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Load(const std::string& tokenizer_json_path);
  // The same from the file's text; `source` names it in errors.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Parse(std::string tokenizer_json, const std::string& source);
  ~BpeTokenizer() override;

  // No BOS/post-processor tokens are added; added tokens appearing in the text are matched.
  std::vector<int32_t> Encode(std::string_view text) const override;
  // Encode with the post-processor's special tokens around it (a TemplateProcessing "single"
  // template, e.g. Llama 3's BOS): HuggingFace's encode with add_special_tokens=True.
  std::vector<int32_t> EncodePrompt(std::string_view text) const override;
  // Raw bytes of the token ("Ġ" -> " "); added tokens give their content; empty for unknown ids.
  std::string TokenBytes(int32_t id) const override;
  // Max id over vocab and added tokens, + 1.
  int32_t vocab_size() const override { return vocab_size_; }

  // Id of a vocab entry (as spelled in tokenizer.json, e.g. "Ġthe") or an added token.
  std::optional<int32_t> TokenId(std::string_view token) const;
  // True for added tokens marked "special": true.
  bool IsSpecial(int32_t id) const;
  // A normalizer rewrites text before encoding (NFC & co.): decoding then need not give it back.
  bool has_normalizer() const { return normalization_ != Normalization::kNone; }
  // Concatenated TokenBytes of the ids.
  std::string Decode(std::span<const int32_t> ids) const;

 private:
  using Normalization = bpe_internal::NormalizationForm;

  struct AddedToken {
    std::string content;  // as in the file; the trie holds it normalized when `normalized`
    int32_t id = 0;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
    bool normalized = false;
  };

  // Byte trie over added-token contents, for leftmost-longest matching.
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> children;  // byte -> node index
    int32_t token = -1;                                       // index into added_tokens_
  };
  struct AddedTrie {
    std::vector<TrieNode> nodes;
    bool empty() const { return nodes.size() <= 1; }
  };

  BpeTokenizer();

  // Loading: each part of tokenizer.json; errors name the field, Load adds the file.
  absl::Status ParseRoot(const nlohmann::json& root);
  absl::Status ParseNormalizer(const nlohmann::json& normalizer);
  absl::Status ParsePreTokenizer(const nlohmann::json& pre_tokenizer);
  absl::Status ParseDecoder(const nlohmann::json& decoder);
  absl::Status ParseModel(const nlohmann::json& model);
  absl::Status ParseVocab(const nlohmann::json& vocab);
  absl::Status ParseMerges(const nlohmann::json& merges);
  absl::Status ParseAddedTokens(const nlohmann::json& added_tokens);
  absl::Status ParsePostProcessor(const nlohmann::json& post_processor, const std::string& field);
  void BuildAddedTries();
  static void AddToTrie(AddedTrie& trie, std::string_view content, int32_t token_index);
  std::optional<int32_t> VocabId(std::string_view token) const;

  // Encoding pipeline, in call order.
  void SplitOnAddedTokens(std::string_view text, const AddedTrie& trie, bool normalized_phase,
                          bpe_internal::EncodeScratch& scratch, std::vector<int32_t>* ids) const;
  int32_t LongestAddedMatch(const AddedTrie& trie, std::string_view text, size_t pos,
                            size_t* length) const;
  void EncodeGap(std::string_view gap, bool normalized_phase, bpe_internal::EncodeScratch& scratch,
                 std::vector<int32_t>* ids) const;
  std::string Normalize(std::string_view text) const;
  void EncodeNormalizedSegment(std::string_view segment, bpe_internal::EncodeScratch& scratch,
                               std::vector<int32_t>* ids) const;
  void EncodeWord(std::string_view word, bpe_internal::EncodeScratch& scratch,
                  std::vector<int32_t>* ids) const;
  void BuildSymbols(std::string_view word, bpe_internal::MergeScratch& scratch) const;

  Normalization normalization_ = Normalization::kNone;
  bpe_internal::PreTokenizer pre_tokenizer_;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;

  bpe_internal::StringIdMap raw_vocab_;    // byte-level-decoded token bytes -> id
  bpe_internal::StringIdMap other_vocab_;  // vocab strings outside the byte-level alphabet
  int32_t byte_token_id_[256];             // id of the single-byte token, -1 if absent
  bpe_internal::MergeTable merges_;

  std::vector<AddedToken> added_tokens_;
  bpe_internal::StringIdMap added_by_content_;  // original content -> id
  AddedTrie raw_trie_;                          // added tokens matched on the raw text
  AddedTrie normalized_trie_;                   // added tokens matched after normalization

  std::vector<int32_t> prompt_prefix_, prompt_suffix_;  // the post-processor's, around a prompt
  std::vector<std::string> token_bytes_;  // id -> bytes for TokenBytes
  std::vector<uint8_t> is_special_;       // id -> 1 for special added tokens
  int32_t vocab_size_ = 0;
};

}  // namespace tailserve
