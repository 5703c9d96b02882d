#include "router/model_tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "common/status_macros.h"

namespace tailserve {

absl::StatusOr<std::unique_ptr<ModelTokenizer>> ModelTokenizer::Load(const std::string& model_dir) {
  TAILSERVE_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(model_dir));
  const std::string path = (std::filesystem::path(model_dir) / "tokenizer.json").string();
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> bpe, BpeTokenizer::Load(path));
  if (bpe->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ids up to ", bpe->vocab_size() - 1,
                                                   " do not fit the model's vocab_size ", config.vocab_size));
  }
  std::unique_ptr<ModelTokenizer> t(new ModelTokenizer());
  t->bpe_ = std::move(bpe);
  t->vocab_size_ = static_cast<int32_t>(config.vocab_size);
  t->max_context_ = static_cast<int32_t>(config.max_position);
  return t;
}

std::string ModelTokenizer::TokenBytes(int32_t id) const {
  if (bpe_->IsSpecial(id)) return {};
  return bpe_->TokenBytes(id);
}

}  // namespace tailserve
