#pragma once
// The KV cache's element formats, shared by the backends: the CUDA backend stores them, the CPU
// backend can emulate them (QuantizeKvHead) so the accuracy a format costs is measured apart from
// the kernels that implement it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace tailserve {

enum class KvDtype : int32_t { kFp8E4M3 = 0, kFp8E5M2 = 1, kFp16 = 2 };

absl::StatusOr<KvDtype> ParseKvDtype(const std::string& name);
inline size_t KvElementBytes(KvDtype d) { return d == KvDtype::kFp16 ? 2 : 1; }
inline const char* KvDtypeName(KvDtype d) {
  return d == KvDtype::kFp8E4M3 ? "fp8_e4m3" : d == KvDtype::kFp8E5M2 ? "fp8_e5m2" : "fp16";
}
// Largest finite value of the format.
float KvDtypeMax(KvDtype d);

// Rounds x to the nearest value of the format (ties to even, subnormals kept, saturating at the
// largest finite value): what a cast to __nv_fp8_e4m3 / __nv_fp8_e5m2 / __half computes.
float RoundToKvDtype(KvDtype d, float x);

// What one (token, KV head) vector becomes after a round trip through the cache, in place: FP8
// formats scale it so its largest magnitude maps to the format's maximum (the CUDA kernels' per
// token and head scale), round, and scale back; fp16 rounds.
void QuantizeKvHead(KvDtype d, float* head, size_t n);

}  // namespace tailserve
