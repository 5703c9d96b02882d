// tailserve-train: fits the length predictor from a router feedback log or a trace, prints its
// error on a held-out tail of the data, and writes the ONNX model the router loads.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "router/predictor/onnx_model.h"
#include "tools/train/trainer.h"

int main(int argc, char** argv) {
  using namespace tailserve;
  CLI::App app{"Train the tailserve length predictor and export it as ONNX"};
  std::string feedback, out, kind = "linear";
  std::vector<std::string> traces;
  size_t limit = 0;
  double holdout = 0.2, ridge = 1e-3;
  int hidden = 16, epochs = 1500;
  FeatureInput defaults;
  defaults.max_tokens = 4096;
  app.add_option("--feedback", feedback, "router feedback log (JSON lines)");
  app.add_option("--trace", traces, "trace CSV/JSONL (prompt and output lengths); repeatable");
  app.add_option("--limit", limit, "use at most this many rows");
  app.add_option("--holdout", holdout, "fraction of the data (its tail, in time order) kept out of training");
  app.add_option("--model", kind, "linear or mlp")->check(CLI::IsMember({"linear", "mlp"}));
  app.add_option("--ridge", ridge, "ridge penalty (linear)");
  app.add_option("--hidden", hidden, "hidden units (mlp)");
  app.add_option("--epochs", epochs, "training epochs (mlp)");
  app.add_option("--trace-max-tokens", defaults.max_tokens, "max_tokens the traced clients send");
  app.add_option("--trace-non-alnum", defaults.non_alnum_ratio, "non_alnum_ratio of traced prompts");
  app.add_option("--out", out, "where to write the ONNX model")->required();
  CLI11_PARSE(app, argc, argv);
  if (feedback.empty() == traces.empty()) {
    std::fprintf(stderr, "give --feedback or --trace, not both\n");
    return 2;
  }
  // Each source's tail (in time order) is held out, so the error shown is on requests the model
  // has not seen.
  std::vector<Sample> all, train, test;
  std::vector<std::string> sources = feedback.empty() ? traces : std::vector<std::string>{feedback};
  for (const std::string& source : sources) {
    absl::StatusOr<std::vector<Sample>> data =
        feedback.empty() ? ReadTrace(source, defaults, limit) : ReadFeedbackLog(source);
    if (!data.ok()) {
      std::fprintf(stderr, "%s\n", std::string(data.status().message()).c_str());
      return 2;
    }
    if (limit && data->size() > limit) data->resize(limit);
    const size_t n_train = std::max<size_t>(1, static_cast<size_t>(data->size() * (1.0 - holdout)));
    train.insert(train.end(), data->begin(), data->begin() + n_train);
    test.insert(test.end(), data->begin() + n_train, data->end());
    all.insert(all.end(), data->begin(), data->end());
  }
  const Fit fit = kind == "linear" ? FitLinear(train, ridge) : FitMlp(train, hidden, epochs, 1);

  // Constant baselines: the training mean, for scale.
  double mean = 0;
  for (const Sample& s : train) mean += s.steps;
  mean /= train.size();
  const Predictor constant = [mean](const FeatureVector&) { return mean; };
  // And the training median: the constant with the least absolute error, the stronger baseline
  // on skewed lengths.
  std::vector<double> steps;
  for (const Sample& s : train) steps.push_back(s.steps);
  std::nth_element(steps.begin(), steps.begin() + steps.size() / 2, steps.end());
  const double median = steps[steps.size() / 2];
  const Predictor constant_median = [median](const FeatureVector&) { return median; };
  std::printf("| data | rows | model | MAPE | MAE (steps) | within +-20%% | rank correlation |\n"
              "|---|---:|---|---:|---:|---:|---:|\n");
  for (const auto& [name, part] : {std::pair{"train", &train}, std::pair{"holdout", &test}}) {
    if (part->empty()) continue;
    for (const auto& [mname, p] : {std::pair{kind.c_str(), &fit.predict}, std::pair{"constant mean", &constant},
                                   std::pair{"constant median", &constant_median}}) {
      const Evaluation e = Evaluate(*p, *part);
      std::printf("| %s | %zu | %s | %.1f%% | %.1f | %.1f%% | %.2f |\n", name, part->size(), mname, 100 * e.mape,
                  e.mae, 100 * e.within_20, e.rank_corr);
    }
  }
  std::ofstream file(out, std::ios::binary);
  if (!fit.model.SerializeToOstream(&file)) {
    std::fprintf(stderr, "cannot write %s\n", out.c_str());
    return 1;
  }
  file.close();
  // Load it back exactly as the router will, and check it agrees with the trainer.
  auto loaded = OnnxModel::Load(out, kFeatureInputName, kNumFeatures);
  if (!loaded.ok()) {
    std::fprintf(stderr, "written model does not load: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  double worst = 0;
  for (const Sample& s : all) {
    const double a = fit.predict(s.x), b = *(*loaded)->Predict(s.x);
    worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(a)));
  }
  std::printf("\nwrote %s; reloaded with the router's evaluator: worst relative difference %.2g\n", out.c_str(), worst);
  return worst < 1e-4 ? 0 : 1;
}
