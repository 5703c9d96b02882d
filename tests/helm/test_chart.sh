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
yamllint -c "$SRC/.yamllint" "$SRC/helm/tailserve/values.yaml" "$SRC/helm/tailserve/Chart.yaml" "$SRC"/tests/helm/*.yaml || status=1
exit $status
