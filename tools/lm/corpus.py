#!/usr/bin/env python3
"""Turns tools/lm/corpus/build.sh's prose files (one paragraph a line) into training documents:
runs of 1 to MAX consecutive paragraphs of one source (so the model sees texts of many lengths
end), sources capped in size so no single style dominates, 4% of documents held out (chosen by
a hash of their text, so the split does not move when sources are added). Writes train.txt and
heldout.txt (documents separated by "\\n\\x1e\\n") and a copy of SOURCES.tsv.

    tools/lm/corpus.py --prose WORK/prose --out DIR
"""
import argparse
import hashlib
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_train import DOC_SEPARATOR  # noqa: E402

# MB of paragraphs taken from a source (from its start; others whole), and the most paragraphs a
# document joins (verses and glosses are short).
CAP_MB = {"comm-tdavid": 3.0, "comm-mhcc": 2.0, "wordnet": 4.0}
MAX_PARAGRAPHS = {"bible-web": 6, "wordnet": 1, "fortunes": 1}


def documents(name, path, rng):
    cap = CAP_MB.get(name, 1e9) * 1e6
    with open(path, encoding="utf-8") as f:
        paras = []
        size = 0
        for line in f:
            line = line.strip()
            if not line:
                continue
            paras.append(line)
            size += len(line)
            if size >= cap:
                break
    most = MAX_PARAGRAPHS.get(name, 3)
    i = 0
    while i < len(paras):
        n = rng.randint(1, most)
        yield "\n\n".join(paras[i:i + n])
        i += n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prose", required=True, help="directory of <source>.txt from tools/lm/corpus/build.sh")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout-percent", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    train, held = [], []
    for name in sorted(f[:-4] for f in os.listdir(args.prose) if f.endswith(".txt")):
        for doc in documents(name, os.path.join(args.prose, name + ".txt"), rng):
            h = int(hashlib.sha256(doc.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF * 100
            (held if h < args.heldout_percent else train).append(doc)
    rng.shuffle(train)
    rng.shuffle(held)
    os.makedirs(args.out, exist_ok=True)
    for name, docs in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(DOC_SEPARATOR.join(docs))
    sources = os.path.join(os.path.dirname(os.path.abspath(args.prose)), "SOURCES.tsv")
    if os.path.exists(sources):
        shutil.copy(sources, os.path.join(args.out, "SOURCES.tsv"))
    mb = lambda docs: sum(len(d) for d in docs) / 1e6
    print(f"train {len(train):,} documents ({mb(train):.1f} MB), held-out {len(held):,} ({mb(held):.1f} MB) -> {args.out}")


if __name__ == "__main__":
    main()
