#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace tailserve {
namespace {

// Reads one mapping, remembering which keys were consumed so the rest can be reported as unknown.
class Section {
 public:
  Section(YAML::Node node, std::string path, std::vector<std::string>* errors)
      : node_(std::move(node)), path_(std::move(path)), errors_(errors) {
    if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
      Error(path_, "must be a mapping");
      node_ = YAML::Node();
    }
  }
  ~Section() {
    if (!node_.IsDefined() || !node_.IsMap()) return;
    for (const auto& kv : node_) {
      // A key that is a list or a mapping (`? [a, b] : 1`) is no key of ours; never as<>() here,
      // which throws from a destructor.
      if (!kv.first.IsScalar()) {
        Error(path_.empty() ? "(top level)" : path_, absl::StrCat("keys must be strings, got ", Show(kv.first)));
        continue;
      }
      const std::string& key = kv.first.Scalar();
      if (!seen_.count(key)) Error(Join(key), "unknown key");
    }
  }

  Section Sub(const std::string& key) { return Section(Find(key).value_or(YAML::Node()), Join(key), errors_); }

  void Int(const std::string& key, int* out, int64_t lo, int64_t hi) {
    int64_t v = *out;
    if (Integer(key, &v, lo, hi)) *out = static_cast<int>(v);
  }
  void Double(const std::string& key, double* out, double lo, double hi) {
    std::optional<YAML::Node> found = Find(key);
    if (!found) return;
    const YAML::Node& n = *found;
    double v;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
      Error(Join(key), absl::StrCat("expected a number, got ", Show(n)));
    } else if (v < lo || v > hi) {
      Error(Join(key), absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
    } else {
      *out = v;
    }
  }
  void Bool(const std::string& key, bool* out) {
    std::optional<YAML::Node> found = Find(key);
    if (!found) return;
    const YAML::Node& n = *found;
    bool v;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
      Error(Join(key), absl::StrCat("expected true or false, got ", Show(n)));
    } else {
      *out = v;
    }
  }
  void String(const std::string& key, std::string* out, const std::set<std::string>& allowed = {}) {
    std::optional<YAML::Node> found = Find(key);
    if (!found) return;
    const YAML::Node& n = *found;
    if (!n.IsScalar()) {
      Error(Join(key), absl::StrCat("expected a string, got ", Show(n)));
    } else if (!allowed.empty() && !allowed.count(n.Scalar())) {
      Error(Join(key), absl::StrCat("must be one of {", absl::StrJoin(allowed, ", "), "}, got '",
                                    n.Scalar(), "'"));
    } else {
      *out = n.Scalar();
    }
  }
  void StringList(const std::string& key, std::vector<std::string>* out) {
    std::optional<YAML::Node> found = Find(key);
    if (!found) return;
    const YAML::Node& n = *found;
    if (!n.IsSequence()) {
      Error(Join(key), absl::StrCat("expected a list of strings, got ", Show(n)));
      return;
    }
    std::vector<std::string> v;
    for (size_t i = 0; i < n.size(); ++i) {
      if (!n[i].IsScalar() || n[i].Scalar().empty()) {
        Error(absl::StrCat(Join(key), "[", i, "]"), "expected a non-empty string");
        return;
      }
      v.push_back(n[i].Scalar());
    }
    *out = std::move(v);
  }
  void Error(const std::string& where, const std::string& what) {
    errors_->push_back(absl::StrCat(where, ": ", what));
  }

 private:
  bool Integer(const std::string& key, int64_t* out, int64_t lo, int64_t hi) {
    std::optional<YAML::Node> found = Find(key);
    if (!found) return false;
    const YAML::Node& n = *found;
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
      Error(Join(key), absl::StrCat("expected an integer, got ", Show(n)));
      return false;
    }
    if (v < lo || v > hi) {
      Error(Join(key), absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
      return false;
    }
    *out = v;
    return true;
  }
  // The value at `key`, or nullopt when absent or null (a default YAML::Node is a defined null).
  std::optional<YAML::Node> Find(const std::string& key) {
    seen_.insert(key);
    if (!node_.IsDefined() || !node_.IsMap()) return std::nullopt;
    const YAML::Node& cnode = node_;  // const lookup: never inserts the key
    YAML::Node n = cnode[key];
    if (!n.IsDefined() || n.IsNull()) return std::nullopt;
    return n;
  }
  std::string Join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  static std::string Show(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    return n.IsSequence() ? "a list" : "a mapping";
  }

  YAML::Node node_;
  std::string path_;
  std::vector<std::string>* errors_;
  std::set<std::string> seen_;
};

absl::Status ApplyOverride(YAML::Node root, const std::string& item) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("override '", item, "': expected section.key=value"));
  }
  std::vector<std::string> path = absl::StrSplit(item.substr(0, eq), '.');
  if (path.size() < 2 || std::any_of(path.begin(), path.end(), [](auto& p) { return p.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat("override '", item, "': expected section.key=value"));
  }
  YAML::Node value;
  try {
    value = YAML::Load(item.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("override '", item, "': ", e.what()));
  }
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    const YAML::Node& cnode = node;
    if (!cnode[path[i]] || cnode[path[i]].IsNull()) node[path[i]] = YAML::Node(YAML::NodeType::Map);
    if (!cnode[path[i]].IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat("override '", item, "': '", path[i], "' is not a section"));
    }
    node.reset(node[path[i]]);  // reset rebinds; operator= would overwrite the parent's value
  }
  node[path.back()] = value;
  return absl::OkStatus();
}

