#pragma once
// The simulator backend's token function, shared with the tools that drive it: a simulated
// sequence with sampling seed `seed` emits SimToken(seed, i, vocab) at output position i, whatever
// worker runs it, so a re-dispatched sequence continues exactly where it stopped.
#include <cstdint>

namespace tailserve {

inline int32_t SimToken(uint64_t seed, int64_t index, int32_t vocab_size) {
  // splitmix64 of (seed, index): cheap, well mixed, stateless.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<int32_t>(z % static_cast<uint64_t>(vocab_size));
}

}  // namespace tailserve
