#include "router/predictor/onnx_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tailserve {

std::string Tensor::ShapeString() const { return absl::StrCat("[", absl::StrJoin(dims, ","), "]"); }

namespace {

using Inputs = std::vector<const Tensor*>;

absl::Status Bad(const onnx::NodeProto& node, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("node '", node.name(), "' (", node.op_type(), "): ", why));
}

const onnx::AttributeProto* FindAttr(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}
int64_t AttrInt(const onnx::NodeProto& n, const std::string& name, int64_t def) {
  const auto* a = FindAttr(n, name);
  return a ? a->i() : def;
}
float AttrFloat(const onnx::NodeProto& n, const std::string& name, float def) {
  const auto* a = FindAttr(n, name);
  return a ? a->f() : def;
}
std::string AttrString(const onnx::NodeProto& n, const std::string& name, const std::string& def) {
  const auto* a = FindAttr(n, name);
  return a ? a->s() : def;
}
std::vector<int64_t> AttrInts(const onnx::NodeProto& n, const std::string& name) {
  const auto* a = FindAttr(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}
std::vector<float> AttrFloats(const onnx::NodeProto& n, const std::string& name) {
  const auto* a = FindAttr(n, name);
  return a ? std::vector<float>(a->floats().begin(), a->floats().end()) : std::vector<float>{};
}
std::vector<std::string> AttrStrings(const onnx::NodeProto& n, const std::string& name) {
  const auto* a = FindAttr(n, name);
  return a ? std::vector<std::string>(a->strings().begin(), a->strings().end()) : std::vector<std::string>{};
}

// Checks that inputs [0, required) are present and float.
absl::Status NeedFloats(const onnx::NodeProto& node, const Inputs& in, size_t required) {
  if (in.size() < required) return Bad(node, absl::StrCat("needs ", required, " inputs, has ", in.size()));
  for (size_t k = 0; k < required; ++k) {
    if (!in[k]) return Bad(node, absl::StrCat("input ", k, " is missing"));
    if (in[k]->type != Tensor::Type::kFloat) return Bad(node, absl::StrCat("input ", k, " must be float"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> Strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t k = dims.size(); k-- > 1;) s[k - 1] = s[k] * dims[k];
  return s;
}

absl::Status Binary(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out,
                    float (*op)(float, float)) {
  TAILSERVE_RETURN_IF_ERROR(NeedFloats(node, in, 2));
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  std::vector<int64_t> dims;
  if (!BroadcastShape(a.dims, b.dims, &dims).ok()) {
    return Bad(node, absl::StrCat("shapes ", a.ShapeString(), " and ", b.ShapeString(), " do not broadcast"));
  }
  const size_t rank = dims.size();
  // Strides of a and b over the output's dimensions, 0 where they broadcast.
  auto aligned = [&](const Tensor& t) {
    std::vector<int64_t> s(rank, 0);
    const std::vector<int64_t> own = Strides(t.dims);
    const size_t off = rank - t.dims.size();
    for (size_t k = 0; k < t.dims.size(); ++k) s[off + k] = t.dims[k] == 1 ? 0 : own[k];
    return s;
  };
  const std::vector<int64_t> sa = aligned(a), sb = aligned(b), so = Strides(dims);
  Tensor r = Tensor::Float(dims, {});
  r.f.resize(static_cast<size_t>(r.size()));
  for (int64_t idx = 0; idx < r.size(); ++idx) {
    int64_t ia = 0, ib = 0, rem = idx;
    for (size_t k = 0; k < rank; ++k) {
      const int64_t c = rank ? rem / so[k] : 0;
      rem -= c * so[k];
      ia += c * sa[k];
      ib += c * sb[k];
    }
    r.f[idx] = op(a.f[ia], b.f[ib]);
  }
  out->push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Unary(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out, float (*op)(float)) {
  TAILSERVE_RETURN_IF_ERROR(NeedFloats(node, in, 1));
  Tensor r = *in[0];
  for (float& v : r.f) v = op(v);
  out->push_back(std::move(r));
  return absl::OkStatus();
}

// out[m x n] = alpha * op(a) op(b), op transposing when asked; a is [m x k] (or [k x m] when
// transposed), b is [k x n] (or [n x k]). Accumulates in double.
std::vector<float> Multiply(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t k, int64_t n,
                            bool ta, bool tb, float alpha) {
  std::vector<float> r(static_cast<size_t>(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += double(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      }
      r[i * n + j] = static_cast<float>(alpha * acc);
    }
  return r;
}

absl::Status MatMul(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  TAILSERVE_RETURN_IF_ERROR(NeedFloats(node, in, 2));
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  if (a.dims.empty() || b.dims.empty() || a.dims.size() > 2 || b.dims.size() > 2) {
    return Bad(node, absl::StrCat("supports 1-D and 2-D operands, got ", a.ShapeString(), " x ", b.ShapeString()));
  }
  const int64_t m = a.dims.size() == 2 ? a.dims[0] : 1, k = a.dims.back();
  const int64_t kb = b.dims[0], n = b.dims.size() == 2 ? b.dims[1] : 1;
  if (k != kb) return Bad(node, absl::StrCat("inner dimensions differ: ", a.ShapeString(), " x ", b.ShapeString()));
  std::vector<int64_t> dims;
  if (a.dims.size() == 2) dims.push_back(m);
  if (b.dims.size() == 2) dims.push_back(n);
  out->push_back(Tensor::Float(dims, Multiply(a.f, b.f, m, k, n, false, false, 1.0f)));
  return absl::OkStatus();
}

absl::Status Gemm(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  TAILSERVE_RETURN_IF_ERROR(NeedFloats(node, in, 2));
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  if (a.dims.size() != 2 || b.dims.size() != 2) {
    return Bad(node, absl::StrCat("A and B must be 2-D, got ", a.ShapeString(), " and ", b.ShapeString()));
  }
  const bool ta = AttrInt(node, "transA", 0) != 0, tb = AttrInt(node, "transB", 0) != 0;
  const float alpha = AttrFloat(node, "alpha", 1.0f), beta = AttrFloat(node, "beta", 1.0f);
  const int64_t m = ta ? a.dims[1] : a.dims[0], k = ta ? a.dims[0] : a.dims[1];
  const int64_t kb = tb ? b.dims[1] : b.dims[0], n = tb ? b.dims[0] : b.dims[1];
  if (k != kb) return Bad(node, absl::StrCat("inner dimensions differ: ", a.ShapeString(), " x ", b.ShapeString()));
  Tensor r = Tensor::Float({m, n}, Multiply(a.f, b.f, m, k, n, ta, tb, alpha));
  if (in.size() > 2 && in[2]) {
    if (in[2]->type != Tensor::Type::kFloat) return Bad(node, "C must be float");
    Tensor scaled = *in[2];
    for (float& v : scaled.f) v *= beta;
    std::vector<Tensor> sum;
    const Inputs pair = {&r, &scaled};
    TAILSERVE_RETURN_IF_ERROR(Binary(node, pair, &sum, [](float x, float y) { return x + y; }));
    if (sum[0].dims != r.dims) return Bad(node, "C does not broadcast to [M, N]");
    r = std::move(sum[0]);
  }
  out->push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Clip(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  TAILSERVE_RETURN_IF_ERROR(NeedFloats(node, in, 1));
  // Opset >= 11 takes min/max as optional scalar inputs; older opsets as attributes.
  float lo = AttrFloat(node, "min", -std::numeric_limits<float>::infinity());
  float hi = AttrFloat(node, "max", std::numeric_limits<float>::infinity());
  for (size_t k = 1; k <= 2 && k < in.size(); ++k) {
    if (!in[k]) continue;
    if (in[k]->type != Tensor::Type::kFloat || in[k]->size() != 1) return Bad(node, "min/max must be float scalars");
    (k == 1 ? lo : hi) = in[k]->f[0];
  }
  Tensor r = *in[0];
  for (float& v : r.f) v = std::min(std::max(v, lo), hi);
  out->push_back(std::move(r));
  return absl::OkStatus();
}

int64_t NormalizeAxis(int64_t axis, size_t rank) { return axis < 0 ? axis + static_cast<int64_t>(rank) : axis; }

absl::Status Concat(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  if (in.empty() || std::any_of(in.begin(), in.end(), [](const Tensor* t) { return !t; })) {
    return Bad(node, "needs at least one input, none missing");
  }
  const size_t rank = in[0]->dims.size();
  const int64_t axis = NormalizeAxis(AttrInt(node, "axis", 0), rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank)) return Bad(node, "axis out of range");
  std::vector<int64_t> dims = in[0]->dims;
  dims[axis] = 0;
  for (const Tensor* t : in) {
    if (t->type != in[0]->type || t->dims.size() != rank) return Bad(node, "inputs differ in type or rank");
    for (size_t k = 0; k < rank; ++k) {
      if (static_cast<int64_t>(k) != axis && t->dims[k] != in[0]->dims[k]) {
        return Bad(node, absl::StrCat("shapes ", in[0]->ShapeString(), " and ", t->ShapeString(), " differ off the axis"));
      }
    }
    dims[axis] += t->dims[axis];
  }
  const int64_t outer = std::accumulate(dims.begin(), dims.begin() + axis, int64_t{1}, std::multiplies<>());
  Tensor r;
  r.type = in[0]->type;
  r.dims = dims;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* t : in) {
      const int64_t chunk = t->size() / std::max<int64_t>(outer, 1);
      if (t->type == Tensor::Type::kFloat) {
        r.f.insert(r.f.end(), t->f.begin() + o * chunk, t->f.begin() + (o + 1) * chunk);
      } else {
        r.i.insert(r.i.end(), t->i.begin() + o * chunk, t->i.begin() + (o + 1) * chunk);
      }
    }
  }
  out->push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Reshape(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  if (in.size() < 2 || !in[0] || !in[1]) return Bad(node, "needs data and shape");
  if (in[1]->type != Tensor::Type::kInt64 || in[1]->dims.size() != 1) return Bad(node, "shape must be a 1-D int64 tensor");
  const Tensor& x = *in[0];
  const bool allowzero = AttrInt(node, "allowzero", 0) != 0;
  std::vector<int64_t> dims = in[1]->i;
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0 && !allowzero) {
      if (k >= x.dims.size()) return Bad(node, "0 in shape refers to a missing input dimension");
      dims[k] = x.dims[k];
    }
    if (dims[k] == -1) {
      if (infer >= 0) return Bad(node, "more than one -1 in shape");
      infer = static_cast<int64_t>(k);
    } else if (dims[k] < 0) {
      return Bad(node, "negative dimension in shape");
    } else {
      known *= dims[k];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.size() % known != 0) return Bad(node, "cannot infer the -1 dimension");
    dims[infer] = x.size() / known;
  }
  Tensor r = x;
  r.dims = dims;
  if (r.size() != x.size()) {
    return Bad(node, absl::StrCat("cannot reshape ", x.ShapeString(), " to ", r.ShapeString()));
  }
  out->push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Flatten(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  if (in.empty() || !in[0]) return Bad(node, "needs an input");
  const Tensor& x = *in[0];
  const int64_t axis = NormalizeAxis(AttrInt(node, "axis", 1), x.dims.size());
  if (axis < 0 || axis > static_cast<int64_t>(x.dims.size())) return Bad(node, "axis out of range");
  const int64_t outer = std::accumulate(x.dims.begin(), x.dims.begin() + axis, int64_t{1}, std::multiplies<>());
  Tensor r = x;
  r.dims = {outer, outer ? x.size() / outer : 0};
  out->push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Identity(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  if (in.empty() || !in[0]) return Bad(node, "needs an input");
  out->push_back(*in[0]);
  return absl::OkStatus();
}

absl::Status Cast(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  if (in.empty() || !in[0]) return Bad(node, "needs an input");
  const int64_t to = AttrInt(node, "to", 0);
  const Tensor& x = *in[0];
  Tensor r;
  r.dims = x.dims;
  if (to == onnx::TensorProto::FLOAT) {
    r.type = Tensor::Type::kFloat;
    r.f = x.type == Tensor::Type::kFloat ? x.f : std::vector<float>(x.i.begin(), x.i.end());
  } else if (to == onnx::TensorProto::INT64) {
    r.type = Tensor::Type::kInt64;
    if (x.type == Tensor::Type::kInt64) {
      r.i = x.i;
    } else {
      for (float v : x.f) {
        if (!std::isfinite(v)) return Bad(node, "cannot cast a non-finite value to int64");
        r.i.push_back(static_cast<int64_t>(v));  // truncation toward zero, as the spec says
      }
    }
  } else {
    return Bad(node, absl::StrCat("casts to FLOAT or INT64 only, asked for type ", to));
  }
  out->push_back(std::move(r));
  return absl::OkStatus();
}

// ai.onnx.ml TreeEnsembleRegressor: the export format of gradient-boosted trees (XGBoost, LightGBM,
// scikit-learn through their ONNX converters).
absl::Status TreeEnsembleRegressor(const onnx::NodeProto& node, const Inputs& in, std::vector<Tensor>* out) {
  TAILSERVE_RETURN_IF_ERROR(NeedFloats(node, in, 1));
  const Tensor& x = *in[0];
  if (x.dims.empty() || x.dims.size() > 2) return Bad(node, "X must be 1-D or 2-D");
  const int64_t rows = x.dims.size() == 2 ? x.dims[0] : 1, cols = x.dims.back();
  if (FindAttr(node, "nodes_values_as_tensor") || FindAttr(node, "target_weights_as_tensor") ||
      FindAttr(node, "base_values_as_tensor")) {
    return Bad(node, "*_as_tensor attributes are not supported");
  }
  const auto tree = AttrInts(node, "nodes_treeids"), id = AttrInts(node, "nodes_nodeids"),
             feature = AttrInts(node, "nodes_featureids"), t_child = AttrInts(node, "nodes_truenodeids"),
             f_child = AttrInts(node, "nodes_falsenodeids"), missing = AttrInts(node, "nodes_missing_value_tracks_true");
  const auto value = AttrFloats(node, "nodes_values");
  const auto mode = AttrStrings(node, "nodes_modes");
  const size_t n = tree.size();
  if (n == 0 || id.size() != n || feature.size() != n || t_child.size() != n || f_child.size() != n ||
      value.size() != n || mode.size() != n || (!missing.empty() && missing.size() != n)) {
    return Bad(node, "nodes_* attributes are missing or differ in length");
  }
  const auto tt = AttrInts(node, "target_treeids"), tn = AttrInts(node, "target_nodeids"),
             tid = AttrInts(node, "target_ids");
  const auto tw = AttrFloats(node, "target_weights");
  if (tt.size() != tn.size() || tt.size() != tid.size() || tt.size() != tw.size()) {
    return Bad(node, "target_* attributes differ in length");
  }
  const int64_t n_targets = AttrInt(node, "n_targets", 1);
  const auto base = AttrFloats(node, "base_values");
  if (n_targets < 1 || (!base.empty() && static_cast<int64_t>(base.size()) != n_targets)) {
    return Bad(node, "n_targets / base_values do not agree");
  }
  const std::string aggregate = AttrString(node, "aggregate_function", "SUM");
  if (aggregate != "SUM" && aggregate != "AVERAGE" && aggregate != "MIN" && aggregate != "MAX") {
    return Bad(node, "unknown aggregate_function " + aggregate);
  }
  if (AttrString(node, "post_transform", "NONE") != "NONE") return Bad(node, "post_transform must be NONE");

  auto key = [](int64_t t, int64_t i) { return (static_cast<uint64_t>(t) << 32) ^ static_cast<uint32_t>(i); };
  std::unordered_map<uint64_t, size_t> index;
  std::unordered_map<int64_t, std::vector<int64_t>> children;
  for (size_t k = 0; k < n; ++k) {
    if (!index.emplace(key(tree[k], id[k]), k).second) return Bad(node, "duplicate (tree, node) id");
    if (mode[k] != "LEAF") {
      if (feature[k] < 0 || feature[k] >= cols) {
        return Bad(node, absl::StrCat("feature id ", feature[k], " outside X's ", cols, " columns"));
      }
      children[tree[k]].push_back(t_child[k]);
      children[tree[k]].push_back(f_child[k]);
    }
  }
  std::vector<int64_t> trees;
  for (size_t k = 0; k < n; ++k) {
    if (std::find(trees.begin(), trees.end(), tree[k]) != trees.end()) continue;
    trees.push_back(tree[k]);
  }
  std::vector<size_t> root_of;
  for (int64_t t : trees) {
    std::optional<size_t> root;
    for (size_t k = 0; k < n && !root; ++k) {
      const auto& c = children[t];
      if (tree[k] == t && std::find(c.begin(), c.end(), id[k]) == c.end()) root = k;
    }
    if (!root) return Bad(node, absl::StrCat("tree ", t, " has no root"));
    root_of.push_back(*root);
  }
  std::unordered_map<size_t, std::vector<std::pair<int64_t, float>>> leaf_targets;
  for (size_t k = 0; k < tt.size(); ++k) {
    auto it = index.find(key(tt[k], tn[k]));
    if (it == index.end() || mode[it->second] != "LEAF") return Bad(node, "a target refers to a node that is not a leaf");
    if (tid[k] < 0 || tid[k] >= n_targets) return Bad(node, "target id out of range");
    leaf_targets[it->second].emplace_back(tid[k], tw[k]);
  }

  Tensor r = Tensor::Float({rows, n_targets}, std::vector<float>(static_cast<size_t>(rows * n_targets), 0.0f));
  for (int64_t row = 0; row < rows; ++row) {
    const float* xs = x.f.data() + row * cols;
    std::vector<double> acc(n_targets, aggregate == "MIN" ? INFINITY : aggregate == "MAX" ? -INFINITY : 0.0);
    for (size_t ti = 0; ti < trees.size(); ++ti) {
      size_t k = root_of[ti];
      for (size_t steps = 0; mode[k] != "LEAF"; ++steps) {
        if (steps > n) return Bad(node, "a tree has a cycle");
        const float v = xs[feature[k]];
        bool go;
        if (std::isnan(v) && !missing.empty() && missing[k]) {
          go = true;
        } else if (mode[k] == "BRANCH_LEQ") go = v <= value[k];
        else if (mode[k] == "BRANCH_LT") go = v < value[k];
        else if (mode[k] == "BRANCH_GTE") go = v >= value[k];
        else if (mode[k] == "BRANCH_GT") go = v > value[k];
        else if (mode[k] == "BRANCH_EQ") go = v == value[k];
        else if (mode[k] == "BRANCH_NEQ") go = v != value[k];
        else return Bad(node, "unknown node mode " + mode[k]);
        auto next = index.find(key(tree[k], go ? t_child[k] : f_child[k]));
        if (next == index.end()) return Bad(node, "a branch points to a missing node");
        k = next->second;
      }
      std::vector<double> tree_value(n_targets, 0.0);
      for (auto [target, w] : leaf_targets[k]) tree_value[target] += w;
      for (int64_t t = 0; t < n_targets; ++t) {
        if (aggregate == "MIN") acc[t] = std::min(acc[t], tree_value[t]);
        else if (aggregate == "MAX") acc[t] = std::max(acc[t], tree_value[t]);
        else acc[t] += tree_value[t];
      }
    }
    for (int64_t t = 0; t < n_targets; ++t) {
      double v = acc[t];
      if (aggregate == "AVERAGE") v /= static_cast<double>(trees.size());
      if (!base.empty()) v += base[t];
      r.f[row * n_targets + t] = static_cast<float>(v);
    }
  }
  out->push_back(std::move(r));
  return absl::OkStatus();
}

}  // namespace

absl::Status BroadcastShape(const std::vector<int64_t>& a, const std::vector<int64_t>& b, std::vector<int64_t>* out) {
  const size_t rank = std::max(a.size(), b.size());
  out->assign(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t da = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const int64_t db = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return absl::InvalidArgumentError("shapes do not broadcast");
    (*out)[k] = da == 1 ? db : da;
  }
  return absl::OkStatus();
}

std::string OpKey(const onnx::NodeProto& node) {
  const std::string& d = node.domain();
  return (d == "ai.onnx" ? "" : d) + "/" + node.op_type();
}

const std::map<std::string, OpFn>& SupportedOps() {
  static const auto* ops = new std::map<std::string, OpFn>{
      {"/Add", [](auto& n, auto& in, auto* out) { return Binary(n, in, out, [](float a, float b) { return a + b; }); }},
      {"/Sub", [](auto& n, auto& in, auto* out) { return Binary(n, in, out, [](float a, float b) { return a - b; }); }},
      {"/Mul", [](auto& n, auto& in, auto* out) { return Binary(n, in, out, [](float a, float b) { return a * b; }); }},
      {"/Div", [](auto& n, auto& in, auto* out) { return Binary(n, in, out, [](float a, float b) { return a / b; }); }},
      {"/Relu", [](auto& n, auto& in, auto* out) { return Unary(n, in, out, [](float v) { return v > 0 ? v : 0.0f; }); }},
      {"/Sigmoid",
       [](auto& n, auto& in, auto* out) { return Unary(n, in, out, [](float v) { return 1.0f / (1.0f + std::exp(-v)); }); }},
      {"/Tanh", [](auto& n, auto& in, auto* out) { return Unary(n, in, out, [](float v) { return std::tanh(v); }); }},
      {"/Exp", [](auto& n, auto& in, auto* out) { return Unary(n, in, out, [](float v) { return std::exp(v); }); }},
      {"/Log", [](auto& n, auto& in, auto* out) { return Unary(n, in, out, [](float v) { return std::log(v); }); }},
      {"/MatMul", MatMul},
      {"/Gemm", Gemm},
      {"/Clip", Clip},
      {"/Concat", Concat},
      {"/Reshape", Reshape},
      {"/Flatten", Flatten},
      {"/Identity", Identity},
      {"/Cast", Cast},
      {"ai.onnx.ml/TreeEnsembleRegressor", TreeEnsembleRegressor},
  };
  return *ops;
}

}  // namespace tailserve
