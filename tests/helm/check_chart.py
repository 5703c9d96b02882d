#!/usr/bin/env python3
"""Checks a rendered tailserve chart (tests/helm/render output) against the values it came from.

check_chart.py MANIFEST VALUES_JSON ROUTER_BIN: exits non-zero naming every failed check."""
import hashlib
import json
import subprocess
import sys
import tempfile

import yaml

manifest, values_json, router_bin = sys.argv[1:4]
values = json.load(open(values_json))
docs = [d for d in yaml.safe_load_all(open(manifest)) if d]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
name = "tailserve"  # release "tailserve" of chart "tailserve"
v_router, v_worker, v_mon = values["router"], values["worker"], values["monitoring"]

expected_kinds = {"ConfigMap": 1, "Deployment": 1, "Service": 2, "StatefulSet": 1, "PodDisruptionBudget": 2,
                  "HorizontalPodAutoscaler": 1 if v_router["autoscaling"]["enabled"] else 0,
                  "ServiceMonitor": 1 if v_mon["serviceMonitor"]["enabled"] else 0,
                  "PodMonitor": 1 if v_mon["podMonitor"]["enabled"] else 0}
for kind, n in expected_kinds.items():
    check(len(by_kind.get(kind, {})) == n, f"{n} {kind} expected, got {sorted(by_kind.get(kind, {}))}")
check(set(by_kind) <= set(expected_kinds), f"unexpected kinds {sorted(set(by_kind) - set(expected_kinds))}")

# ConfigMap: exactly the values' config, with the chart's ports and the StatefulSet pods as workers,
# and accepted by the real configuration loader.
cm = by_kind["ConfigMap"][f"{name}-config"]
text = cm["data"]["ladb_config.yaml"]
config = yaml.safe_load(text)
want = json.loads(json.dumps(values["config"]))
want["router"].update({"listen_host": "0.0.0.0", "grpc_port": v_router["grpcPort"], "http_port": v_router["httpPort"],
                       "api_port": v_router["apiPort"],
                       "workers": [f"{name}-worker-{i}.{name}-worker.default.svc.cluster.local:{v_worker['grpcPort']}"
                                   for i in range(v_worker["replicas"])]})
if v_worker["backend"] != "sim":
    want["router"]["model_path"] = v_worker["modelPath"]
if v_router["apiKeys"]["secretName"]:
    want["router"]["api_keys_file"] = "/etc/tailserve-keys/keys"
v_tls = values["tls"]
if v_tls["routerSecretName"]:
    want["router"].update({"tls_cert_file": "/etc/tailserve-tls/tls.crt", "tls_key_file": "/etc/tailserve-tls/tls.key"})
if v_tls["routerClientSecretName"]:
    want["router"].update({"worker_tls_ca_file": "/etc/tailserve-worker-client/ca.crt",
                           "worker_tls_cert_file": "/etc/tailserve-worker-client/tls.crt",
                           "worker_tls_key_file": "/etc/tailserve-worker-client/tls.key"})
if v_tls["workerSecretName"]:
    want["worker"].update({"tls_cert_file": "/etc/tailserve-tls/tls.crt", "tls_key_file": "/etc/tailserve-tls/tls.key",
                           "tls_client_ca_file": "/etc/tailserve-tls/ca.crt"})
want["worker"].update({"listen_host": "0.0.0.0", "grpc_port": v_worker["grpcPort"], "http_port": v_worker["httpPort"],
                       "backend": v_worker["backend"], "model_path": v_worker["modelPath"]})
check(config == want, f"ConfigMap ladb_config.yaml differs from the values: {config} != {want}")
with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
    f.write(text)
    f.flush()
    r = subprocess.run([router_bin, "--check-config", "--config", f.name], capture_output=True, text=True)
    check(r.returncode == 0, f"tailserve-router --check-config refused the ConfigMap: {r.stdout}{r.stderr}")
checksum = hashlib.sha256(text.rstrip("\n").encode()).hexdigest()


