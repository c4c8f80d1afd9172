{{- define "modelpack.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ required "image.tag or image.digest is required" .Values.image.tag }}
{{- end -}}
{{- end -}}

{{- define "modelpack.labels" -}}
app.kubernetes.io/name: modelpack
app.kubernetes.io/part-of: modelpack
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "modelpack.pluginDir" -}}
{{ .Values.kubeletDir }}/plugins/{{ .Values.driverName }}
{{- end -}}
