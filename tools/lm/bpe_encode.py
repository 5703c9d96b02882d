"""Encodes text with a byte-level BPE tokenizer.json (the kind tools/lm/bpe_train.py writes): the
reference encoder of the training pipeline, used where the `tokenizers` package is missing. Same
ids as HuggingFace tokenizers for such a file: pre-tokenize with its Split regex, map bytes to
ByteLevel characters, apply merges by rank within each piece."""
import json

import regex

from bpe_train import bytes_to_unicode


class Encoder:
    def __init__(self, tokenizer_json_path):
        with open(tokenizer_json_path, encoding="utf-8") as f:
            tok = json.load(f)
        model = tok["model"]
        if model.get("type") != "BPE" or model.get("ignore_merges"):
            raise ValueError(f"{tokenizer_json_path}: model: only BPE without ignore_merges is supported")
        steps = tok["pre_tokenizer"]["pretokenizers"]
        self.split = regex.compile(steps[0]["pattern"]["Regex"])
        self.vocab = model["vocab"]
        self.ranks = {tuple(m.split(" ")) if isinstance(m, str) else tuple(m): r for r, m in enumerate(model["merges"])}
        self.special = {t["content"]: t["id"] for t in tok["added_tokens"]}
        self.byte_char = bytes_to_unicode()
        self.char_byte = {c: b for b, c in self.byte_char.items()}
        self.token = {i: t for t, i in self.vocab.items()}
        self.token.update({i: t for t, i in self.special.items()})
        self.cache = {}

    def _piece(self, piece):
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        word = [self.byte_char[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best = min(range(len(word) - 1), key=lambda i: self.ranks.get((word[i], word[i + 1]), 1 << 30))
            if (word[best], word[best + 1]) not in self.ranks:
                break
            word[best:best + 2] = [word[best] + word[best + 1]]
        ids = [self.vocab[w] for w in word]
        if len(self.cache) < 1_000_000:
            self.cache[piece] = ids
        return ids

    def encode(self, text):
        """Token ids of `text` (no special tokens added; none recognised inside it)."""
        out = []
        for piece in self.split.findall(text):
            out.extend(self._piece(piece))
        return out

    def decode(self, ids):
        """Text of `ids` (special tokens as their text; invalid UTF-8 replaced)."""
        out = bytearray()
        for i in ids:
            t = self.token[i]
            out += t.encode("utf-8") if t in self.special else bytes(self.char_byte[c] for c in t)
        return out.decode("utf-8", errors="replace")
