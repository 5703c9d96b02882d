#!/usr/bin/env python3
"""The issue's H200 decode targets carried over to another GPU, from one call's output on it.

Usage: target_carry.py DIR   (DIR holds ceilings.md from `bash bench/gpu_run.sh kernels --ceilings`
and bench_8b.md from `bash bench/gpu_run.sh bench8b`, both run on the same card in one call)

Two carries, both printed: (A) the same fraction of the card's copy roofline (the target scaled by
its copy bandwidth against the H200's 4.26 TB/s), and (B) the same µs over a pure read of the
step's bytes (the H200 target plus the difference of the two cards' pure reads). (A) is lenient
when the step's overhead is latency, the same µs on both cards, as the H100 and H200
traces found; (B) keeps that overhead. A pure read is 32 layers of q/k/v + o + FFN and the LM head
at the read times in ceilings.md, plus the rest of the step's bytes (mostly KV) at the FFN's rate.
"""
import re
import sys

H200_COPY_TBS = 4.26
# The H200's read of each op's bytes (`kernels --ceilings`, bench/RESULTS.md).
H200_READ_US = {'o': 10.1, 'q/k/v': 12.7, 'FFN (gate/up + down)': 78.7, 'LM head': 232.0}
H200_FFN_TBS = 4.48
TARGETS_MS = {1: 3.9, 16: 4.4, 64: 5.5}  # 8B shape, 512 tokens of context (issue 5)
LAYERS = 32
LAYER_OPS = ('o', 'q/k/v', 'FFN (gate/up + down)')


def pure_read_ms(read_us, rest_gb, rest_tbs):
    """A step's bytes read at a card's pure-read times, the bytes outside the weights at rest_tbs."""
    return (LAYERS * sum(read_us[k] for k in LAYER_OPS) + read_us['LM head']) / 1e3 + rest_gb / rest_tbs


def main(d):
    ceil = open(f'{d}/ceilings.md').read()
    copy_tbs = float(re.search(r'([\d.]+) TB/s read \+ written', ceil).group(1))
    reads = {}  # name -> (MB, µs, TB/s)
    for m in re.finditer(r'^\| ([^|]+?) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|', ceil, re.M):
        reads[m.group(1)] = tuple(float(m.group(i)) for i in (2, 3, 4))
    steps = {}  # batch -> (P50 ms, bytes GB)
    for m in re.finditer(r'^\| (\d+) \| 512 \| ([\d.]+) \| [\d.]+ \| \d+ \| ([\d.]+) \|', open(f'{d}/bench_8b.md').read(),
                         re.M):
        steps[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    layer_mb = sum(reads[k][0] for k in LAYER_OPS)
    read_us = {k: v[1] for k, v in reads.items()}
    print(f'copy {copy_tbs:.2f} TB/s (H200 {H200_COPY_TBS}); FFN read {reads["FFN (gate/up + down)"][2]:.2f} TB/s '
          f'(H200 {H200_FFN_TBS})\n')
    print('| batch | bytes GB | H200 target ms | pure read H200 / here ms | (A) ms | (B) ms | measured here ms |\n'
          '|---:|---:|---:|---:|---:|---:|---:|')
    for batch, target in TARGETS_MS.items():
        if batch not in steps:
            continue
        p50, gb = steps[batch]
        rest_gb = max(0.0, gb - (LAYERS * layer_mb + reads['LM head'][0]) / 1e3)
        pure_h200 = pure_read_ms(H200_READ_US, rest_gb, H200_FFN_TBS)
        pure_here = pure_read_ms(read_us, rest_gb, reads['FFN (gate/up + down)'][2])
        carry_a = target * H200_COPY_TBS / copy_tbs
        carry_b = target + pure_here - pure_h200
        ok = 'meets' if p50 <= carry_b else 'misses'
        print(f'| {batch} | {gb:.2f} | {target} | {pure_h200:.3f} / {pure_here:.3f} | {carry_a:.3f} | {carry_b:.3f} | '
              f'{p50:.3f} ({ok} B) |')


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else '.')
