#!/usr/bin/env bash
# deploy/: the Prometheus rule file passes promtool check + its unit tests, every YAML lints, the
# Grafana dashboard is valid JSON whose queries only use metrics tailserve exports.
# Usage: deploy_test.sh SOURCE_DIR
set -euo pipefail
SRC=$1
cd "$SRC/deploy/prometheus"
promtool check rules tailserve-rules.yml
promtool test rules tailserve-rules.test.yml
yamllint -c "$SRC/.yamllint" "$SRC/deploy"
python3 - "$SRC" <<'PY'
import json, re, sys, pathlib
src = pathlib.Path(sys.argv[1])
exported = set()
for f in ["router/router_metrics.cc", "worker/worker_metrics.cc"]:
    exported |= set(re.findall(r'"(tailserve_[a-z0-9_]+)"', (src / f).read_text()))
dash = json.loads((src / "deploy/grafana/tailserve-dashboard.json").read_text())
bad = []
for panel in dash["panels"]:
    for t in panel["targets"]:
        for m in re.findall(r"tailserve_[a-z0-9_]+", t["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            if m not in exported and base not in exported:
                bad.append((panel["title"], m))
rules = (src / "deploy/prometheus/tailserve-rules.yml").read_text()
for m in set(re.findall(r"\btailserve_[a-z0-9_]+", rules)):
    base = re.sub(r"_(bucket|sum|count)$", "", m)
    if m not in exported and base not in exported:
        bad.append(("rules", m))
print(f"dashboard: {len(dash['panels'])} panels; unknown metrics: {bad}")
sys.exit(1 if bad else 0)
PY
