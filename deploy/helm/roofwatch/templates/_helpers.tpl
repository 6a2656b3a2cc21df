{{/* Chart name, truncated to the 63 characters a label value may have. */}}
{{- define "roofwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: the release name when it already contains the chart name. */}}
{{- define "roofwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "roofwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the agent's pods; never change them on upgrade (the selector is immutable). */}}
{{- define "roofwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "roofwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "roofwatch.labels" -}}
{{ include "roofwatch.componentLabels" (dict "context" . "component" "agent") }}
{{- end }}

{{/* The standard labels with another app.kubernetes.io/component: (dict "context" . "component" "x"). */}}
{{- define "roofwatch.componentLabels" -}}
{{- $ctx := .context -}}
helm.sh/chart: {{ include "roofwatch.chart" $ctx }}
{{ include "roofwatch.selectorLabels" $ctx }}
app.kubernetes.io/version: {{ $ctx.Values.image.tag | default $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: roofwatch
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
{{- end }}

{{- define "roofwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "roofwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the ConfigMap is mounted; ROOFWATCH_CONFIG names the file in it. */}}
{{- define "roofwatch.configDir" -}}/etc/roofwatch{{- end }}

{{/*
Pod securityContext: the chart's default for the chosen mode, with .Values.podSecurityContext
merged over it.
*/}}
{{- define "roofwatch.podSecurityContext" -}}
{{- $ctx := dict "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if not .Values.podResources.enabled }}
{{- $_ := set $ctx "runAsUser" 65534 }}
{{- $_ := set $ctx "runAsGroup" 65534 }}
{{- $_ := set $ctx "runAsNonRoot" true }}
{{- end }}
{{- toYaml (mustMergeOverwrite $ctx (deepCopy .Values.podSecurityContext)) }}
{{- end }}

{{/*
Container securityContext. With the pod-resources socket (owned by root) the agent runs as uid 0
with no capabilities at all; without it as nobody (65534). AMD device nodes mounted by hostPath are
only usable from a privileged container (see values.yaml, amd.enabled). .Values.securityContext is
merged over the result.
*/}}
{{- define "roofwatch.securityContext" -}}
{{- $ctx := dict "readOnlyRootFilesystem" true "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if .Values.amd.enabled }}
{{- $_ := set $ctx "privileged" true }}
{{- else }}
{{- $_ := set $ctx "privileged" false }}
{{- $_ := set $ctx "allowPrivilegeEscalation" false }}
{{- $_ := set $ctx "capabilities" (dict "drop" (list "ALL")) }}
{{- end }}
{{- if .Values.podResources.enabled }}
{{- $_ := set $ctx "runAsUser" 0 }}
{{- $_ := set $ctx "runAsGroup" 0 }}
{{- $_ := set $ctx "runAsNonRoot" false }}
{{- else }}
{{- $_ := set $ctx "runAsUser" 65534 }}
{{- $_ := set $ctx "runAsGroup" 65534 }}
{{- $_ := set $ctx "runAsNonRoot" true }}
{{- end }}
{{- toYaml (mustMergeOverwrite $ctx (deepCopy .Values.securityContext)) }}
{{- end }}

{{/*
A probe from values, switched to HTTPS when the web config turns TLS on (the kubelet does not
verify the certificate, and /healthz needs no password).
*/}}
{{- define "roofwatch.probe" -}}
{{- $probe := deepCopy .probe -}}
{{- if and .https $probe.httpGet -}}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end }}

{{/* The agent's image: by digest when one is given, else by tag (appVersion, "-amd" for the AMD variant). */}}
{{- define "roofwatch.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-amd" "" .Values.amd.enabled)) }}
{{- end -}}
{{- end }}
