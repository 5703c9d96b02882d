#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tailserve {
namespace {

using nlohmann::json;

// Headers of real checkpoints are well under a megabyte; a huge length means a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100 << 20;

absl::StatusOr<DType> ParseDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("dtype ", s, " is not supported (F32, F16, BF16)"));
}

const char* DTypeTag(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
  }
  return "?";
}

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

void ToFloat(DType dtype, const std::byte* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&dst[i], &bits, 4);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return;
  }
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat: ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", file->size_, " bytes is too short for a safetensors header"));
  }
  file->map_ = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (file->map_ == MAP_FAILED) {
    file->map_ = nullptr;
    return absl::InternalError(absl::StrCat(path, ": mmap: ", std::strerror(errno)));
  }
  const auto* base = static_cast<const std::byte*>(file->map_);
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > kMaxHeaderBytes || header_len > file->size_ - 8) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": corrupt header: header length ", header_len,
                                                   " does not fit the file (", file->size_, " bytes)"));
  }
  json header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len),
                            nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return absl::InvalidArgumentError(absl::StrCat(name, ": corrupt header: not a JSON object"));
  const std::byte* data = base + 8 + header_len;
  const size_t data_size = file->size_ - 8 - header_len;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_object()) {
        for (auto& [mk, mv] : value.items()) {
          if (mv.is_string()) file->metadata_[mk] = mv.get<std::string>();
        }
      }
      continue;
    }
    const std::string at = absl::StrCat(name, ": tensor ", key);
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets") ||
        !value["dtype"].is_string() || !value["shape"].is_array() || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      return absl::InvalidArgumentError(at + ": corrupt header entry (needs dtype, shape, data_offsets)");
    }
    TensorInfo t;
    t.name = key;
    t.file = name;
    absl::StatusOr<DType> dtype = ParseDType(value["dtype"].get<std::string>());
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat(at, ": ", std::string(dtype.status().message())));
    t.dtype = *dtype;
    for (const json& d : value["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return absl::InvalidArgumentError(at + ": corrupt shape");
      t.shape.push_back(d.get<int64_t>());
    }
    const json& off = value["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(at + ": corrupt data_offsets");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": data [", begin, ", ", end, ") extends past the end of the file (",
                                                     data_size, " data bytes; truncated?)"));
    }
    t.nbytes = end - begin;
    if (t.nbytes != static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": ", t.nbytes, " bytes do not hold ", DTypeTag(t.dtype),
                                                     ShapeString(t.shape)));
    }
    t.data = data + begin;
    file->tensors_.emplace(key, std::move(t));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

absl::StatusOr<TensorStore> TensorStore::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  TensorStore store;
  store.dir_ = dir;
  std::vector<std::string> shards;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError("model.safetensors.index.json: not a JSON object with a weight_map");
    }
    std::map<std::string, std::string> weight_map;
    for (auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) return absl::InvalidArgumentError("model.safetensors.index.json: weight_map." + tensor + " is not a file name");
      weight_map[tensor] = shard.get<std::string>();
      if (std::find(shards.begin(), shards.end(), weight_map[tensor]) == shards.end()) shards.push_back(weight_map[tensor]);
    }
    for (const std::string& shard : shards) {
      if (shard.find('/') != std::string::npos) {
        return absl::InvalidArgumentError("model.safetensors.index.json: shard name " + shard + " has a directory part");
      }
      TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                                 SafetensorsFile::Open((fs::path(dir) / shard).string()));
      store.files_.push_back(std::move(f));
      for (auto& [name, info] : store.files_.back()->tensors()) store.index_[name] = &info;
    }
    for (auto& [tensor, shard] : weight_map) {
      auto it = store.index_.find(tensor);
      if (it == store.index_.end() || it->second->file != shard) {
        return absl::InvalidArgumentError(absl::StrCat("model.safetensors.index.json: tensor ", tensor, " is not in ", shard));
      }
    }
    return store;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single)) {
    return absl::NotFoundError(absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  TAILSERVE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(single.string()));
  store.files_.push_back(std::move(f));
  for (auto& [name, info] : store.files_.back()->tensors()) store.index_[name] = &info;
  return store;
}

const TensorInfo* TensorStore::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<const TensorInfo*> TensorStore::Get(const std::string& name, std::span<const int64_t> shape) const {
  const TensorInfo* t = Find(name);
  if (!t) {
    return absl::NotFoundError(absl::StrCat(dir_, ": tensor ", name, " is missing from the checkpoint (expected ",
                                            ShapeString(shape), ")"));
  }
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor ", name, " has shape ", ShapeString(t->shape),
                                                   ", the config needs ", ShapeString(shape)));
  }
  return t;
}

absl::Status TensorStore::ReadFloat(const std::string& name, std::span<const int64_t> shape, std::vector<float>* out) const {
  TAILSERVE_ASSIGN_OR_RETURN(const TensorInfo* t, Get(name, shape));
  out->resize(static_cast<size_t>(t->numel()));
  ToFloat(t->dtype, t->data, out->size(), out->data());
  return absl::OkStatus();
}

std::vector<std::string> TensorStore::Names() const {
  std::vector<std::string> names;
  for (auto& [n, _] : index_) names.push_back(n);
  return names;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    uint64_t n = DTypeSize(e.dtype);
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    header[e.name] = {{"dtype", DTypeTag(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8) text += ' ';  // align the data section as the reference writer does
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->expected_ = offset;
  w->f_ = std::fopen(path.c_str(), "wb");
  if (!w->f_) return absl::InternalError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  const uint64_t len = text.size();
  if (std::fwrite(&len, 8, 1, w->f_) != 1 || std::fwrite(text.data(), 1, text.size(), w->f_) != text.size()) {
    return absl::InternalError(path + ": write failed");
  }
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

absl::Status SafetensorsWriter::Write(std::span<const std::byte> bytes) {
  if (written_ + bytes.size() > expected_) return absl::InternalError(path_ + ": more tensor bytes than declared");
  if (std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) return absl::InternalError(path_ + ": write failed");
  written_ += bytes.size();
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Close() {
  if (written_ != expected_) {
    return absl::InternalError(absl::StrCat(path_, ": wrote ", written_, " of ", expected_, " declared bytes"));
  }
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) return absl::InternalError(path_ + ": close failed");
  return absl::OkStatus();
}

}  // namespace tailserve
