#!/usr/bin/env python3
"""Trains a small Llama-architecture model from scratch on a document corpus and writes a
HuggingFace checkpoint (config.json, generation_config.json, bf16 model.safetensors, tokenizer
files) with its held-out loss and perplexity beside unigram and bigram baselines on the same split.
Half the held-out documents choose the kept step (lowest validation loss); the other half is
what the perplexity is reported on.

Every document is [BOS] + tokens + [EOS], so the model learns to end. Training fits a wall-clock
budget (--max-seconds): the first steps measure the step time, and the schedule (warm-up, cosine
decay) is laid over the steps that fit.

    tools/lm/train.py --corpus DIR --tokenizer DIR --out DIR [--max-seconds 420]
(DIR of train.txt and heldout.txt, as tools/lm/corpus.py writes them.)
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_train import BOS, DOC_SEPARATOR, EOS  # noqa: E402
from model import LlamaForCausalLM, LlamaShape  # noqa: E402
import safetensors_io  # noqa: E402


SAMPLE_PROMPTS = ["The history of", "To install the package, run", "A good program", "In the morning, she",
                  "The most important thing about"]


def load_tokenizer(tok_dir):
    """encode(list of str) -> list of id lists; the Rust `tokenizers` when present, else ours."""
    path = os.path.join(tok_dir, "tokenizer.json")
    try:
        from tokenizers import Tokenizer
        t = Tokenizer.from_file(path)
        return lambda docs: [e.ids for e in t.encode_batch(docs, add_special_tokens=False)]
    except ImportError:
        from bpe_encode import Encoder
        e = Encoder(path)
        return lambda docs: [e.encode(d) for d in docs]


def token_stream(path, encode, bos, eos):
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split(DOC_SEPARATOR) if d.strip()]
    ids = []
    for doc in encode(docs):
        ids.append(bos)
        ids.extend(doc)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32), len(docs)


def ngram_baselines(train, held, vocab):
    """Cross-entropy (nats a token) of a unigram and an interpolated bigram model on `held`; the
    bigram's weight is chosen on the last 2% of `train`, which is left out of the counts."""
    cut = int(len(train) * 0.98)
    fit, tune = train[:cut].long(), train[cut:].long()
    uni = torch.bincount(fit, minlength=vocab).double() + 0.1
    uni /= uni.sum()
    pairs = fit[:-1] * vocab + fit[1:]
    big = torch.bincount(pairs, minlength=vocab * vocab).double().view(vocab, vocab)
    row = big.sum(1, keepdim=True)

    def ce_bigram(s, lam):
        prev, nxt = s[:-1], s[1:]
        pb = torch.where(row[prev, 0] > 0, big[prev, nxt] / row[prev, 0].clamp(min=1), torch.zeros(()).double())
        return -(lam * pb + (1 - lam) * uni[nxt]).log().mean().item()

    lam = min((0.5, 0.7, 0.8, 0.9, 0.95), key=lambda l: ce_bigram(tune, l))
    h = held.long()
    return -uni[h].log().mean().item(), ce_bigram(h, lam), lam


@torch.no_grad()
def evaluate(model, held, seq, device, max_tokens):
    model.eval()
    n = min(len(held), max_tokens) // (seq + 1) * (seq + 1)
    windows = held[:n].long().view(-1, seq + 1)
    total, count = 0.0, 0
    for i in range(0, len(windows), 16):
        w = windows[i:i + 16].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(w[:, :-1])
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train()
    return total / max(count, 1)


