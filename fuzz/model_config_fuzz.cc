// A checkpoint's config.json text through the model config parser.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)tailserve::ParseModelConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  return 0;
}
