// tokenizer.json text through the BPE tokenizer's loader; when it loads, the input's bytes
// encoded, and the ids decoded back.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<tailserve::BpeTokenizer>> t = tailserve::BpeTokenizer::Parse(in, "fuzz.json");
  if (!t.ok()) return 0;
  const std::vector<int32_t> ids = (*t)->EncodePrompt(in.substr(0, 4096));
  (void)(*t)->Decode(ids);
  return 0;
}