@torch.no_grad()
def generate(model, prompt_ids, n, device, eos, temperature=0.0, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt_ids)
    model.eval()
    for _ in range(n):
        x = torch.tensor([ids[-model.shape.max_position_embeddings:]], device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)[0, -1].float().cpu()
        nxt = int(logits.argmax()) if temperature == 0 else int(torch.multinomial((logits / temperature).softmax(-1), 1, generator=g))
        ids.append(nxt)
        if nxt == eos:
            break
    model.train()
    return ids[len(prompt_ids):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="directory with train.txt and heldout.txt")
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=420, help="training wall-clock budget")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--eval-tokens", type=int, default=2_000_000, help="held-out (test half) tokens reported")
    ap.add_argument("--valid-tokens", type=int, default=200_000, help="validation tokens at each evaluation")
    ap.add_argument("--eval-every", type=int, default=500, help="steps between validation evaluations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with open(os.path.join(args.tokenizer, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    bos, eos = special[BOS], special[EOS]
    vocab = max(max(tok["model"]["vocab"].values()), *special.values()) + 1
    t0 = time.time()
    encode = load_tokenizer(args.tokenizer)
    train, n_train = token_stream(os.path.join(args.corpus, "train.txt"), encode, bos, eos)
    held, n_held = token_stream(os.path.join(args.corpus, "heldout.txt"), encode, bos, eos)
    print(f"tokenized in {time.time() - t0:.0f} s: train {len(train):,} tokens ({n_train:,} documents), "
          f"held-out {len(held):,} ({n_held:,})", flush=True)

    shape = LlamaShape(vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, intermediate_size=args.ffn)
    model = LlamaForCausalLM(shape).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f} M parameters, {shape}", flush=True)
    step_model = torch.compile(model) if args.compile else model
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), **({"fused": True} if device.type == "cuda" else {}))
    # The held-out documents split in two: the first half picks the checkpoint (the step with the
    # lowest loss on it, evaluated every --eval-every steps), the second half is reported.
    valid, test = held[:len(held) // 2], held[len(held) // 2:]
    best = (float("inf"), 0, None)
    g = torch.Generator().manual_seed(args.seed)
    warmup, total_steps, step = 100, None, 0
    start = time.time()
    log = []
    while total_steps is None or step < total_steps:
        idx = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=g)
        batch = torch.stack([train[i:i + args.seq + 1] for i in idx]).long().to(device, non_blocking=True)
        lr = args.lr * min(1.0, (step + 1) / warmup)
        if total_steps:
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total_steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = step_model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step in (10, 40) and device.type == "cuda":
            torch.cuda.synchronize()
        if step == 10:  # the first steps pay for start-up (allocator, kernel selection): not timed
            t10 = time.time()
        if step == 40:  # the step time is known: lay the schedule over what fits the budget
            per_step = (time.time() - t10) / 30
            left = args.max_seconds - (time.time() - start)
            total_steps = max(step + 1, step + int(0.95 * left / per_step))  # 5% for the evaluations
            print(f"{per_step * 1000:.0f} ms a step: {total_steps} steps, "
                  f"{total_steps * args.batch * args.seq / 1e6:.0f} M tokens", flush=True)
        if step % args.eval_every == 0 or step == total_steps:
            v = evaluate(model, valid, args.seq, device, args.valid_tokens)
            if v < best[0]:
                best = (v, step, {k: t.detach().clone().cpu() for k, t in model.state_dict().items()})
            log.append({"step": step, "loss": round(loss.item(), 4), "valid_loss": round(v, 4), "lr": lr,
                        "s": round(time.time() - start, 1)})
            print(log[-1], flush=True)
    train_s = time.time() - start
    model.load_state_dict(best[2])
    print(f"kept step {best[1]} (validation loss {best[0]:.4f})", flush=True)

    held_ce = evaluate(model, test, args.seq, device, args.eval_tokens)
    uni_ce, bi_ce, lam = ngram_baselines(train, test[:args.eval_tokens], vocab)
    results = {
        "parameters": params, "train_tokens": len(train), "heldout_tokens": min(len(test), args.eval_tokens),
        "validation_tokens": min(len(valid), args.valid_tokens), "kept_step": best[1],
        "tokens_seen": step * args.batch * args.seq, "steps": step, "train_seconds": round(train_s, 1),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "heldout_loss": held_ce, "heldout_perplexity": math.exp(held_ce),
        "unigram_perplexity": math.exp(uni_ce), "bigram_perplexity": math.exp(bi_ce), "bigram_lambda": lam,
        "log": log,
    }
    print(f"held-out perplexity {math.exp(held_ce):.1f} (loss {held_ce:.3f}); unigram {math.exp(uni_ce):.1f}, "
          f"bigram {math.exp(bi_ce):.1f}", flush=True)

    from bpe_encode import Encoder
    codec = Encoder(os.path.join(args.tokenizer, "tokenizer.json"))
    results["samples"] = []
    for k, prompt in enumerate(SAMPLE_PROMPTS):
        ids = [bos] + codec.encode(prompt)
        for temperature in (0.0, 0.8):
            out = generate(model, ids, 64, device, eos, temperature, seed=k)
            text = codec.decode([i for i in out if i != eos])
            results["samples"].append({"prompt": prompt, "temperature": temperature, "tokens": len(out),
                                       "ended": bool(out) and out[-1] == eos, "text": text})
            print(f"[{temperature}] {prompt!r} -> {text!r}{' <EOS>' if out and out[-1] == eos else ''}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    sd = {k: v.to(torch.bfloat16) for k, v in model.hf_state_dict().items()}
    safetensors_io.save(sd, os.path.join(args.out, "model.safetensors"), {"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(shape.hf_config(bos, eos), f, indent=1)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos, "do_sample": True, "temperature": 0.8, "top_p": 0.95}, f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
