// ladb_config.yaml text (and one "section.key=value" override, after a NUL byte) through the
// typed config parser.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t split = in.find('\0');
  std::vector<std::string> overrides;
  if (split != std::string::npos) overrides.push_back(in.substr(split + 1));
  (void)tailserve::ParseConfig(in.substr(0, split), overrides, "fuzz.yaml");
  return 0;
}
