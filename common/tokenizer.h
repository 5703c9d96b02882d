#pragma once
// Tokenizer seam: the router turns text into ids and ids back into text deltas through this
// interface. ByteTokenizer (one id per byte) serves until a real BPE tokenizer is plugged in.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tailserve {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // A text prompt's ids: Encode plus whatever the tokenizer adds around a whole input (BOS).
  virtual std::vector<int32_t> EncodePrompt(std::string_view text) const { return Encode(text); }
  // Raw bytes of one token (may be part of a UTF-8 character); empty for ids out of range.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // One token as a client is shown it beside its log-probability: its bytes, and a special
  // token's own text (which TokenBytes leaves out of decoded text).
  virtual std::string TokenText(int32_t id) const { return TokenBytes(id); }
  virtual int32_t vocab_size() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  int32_t vocab_size() const override { return 256; }
};

// Turns a stream of token ids into text deltas that are always valid UTF-8: bytes of a character
// split across tokens are held back until it completes; invalid bytes become U+FFFD.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string Add(int32_t id);
  // Whatever is still held back (an incomplete character at the end of the stream), as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

// Decodes the character starting at s[i] into *cp. Returns its length in bytes, 0 when s ends
// inside it (more bytes may come), or -1 when the bytes can never form a valid character.
int DecodeUtf8(std::string_view s, size_t i, uint32_t* cp);

// Number of leading bytes of `s` that form complete, valid UTF-8; sets *invalid when the next byte
// can never start or continue a valid character.
size_t ValidUtf8Prefix(std::string_view s, bool* invalid);
// The whole of `s` is valid UTF-8 (no incomplete character at the end either).
bool IsValidUtf8(std::string_view s);

}  // namespace tailserve
