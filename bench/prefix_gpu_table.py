#!/usr/bin/env python3
"""Table of bench/gpu_prefix.sh (or bench/prefix_gpu_sim.sh): per arm, the load's summary and the
worker's counters, then what the cache saved. Usage: prefix_gpu_table.py DIR ARM...

The cached share is the worker's (hit / queried prompt tokens): the client hangs up at each
answer's planned length, so no usage comes back. A hit token saves what the worker's own step-cost
fit (tailserve_worker_step_cost_seconds, learned online over the run's steps) charges a prefill
token; the steps' total time is printed beside it, but it also moves with how decodes batch."""
import json
import sys


def metrics(path):
    m = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            m[name] = float(value)
        except ValueError:
            pass
    return m


def ms(q):
    return " / ".join(f"{1000 * q[p]:.0f}" if q.get(p) is not None else "–" for p in ("p50", "p95", "p99"))


def main():
    out, arms = sys.argv[1], sys.argv[2:]
    rows = {}
    print("| arm | ok/sent | cached (worker) | unbounded cache | TTFT P50 / P95 / P99 ms | E2E P50 / P95 / P99 ms "
          "| req/s | prefill tokens | hit tokens | step seconds | fitted ms / prefill token |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for arm in arms:
        try:
            r = json.load(open(f"{out}/{arm}.json"))
            w = metrics(f"{out}/{arm}.wmetrics")
        except (OSError, ValueError) as e:
            print(f"| {arm} | no result: {e} |")
            continue
        rows[arm] = (r, w)
        fit = w.get('tailserve_worker_step_cost_seconds{term="per_prefill_token"}')
        fit_ms = f"{1000 * fit:.4f}" if fit is not None else "–"
        print(f"| {arm} | {r['ok']}/{r['requests']} | {100 * w.get('tailserve_worker_prefix_cache_hit_tokens_total', 0) / max(1, w.get('tailserve_worker_prefix_cache_queried_tokens_total', 0)):.1f}% | "
              f"{100 * r['oracle_cached_tokens'] / max(1, r['oracle_prompt_tokens']):.1f}% | {ms(r['ttft_s'])} | "
              f"{ms(r['e2e_s'])} | {r['throughput_rps']:.2f} | {w.get('tailserve_worker_prefill_tokens_total', 0):.0f} | "
              f"{w.get('tailserve_worker_prefix_cache_hit_tokens_total', 0):.0f} | "
              f"{w.get('tailserve_worker_step_time_seconds_sum', 0):.2f} | "
              f"{fit_ms} |")
    if "nocache" in rows and "cache" in rows:
        (r0, w0), (r1, w1) = rows["nocache"], rows["cache"]
        fit = w0.get('tailserve_worker_step_cost_seconds{term="per_prefill_token"}')
        hits = w1.get("tailserve_worker_prefix_cache_hit_tokens_total", 0)
        t0 = w0.get("tailserve_worker_step_time_seconds_sum", 0)
        t1 = w1.get("tailserve_worker_step_time_seconds_sum", 0)
        print()
        if fit is not None:
            print(f"Prefill time saved: {hits:.0f} hit tokens x {1000 * fit:.4f} ms (the cache-off worker's fitted cost "
                  f"of a prefill token) = {hits * fit:.2f} s; the steps took {t0:.2f} s without the cache, {t1:.2f} s with it.")
        for p in ("p50", "p95", "p99"):
            a, b = r0["ttft_s"].get(p), r1["ttft_s"].get(p)
            if a and b:
                print(f"TTFT {p.upper()}: {1000 * a:.0f} ms without the cache, {1000 * b:.0f} ms with it ({b / a:.2f}x).")


if __name__ == "__main__":
    main()
