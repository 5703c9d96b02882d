#pragma once
// Safetensors files read through mmap: the header is parsed and every tensor's dtype, shape and
// byte range checked at open, so a truncated or corrupt file is refused before anything uses it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tailserve {

enum class DType { kF32, kF16, kBF16 };

const char* DTypeName(DType d);
size_t DTypeSize(DType d);

struct TensorInfo {
  std::string name;
  std::string file;  // file name (no directory), for messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
};

std::string ShapeString(std::span<const int64_t> shape);

// Converts n elements of `dtype` at `src` to fp32.
void ToFloat(DType dtype, const std::byte* src, size_t n, float* dst);
uint16_t FloatToBf16(float f);  // round to nearest even; NaN stays NaN

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a checkpoint directory: `model.safetensors`, or the shards that
// `model.safetensors.index.json` names.
class TensorStore {
 public:
  static absl::StatusOr<TensorStore> Open(const std::string& dir);

  const TensorInfo* Find(const std::string& name) const;
  // The tensor, checked to exist with exactly `shape`; errors name the file and the tensor.
  absl::StatusOr<const TensorInfo*> Get(const std::string& name, std::span<const int64_t> shape) const;
  // Get() then convert to fp32.
  absl::Status ReadFloat(const std::string& name, std::span<const int64_t> shape, std::vector<float>* out) const;
  std::vector<std::string> Names() const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::string dir_;
};

// Writes a safetensors file tensor by tensor, so checkpoints larger than memory can be made:
// the header (names, dtypes, shapes) is declared first, then each tensor's bytes in order.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(const std::string& path, std::vector<Entry> entries,
                                                                   const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  // Appends the next tensor's bytes; the tensors come in the order of `entries`, possibly in chunks.
  absl::Status Write(std::span<const std::byte> bytes);
  absl::Status Close();

 private:
  SafetensorsWriter() = default;
  std::string path_;
  std::FILE* f_ = nullptr;
  size_t expected_ = 0, written_ = 0;
};

}  // namespace tailserve
