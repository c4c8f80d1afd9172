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

{{/* A DaemonSet's updateStrategy from values: rollingUpdate only with RollingUpdate (the API refuses it with
OnDelete, and a --set of type alone must not inherit the default's maxUnavailable into an invalid object). */}}
{{- define "modelpack.updateStrategy" -}}
type: {{ .type }}
{{- if and (eq .type "RollingUpdate") .rollingUpdate }}
rollingUpdate:
  {{- toYaml .rollingUpdate | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A pod template's labels: the user's podLabels, under the selector's own, which win (a podLabels entry that
changed a selector label would orphan the pods). Called with (dict "component" NAME "labels" .Values.X.podLabels). */}}
{{- define "modelpack.podLabels" -}}
{{- toYaml (merge (dict "app.kubernetes.io/name" "modelpack" "app.kubernetes.io/component" .component) (.labels | default dict)) }}
{{- end -}}
