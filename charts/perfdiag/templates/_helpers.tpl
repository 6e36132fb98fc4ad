{{- define "perfdiag.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "perfdiag.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "perfdiag.selectorLabels" -}}
app.kubernetes.io/name: {{ include "perfdiag.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "perfdiag.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "perfdiag.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: perfdiag
{{- end -}}

{{- define "perfdiag.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "perfdiag.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "perfdiag.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "perfdiag.webhookService" -}}
{{- printf "%s-webhook" (include "perfdiag.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "perfdiag.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "perfdiag.fullname" .)) .Values.webhook.certificates.secretName -}}
{{- end -}}

{{/*
What the operator does in a namespace it serves (operator/kube.py and kopf; docs/install.md
lists why each rule is there). Nothing on Secrets: the agents and the analyzer Job get the
storage credentials by envFrom, which needs no RBAC of the operator.
*/}}
{{- define "perfdiag.namespacedRules" -}}
- apiGroups: [perfdiag.io]
  resources: [perfdiagnoses]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [perfdiag.io]
  resources: [perfdiagnoses/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, delete]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs]
  verbs: [get]
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{- define "perfdiag.metricsService" -}}
{{- printf "%s-metrics" (include "perfdiag.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
