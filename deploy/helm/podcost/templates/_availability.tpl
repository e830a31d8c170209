{{/*
How many replicas a component runs, and what follows from it: the Deployment's spec.replicas,
its default topology spread and whether it gets a PodDisruptionBudget. Called with
(dict "root" $ "item" <an item of podcost.components>); answers the number as a string.
A ranker's rankers.overrides.<strategy>.replicaCount wins over rankers.replicaCount.
(values.schema.json refuses more than one watcher or embedded replica without leader election.)
*/}}
{{- define "podcost.replicas" -}}
{{- $v := .root.Values -}}
{{- $own := index $v (ternary "rankers" .item.role (eq .item.role "ranker")) -}}
{{- $replicas := $own.replicaCount -}}
{{- if eq .item.role "ranker" -}}
{{- $override := index $v.rankers.overrides (.item.strategy | default "") | default dict -}}
{{- if hasKey $override "replicaCount" -}}
{{- $replicas = $override.replicaCount -}}
{{- end -}}
{{- end -}}
{{- $replicas | int -}}
{{- end -}}

{{/*
A component's topologySpreadConstraints: its own, else the global ones, else (with more than one
replica and topologySpread.enabled) one constraint per topologySpread.topologyKeys, so that a
zone or a node going away takes at most its share of the replicas. matchLabelKeys keeps the pods
of an old ReplicaSet out of the count during a rollout. Called like podcost.replicas; answers
YAML (a list) or nothing.
*/}}
{{- define "podcost.topologySpread" -}}
{{- $v := .root.Values -}}
{{- $own := index $v (ternary "rankers" .item.role (eq .item.role "ranker")) -}}
{{- $spread := $v.topologySpread -}}
{{- with ($own.topologySpreadConstraints | default $v.topologySpreadConstraints) -}}
{{- toYaml . -}}
{{- else -}}
{{- if and $spread.enabled (gt (include "podcost.replicas" . | int) 1) -}}
{{- $labels := dict "root" .root "component" .item.component -}}
{{- range $spread.topologyKeys }}
- topologyKey: {{ . }}
  maxSkew: {{ $spread.maxSkew | int }}
  whenUnsatisfiable: {{ $spread.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- include "podcost.componentSelectorLabels" $labels | nindent 6 }}
  matchLabelKeys: ["pod-template-hash"]
{{- end }}
{{- end -}}
{{- end -}}
{{- end -}}
