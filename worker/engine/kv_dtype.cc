#include "worker/engine/kv_dtype.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tailserve {
namespace {

struct Format {
  int mantissa_bits;
  int min_exponent;  // of the smallest normal value
  float max;
};

Format FormatOf(KvDtype d) {
  switch (d) {
    case KvDtype::kFp8E4M3: return {3, -6, 448.0f};
    case KvDtype::kFp8E5M2: return {2, -14, 57344.0f};
    case KvDtype::kFp16: break;
  }
  return {10, -14, 65504.0f};
}

}  // namespace

absl::StatusOr<KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "fp8_e4m3" || name == "fp8") return KvDtype::kFp8E4M3;
  if (name == "fp8_e5m2") return KvDtype::kFp8E5M2;
  if (name == "fp16") return KvDtype::kFp16;
  return absl::InvalidArgumentError(absl::StrCat("kv_cache_dtype \"", name, "\" is not one of fp8_e4m3, fp8_e5m2, fp16"));
}

float KvDtypeMax(KvDtype d) { return FormatOf(d).max; }

float RoundToKvDtype(KvDtype d, float x) {
  if (std::isnan(x)) return x;
  const Format f = FormatOf(d);
  const float a = std::fabs(x);
  int exp = 0;
  std::frexp(a, &exp);  // a = m · 2^exp, m in [0.5, 1)
  // Spacing of representable values around a (the subnormal spacing below the normal range).
  const float ulp = std::ldexp(1.0f, std::max(exp - 1, f.min_exponent) - f.mantissa_bits);
  const float r = std::min(std::nearbyint(a / ulp) * ulp, f.max);  // default rounding mode: ties to even
  return std::copysign(r, x);
}

void QuantizeKvHead(KvDtype d, float* head, size_t n) {
  if (d == KvDtype::kFp16) {
    for (size_t i = 0; i < n; ++i) head[i] = RoundToKvDtype(d, head[i]);
    return;
  }
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(head[i]));
  const float scale = amax > 0.0f && std::isfinite(amax) ? amax / KvDtypeMax(d) : 1.0f;
  const float inv_scale = 1.0f / scale;
  for (size_t i = 0; i < n; ++i) head[i] = RoundToKvDtype(d, head[i] * inv_scale) * scale;
}

}  // namespace tailserve
