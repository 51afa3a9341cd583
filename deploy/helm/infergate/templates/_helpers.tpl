{{- define "infergate.name" -}}{{ .Release.Name }}{{- end -}}

{{- define "infergate.labels" -}}
app.kubernetes.io/name: infergate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "infergate.selector" -}}
app.kubernetes.io/name: infergate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "infergate.redisAddress" -}}
{{- if .Values.redis.deploy -}}{{ include "infergate.name" . }}-redis.{{ .Release.Namespace }}.svc:6379{{- else -}}{{ .Values.redis.address }}{{- end -}}
{{- end -}}

{{- define "infergate.redisSecret" -}}
{{- if .Values.redis.existingSecret -}}{{ .Values.redis.existingSecret }}{{- else if .Values.redis.deploy -}}{{ include "infergate.name" . }}-redis{{- end -}}
{{- end -}}

{{- /* The Secret whose key "key" signs the messages replicas share over Redis: the operator's, or the one the chart generates. */ -}}
{{- define "infergate.messageKeySecret" -}}
{{- if .Values.redis.messageKeySecret -}}{{ .Values.redis.messageKeySecret }}{{- else -}}{{ include "infergate.name" . }}-redis-message-key{{- end -}}
{{- end -}}

{{- define "infergate.keysSecret" -}}
{{- if .Values.fallbackKeys.existingSecret -}}{{ .Values.fallbackKeys.existingSecret }}{{- else -}}{{ include "infergate.name" . }}-fallback-keys{{- end -}}
{{- end -}}

{{- /* The Envoy node ids that may receive managed-API keys: those listed, or the one the chart's generated client certificate names (with TLS on; off, none unless listed: serve's own default is the quickstart's node id). */ -}}
{{- define "infergate.secretNodes" -}}
{{- if .Values.tls.xdsSecretNodes -}}{{ join "," .Values.tls.xdsSecretNodes }}{{- else if and .Values.tls.enabled .Values.tls.generate -}}{{ include "infergate.name" . }}-envoy-client{{- end -}}
{{- end -}}
