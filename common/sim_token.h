#pragma once
// The simulator backend's token function, shared with the tools that drive it: a simulated
// sequence with sampling seed `seed` emits SimToken(seed, i, vocab) at output position i, whatever
// worker runs it, so a re-dispatched sequence continues exactly where it stopped.
#include <cstdint>

#include "common/splitmix.h"

namespace tailserve {

inline int32_t SimToken(uint64_t seed, int64_t index, int32_t vocab_size) {
  // splitmix64 of (seed, index): cheap, well mixed, stateless.
  const uint64_t z = SplitMixFinalize(seed + kSplitMixGamma * static_cast<uint64_t>(index + 1));
  return static_cast<int32_t>(z % static_cast<uint64_t>(vocab_size));
}

}  // namespace tailserve
