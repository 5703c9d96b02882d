#!/usr/bin/env python3
"""Checks a chaos run (bench/chaos.sh) against its fault-free run and prints the table.
Every request must either complete with exactly the fault-free run's tokens (seeded sampling:
no token lost, repeated or changed across re-dispatches) or fail with a documented status
(UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) within its deadline; anything else is lost.
  chaos_check.py OUT_DIR TIMEOUT_S"""
import json
import sys
from collections import Counter, defaultdict

out, timeout_s = sys.argv[1], float(sys.argv[2])
CODES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 4: "DEADLINE_EXCEEDED", 8: "RESOURCE_EXHAUSTED", 13: "INTERNAL", 14: "UNAVAILABLE"}
DOCUMENTED = {4, 8, 14}


def read(name):
    with open(f"{out}/{name}") as f:
        return [json.loads(line) for line in f]


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


base, chaos = read("base.jsonl"), read("chaos.jsonl")
faults = []
with open(f"{out}/faults.log") as f:
    for line in f:
        at, kind, worker, dur = line.split()
        faults.append((float(at), kind, int(worker), float(dur)))
assert len(base) == len(chaos), "the two runs sent different requests"
ok = failed = lost = mismatched = 0
lost_examples = []
codes = Counter()
affected = defaultdict(list)  # fault kind -> (base e2e, chaos e2e) of the requests alive during one
for b, c in zip(base, chaos):
    codes[CODES.get(c["code"], str(c["code"]))] += 1
    if b["code"] != 0:
        lost += 1  # the fault-free run must serve everything
        lost_examples.append(f"request {b['i']}: failed without faults ({CODES.get(b['code'], b['code'])})")
        continue
    if c["code"] == 0:
        if c["tokens"] == b["tokens"]:
            ok += 1
        else:
            mismatched += 1
            lost += 1
            lost_examples.append(f"request {c['i']}: {len(c['tokens'])} tokens, the fault-free run {len(b['tokens'])}")
    elif c["code"] in DOCUMENTED and c["e2e_s"] <= timeout_s + 2:
        failed += 1
    else:
        lost += 1
        lost_examples.append(f"request {c['i']}: {CODES.get(c['code'], c['code'])} after {c['e2e_s']:.1f} s")
    start, end = c["arrival_s"], c["arrival_s"] + c["e2e_s"]
    for at, kind, _, dur in faults:
        if start <= at + dur + 0.25 and at - 0.25 <= end:  # the two clocks start ~ms apart
            affected[kind].append((b["e2e_s"], c["e2e_s"], c["code"] == 0))
kinds = Counter(k for _, k, _, _ in faults)
print(f"requests {len(chaos)}; faults injected {len(faults)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
print(f"completed with the fault-free tokens {ok}; failed with a documented status {failed}; lost {lost} "
      f"(of them with different tokens {mismatched}); statuses {dict(codes)}")
for e in lost_examples[:10]:
    print("  lost:", e)
print()
print("| fault | injected | requests alive during one | of them completed | E2E P50 / P99 s, fault-free | E2E P50 / P99 s, with faults |")
print("|---|---:|---:|---:|---|---|")
for kind in sorted(kinds):
    rows = affected.get(kind, [])
    done = [r for r in rows if r[2]]
    print(f"| {kind} | {kinds[kind]} | {len(rows)} | {len(done)} | {pct([r[0] for r in done], .5):.2f} / {pct([r[0] for r in done], .99):.2f} "
          f"| {pct([r[1] for r in done], .5):.2f} / {pct([r[1] for r in done], .99):.2f} |")
print()
with open(f"{out}/memory.log") as f:
    print("memory (RSS, descriptors):")
    for line in f:
        print("  " + line.rstrip())
sys.exit(1 if lost else 0)
