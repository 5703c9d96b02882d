#include "common/block_hash.h"

namespace tailserve {
namespace {

// SplitMix64's finaliser: every input bit moves every output bit.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t ChainBlockHash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ 0x9e3779b97f4a7c15ull) ^ Mix(tokens.size());
  for (int32_t t : tokens) h = Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x632be59bd9b4e019ull));
  return h == 0 ? 1 : h;  // 0 marks "no hash"
}

std::vector<uint64_t> ChainBlockHashes(uint64_t salt, std::span<const int32_t> tokens, size_t block_tokens) {
  std::vector<uint64_t> out;
  out.reserve(tokens.size() / block_tokens);
  uint64_t h = salt;
  for (size_t b = 0; (b + 1) * block_tokens <= tokens.size(); ++b) {
    h = ChainBlockHash(h, tokens.subspan(b * block_tokens, block_tokens));
    out.push_back(h);
  }
  return out;
}

uint64_t BlockHashSalt(std::span<const char> context) {
  uint64_t h = 0x8e3d0fb4a1c2e5f7ull;
  for (char c : context) h = Mix(h ^ static_cast<unsigned char>(c));
  return h;
}

}  // namespace tailserve
