#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer on a text corpus and writes it as a HuggingFace tokenizer.json.

The pre-tokenizer is Llama 3's (its regex split, then ByteLevel without a prefix space) and the
decoder ByteLevel, so transformers, tokenizers.js and tailserve's own tokenizer all read the file.
Training is the classic algorithm: count the corpus's pre-tokenized pieces once, then repeatedly
merge the most frequent adjacent pair, updating only the counts of the pieces that hold it.

    tools/lm/bpe_train.py --corpus train.txt --vocab-size 8192 --out DIR
"""
import argparse
import collections
import heapq
import json
import os
import sys

import regex

# Llama 3's split (tokenizer.json's pre_tokenizer Split pattern).
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Marks document boundaries in the corpus files (tools/lm/corpus.py writes it between documents).
DOC_SEPARATOR = "\n\x1e\n"


def bytes_to_unicode():
    """GPT-2's map of the 256 byte values to printable characters (ByteLevel's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def piece_counts(paths, max_bytes):
    """Frequencies of the corpus's pre-tokenized pieces, each as its ByteLevel string."""
    byte_char = bytes_to_unicode()
    split = regex.compile(SPLIT)
    counts = collections.Counter()
    read = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for doc in f.read().split(DOC_SEPARATOR):
                if max_bytes and read >= max_bytes:
                    return counts
                read += len(doc)
                counts.update(split.findall(doc))
    return collections.Counter({"".join(byte_char[b] for b in p.encode("utf-8")): c for p, c in counts.items()})


def train(counts, merges_wanted):
    """Returns the merges (pairs of token strings) in rank order."""
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[a, b] += freq[i]
            where[a, b].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < merges_wanted and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg:
            if pair_count.get(pair, 0) > 0:
                heapq.heappush(heap, (-pair_count[pair], pair))
            continue
        if -neg < 2:
            break  # nothing left that occurs twice
        merges.append(pair)
        a, b = pair
        merged = a + b
        touched = collections.Counter()
        for i in where.pop(pair):
            w, f = words[i], freq[i]
            j = 0
            out = []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            if len(out) == len(w):
                continue
            for x, y in zip(w, w[1:]):
                pair_count[x, y] -= f
                touched[x, y] += 0
            for x, y in zip(out, out[1:]):
                pair_count[x, y] += f
                where[x, y].add(i)
                touched[x, y] += 0
            words[i] = out
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
    return merges


def post_processor(bos_id):
    """Llama 3's: BOS before every input (HuggingFace encode with add_special_tokens), as trained."""
    bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
    return {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {BOS: {"id": BOS, "ids": [bos_id], "tokens": [BOS]}}}]}


def tokenizer_json(merges):
    byte_char = bytes_to_unicode()
    vocab = {byte_char[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    specials = [{"id": len(vocab) + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for k, s in enumerate((BOS, EOS))]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": post_processor(len(vocab)),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


# tiny-en is a base model: its chat template lays a conversation out as a plain transcript
# ("User: ...", blank line, "Assistant:"), which the OpenAI chat endpoint renders.
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['role'] | capitalize }}: "
                 "{{ message['content'] | trim }}\n\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


def tokenizer_config(vocab_size):
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(vocab_size - 2): {"content": BOS, "special": True},
                                 str(vocab_size - 1): {"content": EOS, "special": True}},
        "chat_template": CHAT_TEMPLATE,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", nargs="+", required=True, help="UTF-8 text files, documents separated by \\n\\x1e\\n")
    ap.add_argument("--vocab-size", type=int, default=8192, help="256 bytes + merges + 2 special tokens")
    ap.add_argument("--max-bytes", type=int, default=0, help="train on at most this many characters (0: all)")
    ap.add_argument("--out", required=True, help="directory for tokenizer.json and tokenizer_config.json")
    args = ap.parse_args()
    if args.vocab_size < 258 + 1:
        sys.exit("--vocab-size: must be at least 259 (256 bytes, one merge, 2 special tokens)")
    counts = piece_counts(args.corpus, args.max_bytes)
    merges = train(counts, args.vocab_size - 256 - 2)
    tok = tokenizer_json(merges)
    size = len(tok["model"]["vocab"]) + 2
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(size), f, indent=1)
    print(f"{len(counts)} distinct pieces, {len(merges)} merges, vocabulary {size} -> {args.out}")


if __name__ == "__main__":
    main()
