#pragma once
// Content hashes of full KV blocks for prefix caching, chained as vLLM's are: a block's hash covers
// its own tokens and, through its parent's hash, every token before it, so two sequences share a
// block only when everything up to its end is equal. The salt separates contexts that must never
// share (model, KV dtype, adapter). The workers' prefix caches and the router's cache-aware
// placement both use it. Not a cryptographic hash: prefixes are matched within one deployment.
#include <cstdint>
#include <span>
#include <vector>

namespace tailserve {

// The hash of a block of `tokens` whose predecessors hash to `parent` (the salt for the first block).
uint64_t ChainBlockHash(uint64_t parent, std::span<const int32_t> tokens);

// The chained hashes of every full `block_tokens`-token block `tokens` begins with, the first
// chained from `salt`.
std::vector<uint64_t> ChainBlockHashes(uint64_t salt, std::span<const int32_t> tokens, size_t block_tokens);

// A salt from a context's identifying text (e.g. "model|kv dtype|adapter").
uint64_t BlockHashSalt(std::span<const char> context);

}  // namespace tailserve
