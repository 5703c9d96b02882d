#pragma once
// The tokenizer the router uses for the model a cluster serves: the checkpoint's tokenizer.json
// for text, the checkpoint's vocabulary for id validation (a model's vocabulary may be padded past
// the tokenizer's ids), and special tokens (EOS, chat markers) left out of streamed text, as vLLM
// and TGI do by default.
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/bpe_tokenizer.h"

namespace tailserve {

class ModelTokenizer final : public Tokenizer {
 public:
  // Reads DIR/config.json and DIR/tokenizer.json.
  static absl::StatusOr<std::unique_ptr<ModelTokenizer>> Load(const std::string& model_dir);

  std::vector<int32_t> Encode(std::string_view text) const override { return bpe_->Encode(text); }
  std::vector<int32_t> EncodePrompt(std::string_view text) const override { return bpe_->EncodePrompt(text); }
  std::string TokenBytes(int32_t id) const override;
  std::string TokenText(int32_t id) const override { return bpe_->TokenBytes(id); }
  int32_t vocab_size() const override { return vocab_size_; }
  // The model's context length (prompt + generated tokens).
  int32_t max_context() const { return max_context_; }

 private:
  std::unique_ptr<BpeTokenizer> bpe_;
  int32_t vocab_size_ = 0;
  int32_t max_context_ = 0;
};

}  // namespace tailserve
