#pragma once
// SplitMix64: the stateless integer mixer behind every deterministic "random" value here (the
// simulator's tokens, the sampler's draws, synthetic checkpoint weights), so each is a pure
// function of its seed and counter.
#include <cstdint>

#ifdef __CUDACC__
#define TAILSERVE_HOST_DEVICE __host__ __device__
#else
#define TAILSERVE_HOST_DEVICE
#endif

namespace tailserve {

inline constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

// The splitmix64 finalizer: a well-mixed 64-bit value from any 64-bit input.
TAILSERVE_HOST_DEVICE inline uint64_t SplitMixFinalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The next value of the splitmix64 sequence whose state is `state`.
TAILSERVE_HOST_DEVICE inline uint64_t SplitMixNext(uint64_t& state) { return SplitMixFinalize(state += kSplitMixGamma); }

// Uniform [0, 1) from (seed, position): what the samplers (CPU and GPU) draw for the token at
// `position`, so a seeded request's randomness does not depend on batching or backend.
TAILSERVE_HOST_DEVICE inline double SampleUniform(uint64_t seed, int64_t position) {
  const uint64_t bits =
      SplitMixFinalize(kSplitMixGamma + (SplitMixFinalize(seed + kSplitMixGamma) ^ static_cast<uint64_t>(position)));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace tailserve