def pod_checks(obj, component, http_port):
    spec = obj["spec"]["template"]
    ann = spec["metadata"].get("annotations", {})
    check(ann.get("checksum/config") == checksum, f"{component}: checksum/config does not hash the ConfigMap")
    scrape = ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(http_port)
    check(scrape == v_mon["scrapeAnnotations"], f"{component}: scrape annotations {ann}")
    c = spec["spec"]["containers"][0]
    check(c["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{component}: readiness is not /readyz")
    check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", f"{component}: liveness is not /healthz")
    check(c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 60,
          f"{component}: liveness kills within a minute")
    check(spec["spec"]["securityContext"]["runAsNonRoot"] is True, f"{component}: not run as non-root")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    check("/etc/tailserve" in mounts and c["args"][:2] == ["--config", "/etc/tailserve/ladb_config.yaml"],
          f"{component}: config not mounted and passed")
    return c, spec["spec"]


router = by_kind["Deployment"][f"{name}-router"]
c, pod = pod_checks(router, "router", v_router["httpPort"])
if v_worker["backend"] != "sim":
    check(any(m["mountPath"] == v_worker["modelVolume"]["mountPath"] for m in c["volumeMounts"]),
          "router: the model volume (tokenizer) is not mounted")
check(router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, "router: maxUnavailable is not 0")
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
check((ports.get("api") == v_router["apiPort"]) == (v_router["apiPort"] >= 0), f"router: API port {ports}")
service_ports = {p["name"] for p in by_kind["Service"][f"{name}-router"]["spec"]["ports"]}
check(("api" in service_ports) == (v_router["apiPort"] >= 0), f"router Service ports {service_ports}")
if v_router["apiKeys"]["secretName"]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    check(volumes.get("api-keys", {}).get("secret", {}).get("secretName") == v_router["apiKeys"]["secretName"],
          "router: the API keys Secret is not a volume")
    check(any(m["mountPath"] == "/etc/tailserve-keys" for m in c["volumeMounts"]), "router: API keys not mounted")
router_secrets = {v["secret"]["secretName"]: v["name"] for v in pod["volumes"] if "secret" in v}
router_mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
for secret, path in ((v_tls["routerSecretName"], "/etc/tailserve-tls"),
                     (v_tls["routerClientSecretName"], "/etc/tailserve-worker-client")):
    if secret:
        check(secret in router_secrets and router_mounts.get(router_secrets[secret]) == path,
              f"router: the TLS Secret {secret} is not mounted at {path}")
if v_router["autoscaling"]["enabled"]:
    check("replicas" not in router["spec"], "router: replicas set while the HPA owns them")
    hpa = by_kind["HorizontalPodAutoscaler"][f"{name}-router"]
    m = hpa["spec"]["metrics"][0]
    check(m["type"] == "Pods" and m["pods"]["metric"]["name"] == "tailserve_router_queue_length",
          f"HPA metric is {m}")
    check(m["pods"]["target"]["averageValue"] == str(v_router["autoscaling"]["targetQueueLength"]), "HPA target")
    check(hpa["spec"]["minReplicas"] == v_router["autoscaling"]["minReplicas"] and
          hpa["spec"]["maxReplicas"] == v_router["autoscaling"]["maxReplicas"], "HPA bounds")
    check("scaleUp" in hpa["spec"]["behavior"] and "scaleDown" in hpa["spec"]["behavior"], "HPA behavior")
    check(hpa["spec"]["scaleTargetRef"]["name"] == f"{name}-router", "HPA target ref")
else:
    check(router["spec"]["replicas"] == v_router["replicas"], "router replicas")

worker = by_kind["StatefulSet"][f"{name}-worker"]
c, pod = pod_checks(worker, "worker", v_worker["httpPort"])
if v_tls["workerSecretName"]:
    secrets = {v["secret"]["secretName"]: v["name"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    check(mounts.get(secrets.get(v_tls["workerSecretName"], "")) == "/etc/tailserve-tls",
          "worker: the TLS Secret is not mounted at /etc/tailserve-tls")
check(worker["spec"]["replicas"] == v_worker["replicas"], "worker replicas")
check(worker["spec"]["serviceName"] == f"{name}-worker", "worker serviceName")
sp = c["startupProbe"]
check(sp["httpGet"]["path"] == "/healthz" and sp["failureThreshold"] * sp["periodSeconds"] >= v_worker["startupSeconds"],
      f"worker startupProbe budget {sp}")
for part in ("requests", "limits"):
    check(c["resources"][part].get("nvidia.com/gpu") == v_worker["gpus"], f"worker {part} nvidia.com/gpu")
check(pod["terminationGracePeriodSeconds"] == v_worker["terminationGracePeriodSeconds"], "worker grace period")
check(pod.get("tolerations") == v_worker["tolerations"], "worker tolerations")
headless = by_kind["Service"][f"{name}-worker"]
check(headless["spec"]["clusterIP"] == "None", "worker Service is not headless")
check(by_kind["Service"][f"{name}-router"]["spec"]["type"] == v_router["service"]["type"], "router Service type")
check(by_kind["PodDisruptionBudget"][f"{name}-router"]["spec"]["minAvailable"] == v_router["minAvailable"], "router PDB")
check(by_kind["PodDisruptionBudget"][f"{name}-worker"]["spec"]["maxUnavailable"] == v_worker["maxUnavailable"],
      "worker PDB")
if v_mon["serviceMonitor"]["enabled"]:
    sm = by_kind["ServiceMonitor"][f"{name}-router"]
    check(sm["spec"]["endpoints"][0]["port"] == "http" and sm["spec"]["endpoints"][0]["path"] == "/metrics",
          "ServiceMonitor endpoint")
    check(sm["metadata"]["labels"].get("release") == v_mon["serviceMonitor"]["labels"].get("release"),
          "ServiceMonitor labels")
if v_mon["podMonitor"]["enabled"]:
    pm = by_kind["PodMonitor"][f"{name}-worker"]
    check(pm["spec"]["podMetricsEndpoints"][0]["port"] == "http", "PodMonitor endpoint")

for f in failures:
    print("FAIL:", f)
print(f"{manifest}: {len(docs)} objects, {len(failures)} failures")
sys.exit(1 if failures else 0)
