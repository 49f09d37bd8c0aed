{{/* hub.name: "hub", or "hub-<revision>" (the Deployment, Services, ServiceAccount, RBAC). */}}
{{- define "hub.name" -}}
hub{{ if .Values.revision }}-{{ .Values.revision }}{{ end }}
{{- end }}

{{/* hub.selectorLabels: the pods' selector (immutable; no Helm bookkeeping). */}}
{{- define "hub.selectorLabels" -}}
app: hub
{{- if .Values.revision }}
hub.mesh/rev: {{ .Values.revision | quote }}
{{- end }}
{{- end }}

{{/* hub.labels: every object's labels: the selector's and Helm's bookkeeping
(helm.sh/chart, app.kubernetes.io/managed-by and /instance, which
charts/chart_deploy_test.go strips before comparing with deploy/). */}}
{{- define "hub.labels" -}}
{{ include "hub.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* hub.subject: the hub's ServiceAccount as an RBAC subject. */}}
{{- define "hub.subject" -}}
- kind: ServiceAccount
  name: {{ include "hub.name" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/* hub.dnsNames: the Service's names on the serving certificate, then tlsExtraDNSNames. */}}
{{- define "hub.dnsNames" -}}
{{- $svc := printf "%s.%s" (include "hub.name" .) .Release.Namespace -}}
{{- $names := list (printf "%s.svc" $svc) (printf "%s.svc.%s" $svc (.Values.domainSuffix | default "cluster.local")) $svc -}}
{{- concat $names .Values.tlsExtraDNSNames | join "," -}}
{{- end }}

{{/* hub.image: <hub>/<image>:<tag>, or <image>:<tag>. */}}
{{- define "hub.image" -}}
{{- if .Values.hub }}{{ .Values.hub }}/{{ end }}{{ .Values.image }}:{{ .Values.tag }}
{{- end }}

{{/* hub.eventNamespaces: namespaces beside remoteSecretsNamespace where the
hub writes Events on distributed objects (distributeNamespaces, or the
root namespace), as a comma-separated list. */}}
{{- define "hub.eventNamespaces" -}}
{{- $ns := list -}}
{{- range (.Values.distributeNamespaces | default (list .Values.rootNamespace)) -}}
{{- if and (ne . $.Values.remoteSecretsNamespace) (not (has . $ns)) -}}
{{- $ns = append $ns . -}}
{{- end -}}
{{- end -}}
{{- join "," $ns -}}
{{- end }}
