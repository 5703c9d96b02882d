#!/usr/bin/env bash
# Renders the Helm chart for the default values and three variants with Helm's template engine
# (tests/helm/render.go: Go text/template + sprig), checks the objects (check_chart.py), lints the
# YAML, and checks NOTES.txt. Usage: test_chart.sh SOURCE_DIR ROUTER_BIN
set -euo pipefail
SRC=$1
ROUTER=$2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$OUT/gocache" go build -o "$OUT/render" "$SRC/tests/helm/render.go"
status=0
for variant in default one-router-four-workers autoscaling monitors; do
  args=()
  [ "$variant" = default ] || args=(-f "$SRC/tests/helm/$variant.yaml")
  "$OUT/render" -chart "$SRC/helm/tailserve" "${args[@]}" -notes "$OUT/$variant.notes" > "$OUT/$variant.yaml"
  # The merged values, for the checker to compare against.
  python3 - "$SRC/helm/tailserve/values.yaml" "${args[@]:1}" > "$OUT/$variant.values.json" <<'PY'
import json, sys, yaml
def merge(a, b):
    for k, v in b.items():
        a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return a
v = yaml.safe_load(open(sys.argv[1]))
for f in sys.argv[2:]:
    v = merge(v, yaml.safe_load(open(f)))
print(json.dumps(v))
PY
  python3 "$SRC/tests/helm/check_chart.py" "$OUT/$variant.yaml" "$OUT/$variant.values.json" "$ROUTER" || status=1
  yamllint -c "$SRC/.yamllint" "$OUT/$variant.yaml" || status=1
  grep -q "grpcurl -plaintext" "$OUT/$variant.notes" || { echo "FAIL: $variant NOTES.txt has no grpcurl example"; status=1; }
done
# The chart's default config is the project's (ladb_config.yaml), but for where the image keeps
# the predictor and the worker list the chart fills in.
python3 - "$SRC/helm/tailserve/values.yaml" "$SRC/ladb_config.yaml" <<'PY' || status=1
import sys, yaml
chart = yaml.safe_load(open(sys.argv[1]))["config"]
shipped = yaml.safe_load(open(sys.argv[2]))
for c in (chart, shipped):
    c["predictor"].pop("model_path", None)
    c["router"].pop("workers", None)
def diff(a, b, at=""):
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            yield from diff(x, y, f"{at}{k}.")
        elif x != y:
            yield f"{at}{k}: {x} (chart) != {y} (ladb_config.yaml)"
wrong = list(diff(chart, shipped))
if wrong:
    sys.exit("FAIL: values.yaml config differs from ladb_config.yaml: " + "; ".join(wrong))
PY
yamllint -c "$SRC/.yamllint" "$SRC/helm/tailserve/values.yaml" "$SRC/helm/tailserve/Chart.yaml" "$SRC"/tests/helm/*.yaml || status=1
exit $status
