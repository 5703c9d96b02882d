// tailserve-make-checkpoint: writes a deterministic synthetic checkpoint (random bf16 weights from
// a seed, HuggingFace layout, a real tokenizer) of any supported architecture and size.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "common/bpe_tokenizer.h"
#include "tools/checkpoint/checkpoint_maker.h"

namespace tailserve {
namespace {

int Main(int argc, char** argv) {
  CLI::App app{"tailserve-make-checkpoint: synthetic HuggingFace checkpoints (bf16, random weights from a seed)"};
  std::string out, preset = "tiny", arch, tokenizer_dir, format = "hf4";
  uint64_t seed = 0;
  int64_t vocab = 0, hidden = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, experts = 0, top_k = 0;
  int64_t max_position = 0, sliding_window = -1;
  double shard_gb = 5, rope_theta = 0;
  int tie = -1;
  app.add_option("--out", out, "output directory")->required();
  app.add_option("--preset", preset, "tiny, llama-3.2-1b, llama-3.1-8b, mixtral-tiny, qwen2-tiny")->capture_default_str();
  app.add_option("--arch", arch, "override the architecture: llama, qwen2, mistral, mixtral");
  app.add_option("--tokenizer", tokenizer_dir, "directory with tokenizer.json (copied; sets vocab, BOS and EOS)");
  app.add_option("--seed", seed, "random seed")->capture_default_str();
  app.add_option("--config-format", format, "hf4 (rope_theta/rope_scaling) or hf5 (rope_parameters)")
      ->check(CLI::IsMember({"hf4", "hf5"}))->capture_default_str();
  app.add_option("--vocab", vocab, "vocabulary size (default: the tokenizer's)");
  app.add_option("--hidden", hidden, "hidden size");
  app.add_option("--ffn", ffn, "intermediate (FFN) size");
  app.add_option("--layers", layers, "decoder layers");
  app.add_option("--heads", heads, "attention heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads");
  app.add_option("--head-dim", head_dim, "head dimension");
  app.add_option("--experts", experts, "MoE experts");
  app.add_option("--experts-per-token", top_k, "MoE experts per token");
  app.add_option("--max-position", max_position, "context length");
  app.add_option("--sliding-window", sliding_window, "Mistral/Mixtral sliding window (0: none)");
  app.add_option("--rope-theta", rope_theta, "RoPE base");
  app.add_option("--tie", tie, "1: LM head tied to the embeddings, 0: separate");
  app.add_option("--shard-gb", shard_gb, "largest shard in GB")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  ModelConfig& c = *config;
  if (!arch.empty()) {
    if (arch == "llama") c.arch = Architecture::kLlama;
    else if (arch == "qwen2") c.arch = Architecture::kQwen2, c.qkv_bias = true;
    else if (arch == "mistral") c.arch = Architecture::kMistral;
    else if (arch == "mixtral") c.arch = Architecture::kMixtral;
    else {
      std::fprintf(stderr, "--arch: %s is not one of llama, qwen2, mistral, mixtral\n", arch.c_str());
      return 2;
    }
  }
  auto set = [](int64_t v, int64_t* field) { if (v > 0) *field = v; };
  set(hidden, &c.hidden_size), set(ffn, &c.intermediate_size), set(layers, &c.num_layers), set(heads, &c.num_heads);
  set(kv_heads, &c.num_kv_heads), set(head_dim, &c.head_dim), set(experts, &c.num_experts);
  set(top_k, &c.experts_per_token), set(max_position, &c.max_position), set(vocab, &c.vocab_size);
  if (sliding_window >= 0) c.sliding_window = sliding_window;
  if (rope_theta > 0) c.rope.theta = rope_theta;
  if (tie >= 0) c.tie_word_embeddings = tie == 1;
  if (c.arch == Architecture::kMixtral && c.num_experts == 0) c.num_experts = 8, c.experts_per_token = 2;
  if (c.arch != Architecture::kMixtral) c.num_experts = c.experts_per_token = 0;

  if (!tokenizer_dir.empty()) {
    auto tok = BpeTokenizer::Load((std::filesystem::path(tokenizer_dir) / "tokenizer.json").string());
    if (!tok.ok()) {
      std::fprintf(stderr, "--tokenizer: %s\n", std::string(tok.status().message()).c_str());
      return 2;
    }
    if (c.vocab_size == 0) c.vocab_size = (*tok)->vocab_size();
    if (c.vocab_size < (*tok)->vocab_size()) {
      std::fprintf(stderr, "--vocab %lld is smaller than the tokenizer's %d ids\n", static_cast<long long>(c.vocab_size),
                   (*tok)->vocab_size());
      return 2;
    }
    // Llama 3 and Qwen spell their BOS / EOS tokens differently; take whichever the tokenizer has.
    for (const char* bos : {"<|begin_of_text|>"}) {
      if (auto id = (*tok)->TokenId(bos)) c.bos_token_id = *id;
    }
    for (const char* eos : {"<|end_of_text|>", "<|eot_id|>", "<|endoftext|>", "<|im_end|>"}) {
      if (auto id = (*tok)->TokenId(eos)) c.eos_token_ids.push_back(*id);
    }
  }
  if (c.vocab_size == 0) {
    std::fprintf(stderr, "--vocab or --tokenizer is needed\n");
    return 2;
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    std::fprintf(stderr, "--kv-heads %lld must divide --heads %lld\n", static_cast<long long>(c.num_kv_heads),
                 static_cast<long long>(c.num_heads));
    return 2;
  }

  CheckpointSpec spec{.config = c, .seed = seed, .tokenizer_dir = tokenizer_dir, .config_format = format,
                      .shard_bytes = static_cast<uint64_t>(shard_gb * 1e9)};
  if (absl::Status s = WriteCheckpoint(spec, out); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %s, %lld layers, hidden %lld, vocab %lld, seed %llu\n", out.c_str(), ArchitectureName(c.arch),
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.vocab_size), static_cast<unsigned long long>(seed));
  return 0;
}

}  // namespace
}  // namespace tailserve

int main(int argc, char** argv) { return tailserve::Main(argc, argv); }
