{{/*
Names are fixed (ballast-...), as config/default names them: the manager's RBAC and the revision
gate name each other, and both are cluster-scoped, so one release per cluster.
*/}}

{{- define "ballast.labels" -}}
app.kubernetes.io/name: ballast
app.kubernetes.io/part-of: ballast
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "ballast.managerLabels" -}}
{{ include "ballast.labels" . }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "ballast.admissionLabels" -}}
{{ include "ballast.labels" . }}
app.kubernetes.io/component: admission
{{- end }}

{{- define "ballast.selectorLabels" -}}
app.kubernetes.io/name: ballast
app.kubernetes.io/component: manager
{{- end }}

{{- define "ballast.serviceAccount" -}}
system:serviceaccount:{{ .Release.Namespace }}:ballast-controller-manager
{{- end }}

{{- define "ballast.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ $tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/*
The objects of one file of config/ (symlinked under files/), each renamed ballast-<name> as
config/default's namePrefix does, with the chart's labels and, when namespaced, the release
namespace. Their rules and specs are config/'s own, unchanged but for the manager's identity in
the revision hold (its namespace is the release's). Call with (list $ "files/..." "component").
*/}}
{{- define "ballast.fromConfig" -}}
{{- $ := index . 0 -}}
{{- $file := index . 1 -}}
{{- $component := index . 2 -}}
{{- $docs := regexSplit "(?m)^---[ \t]*$" ($.Files.Get $file) -1 -}}
{{- if eq (len $docs) 1 | and (not ($.Files.Get $file)) -}}
{{- fail (printf "%s is missing from the chart (a symlink into config/ that did not resolve)" $file) -}}
{{- end -}}
{{- range $doc := $docs }}
{{- $obj := fromYaml $doc }}
{{- if $obj.kind }}
{{- $meta := $obj.metadata }}
{{- $_ := set $meta "name" (printf "ballast-%s" $meta.name) }}
{{- $labels := merge (dict) ($meta.labels | default dict) }}
{{- range $k, $v := include "ballast.labels" $ | fromYaml }}{{ $_ := set $labels $k $v }}{{ end }}
{{- if $component }}{{ $_ := set $labels "app.kubernetes.io/component" $component }}{{ end }}
{{- $_ := set $meta "labels" $labels }}
{{- if hasKey $meta "namespace" }}{{ $_ := set $meta "namespace" $.Release.Namespace }}{{ end }}
{{- if $obj.roleRef }}{{ $_ := set $obj.roleRef "name" (printf "ballast-%s" $obj.roleRef.name) }}{{ end }}
{{- range $s := $obj.subjects | default list }}
{{- $_ := set $s "name" (printf "ballast-%s" $s.name) }}
{{- $_ := set $s "namespace" $.Release.Namespace }}
{{- end }}
{{- if and $obj.spec (hasKey $obj.spec "policyName") }}
{{- $_ := set $obj.spec "policyName" (printf "ballast-%s" $obj.spec.policyName) }}
{{- end }}
{{- if and $obj.spec $obj.spec.matchConditions }}
{{- range $c := $obj.spec.matchConditions }}
{{- $_ := set $c "expression" (replace "system:serviceaccount:ballast-system:ballast-controller-manager" (include "ballast.serviceAccount" $) $c.expression) }}
{{- end }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}
