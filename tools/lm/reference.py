#!/usr/bin/env python3
"""Writes what a model computes for a checkpoint, in ../shared/reference's format: expected.json
(cases of prompt_ids, greedy_ids, top1_margin and the name of their logits tensor) and
expected_logits.safetensors ([prompt + continuation, vocab] float32 logits of each case, the whole
sequence fed at once). fp32 maths over the bf16 weights. With transformers installed (the device
machine) it is transformers' LlamaForCausalLM; without it, tools/lm/model.py, and expected.json
says which.

    tools/lm/reference.py --checkpoint DIR [--out DIR] [--continuation 24]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
from bpe_encode import Encoder  # noqa: E402

PROMPTS = ["The history of the", "To install the package, run", "Once upon a time there was", "Q: What is a file?\nA:"]


def load_model(ckpt):
    try:
        from transformers import AutoModelForCausalLM
        import transformers
        # Loaded as bf16 and then widened, as ../shared/reference was made: fp32 maths over the bf16
        # weights, with the RoPE frequencies rounded as a bf16 model holds them.
        m = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).float()
        # The model was trained with bf16-rounded RoPE frequencies (tools/lm/model.py), which is
        # what a bf16 model cast with .to(bfloat16) holds and what tailserve serves a bf16
        # checkpoint with (../shared/reference was made that way); from_pretrained keeps them in
        # fp32 (transformers 5.17), 5e-4 away in the logits. Use the trained ones.
        rope = m.model.rotary_emb
        rope.inv_freq = rope.inv_freq.to(torch.bfloat16).float()
        if hasattr(rope, "original_inv_freq"):
            rope.original_inv_freq = rope.inv_freq
        return (lambda ids: m(torch.tensor([ids])).logits[0]), f"transformers {transformers.__version__}"
    except ImportError:
        from model import LlamaForCausalLM, LlamaShape
        with open(os.path.join(ckpt, "config.json")) as f:
            c = json.load(f)
        c.setdefault("rope_theta", c.get("rope_parameters", {}).get("rope_theta", 10000.0))
        fields = LlamaShape.__dataclass_fields__
        m = LlamaForCausalLM(LlamaShape(**{k: v for k, v in c.items() if k in fields}))
        sd = {k: v.float() for k, v in safetensors_io.load(os.path.join(ckpt, "model.safetensors")).items()}
        if m.shape.tie_word_embeddings:
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        m.load_state_dict(sd)
        m.eval()
        return (lambda ids: m(torch.tensor([ids]))[0]), "tools/lm/model.py (transformers not installed)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", help="default: the checkpoint's reference/ folder")
    ap.add_argument("--continuation", type=int, default=24)
    args = ap.parse_args()
    out = args.out or os.path.join(args.checkpoint, "reference")
    os.makedirs(out, exist_ok=True)
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    forward, by = load_model(args.checkpoint)
    enc = Encoder(os.path.join(args.checkpoint, "tokenizer.json"))
    with open(os.path.join(args.checkpoint, "config.json")) as f:
        bos = json.load(f)["bos_token_id"]
    cases, tensors = [], {}
    for k, text in enumerate(PROMPTS):
        prompt = [bos] + enc.encode(text)
        ids = list(prompt)
        for _ in range(args.continuation):
            ids.append(int(forward(ids)[-1].argmax()))
        logits = forward(ids).float()
        top2 = logits.topk(2, dim=-1).values
        name = f"case{k}"
        tensors[name] = logits.contiguous()
        cases.append({"prompt": text, "prompt_ids": prompt, "greedy_ids": ids[len(prompt):],
                      "top1_margin": (top2[:, 0] - top2[:, 1]).tolist(), "logits_tensor": name})
    safetensors_io.save(tensors, os.path.join(out, "expected_logits.safetensors"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"computed_by": by, "cases": cases}, f)
    print(f"{len(cases)} cases by {by} -> {out}")


if __name__ == "__main__":
    main()
