{{/* Names and labels shared by every object. */}}
{{- define "tailserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tailserve.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tailserve.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The worker endpoints the router dispatches to: one stable DNS name per StatefulSet pod. */}}
{{- define "tailserve.workerAddresses" -}}
{{- $name := include "tailserve.fullname" . -}}
{{- $list := list -}}
{{- range $i := until (int .Values.worker.replicas) -}}
{{- $list = append $list (printf "%s-worker-%d.%s-worker.%s.svc.cluster.local:%d" $name $i $name $.Release.Namespace (int $.Values.worker.grpcPort)) -}}
{{- end -}}
{{- toJson $list -}}
{{- end -}}

{{/* ladb_config.yaml: the values' config with the chart's ports and the worker list filled in. */}}
{{- define "tailserve.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $router := merge (dict "listen_host" "0.0.0.0" "grpc_port" (int .Values.router.grpcPort) "http_port" (int .Values.router.httpPort) "api_port" (int .Values.router.apiPort) "workers" (include "tailserve.workerAddresses" . | fromJsonArray)) $cfg.router -}}
{{- if .Values.router.apiKeys.secretName -}}
{{- $_ := set $router "api_keys_file" "/etc/tailserve-keys/keys" -}}
{{- end -}}
{{- if .Values.tls.routerSecretName -}}
{{- $_ := set $router "tls_cert_file" "/etc/tailserve-tls/tls.crt" -}}
{{- $_ := set $router "tls_key_file" "/etc/tailserve-tls/tls.key" -}}
{{- end -}}
{{- if .Values.tls.routerClientSecretName -}}
{{- $_ := set $router "worker_tls_ca_file" "/etc/tailserve-worker-client/ca.crt" -}}
{{- $_ := set $router "worker_tls_cert_file" "/etc/tailserve-worker-client/tls.crt" -}}
{{- $_ := set $router "worker_tls_key_file" "/etc/tailserve-worker-client/tls.key" -}}
{{- end -}}
{{- /* Real models: the router tokenizes with the served checkpoint's tokenizer.json (same volume). */ -}}
{{- if ne .Values.worker.backend "sim" -}}
{{- $_ := set $router "model_path" .Values.worker.modelPath -}}
{{- end -}}
{{- $worker := merge (dict "listen_host" "0.0.0.0" "grpc_port" (int .Values.worker.grpcPort) "http_port" (int .Values.worker.httpPort) "backend" .Values.worker.backend "model_path" .Values.worker.modelPath) $cfg.worker -}}
{{- if .Values.tls.workerSecretName -}}
{{- $_ := set $worker "tls_cert_file" "/etc/tailserve-tls/tls.crt" -}}
{{- $_ := set $worker "tls_key_file" "/etc/tailserve-tls/tls.key" -}}
{{- $_ := set $worker "tls_client_ca_file" "/etc/tailserve-tls/ca.crt" -}}
{{- end -}}
{{- $_ := set $cfg "router" $router -}}
{{- $_ := set $cfg "worker" $worker -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "tailserve.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end -}}
