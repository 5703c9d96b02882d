#!/usr/bin/env python3
"""bench/prefix_traces.sh's cache table: per run, the workers' prefix-cache hit rate (cached prompt
tokens over all admitted) beside the oracle's (one infinite cache that sees every request of the
window in arrival order, whole blocks of 16 tokens, the last prompt token always computed) and the
busiest worker's finished sequences over the mean.

    bench/prefix_table.py OUT TRACE FROM_S WINDOW_S MAX_PROMPT
"""
import glob
import json
import os
import re
import sys


def oracle(trace, from_s, window_s, max_prompt):
    seen, hit, total = set(), 0, 0
    first = None
    with open(trace) as f:
        for line in f:
            row = json.loads(line)
            t = row["timestamp"] / 1000.0
            first = t if first is None else first
            if t - first < from_s:
                continue
            if t - first >= from_s + window_s:
                break
            prompt = max(1, min(row["input_length"], max_prompt))
            blocks = 0
            for h in row["hash_ids"]:
                if h not in seen:
                    break
                blocks += 1
            hit += min(blocks * 512, (prompt - 1) // 16 * 16)
            total += prompt
            seen.update(row["hash_ids"])
    return hit / total if total else 0.0


def worker_metrics(path):
    per_worker, cur = [], None
    for line in open(path):
        if line.startswith("# worker"):
            cur = {}
            per_worker.append(cur)
            continue
        m = re.match(r'^(tailserve_worker_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$', line.strip())
        if m and cur is not None:
            key = m.group(1) + (m.group(2) or "")
            cur[key] = cur.get(key, 0.0) + float(m.group(3))
    return per_worker


def main():
    out, trace, from_s, window_s, max_prompt = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    best = oracle(trace, from_s, window_s, max_prompt)
    print("| speed | arm | hit rate | oracle hit rate | of the oracle | busiest worker / mean (sequences) | evictions |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for path in sorted(glob.glob(os.path.join(out, "*.wmetrics"))):
        run = os.path.basename(path)[:-len(".wmetrics")]
        speed, arm = run.split("_")[1], run.split("_", 2)[2]
        ws = worker_metrics(path)
        q = sum(w.get("tailserve_worker_prefix_cache_queried_tokens_total", 0) for w in ws)
        h = sum(w.get("tailserve_worker_prefix_cache_hit_tokens_total", 0) for w in ws)
        seqs = [sum(v for k, v in w.items() if k.startswith("tailserve_worker_sequences_total")) for w in ws]
        ev = sum(w.get("tailserve_worker_kv_evictions_total", 0) for w in ws)
        rate = h / q if q else 0.0
        skew = max(seqs) / (sum(seqs) / len(seqs)) if seqs and sum(seqs) else 0.0
        print(f"| {speed} | {arm} | {100 * rate:.1f}% | {100 * best:.1f}% | {100 * rate / best if best else 0:.0f}% | "
              f"{skew:.2f} | {ev:.0f} |")


if __name__ == "__main__":
    main()
