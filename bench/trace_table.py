#!/usr/bin/env python3
"""Where a replayed decode step's time goes, from bench/cupti_trace.cc's trace.

Usage: trace_table.py trace.tsv [--layer] [--head N] [--ffn]
For every graph replayed at least 5 times, takes each replay's kernels in order of their end, and
charges each kernel the time from the previous kernel's end to its own (its cost to the step: a
kernel launched programmatically starts early and waits inside, so its span overstates it). Prints
the median over replays, summed by kernel name, beside the median span. Where two graph branches
run at once (the FFN halves) the kernels of one are charged time the other spent: read them as a
block. --layer also prints one layer of one replay (from the 21st RMSNorm to the 23rd), kernel by
kernel in order of start. --head N prints each graph's first N kernels: when each was submitted,
started and ended, on which channel and stream. --ffn prints, for graphs whose FFN runs as two
halves, when each half's GEMMs start and end after the norm before the FFN (medians over layers 1-30
of every replay), and how long each SwiGLU ends after its gate/up.
"""
import collections
import statistics
import sys


def short(name):
    for key, label in (("AttentionBlock", "attention block"), ("RmsNorm", "rmsnorm"), ("RopeWriteKv", "rope_kv_write"), ("AttentionMma", "attention"),
                       ("AttentionCombine", "combine"), ("SwiGlu", "swiglu"), ("splitKreduce", "cublas splitK reduce"),
                       ("Embed", "embed"), ("Sample", "sample"), ("CopyKernel", "copy"), ("Gemv", "gemv"),
                       ("StreamGemm", "stream gemm / ffn"),
                       ("nvjet", "cublas gemm"), ("gemm", "cublas gemm")):
        if key in name:
            return label
    return name[:40]


