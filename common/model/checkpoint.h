#pragma once
// The tensors a model of a given config must have (names and shapes in the HuggingFace layout),
// and a checkpoint directory opened and checked against them. Shared by every backend and by the
// checkpoint maker, so all agree on one definition of each architecture.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"

namespace tailserve {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

std::string LayerTensorName(int64_t layer, const std::string& suffix);  // "model.layers.<L>.<suffix>"
std::string ExpertTensorName(int64_t layer, int64_t expert, const char* w);  // w1 (gate), w2 (down), w3 (up)

// Every tensor the config needs, in a stable order (embeddings, layers, final norm, LM head).
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

struct Checkpoint {
  std::string dir;
  ModelConfig config;
  TensorStore tensors;
};

// Reads the config files and opens the safetensors; refuses a checkpoint that lacks a tensor or
// has one of the wrong shape, naming file and tensor.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir);

}  // namespace tailserve
