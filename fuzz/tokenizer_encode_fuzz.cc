// Arbitrary bytes (invalid UTF-8 included) through the real tokenizers: the default model's and,
// when scripts/fetch-tokenizers.sh fetched them, Llama 3's and Qwen's (TAILSERVE_FUZZ_TOKENIZERS:
// a colon-separated list of tokenizer.json paths). Encoding then decoding gives the bytes back
// wherever they were valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/bpe_tokenizer.h"
#include "common/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::unique_ptr<tailserve::BpeTokenizer>> tokenizers = [] {
    std::vector<std::unique_ptr<tailserve::BpeTokenizer>> out;
    const char* list = std::getenv("TAILSERVE_FUZZ_TOKENIZERS");
    for (const std::string& path : std::vector<std::string>(absl::StrSplit(list ? list : TAILSERVE_DEFAULT_TOKENIZER, ':'))) {
      if (path.empty()) continue;
      absl::StatusOr<std::unique_ptr<tailserve::BpeTokenizer>> t = tailserve::BpeTokenizer::Load(path);
      if (!t.ok()) __builtin_trap();  // a broken setup, not a finding
      out.push_back(*std::move(t));
    }
    return out;
  }();
  const std::string in(reinterpret_cast<const char*>(data), size);
  const bool valid = tailserve::IsValidUtf8(in);
  for (const auto& t : tokenizers) {
    const std::vector<int32_t> ids = t->Encode(in);
    for (int32_t id : ids) {
      if (id < 0 || id >= t->vocab_size()) __builtin_trap();
    }
    // Round trip on valid UTF-8 (a normalizer may rewrite text: only checked for tokenizers without one).
    if (valid && !t->has_normalizer() && t->Decode(ids) != in) __builtin_trap();
  }
  return 0;
}
