// GenerateRequest bytes through what the router's Generate does with them: the raw parse that
// names a field with invalid UTF-8, then edge validation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/tokenizer.h"
#include "router/generation_service.h"
#include "router/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tailserve::ByteTokenizer tokenizer;
  static const tailserve::RouterConfig limits;
  absl::StatusOr<tailserve::v1::GenerateRequest> req =
      tailserve::ParseGenerateRequest(std::string(reinterpret_cast<const char*>(data), size));
  if (req.ok()) (void)tailserve::ValidateRequest(*req, limits, tokenizer);
  return 0;
}
