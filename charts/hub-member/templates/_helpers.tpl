{{- define "member.name" -}}
hub-remote-member{{ if .Values.revision }}-{{ .Values.revision }}{{ end }}
{{- end }}

{{- define "member.labels" -}}
app: hub
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "member.subject" -}}
- kind: ServiceAccount
  name: {{ .Values.serviceAccount.name }}
  namespace: {{ .Release.Namespace }}
{{- end }}