def main():
    rows = []
    with open(sys.argv[1]) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            # Traces before the extra columns (queued, submitted, channel, stream, cluster) lack them.
            extra = tuple(int(c) for c in cols[6:11]) if len(cols) >= 11 else (0, 0, 0, 0, 0)
            rows.append((int(cols[0]), int(cols[1]), int(cols[2]), int(cols[3]), int(cols[4]), cols[5]) + extra)
    by_graph = collections.defaultdict(list)
    for r in rows:
        if r[2]:
            by_graph[r[2]].append(r)
    for graph, recs in sorted(by_graph.items()):
        nodes = sorted({r[3] for r in recs})
        # Replays: each node's k-th record belongs to replay k.
        per_node = collections.defaultdict(list)
        for r in sorted(recs):
            per_node[r[3]].append(r)
        replays = min(len(v) for v in per_node.values())
        if replays < 5:
            continue
        steps, cost, span, count = [], collections.defaultdict(list), collections.defaultdict(list), collections.Counter()
        grids = {}
        for k in range(replays):
            ks = sorted((per_node[n][k] for n in nodes), key=lambda r: r[1])
            t0 = min(r[0] for r in ks)
            steps.append(ks[-1][1] - t0)
            prev_end = t0
            acc, sp = collections.Counter(), collections.Counter()
            for r in ks:
                label = short(r[5])
                acc[label] += max(0, r[1] - max(prev_end, 0))
                sp[label] += r[1] - r[0]
                prev_end = max(prev_end, r[1])
                if k == 0:
                    count[label] += 1
                    grids.setdefault(label, set()).add(r[4])
            for label in acc:
                cost[label].append(acc[label])
                span[label].append(sp[label])
        total = statistics.median(steps)
        print(f"\ngraph {graph}: {len(nodes)} kernels, {replays} replays, step (first start to last end) "
              f"median {total / 1e3:.1f} us, min {min(steps) / 1e3:.1f}")
        print("| kernel | launches | cost to the step us (median) | per launch | share | span us (median) | grids |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for label in sorted(cost, key=lambda l: -statistics.median(cost[l])):
            c = statistics.median(cost[label])
            print(f"| {label} | {count[label]} | {c / 1e3:.1f} | {c / 1e3 / count[label]:.2f} | {100 * c / total:.0f}% | "
                  f"{statistics.median(span[label]) / 1e3:.1f} | {','.join(str(g) for g in sorted(grids[label])[:4])} |")
        if "--head" in sys.argv:
            # The step's first kernels, medians over replays relative to the first kernel's start:
            # when the driver submitted each (0: unknown), when it started and ended, and where.
            head = int(sys.argv[sys.argv.index("--head") + 1])
            runs = [sorted((per_node[n][k] for n in nodes), key=lambda r: r[0]) for k in range(replays)]
            print(f"\n| kernel | grid | cluster | channel | stream | submitted us | start us | end us |\n"
                  "|---|---:|---:|---:|---:|---:|---:|---:|")
            for i, r in enumerate(runs[0][:head]):
                med = lambda col: statistics.median((k[i][col] - k[0][0]) / 1e3 if k[i][col] else 0.0 for k in runs)
                print(f"| {short(r[5])} | {r[4]} | {r[10]} | {r[8]} | {r[9]} | {med(7):.2f} | {med(0):.2f} | {med(1):.2f} |")
        if "--ffn" in sys.argv:
            ffn_phases([sorted((per_node[n][k] for n in nodes), key=lambda r: r[0]) for k in range(replays)])
        if "--layer" in sys.argv:
            ks = sorted((per_node[n][replays // 2] for n in nodes), key=lambda r: r[0])
            norms = [i for i, r in enumerate(ks) if short(r[5]) == "rmsnorm"]
            if len(norms) < 23:
                continue
            t0, prev_end = ks[0][0], ks[norms[20] - 1][1]
            print("\n| kernel | grid | start us | end us | span us | end - latest end so far us (negative: off the critical path) |\n|---|---:|---:|---:|---:|---:|")
            for r in ks[norms[20]:norms[22] + 1]:
                print(f"| {short(r[5])} | {r[4]} | {(r[0] - t0) / 1e3:.2f} | {(r[1] - t0) / 1e3:.2f} | "
                      f"{(r[1] - r[0]) / 1e3:.2f} | {(r[1] - prev_end) / 1e3:.2f} |")
                prev_end = max(prev_end, r[1])


def ffn_phases(runs):
    """The FFN halves' timeline: gate/up A and B, down A and B, relative to the norm before them."""
    phases = collections.defaultdict(list)
    for ks in runs:
        norms = [r for r in ks if short(r[5]) == "rmsnorm"]
        for layer in range(1, (len(norms) - 1) // 2 - 1):
            before, after = norms[2 * layer + 1], norms[2 * layer + 2]
            block = [r for r in ks if before[1] <= r[0] < after[0] and r is not after]
            gemms = [r for r in block if short(r[5]) == "cublas gemm"]
            swiglu = [r for r in block if short(r[5]) == "swiglu"]
            if len(gemms) != 4 or len(swiglu) != 2:
                continue
            for name, r in zip(("gate/up A", "gate/up B", "down A", "down B"), gemms):
                phases[name + " start"].append(r[0] - before[1])
                phases[name + " end"].append(r[1] - before[1])
            phases["SwiGLU A end after gate/up A"].append(swiglu[0][1] - gemms[0][1])
            phases["SwiGLU B end after gate/up B"].append(swiglu[1][1] - gemms[1][1])
            phases["FFN (norm end to last end)"].append(max(r[1] for r in block) - before[1])
    if not phases:
        return
    print("\n| FFN halves, us after the norm | median | min | max |\n|---|---:|---:|---:|")
    for name, v in phases.items():
        print(f"| {name} | {statistics.median(v) / 1e3:.2f} | {min(v) / 1e3:.2f} | {max(v) / 1e3:.2f} |")


if __name__ == "__main__":
    main()
