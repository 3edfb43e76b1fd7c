{{/* Chart name, truncated to fit a DNS-1123 label. */}}
{{- define "embedfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart unless the release name already contains it. */}}
{{- define "embedfleet.fullname" -}}
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

{{- define "embedfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "embedfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "embedfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object, without a component (dashboards, rules and tests add their own). */}}
{{- define "embedfleet.baseLabels" -}}
helm.sh/chart: {{ include "embedfleet.chart" . }}
app.kubernetes.io/name: {{ include "embedfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: embedfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of the operator's own objects. */}}
{{- define "embedfleet.labels" -}}
{{ include "embedfleet.baseLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "embedfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "embedfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "embedfleet.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The namespaced permissions the operator needs wherever it manages EmbeddingDeployments: the
custom resource and its status, the children it applies (server-side apply = patch), events.
It creates each gateway's Role granting read on EndpointSlices; RBAC only lets it grant what
it holds itself, hence that rule. Listed once; rendered into a ClusterRole (all namespaces) or a
Role (operator.watchNamespace). No wildcard verbs or resources, on purpose.
*/}}
{{- define "embedfleet.namespacedRules" -}}
- apiGroups: ["embedfleet.dev"]
  resources: ["embeddingdeployments"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["embedfleet.dev"]
  resources: ["embeddingdeployments/status"]
  verbs: ["get", "patch", "update"]
# Owner references with blockOwnerDeletion need update on the owner's finalizers subresource.
- apiGroups: ["embedfleet.dev"]
  resources: ["embeddingdeployments/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rbac.serviceMonitors }}
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
{{- end }}
{{- end }}

{{/* The leader-election Lease's name. */}}
{{- define "embedfleet.leaseName" -}}
{{- default (include "embedfleet.fullname" .) .Values.operator.leaderElection.leaseName }}
{{- end }}
