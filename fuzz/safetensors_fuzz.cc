// A safetensors file's bytes (header length, JSON header, data) through the loader, and every
// tensor it accepts read whole, so an offset past the data shows as an ASan error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/tailserve-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  absl::StatusOr<std::unique_ptr<tailserve::SafetensorsFile>> file = tailserve::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  std::vector<float> out;
  for (const auto& [name, t] : (*file)->tensors()) {
    const int64_t n = t.numel();
    if (n > (1 << 20)) continue;
    out.resize(static_cast<size_t>(n));
    tailserve::ToFloat(t.dtype, t.data, out.size(), out.data());
  }
  return 0;
}
