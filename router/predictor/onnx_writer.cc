#include "router/predictor/onnx_writer.h"

#include "router/predictor/features.h"

namespace tailserve {
namespace {

void AddInitializer(onnx::GraphProto* g, const std::string& name, std::vector<int64_t> dims,
                    const std::vector<float>& values) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  for (float v : values) t->add_float_data(v);
}

void AddNode(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in, const std::string& out) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out);
  for (auto& i : in) n->add_input(i);
  n->add_output(out);
}

void SetFloatTensor(onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::ModelProto Skeleton(int n_features, const std::string& doc, onnx::GraphProto** graph) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("tailserve-train");
  m.set_producer_version("1");
  m.set_doc_string(doc);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("length_predictor");
  SetFloatTensor(g->add_input(), kFeatureInputName, {1, n_features});
  SetFloatTensor(g->add_output(), "steps", {1, 1});
  AddInitializer(g, "one", {}, {1.0f});
  *graph = g;
  return m;
}

}  // namespace

onnx::ModelProto LinearLengthModel(const std::vector<float>& w, float b, const std::string& doc) {
  onnx::GraphProto* g;
  onnx::ModelProto m = Skeleton(static_cast<int>(w.size()), doc, &g);
  AddInitializer(g, "w", {static_cast<int64_t>(w.size()), 1}, w);
  AddInitializer(g, "b", {1}, {b});
  AddNode(g, "MatMul", {kFeatureInputName, "w"}, "xw");
  AddNode(g, "Add", {"xw", "b"}, "log1p_steps");
  AddNode(g, "Exp", {"log1p_steps"}, "steps_plus_one");
  AddNode(g, "Sub", {"steps_plus_one", "one"}, "steps");
  return m;
}

onnx::ModelProto MlpLengthModel(const std::vector<float>& w1, const std::vector<float>& b1, const std::vector<float>& w2,
                                float b2, int n_features, const std::string& doc) {
  onnx::GraphProto* g;
  onnx::ModelProto m = Skeleton(n_features, doc, &g);
  const int64_t hidden = static_cast<int64_t>(b1.size());
  AddInitializer(g, "w1", {n_features, hidden}, w1);
  AddInitializer(g, "b1", {hidden}, b1);
  AddInitializer(g, "w2", {hidden, 1}, w2);
  AddInitializer(g, "b2", {1}, {b2});
  AddNode(g, "Gemm", {kFeatureInputName, "w1", "b1"}, "h");
  AddNode(g, "Relu", {"h"}, "a");
  AddNode(g, "Gemm", {"a", "w2", "b2"}, "log1p_steps");
  AddNode(g, "Exp", {"log1p_steps"}, "steps_plus_one");
  AddNode(g, "Sub", {"steps_plus_one", "one"}, "steps");
  return m;
}

}  // namespace tailserve