void ReadAll(YAML::Node root, Config* c, std::vector<std::string>* errors) {
  Section top(root, "", errors);
  {
    Section s = top.Sub("batching");
    auto& b = c->batching;
    s.String("mode", &b.mode, {"ladb", "fifo", "fcfs", "slo"});
    s.Int("max_batch_size", &b.max_batch_size, 1, 4096);
    s.Int("min_batch_size", &b.min_batch_size, 1, 4096);
    s.Int("target_latency_ms", &b.target_latency_ms, 1, 3'600'000);
    s.Double("variance_tolerance", &b.variance_tolerance, 0.0, 10.0);
    if (b.min_batch_size > b.max_batch_size) {
      s.Error("batching.min_batch_size", absl::StrCat("must be <= batching.max_batch_size (",
                                                      b.max_batch_size, "), got ", b.min_batch_size));
    }
  }
  {
    Section s = top.Sub("predictor");
    auto& p = c->predictor;
    s.Double("steps_per_prompt_token", &p.steps_per_prompt_token, 0.0, 1e6);
    s.Double("base_steps", &p.base_steps, 0.0, 1e9);
    s.Double("step_budget_margin", &p.step_budget_margin, -1.0, 100.0);
    s.Int("min_step_budget", &p.min_step_budget, 1, 1'000'000);
    s.String("model_path", &p.model_path);
    s.Int("warmup_steps", &p.warmup_steps, 0, 100'000'000);
    s.Int("update_interval_ms", &p.update_interval_ms, 10, 86'400'000);
    s.String("feedback_log", &p.feedback_log);
    s.Double("drift_mape_threshold", &p.drift_mape_threshold, 0.01, 1000);
    s.Double("drift_window_s", &p.drift_window_s, 1, 86400);
    s.Double("drift_cooldown_s", &p.drift_cooldown_s, 0, 86400);
    s.Int("drift_min_samples", &p.drift_min_samples, 1, 10'000'000);
  }
  {
    Section s = top.Sub("router");
    auto& r = c->router;
    s.String("listen_host", &r.listen_host);
    s.Int("grpc_port", &r.grpc_port, 0, 65535);
    s.Int("http_port", &r.http_port, 0, 65535);
    s.StringList("workers", &r.workers);
    s.String("queue_strategy", &r.queue_strategy, {"fifo", "priority_by_remaining_steps"});
    s.Int("timeout_ms", &r.timeout_ms, 0, 3'600'000);
    s.Int("max_wait_ms", &r.max_wait_ms, 1, 3'600'000);
    s.String("fallback_policy", &r.fallback_policy, {"immediate_dispatch"});
    s.Int("max_queue_size", &r.max_queue_size, 1, 10'000'000);
    s.Int("max_tokens_limit", &r.max_tokens_limit, 1, 10'000'000);
    s.Int("max_prompt_tokens", &r.max_prompt_tokens, 1, 100'000'000);
    s.Int("max_failed_dispatches", &r.max_failed_dispatches, 1, 1000);
    s.Int("health_check_interval_ms", &r.health_check_interval_ms, 10, 3'600'000);
    s.Int("health_check_timeout_ms", &r.health_check_timeout_ms, 10, 3'600'000);
    s.Int("unhealthy_after_failures", &r.unhealthy_after_failures, 1, 1000);
    s.Double("metrics_window_seconds", &r.metrics_window_seconds, 1, 86400);
    s.String("model_path", &r.model_path);
    s.Int("interactive_ttft_slo_ms", &r.interactive_ttft_slo_ms, 0, 3'600'000);
    s.Int("interactive_tpot_slo_ms", &r.interactive_tpot_slo_ms, 0, 3'600'000);
    s.Int("standard_ttft_slo_ms", &r.standard_ttft_slo_ms, 0, 3'600'000);
    s.Int("standard_tpot_slo_ms", &r.standard_tpot_slo_ms, 0, 3'600'000);
    s.Int("batch_ttft_slo_ms", &r.batch_ttft_slo_ms, 0, 3'600'000);
    s.Int("batch_tpot_slo_ms", &r.batch_tpot_slo_ms, 0, 3'600'000);
    s.Int("slo_reject_waiting", &r.slo_reject_waiting, 0, 10'000'000);
    s.Bool("cache_aware_routing", &r.cache_aware_routing);
    s.Int("prefix_index_blocks", &r.prefix_index_blocks, 1, 100'000'000);
    s.Bool("prefix_cache_events", &r.prefix_cache_events);
    s.Bool("session_affinity", &r.session_affinity);
    s.Double("max_load_imbalance", &r.max_load_imbalance, 0, 1000);
    s.Int("api_port", &r.api_port, -1, 65535);
    s.Int("api_threads", &r.api_threads, 1, 64);
    s.Int("api_max_body_bytes", &r.api_max_body_bytes, 1024, 1 << 30);
    s.String("served_model_name", &r.served_model_name);
    s.String("api_keys_file", &r.api_keys_file);
    s.String("tls_cert_file", &r.tls_cert_file);
    s.String("tls_key_file", &r.tls_key_file);
    s.String("worker_tls_ca_file", &r.worker_tls_ca_file);
    s.String("worker_tls_cert_file", &r.worker_tls_cert_file);
    s.String("worker_tls_key_file", &r.worker_tls_key_file);
  }
  {
    Section s = top.Sub("worker");
    auto& w = c->worker;
    s.String("listen_host", &w.listen_host);
    s.Int("grpc_port", &w.grpc_port, 0, 65535);
    s.Int("http_port", &w.http_port, 0, 65535);
    s.String("backend", &w.backend, {"sim", "cpu", "cuda"});
    s.String("model_id", &w.model_id);
    s.String("tls_cert_file", &w.tls_cert_file);
    s.String("tls_key_file", &w.tls_key_file);
    s.String("tls_client_ca_file", &w.tls_client_ca_file);
    s.String("model_path", &w.model_path);
    s.Int("threads", &w.threads, 0, 1024);
    s.String("kv_cache_dtype", &w.kv_cache_dtype, {"fp8_e4m3", "fp8_e5m2", "fp16"});
    s.Double("kv_memory_fraction", &w.kv_memory_fraction, 0.01, 0.99);
    s.Int("max_context", &w.max_context, 0, 10'000'000);
    s.Int("cuda_device", &w.cuda_device, 0, 64);
    s.Int("slots", &w.slots, 1, 65536);
    s.Int("step_token_budget", &w.step_token_budget, 0, 10'000'000);
    // Decodes come out of the budget first: one smaller than the slots could starve the prompts.
    if (w.step_token_budget > 0 && w.step_token_budget < w.slots) {
      s.Error("worker.step_token_budget", absl::StrCat("must be 0 or >= worker.slots (", w.slots, "), got ",
                                                       w.step_token_budget));
    }
    s.Double("step_time_target_ms", &w.step_time_target_ms, 0, 60'000);
    s.Int("max_waiting", &w.max_waiting, 0, 1'000'000);
    s.String("admission", &w.admission, {"fcfs", "predicted"});
    s.Int("aging_ms", &w.aging_ms, 1, 3'600'000);
    s.String("kv_reservation", &w.kv_reservation, {"max_tokens", "on_demand", "predicted"});
    s.Double("kv_reservation_margin", &w.kv_reservation_margin, 0, 100);
    s.String("preemption", &w.preemption, {"newest", "most_remaining"});
    s.Bool("prefix_caching", &w.prefix_caching);
    s.Double("metrics_window_seconds", &w.metrics_window_seconds, 1, 86400);
    Section sim = s.Sub("sim");
    sim.Double("step_base_ms", &w.sim.step_base_ms, 0, 60'000);
    sim.Double("step_per_sequence_ms", &w.sim.step_per_sequence_ms, 0, 60'000);
    sim.Double("step_per_kv_token_ns", &w.sim.step_per_kv_token_ns, 0, 1e9);
    sim.Double("step_per_prefill_token_ms", &w.sim.step_per_prefill_token_ms, 0, 60'000);
    sim.Int("vocab_size", &w.sim.vocab_size, 2, 10'000'000);
    sim.Int("kv_blocks", &w.sim.kv_blocks, 0, 2'000'000'000);
    sim.Int("fail_after_steps", &w.sim.fail_after_steps, 0, 2'000'000'000);
  }
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text,
                                   const std::vector<std::string>& overrides,
                                   const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(source, ": top level must be a mapping"));
  for (const auto& o : overrides) {
    TAILSERVE_RETURN_IF_ERROR(ApplyOverride(root, o));
  }
  Config config;
  std::vector<std::string> errors;
  ReadAll(root, &config, &errors);
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", absl::StrJoin(errors, "; ")));
  }
  return config;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open config file"));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Config> config = ParseConfig(ss.str(), overrides, path);
  // Relative paths in the file are relative to the file's folder, wherever the process starts.
  if (config.ok()) {
    for (std::string* p : {&config->predictor.model_path, &config->predictor.feedback_log, &config->router.model_path,
                           &config->router.api_keys_file, &config->router.tls_cert_file, &config->router.tls_key_file,
                           &config->router.worker_tls_ca_file, &config->router.worker_tls_cert_file,
                           &config->router.worker_tls_key_file, &config->worker.model_path,
                           &config->worker.tls_cert_file, &config->worker.tls_key_file,
                           &config->worker.tls_client_ca_file}) {
      if (!p->empty() && (*p)[0] != '/') *p = (std::filesystem::path(path).parent_path() / *p).lexically_normal().string();
    }
  }
  return config;
}

}  // namespace tailserve
