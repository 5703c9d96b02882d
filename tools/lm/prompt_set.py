#!/usr/bin/env python3
"""Writes the default model's evaluation prompt set: the openings of held-out documents (the model
never trained on them), each cut after a few words and sent with a sampling temperature, as JSON
lines tailserve-load --prompts reads ({"prompt", "max_tokens", "temperature"}). How long the model
runs on before it ends the document (EOS) depends on what was cut and on the temperature: that is
the output-length behaviour the router's length predictor learns (bench/default_model_lengths.sh).

    tools/lm/prompt_set.py --heldout heldout.txt --out prompts.jsonl [--n 600] [--seed 0]
"""
import argparse
import json
import random

DOC_SEPARATOR = "\n\x1e\n"  # tools/lm/corpus.py


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heldout", required=True, help="held-out documents (tools/lm/corpus.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with open(args.heldout, encoding="utf-8") as f:
        docs = [d.strip() for d in f.read().split(DOC_SEPARATOR) if len(d.split()) >= 6]
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as out:
        for doc in rng.sample(docs, args.n):
            words = doc.split(" ")
            cut = min(rng.choice([3, 6, 12, 24, 48]), len(words) - 2)
            row = {"prompt": " ".join(words[:cut]), "max_tokens": args.max_tokens,
                   "temperature": rng.choice([0.0, 0.7, 1.0])}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{args.n} prompts from {len(docs)} held-out documents -> {args.out}")


if __name__ == "__main__":
    main()
