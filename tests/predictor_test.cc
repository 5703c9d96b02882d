// The ONNX evaluator (each operator against hand-computed values, refusals at load), the feature
// vector, and the trainer's ONNX files loading back with the trainer's predictions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "router/predictor/features.h"
#include "router/predictor/onnx_model.h"
#include "router/predictor/onnx_ops.h"
#include "router/predictor/onnx_writer.h"
#include "tools/train/trainer.h"

namespace tailserve {
namespace {

onnx::NodeProto Node(const std::string& op, const std::string& domain = "") {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_domain(domain);
  n.set_name("n");
  return n;
}
void IntAttr(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void FloatAttr(onnx::NodeProto& n, const std::string& name, float v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
void IntsAttr(onnx::NodeProto& n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}
void FloatsAttr(onnx::NodeProto& n, const std::string& name, std::vector<float> v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOATS);
  for (auto x : v) a->add_floats(x);
}
void StringsAttr(onnx::NodeProto& n, const std::string& name, std::vector<std::string> v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRINGS);
  for (auto& x : v) a->add_strings(x);
}

Tensor RunOp(const onnx::NodeProto& node, std::vector<const Tensor*> in) {
  std::vector<Tensor> out;
  const absl::Status s = SupportedOps().at(OpKey(node))(node, in, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out.empty() ? Tensor{} : out[0];
}
absl::Status OpStatus(const onnx::NodeProto& node, std::vector<const Tensor*> in) {
  std::vector<Tensor> out;
  return SupportedOps().at(OpKey(node))(node, in, &out);
}

void ExpectFloats(const Tensor& t, std::vector<int64_t> dims, std::vector<float> values, float tol = 1e-6f) {
  EXPECT_EQ(t.dims, dims);
  ASSERT_EQ(t.f.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(t.f[i], values[i], tol) << "element " << i;
}

TEST(OnnxOpsTest, ElementwiseWithBroadcasting) {
  const Tensor a = Tensor::Float({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor row = Tensor::Float({3}, {10, 20, 30});
  const Tensor col = Tensor::Float({2, 1}, {2, 4});
  ExpectFloats(RunOp(Node("Add"), {&a, &row}), {2, 3}, {11, 22, 33, 14, 25, 36});
  ExpectFloats(RunOp(Node("Sub"), {&a, &col}), {2, 3}, {-1, 0, 1, 0, 1, 2});
  ExpectFloats(RunOp(Node("Mul"), {&col, &row}), {2, 3}, {20, 40, 60, 40, 80, 120});
  ExpectFloats(RunOp(Node("Div"), {&a, &col}), {2, 3}, {0.5, 1, 1.5, 1, 1.25, 1.5});
  const Tensor bad = Tensor::Float({2}, {1, 2});
  EXPECT_EQ(OpStatus(Node("Add"), {&a, &bad}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OnnxOpsTest, Unary) {
  const Tensor x = Tensor::Float({4}, {-2, 0, 1, 2});
  ExpectFloats(RunOp(Node("Relu"), {&x}), {4}, {0, 0, 1, 2});
  ExpectFloats(RunOp(Node("Sigmoid"), {&x}), {4}, {0.11920292f, 0.5f, 0.7310586f, 0.8807971f});
  ExpectFloats(RunOp(Node("Tanh"), {&x}), {4}, {-0.9640276f, 0, 0.7615942f, 0.9640276f});
  ExpectFloats(RunOp(Node("Exp"), {&x}), {4}, {0.13533528f, 1, 2.7182817f, 7.389056f}, 1e-5f);
  const Tensor pos = Tensor::Float({3}, {1, 2.718281828f, 10});
  ExpectFloats(RunOp(Node("Log"), {&pos}), {3}, {0, 1, 2.3025851f});
  ExpectFloats(RunOp(Node("Identity"), {&x}), {4}, {-2, 0, 1, 2});
}

TEST(OnnxOpsTest, ClipFromInputsAndAttributes) {
  const Tensor x = Tensor::Float({4}, {-2, 0, 1, 5});
  const Tensor lo = Tensor::Float({}, {-1}), hi = Tensor::Float({}, {2});
  ExpectFloats(RunOp(Node("Clip"), {&x, &lo, &hi}), {4}, {-1, 0, 1, 2});
  ExpectFloats(RunOp(Node("Clip"), {&x, nullptr, &hi}), {4}, {-2, 0, 1, 2});
  onnx::NodeProto old = Node("Clip");
  FloatAttr(old, "min", 0);
  FloatAttr(old, "max", 1);
  ExpectFloats(RunOp(old, {&x}), {4}, {0, 0, 1, 1});
}

TEST(OnnxOpsTest, MatMulAndGemm) {
  const Tensor a = Tensor::Float({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = Tensor::Float({3, 2}, {7, 8, 9, 10, 11, 12});
  ExpectFloats(RunOp(Node("MatMul"), {&a, &b}), {2, 2}, {58, 64, 139, 154});
  const Tensor v = Tensor::Float({3}, {1, 0, -1});
  ExpectFloats(RunOp(Node("MatMul"), {&v, &b}), {2}, {-4, -4});
  EXPECT_FALSE(OpStatus(Node("MatMul"), {&a, &a}).ok());

  onnx::NodeProto g = Node("Gemm");
  FloatAttr(g, "alpha", 2);
  FloatAttr(g, "beta", 0.5);
  IntAttr(g, "transB", 1);
  const Tensor bt = Tensor::Float({2, 3}, {7, 9, 11, 8, 10, 12});  // b transposed
  const Tensor c = Tensor::Float({2}, {10, 20});
  ExpectFloats(RunOp(g, {&a, &bt, &c}), {2, 2}, {121, 138, 283, 318});
  onnx::NodeProto ta = Node("Gemm");
  IntAttr(ta, "transA", 1);
  const Tensor at = Tensor::Float({3, 2}, {1, 4, 2, 5, 3, 6});
  ExpectFloats(RunOp(ta, {&at, &b}), {2, 2}, {58, 64, 139, 154});
}

TEST(OnnxOpsTest, ConcatReshapeFlattenCast) {
  const Tensor a = Tensor::Float({1, 2}, {1, 2}), b = Tensor::Float({1, 3}, {3, 4, 5});
  onnx::NodeProto concat = Node("Concat");
  IntAttr(concat, "axis", -1);
  ExpectFloats(RunOp(concat, {&a, &b}), {1, 5}, {1, 2, 3, 4, 5});
  const Tensor x = Tensor::Float({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor shape = Tensor::Int64({2}, {3, -1});
  ExpectFloats(RunOp(Node("Reshape"), {&x, &shape}), {3, 2}, {1, 2, 3, 4, 5, 6});
  const Tensor keep = Tensor::Int64({3}, {0, 1, 3});
  ExpectFloats(RunOp(Node("Reshape"), {&x, &keep}), {2, 1, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor wrong = Tensor::Int64({1}, {4});
  EXPECT_FALSE(OpStatus(Node("Reshape"), {&x, &wrong}).ok());
  const Tensor cube = Tensor::Float({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  onnx::NodeProto flat = Node("Flatten");
  IntAttr(flat, "axis", 2);
  ExpectFloats(RunOp(flat, {&cube}), {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  ExpectFloats(RunOp(Node("Flatten"), {&cube}), {2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  onnx::NodeProto to_int = Node("Cast");
  IntAttr(to_int, "to", onnx::TensorProto::INT64);
  const Tensor f = Tensor::Float({3}, {1.9f, -1.9f, 0});
  EXPECT_EQ(RunOp(to_int, {&f}).i, (std::vector<int64_t>{1, -1, 0}));
  onnx::NodeProto to_double = Node("Cast");
  IntAttr(to_double, "to", onnx::TensorProto::DOUBLE);
  EXPECT_FALSE(OpStatus(to_double, {&f}).ok());
}

// Two trees over features (x0, x1):
//   tree 0: x0 <= 10 ? 1.0 : 3.0        tree 1: x1 < 0.5 ? (x0 > 20 ? 5 : 2) : 7
onnx::NodeProto Trees(const std::string& aggregate) {
  onnx::NodeProto n = Node("TreeEnsembleRegressor", "ai.onnx.ml");
  IntsAttr(n, "nodes_treeids", {0, 0, 0, 1, 1, 1, 1, 1});
  IntsAttr(n, "nodes_nodeids", {0, 1, 2, 0, 1, 2, 3, 4});
  IntsAttr(n, "nodes_featureids", {0, 0, 0, 1, 0, 0, 0, 0});
  FloatsAttr(n, "nodes_values", {10, 0, 0, 0.5, 20, 0, 0, 0});
  StringsAttr(n, "nodes_modes", {"BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LT", "BRANCH_GT", "LEAF", "LEAF", "LEAF"});
  IntsAttr(n, "nodes_truenodeids", {1, 0, 0, 1, 3, 0, 0, 0});
  IntsAttr(n, "nodes_falsenodeids", {2, 0, 0, 2, 4, 0, 0, 0});
  IntsAttr(n, "target_treeids", {0, 0, 1, 1, 1});
  IntsAttr(n, "target_nodeids", {1, 2, 2, 3, 4});
  IntsAttr(n, "target_ids", {0, 0, 0, 0, 0});
  FloatsAttr(n, "target_weights", {1, 3, 7, 5, 2});
  IntAttr(n, "n_targets", 1);
  FloatsAttr(n, "base_values", {0.5});
  auto* a = n.add_attribute();
  a->set_name("aggregate_function");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(aggregate);
  return n;
}

TEST(OnnxOpsTest, TreeEnsembleRegressor) {
  const Tensor x = Tensor::Float({4, 2}, {5, 0, 25, 0, 15, 0, 5, 1});
  // Row values per tree: (1, 2), (3, 5), (3, 2), (1, 7); plus base 0.5.
  ExpectFloats(RunOp(Trees("SUM"), {&x}), {4, 1}, {3.5, 8.5, 5.5, 8.5});
  ExpectFloats(RunOp(Trees("AVERAGE"), {&x}), {4, 1}, {2.0, 4.5, 3.0, 4.5});
  ExpectFloats(RunOp(Trees("MAX"), {&x}), {4, 1}, {2.5, 5.5, 3.5, 7.5});
  const Tensor narrow = Tensor::Float({1, 1}, {5});
  const absl::Status s = OpStatus(Trees("SUM"), {&narrow});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("feature id 1 outside X's 1 columns"), std::string::npos) << s;
}

// A model around one node: features [1, 2] -> op -> steps.
onnx::ModelProto OneNodeModel(const std::string& op, const std::string& input = kFeatureInputName, int64_t width = 2) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* opset = m.add_opset_import();
  opset->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* in = g->add_input();
  in->set_name(input);
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
  in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(width);
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("the_node");
  n->add_input(input);
  n->add_output("steps");
  auto* out = g->add_output();
  out->set_name("steps");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  out->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
  out->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(width);
  return m;
}

TEST(OnnxModelTest, LoadsAndRunsAWholeGraph) {
  auto m = OnnxModel::FromProto(OneNodeModel("Relu"), kFeatureInputName, 2, "relu");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<float> x = {-3, 4};
  EXPECT_EQ(*(*m)->Predict(x), 0.0f);
}

TEST(OnnxModelTest, GradientBoostedTreesThroughTheChecker) {
  onnx::ModelProto m = OneNodeModel("Relu");
  auto* ml = m.add_opset_import();
  ml->set_domain("ai.onnx.ml");
  ml->set_version(3);
  onnx::NodeProto trees = Trees("SUM");
  trees.set_name("trees");
  trees.add_input(kFeatureInputName);
  trees.add_output("steps");
  *m.mutable_graph()->mutable_node(0) = trees;
  m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(1);
  auto model = OnnxModel::FromProto(m, kFeatureInputName, 2, "trees.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> x = {25, 0};
  EXPECT_FLOAT_EQ(*(*model)->Predict(x), 8.5f);
}

TEST(OnnxModelTest, RefusesUnsupportedOperatorNamingNodeAndOp) {
  auto m = OnnxModel::FromProto(OneNodeModel("Softmax"), kFeatureInputName, 2, "soft.onnx");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.status().message(),
            "soft.onnx: node 'the_node': operator /Softmax is not supported by the tailserve evaluator");
}

TEST(OnnxModelTest, RefusesWrongInputNameOrShape) {
  auto name = OnnxModel::FromProto(OneNodeModel("Relu", "x"), kFeatureInputName, 2, "m");
  EXPECT_EQ(name.status().message(), "m: the model must have exactly one input, named 'features'");
  auto shape = OnnxModel::FromProto(OneNodeModel("Relu"), kFeatureInputName, 8, "m");
  EXPECT_EQ(shape.status().message(), "m: input 'features' must be shaped [1, 8] or [8]");
}

TEST(OnnxModelTest, RefusesWhatTheCheckerRefuses) {
  auto m = OnnxModel::FromProto(OneNodeModel("NoSuchOp"), kFeatureInputName, 2, "m");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("ONNX checker"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("NoSuchOp"), std::string::npos) << m.status();
}

TEST(OnnxModelTest, RefusesCorruptMissingAndTruncatedFiles) {
  const std::string dir = ::testing::TempDir();
  EXPECT_EQ(OnnxModel::Load(dir + "/nope.onnx", kFeatureInputName, 8).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir + "/junk.onnx") << "this is not protobuf \xff\xff\xff\xff";
  auto junk = OnnxModel::Load(dir + "/junk.onnx", kFeatureInputName, 8);
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument) << junk.status();
  std::string bytes;
  LinearLengthModel(std::vector<float>(kNumFeatures, 0.1f), 1.0f, "t").SerializeToString(&bytes);
  std::ofstream(dir + "/cut.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto cut = OnnxModel::Load(dir + "/cut.onnx", kFeatureInputName, kNumFeatures);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument) << cut.status();
}

TEST(FeaturesTest, NonAlnumRatio) {
  EXPECT_EQ(NonAlnumRatio("hello world"), 0.0);
  EXPECT_EQ(NonAlnumRatio("!!!"), 1.0);
  EXPECT_EQ(NonAlnumRatio(""), 0.0);
  EXPECT_DOUBLE_EQ(NonAlnumRatio("ab!?"), 0.5);
  EXPECT_DOUBLE_EQ(NonAlnumRatio("ok 🙂🙂"), 0.5);    // emoji count, spaces do not
  EXPECT_DOUBLE_EQ(NonAlnumRatio("héllo 世界"), 0.0);  // letters of any script are alphanumeric
  EXPECT_DOUBLE_EQ(NonAlnumRatio("a\xff"), 0.5);       // invalid bytes count as non-alphanumeric
}

TEST(FeaturesTest, VectorOrderMatchesNames) {
  FeatureInput in;
  in.prompt_tokens = 100;
  in.non_alnum_ratio = 0.25;
  in.max_tokens = 50;
  in.priority = 1;
  in.has_stop = true;
  in.temperature = 0.7f;
  const FeatureVector f = MakeFeatures(in);
  EXPECT_EQ(std::string(kFeatureNames[0]), "prompt_tokens");
  EXPECT_EQ(f[0], 100);
  EXPECT_NEAR(f[1], std::log1p(100.0), 1e-6);
  EXPECT_EQ(f[2], 0.25f);
  EXPECT_EQ(f[3], 50);
  EXPECT_NEAR(f[4], std::log1p(50.0), 1e-6);
  EXPECT_EQ(f[5], 1);
  EXPECT_EQ(f[6], 1);
  EXPECT_EQ(f[7], 0.7f);
}

std::vector<Sample> Synthetic(uint64_t seed) {
  std::printf("synthetic data seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> prompt(1, 4000);
  std::vector<Sample> out;
  for (int i = 0; i < 2000; ++i) {
    FeatureInput f;
    f.prompt_tokens = prompt(rng);
    f.max_tokens = 4096;
    f.priority = 1 + static_cast<int>(rng() % 3);
    const double steps = std::exp(0.5 * std::log1p(double(f.prompt_tokens)) + 0.3 * f.priority + 1.0) - 1.0;
    out.push_back({MakeFeatures(f), steps});
  }
  return out;
}

void ExpectOnnxMatchesTrainer(const Fit& fit, const std::vector<Sample>& data) {
  const std::string path = ::testing::TempDir() + "/trained.onnx";
  {
    std::ofstream f(path, std::ios::binary);
    ASSERT_TRUE(fit.model.SerializeToOstream(&f));
  }
  auto loaded = OnnxModel::Load(path, kFeatureInputName, kNumFeatures);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const Sample& s : data) {
    const double want = fit.predict(s.x);
    ASSERT_NEAR(*(*loaded)->Predict(s.x), want, 1e-4 * std::max(1.0, want));
  }
}

TEST(TrainerTest, LinearRecoversALogLinearLawAndItsOnnxAgrees) {
  const auto data = Synthetic(7);
  const Fit fit = FitLinear(data, 1e-9);
  EXPECT_LT(Evaluate(fit.predict, data).mape, 0.01);
  ExpectOnnxMatchesTrainer(fit, data);
}

TEST(TrainerTest, RankCorrelationIsSpearmans) {
  EXPECT_DOUBLE_EQ(RankCorrelation({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(RankCorrelation({1, 2, 3, 4}, {9, 1, 0, -5}), -1.0);
  EXPECT_DOUBLE_EQ(RankCorrelation({5, 5, 5}, {1, 2, 3}), 0.0) << "a constant predictor orders nothing";
  EXPECT_DOUBLE_EQ(RankCorrelation({1}, {1}), 0.0);
  // Ties take their mean rank: ranks (0.5, 0.5, 2) against (0, 1, 2); covariance 1.5.
  EXPECT_NEAR(RankCorrelation({1, 1, 2}, {1, 2, 3}), 1.5 / std::sqrt(1.5 * 2.0), 1e-12);
  EXPECT_DOUBLE_EQ(Evaluate([](const FeatureVector& x) { return double(x[0]); },
                            {{MakeFeatures({.prompt_tokens = 3}), 30}, {MakeFeatures({.prompt_tokens = 7}), 70}})
                       .rank_corr,
                   1.0);
}

TEST(TrainerTest, MlpLearnsAndItsOnnxAgrees) {
  const auto data = Synthetic(11);
  const Fit fit = FitMlp(data, 8, 400, 3);
  EXPECT_LT(Evaluate(fit.predict, data).mape, 0.15);
  ExpectOnnxMatchesTrainer(fit, data);
}

TEST(TrainerTest, FeedbackLogRoundTrip) {
  const std::string path = ::testing::TempDir() + "/feedback.jsonl";
  {
    std::ofstream f(path);
    f << R"({"features": {"prompt_tokens": 10, "log_prompt_tokens": 2.4, "non_alnum_ratio": 0, "max_tokens": 64,)"
      << R"( "log_max_tokens": 4.17, "priority": 2, "has_stop": 0, "temperature": 0}, "actual_steps": 12})" << "\n";
  }
  auto s = ReadFeedbackLog(path);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0].x[0], 10);
  EXPECT_EQ((*s)[0].steps, 12);
  std::ofstream(path) << R"({"features": {"prompt_tokens": 10}, "actual_steps": 3})" << "\n";
  EXPECT_EQ(ReadFeedbackLog(path).status().message(), path + ":1: feature 'log_prompt_tokens' missing");
}

}  // namespace
}  // namespace tailserve
