#!/usr/bin/env python3
"""Writes the ids HuggingFace `tokenizers` gives for a set of texts with a tokenizer.json, in
../shared/reference/tokenizer's format ({"cases": [{"text", "ids", "decoded"}]}, plus "prompt_ids":
with add_special_tokens, as a prompt is encoded), for tailserve's tokenizer to be tested against:
hand-written edge cases plus held-out corpus documents.

    tools/lm/tokenizer_cases.py --tokenizer DIR --heldout heldout.txt --out cases.json [--docs 60]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_train import DOC_SEPARATOR  # noqa: E402

EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n\n", "\t tab", "Hello, world!", "It's 12:30 -- isn't it?", "12345678901",
    "naïve café Straße", "日本語のテキスト", "emoji 🙂🙃 and flags 🇫🇷", "<|end_of_text|> in text",
    "trailing spaces   ", "   leading spaces", "mixed\r\nline\rendings", "x" * 300, "don't WON'T I'M",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", type=int, default=60)
    args = ap.parse_args()
    from tokenizers import Tokenizer
    import tokenizers
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    with open(args.heldout, encoding="utf-8") as f:
        docs = [d for d in f.read().split(DOC_SEPARATOR) if d.strip()]
    step = max(1, len(docs) // args.docs)
    texts = EDGE_CASES + [d[:2000] for d in docs[::step][:args.docs]]
    cases = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "prompt_ids": tok.encode(t, add_special_tokens=True).ids})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "tokenizer.json", "produced_by": f"HuggingFace tokenizers {tokenizers.__version__}", "cases": cases}, f, ensure_ascii=False)
    print(f"{len(cases)} texts -> {args.out}")


if __name__ == "__main__":
    main()
