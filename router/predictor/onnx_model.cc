#include "router/predictor/onnx_model.h"

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "router/predictor/onnx_ops.h"

namespace tailserve {
namespace {

constexpr size_t kMaxModelBytes = 64 << 20;  // a length predictor is kilobytes; refuse anything huge

template <class T, class Repeated>
std::vector<T> Values(const onnx::TensorProto& t, const Repeated& typed, int64_t n) {
  std::vector<T> out;
  if (!t.raw_data().empty()) {
    out.resize(t.raw_data().size() / sizeof(T));
    std::memcpy(out.data(), t.raw_data().data(), out.size() * sizeof(T));  // ONNX raw data is little-endian
  } else {
    out.assign(typed.begin(), typed.end());
  }
  if (static_cast<int64_t>(out.size()) != n) out.clear();
  return out;
}

}  // namespace

absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& t) {
  Tensor r;
  r.dims.assign(t.dims().begin(), t.dims().end());
  const int64_t n = r.size();
  if (t.has_data_location() && t.data_location() == onnx::TensorProto::EXTERNAL) {
    return absl::InvalidArgumentError(absl::StrCat("initializer '", t.name(), "': external data is not supported"));
  }
  if (t.data_type() == onnx::TensorProto::FLOAT) {
    r.f = Values<float>(t, t.float_data(), n);
    if (static_cast<int64_t>(r.f.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("initializer '", t.name(), "': data does not match its shape"));
    }
  } else if (t.data_type() == onnx::TensorProto::INT64) {
    r.type = Tensor::Type::kInt64;
    r.i = Values<int64_t>(t, t.int64_data(), n);
    if (static_cast<int64_t>(r.i.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("initializer '", t.name(), "': data does not match its shape"));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("initializer '", t.name(), "': element type ", t.data_type(), " (only FLOAT and INT64)"));
  }
  return r;
}

absl::StatusOr<std::unique_ptr<OnnxModel>> OnnxModel::Load(const std::string& path, const std::string& input_name,
                                                           int n_features) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open ONNX model"));
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  if (bytes.size() > kMaxModelBytes) return absl::InvalidArgumentError(absl::StrCat(path, ": larger than 64 MiB"));
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes)) return absl::InvalidArgumentError(absl::StrCat(path, ": not an ONNX model (protobuf parse failed)"));
  return FromProto(std::move(model), input_name, n_features, path);
}

absl::StatusOr<std::unique_ptr<OnnxModel>> OnnxModel::FromProto(onnx::ModelProto model, const std::string& input_name,
                                                                 int n_features, const std::string& source) {
  auto fail = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat(source, ": ", why)); };
  try {
    onnx::checker::check_model(model);
    onnx::shape_inference::InferShapes(model);
  } catch (const std::exception& e) {
    return fail(absl::StrCat("ONNX checker: ", e.what()));
  }
  auto m = std::unique_ptr<OnnxModel>(new OnnxModel());
  const onnx::GraphProto& g = model.graph();
  for (const onnx::NodeProto& node : g.node()) {
    if (!SupportedOps().count(OpKey(node))) {
      return fail(absl::StrCat("node '", node.name(), "': operator ", OpKey(node),
                               " is not supported by the tailserve evaluator"));
    }
  }
  for (const onnx::TensorProto& t : g.initializer()) {
    absl::StatusOr<Tensor> tensor = TensorFromProto(t);
    if (!tensor.ok()) return fail(std::string(tensor.status().message()));
    m->initializers_[t.name()] = *std::move(tensor);
  }
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const auto& vi : g.input()) {
    if (!m->initializers_.count(vi.name())) inputs.push_back(&vi);
  }
  if (inputs.size() != 1 || inputs[0]->name() != input_name) {
    return fail(absl::StrCat("the model must have exactly one input, named '", input_name, "'"));
  }
  const auto& type = inputs[0]->type().tensor_type();
  if (type.elem_type() != onnx::TensorProto::FLOAT) return fail(absl::StrCat("input '", input_name, "' must be float"));
  const auto& shape = type.shape();
  const auto dim_is = [](const onnx::TensorShapeProto::Dimension& d, int64_t v) {
    return !d.has_dim_value() || d.dim_value() == v;  // symbolic dims accept anything
  };
  if (shape.dim_size() == 2 && dim_is(shape.dim(0), 1) && shape.dim(1).has_dim_value() &&
      shape.dim(1).dim_value() == n_features) {
    m->input_is_vector_ = false;
  } else if (shape.dim_size() == 1 && shape.dim(0).has_dim_value() && shape.dim(0).dim_value() == n_features) {
    m->input_is_vector_ = true;
  } else {
    return fail(absl::StrCat("input '", input_name, "' must be shaped [1, ", n_features, "] or [", n_features, "]"));
  }
  if (g.output_size() != 1) return fail("the model must have exactly one output");
  m->model_ = std::move(model);
  m->input_name_ = input_name;
  m->n_features_ = n_features;
  m->description_ = absl::StrCat(source, " (", m->model_.graph().node_size(), " nodes, producer '",
                                 m->model_.producer_name(), "')");
  // A dry run on zeros: shape errors the checker cannot see surface here, at start.
  const std::vector<float> zeros(n_features, 0.0f);
  if (absl::StatusOr<float> p = m->Predict(zeros); !p.ok()) return fail(std::string(p.status().message()));
  return m;
}

absl::StatusOr<std::vector<Tensor>> OnnxModel::Run(const std::map<std::string, Tensor>& inputs) const {
  std::map<std::string, Tensor> values = initializers_;
  for (const auto& [name, t] : inputs) values[name] = t;
  for (const onnx::NodeProto& node : model_.graph().node()) {
    std::vector<const Tensor*> in;
    for (const std::string& name : node.input()) {
      if (name.empty()) {
        in.push_back(nullptr);
        continue;
      }
      auto it = values.find(name);
      if (it == values.end()) return absl::InvalidArgumentError(absl::StrCat("node '", node.name(), "': no value for input '", name, "'"));
      in.push_back(&it->second);
    }
    std::vector<Tensor> out;
    TAILSERVE_RETURN_IF_ERROR(SupportedOps().at(OpKey(node))(node, in, &out));
    if (out.size() < static_cast<size_t>(node.output_size())) {
      return absl::InvalidArgumentError(absl::StrCat("node '", node.name(), "': produced too few outputs"));
    }
    for (int k = 0; k < node.output_size(); ++k) values[node.output(k)] = std::move(out[k]);
  }
  std::vector<Tensor> outputs;
  for (const auto& o : model_.graph().output()) {
    auto it = values.find(o.name());
    if (it == values.end()) return absl::InvalidArgumentError(absl::StrCat("graph output '", o.name(), "' was not computed"));
    outputs.push_back(it->second);
  }
  return outputs;
}

absl::StatusOr<float> OnnxModel::Predict(std::span<const float> features) const {
  if (static_cast<int>(features.size()) != n_features_) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", n_features_, " features, got ", features.size()));
  }
  std::vector<int64_t> dims = input_is_vector_ ? std::vector<int64_t>{n_features_} : std::vector<int64_t>{1, n_features_};
  TAILSERVE_ASSIGN_OR_RETURN(
      const std::vector<Tensor> out,
      Run({{input_name_, Tensor::Float(dims, std::vector<float>(features.begin(), features.end()))}}));
  const Tensor& y = out[0];
  if (y.type != Tensor::Type::kFloat || y.f.empty()) return absl::InvalidArgumentError("the output must be a non-empty float tensor");
  return y.f[0];
}

}  // namespace tailserve
