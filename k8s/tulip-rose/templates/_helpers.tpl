{{/* Chart name, bounded so "<fullname>-tulip" stays a valid DNS label. */}}
{{- define "tulip-rose.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "tulip-rose.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tulip-rose.ivyName" -}}
{{- printf "%s-ivy" (include "tulip-rose.fullname" .) }}
{{- end }}

{{/* Tulip's Deployment and its headless Service share this name; an extra
     model pool's (`pools`) ends in "-<pool name>". */}}
{{- define "tulip-rose.tulipName" -}}
{{- printf "%s-tulip%s" (include "tulip-rose.fullname" .) (include "tulip-rose.poolSuffix" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "" for the top-level pool, "-<name>" in an extra pool's context. */}}
{{- define "tulip-rose.poolSuffix" -}}
{{- get . "poolSuffix" | default "" }}
{{- end }}

{{/* Fills .out.ctx with the context an extra model pool (.pool, an entry of
     `pools`) renders its Tulip objects in: the root context with the pool's
     `model` and `tulip` merged over the top-level ones, and its suffix. */}}
{{- define "tulip-rose.poolContext" -}}
{{- $root := .root }}
{{- $values := deepCopy $root.Values }}
{{- $_ := set $values "model" (mergeOverwrite (deepCopy $root.Values.model) (deepCopy (.pool.model | default dict))) }}
{{- $_ := set $values "tulip" (mergeOverwrite (deepCopy $root.Values.tulip) (deepCopy (.pool.tulip | default dict))) }}
{{- /* Adapters are of one model: a pool has its own tulip.lora or none, never the first pool's. */}}
{{- $_ := set $values.tulip "lora" (dig "lora" (list) (.pool.tulip | default dict)) }}
{{- $_ := set .out "ctx" (dict "Values" $values "Release" $root.Release "Chart" $root.Chart "Capabilities" $root.Capabilities "Template" $root.Template "Files" $root.Files "poolSuffix" (printf "-%s" .pool.name)) }}
{{- end }}

{{/* Every pool's DNS name, comma-separated: what IVY_TULIP_DNS lists. */}}
{{- define "tulip-rose.tulipDnsAll" -}}
{{- $names := list (include "tulip-rose.tulipDns" .) }}
{{- range $pool := .Values.pools }}
{{- $out := dict }}
{{- $_ := include "tulip-rose.poolContext" (dict "root" $ "pool" $pool "out" $out) }}
{{- $names = append $names (include "tulip-rose.tulipDns" $out.ctx) }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{/* What Ivy resolves: every ready Tulip pod's address, on the gRPC port. */}}
{{- define "tulip-rose.tulipDns" -}}
{{- printf "%s.%s.svc.%s:%d" (include "tulip-rose.tulipName" .) .Release.Namespace .Values.clusterDomain (int .Values.tulip.port) }}
{{- end }}

{{- define "tulip-rose.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "tulip-rose.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tulip-rose
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "ivy"). */}}
{{- define "tulip-rose.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tulip-rose.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tulip-rose.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tulip-rose.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Full image reference: (dict "ctx" $ "image" .Values.ivy.image "tag" "0.1.0"). */}}
{{- define "tulip-rose.image" -}}
{{- $repo := .image.repository }}
{{- with .ctx.Values.imageRegistry }}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}
{{- end }}
{{- printf "%s:%s" $repo (default .tag .image.tag) }}
{{- end }}

{{- define "tulip-rose.tulipImage" -}}
{{- $variant := ternary "cuda" "cpu" .Values.tulip.gpu.enabled }}
{{- include "tulip-rose.image" (dict "ctx" . "image" .Values.tulip.image "tag" (printf "%s-%s" .Chart.AppVersion $variant)) }}
{{- end }}

{{- define "tulip-rose.ivyImage" -}}
{{- include "tulip-rose.image" (dict "ctx" . "image" .Values.ivy.image "tag" .Chart.AppVersion) }}
{{- end }}

{{/* Where the images keep the embedded default model (see deploy/*.Dockerfile). */}}
{{- define "tulip-rose.embeddedModelDir" -}}
/opt/models/all-MiniLM-L6-v2
{{- end }}

{{/* The model directory as the containers see it. */}}
{{- define "tulip-rose.modelDir" -}}
{{- if eq .Values.model.source "image" }}
{{- include "tulip-rose.embeddedModelDir" . }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.path) }}
{{- end }}
{{- end }}

{{/* The model volume (none for the embedded model). */}}
{{- define "tulip-rose.modelVolume" -}}
{{- $m := .Values.model }}
{{- if ne $m.source "image" }}
- name: model
{{- if eq $m.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ $m.pvc.claimName }}
    readOnly: {{ not $m.init.enabled }}
{{- else if eq $m.source "hostPath" }}
  hostPath:
    path: {{ $m.hostPath.path }}
    type: {{ $m.hostPath.type }}
{{- else if eq $m.source "emptyDir" }}
  emptyDir:
    sizeLimit: {{ $m.emptyDir.sizeLimit }}
{{- end }}
{{- end }}
{{- end }}

{{/* The serving containers mount the model read-only. */}}
{{- define "tulip-rose.modelMount" -}}
{{- if ne .Values.model.source "image" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "tulip-rose.modelInit" -}}
{{- $m := .Values.model }}
{{- if and $m.init.enabled (ne $m.source "image") }}
- name: model-init
  image: {{ $m.init.image }}
  {{- with $m.init.command }}
  command: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $m.init.args }}
  args: {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    - name: MODEL_DIR
      value: {{ include "tulip-rose.modelDir" . | quote }}
    {{- with $m.init.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $m.init.resources }}
  resources: {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext: {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ $m.mountPath }}
    - name: tmp
      mountPath: /tmp
{{- end }}
{{- end }}

{{/* Pod fields common to Ivy and Tulip. */}}
{{- define "tulip-rose.podCommon" -}}
serviceAccountName: {{ include "tulip-rose.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
securityContext: {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Scheduling fields of one component: include with its values. */}}
{{- define "tulip-rose.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod annotations: prometheus.io scrape hints for the metrics port, plus
the component's own: (dict "ctx" $ "port" 7071 "extra" .Values.tulip.podAnnotations),
and "scheme" "https" when the port serves TLS. */}}
{{- define "tulip-rose.podAnnotations" -}}
{{- $annotations := deepCopy (default (dict) .extra) }}
{{- if .ctx.Values.metrics.podAnnotations }}
{{- $annotations = merge $annotations (dict "prometheus.io/scrape" "true" "prometheus.io/port" (toString .port) "prometheus.io/path" "/metrics") }}
{{- with .scheme }}
{{- $_ := set $annotations "prometheus.io/scheme" . }}
{{- end }}
{{- end }}
{{- with $annotations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* The Secret holding Ivy's API key; empty when there is no key. */}}
{{- define "tulip-rose.ivyApiKeySecret" -}}
{{- $k := .Values.ivy.apiKey }}
{{- $k.existingSecret | default (ternary (printf "%s-api-key" (include "tulip-rose.ivyName" .)) "" (ne $k.value "")) }}
{{- end }}

{{/* Ivy's container, shared by the Ivy Deployment and the co-located
sidecar in Tulip's pods: (dict "ctx" $ "prefix" "" "socket" "" "resources"
.Values.ivy.resources "extraEnv" list). prefix keeps the port and volume
names apart from Tulip's in a shared pod; with a socket, Ivy dials that one
Tulip instead of resolving the headless Service. */}}
{{- define "tulip-rose.ivyContainer" -}}
{{- $ctx := .ctx }}
{{- $i := $ctx.Values.ivy }}
{{- $p := .prefix -}}
- name: ivy
  image: {{ include "tulip-rose.ivyImage" $ctx }}
  imagePullPolicy: {{ $i.image.pullPolicy }}
  env:
    {{- with .socket }}
    - name: IVY_TULIP
      value: {{ printf "unix://%s" . | quote }}
    {{- else }}
    - name: IVY_TULIP_DNS
      value: {{ include "tulip-rose.tulipDnsAll" $ctx | quote }}
    {{- with $ctx.Values.ivy.defaultModel }}
    - name: IVY_DEFAULT_MODEL
      value: {{ . | quote }}
    {{- end }}
    - name: IVY_DNS_INTERVAL
      value: {{ $i.dnsIntervalSeconds | quote }}
    {{- end }}
    - name: IVY_CONFIG
      value: /etc/ivy/templates.toml
    - name: IVY_HOST
      value: "0.0.0.0"
    - name: IVY_PORT
      value: {{ $i.port | quote }}
    - name: IVY_GRPC_PORT
      value: {{ $i.grpcPort | quote }}
    - name: IVY_DRAIN_TIMEOUT
      value: {{ $i.drainTimeoutSeconds | quote }}
    - name: IVY_LOG
      value: {{ $i.log | quote }}
    {{- with $i.maxConcurrentRequests }}
    - name: IVY_MAX_CONCURRENT_REQUESTS
      value: {{ . | quote }}
    {{- end }}
    {{- with $i.requestTimeoutSeconds }}
    - name: IVY_REQUEST_TIMEOUT
      value: {{ . | quote }}
    {{- end }}
    {{- $a := $ctx.Values.tulip.autoscaling }}
    {{- if and $a.keda.enabled (eq (int $a.minReplicas) 0) }}
    # The pool may be at zero: hold requests while its first pod starts.
    - name: IVY_COLD_START_HOLD
      value: {{ $a.coldStartHoldSeconds | quote }}
    {{- end }}
    {{- range $key, $var := dict "headerTimeoutSeconds" "IVY_HEADER_TIMEOUT" "bodyTimeoutSeconds" "IVY_BODY_TIMEOUT" "idleTimeoutSeconds" "IVY_IDLE_TIMEOUT" "writeTimeoutSeconds" "IVY_WRITE_TIMEOUT" "maxConnections" "IVY_MAX_CONNECTIONS" }}
    {{- with index $i.connections $key }}
    - name: {{ $var }}
      value: {{ . | quote }}
    {{- end }}
    {{- end }}
    {{- if $i.tls.secretName }}
    - name: IVY_TLS_CERT
      value: /etc/ivy-tls/tls.crt
    - name: IVY_TLS_KEY
      value: /etc/ivy-tls/tls.key
    {{- end }}
    {{- with $i.batch }}
    {{- if .enabled }}
    # The Batch API on the cluster store every Ivy pod shares.
    - name: IVY_BATCH_DATABASE_URL
      valueFrom:
        secretKeyRef:
          name: {{ .databaseUrlSecret }}
          key: {{ .databaseUrlKey }}
    - name: IVY_BATCH_OBJECT_STORE_URL
      value: {{ .objectStoreUrl | quote }}
    {{- with .objectStoreEndpoint }}
    - name: AWS_ENDPOINT_URL
      value: {{ . | quote }}
    {{- end }}
    {{- with .objectStoreRegion }}
    - name: AWS_REGION
      value: {{ . | quote }}
    {{- end }}
    {{- if .objectStoreAllowHttp }}
    - name: AWS_ALLOW_HTTP
      value: "true"
    {{- end }}
    {{- with .objectStoreCredentialsSecret }}
    {{- range $var := list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" }}
    - name: {{ $var }}
      valueFrom:
        secretKeyRef:
          name: {{ $.ctx.Values.ivy.batch.objectStoreCredentialsSecret }}
          key: {{ $var }}
    {{- end }}
    {{- end }}
    {{- $b := . }}
    {{- range $key, $var := dict "maxFileBytes" "IVY_BATCH_MAX_FILE_BYTES" "maxLines" "IVY_BATCH_MAX_LINES" "shardLines" "IVY_BATCH_SHARD_LINES" "leaseSeconds" "IVY_BATCH_LEASE" "concurrency" "IVY_BATCH_CONCURRENCY" }}
    {{- if not (kindIs "invalid" (index $b $key)) }}
    - name: {{ $var }}
      value: {{ index $b $key | quote }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- with include "tulip-rose.ivyApiKeySecret" $ctx }}
    - name: IVY_API_KEY
      valueFrom:
        secretKeyRef:
          name: {{ . }}
          key: {{ $i.apiKey.secretKey }}
    {{- end }}
    {{- with concat $i.extraEnv (default (list) .extraEnv) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: {{ $p }}http
      containerPort: {{ $i.port }}
      protocol: TCP
    - name: {{ $p }}grpc
      containerPort: {{ $i.grpcPort }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /health
      port: {{ $p }}http
      {{- if $i.tls.secretName }}
      scheme: HTTPS
      {{- end }}
    {{- toYaml $i.probes.startup | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /ready
      port: {{ $p }}http
      {{- if $i.tls.secretName }}
      scheme: HTTPS
      {{- end }}
    {{- toYaml $i.probes.readiness | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /health
      port: {{ $p }}http
      {{- if $i.tls.secretName }}
      scheme: HTTPS
      {{- end }}
    {{- toYaml $i.probes.liveness | nindent 4 }}
  # Load balancers drop the pod from rotation before SIGTERM arrives.
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $i.preStopSleepSeconds }}
  resources: {{- toYaml .resources | nindent 4 }}
  securityContext: {{- toYaml $ctx.Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    - name: {{ $p }}config
      mountPath: /etc/ivy
      readOnly: true
    - name: {{ $p }}tmp
      mountPath: /tmp
    {{- if $i.tls.secretName }}
    - name: {{ $p }}tls
      mountPath: /etc/ivy-tls
      readOnly: true
    {{- end }}
    {{- with .socket }}
    - name: tulip-socket
      mountPath: {{ dir . }}
    {{- end }}
{{- end }}

{{/* The volumes of Ivy's container: (dict "ctx" $ "prefix" ""). */}}
{{- define "tulip-rose.ivyVolumes" -}}
# Mounted as a directory (not subPath) so ConfigMap updates reach the pod.
- name: {{ .prefix }}config
  configMap:
    name: {{ include "tulip-rose.ivyName" .ctx }}
- name: {{ .prefix }}tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with .ctx.Values.ivy.tls.secretName }}
- name: {{ $.prefix }}tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{/* The co-located Ivy's Service: serves the Ivy sidecars of Tulip's pods. */}}
{{- define "tulip-rose.colocatedIvyName" -}}
{{- printf "%s-ivy" (include "tulip-rose.tulipName" .) }}
{{- end }}

{{/* Tulip's Unix socket for the co-located Ivy, in a volume both mount. */}}
{{- define "tulip-rose.tulipSocket" -}}
/run/tulip/tulip.sock
{{- end }}

{{/* Checks between values that the schema cannot express. */}}
{{- define "tulip-rose.validate" -}}
{{- if le (float64 .Values.tulip.preStopSleepSeconds) (float64 .Values.ivy.dnsIntervalSeconds) }}
{{- fail (printf "tulip.preStopSleepSeconds (%v) must exceed ivy.dnsIntervalSeconds (%v): Ivy has to drop a stopping Tulip pod from its list before the pod stops taking work" .Values.tulip.preStopSleepSeconds .Values.ivy.dnsIntervalSeconds) }}
{{- end }}
{{- if .Values.tulip.colocatedIvy.enabled }}
{{- $t := .Values.tulip }}
{{- $i := .Values.ivy }}
{{- $tulipPorts := list (int $t.port) (int $t.metricsPort) }}
{{- if or (has (int $i.port) $tulipPorts) (has (int $i.grpcPort) $tulipPorts) }}
{{- fail (printf "tulip.colocatedIvy: ivy.port (%v) and ivy.grpcPort (%v) must differ from tulip.port (%v) and tulip.metricsPort (%v): the sidecar shares the pod's network" $i.port $i.grpcPort $t.port $t.metricsPort) }}
{{- end }}
{{- if ge (float64 $i.preStopSleepSeconds) (float64 $t.preStopSleepSeconds) }}
{{- fail (printf "tulip.colocatedIvy: ivy.preStopSleepSeconds (%v) must be less than tulip.preStopSleepSeconds (%v): the sidecar has to stop taking requests while its Tulip still takes work" $i.preStopSleepSeconds $t.preStopSleepSeconds) }}
{{- end }}
{{- end }}
{{- $a := .Values.tulip.autoscaling }}
{{- if and $a.keda.enabled $a.hpa.enabled }}
{{- fail "tulip.autoscaling: enable keda or hpa, not both: two autoscalers on one Deployment fight over its replica count" }}
{{- end }}
{{- if and $a.hpa.enabled (eq (int $a.minReplicas) 0) }}
{{- fail "tulip.autoscaling.minReplicas 0 (scale from zero) needs keda: a plain HPA keeps at least one replica" }}
{{- end }}
{{- if and (or $a.keda.enabled $a.hpa.enabled) .Values.pools }}
{{- fail "tulip.autoscaling sizes one Tulip pool; with several model pools (pools) scale them with tulip.replicas for now" }}
{{- end }}
{{- with .Values.ivy.batch }}
{{- if and .enabled (or (not .databaseUrlSecret) (not .objectStoreUrl)) }}
{{- fail "ivy.batch.enabled needs ivy.batch.databaseUrlSecret and ivy.batch.objectStoreUrl: Ivy pods share the Batch API's work through PostgreSQL and an S3-compatible bucket" }}
{{- end }}
{{- end }}
{{- if lt (int $a.maxReplicas) (int $a.minReplicas) }}
{{- fail (printf "tulip.autoscaling.maxReplicas (%v) must be at least minReplicas (%v)" $a.maxReplicas $a.minReplicas) }}
{{- end }}
{{- if and .Values.pools .Values.tulip.colocatedIvy.enabled }}
{{- fail "pools: several model pools need the Ivy Deployment; tulip.colocatedIvy serves one Tulip each" }}
{{- end }}
{{- $seen := list "" }}
{{- range .Values.pools }}
{{- if has .name $seen }}
{{- fail (printf "pools: the name %q is used twice (or is empty); each pool needs its own" .name) }}
{{- end }}
{{- $seen = append $seen .name }}
{{- end }}
{{- if and .Values.ivy.apiKey.existingSecret .Values.ivy.apiKey.value }}
{{- fail "ivy.apiKey: set either existingSecret or value, not both" }}
{{- end }}
{{- end }}

{{/* Label matchers pinning a query to this release's namespace (plus
tulip.autoscaling.prometheus.extraMatchers). */}}
{{- define "tulip-rose.metricSelector" -}}
{{- $m := list (printf "namespace=%q" .Release.Namespace) }}
{{- with .Values.tulip.autoscaling.prometheus.extraMatchers }}
{{- $m = append $m . }}
{{- end }}
{{- join "," $m }}
{{- end }}

{{/* The summed backlog of one class, in seconds: (dict "ctx" $ "class" "batch").
A draining pod's backlog is its own to finish, so it is left out; a pod that
is gone has no series (Prometheus marks a vanished target's series stale
at once, and no range function keeps its last value); no pod at all reads
0, not "no data", which would hold the autoscaler where it is. */}}
{{- define "tulip-rose.backlogQuery" -}}
{{- $sel := include "tulip-rose.metricSelector" .ctx }}
{{- printf "sum(tulip_class_backlog_seconds{%s,class=%q} unless on(instance) (tulip_draining{%s} == 1)) or vector(0)" $sel .class $sel }}
{{- end }}

{{/* The HPA behaviour both variants use (tulip.autoscaling). */}}
{{- define "tulip-rose.scalingBehavior" -}}
scaleUp:
  stabilizationWindowSeconds: {{ .scaleUp.stabilizationWindowSeconds }}
  selectPolicy: Max
  policies:
    - type: Pods
      value: {{ .scaleUp.pods }}
      periodSeconds: {{ .scaleUp.periodSeconds }}
    - type: Percent
      value: 100
      periodSeconds: {{ .scaleUp.periodSeconds }}
scaleDown:
  stabilizationWindowSeconds: {{ .scaleDown.stabilizationWindowSeconds }}
  selectPolicy: Min
  policies:
    - type: Pods
      value: {{ .scaleDown.pods }}
      periodSeconds: {{ .scaleDown.periodSeconds }}
{{- end }}
