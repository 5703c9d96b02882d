#!/usr/bin/env python3
"""Turns bench/ladb_traces.sh output (one JSON summary + metrics scrape per run) into the table
recorded in bench/RESULTS.md: P50/P95/P99 of TTFT, end-to-end and end-to-end per output token,
TPOT (time per output token after the first), mean E2E, SLO attainment and goodput (the load
generator's --ttft-slo-ms / --tpot-slo-ms, 1 s and 50 ms by default), throughput, and each mode's
change against the fcfs baseline (dispatch at once) at each speed."""
import glob, json, os, re, sys

out = sys.argv[1] if len(sys.argv) > 1 else "bench/out/ladb"
runs = {}
for path in sorted(glob.glob(os.path.join(out, "*_*x_*.json"))):
    trace, speed, mode = re.match(r"(\w+?)_([\d.]+)x_([\w-]+)\.json", os.path.basename(path)).groups()
    runs[(trace, speed, mode)] = json.load(open(path))

def metric(trace, speed, mode, pattern, ext="metrics"):
    """Sums a metric over the run's router (.metrics) or workers' (.wmetrics) scrape."""
    try:
        text = open(os.path.join(out, f"{trace}_{speed}x_{mode}.{ext}")).read()
    except OSError:
        return 0.0
    return sum(float(v) for v in re.findall(rf"^{pattern} (\S+)$", text, re.M))

order = lambda kv: (kv[0][0], float(kv[0][1]), kv[0][2] != "fcfs", kv[0][2])

ms = lambda s: "–" if s is None else f"{1000 * s:.0f}"  # None: no request succeeded
print("| trace | speed | mode | ok/sent | req/s | tok/s | TTFT P50 / P95 / P99 ms | TPOT P50 / P95 / P99 ms"
      " | E2E P50 / P95 / P99 ms | mean E2E ms | SLO met | goodput req/s | budget re-dispatches"
      " | preemptions | batches full / min / timeout / immediate |")
print("|---|---:|---|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|")
for (trace, speed, mode), r in sorted(runs.items(), key=order):
    q = lambda k: " / ".join(ms(r[k][p]) for p in ("p50", "p95", "p99")) if k in r else "–"
    slo = f"{100 * r['slo_attainment']:.0f}%" if "slo_attainment" in r else "–"
    goodput = f"{r['goodput_rps']:.2f}" if "goodput_rps" in r else "–"
    mean_e2e = ms(r["e2e_mean_s"]) if "e2e_mean_s" in r else "–"
    batches = " / ".join("%.0f" % metric(trace, speed, mode, 'tailserve_router_batches_total{reason="%s"}' % x)
                         for x in ("full", "min_size", "timeout", "immediate"))
    budget = metric(trace, speed, mode, 'tailserve_router_redispatches_total{reason="budget"}')
    preempted = metric(trace, speed, mode, "tailserve_worker_preemptions_total", "wmetrics")
    print(f"| {trace} | {speed}x | {mode} | {r['ok']}/{r['requests']} | {r['throughput_rps']:.2f} | "
          f"{r['output_tokens_per_s']:.0f} | {q('ttft_s')} | {q('tpot_s')} | {q('e2e_s')} | {mean_e2e} | {slo} | "
          f"{goodput} | {budget:.0f} | {preempted:.0f} | {batches} |")

print("\nAgainst the fcfs baseline at the same offered load (negative = faster than fcfs):\n")
print("| trace | speed | mode | TTFT P95 | TPOT P99 | E2E P95 | E2E P99 | mean E2E |\n|---|---:|---|---:|---:|---:|---:|---:|")
for (trace, speed, mode), r in sorted(runs.items(), key=order):
    if mode == "fcfs" or (trace, speed, "fcfs") not in runs:
        continue
    f = runs[(trace, speed, "fcfs")]
    d = lambda k, p: f"{100 * (r[k][p] / f[k][p] - 1):+.0f}%" if k in r and k in f else "–"
    mean = f"{100 * (r['e2e_mean_s'] / f['e2e_mean_s'] - 1):+.0f}%" if "e2e_mean_s" in r and "e2e_mean_s" in f else "–"
    print(f"| {trace} | {speed}x | {mode} | {d('ttft_s', 'p95')} | {d('tpot_s', 'p99')} | {d('e2e_s', 'p95')} | "
          f"{d('e2e_s', 'p99')} | {mean} |")
