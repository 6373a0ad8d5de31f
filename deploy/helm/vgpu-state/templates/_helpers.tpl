{{/* Labels on every object: the kustomize base's two, and Helm's own. */}}
{{- define "vgpu-state.labels" -}}
app.kubernetes.io/name: vgpu-state
app.kubernetes.io/part-of: vgpu-state
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "vgpu-state.image" -}}
{{- with .Values.image.registry }}{{ . }}/{{ end -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The objects of one of the chart's files/ (copies of deploy/, kept equal by
scripts/sync_chart_files.py), each with the chart's labels added and, if it has a
namespace, in the release's. Read as data, never as a template.
Called with (list $ "files/NAME.yaml").
*/}}
{{- define "vgpu-state.static" -}}
{{- $root := index . 0 }}
{{- $labels := include "vgpu-state.labels" $root | fromYaml }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" ($root.Files.Get (index . 1)) -1 }}
{{- $obj := fromYaml $doc }}
{{- if $obj }}
{{- $_ := set $obj.metadata "labels" (merge (dict) (get $obj.metadata "labels" | default dict) $labels) }}
{{- if hasKey $obj.metadata "namespace" }}
{{- $_ := set $obj.metadata "namespace" $root.Release.Namespace }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}
