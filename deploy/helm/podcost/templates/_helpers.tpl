{{/* The chart name, truncated to a DNS label. */}}
{{- define "podcost.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The release-qualified name every object is named from. Component objects append
"-<component>" (e.g. "-watcher", "-ranker-topology-spread"), so it keeps room for them.
*/}}
{{- define "podcost.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "podcost.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select this release's pods (stable across upgrades). */}}
{{- define "podcost.selectorLabels" -}}
app.kubernetes.io/name: {{ include "podcost.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "podcost.labels" -}}
helm.sh/chart: {{ include "podcost.chart" . }}
{{ include "podcost.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: podcost
{{- end -}}

{{/* The service account the pods run as. */}}
{{- define "podcost.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "podcost.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Labels of one component's objects; call with (dict "root" $ "component" "watcher").
The component's selector is podcost.selectorLabels plus app.kubernetes.io/component.
*/}}
{{- define "podcost.componentLabels" -}}
{{ include "podcost.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "podcost.componentSelectorLabels" -}}
{{ include "podcost.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
"true" when the release runs everything in one `podcost run` Deployment: mode "all" and no
Kafka bootstrap servers configured (the in-process bus). Empty otherwise.
*/}}
{{- define "podcost.embedded" -}}
{{- if and (eq .Values.mode "all") (not .Values.kafka.bootstrapServers) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the watcher runs (its own Deployment, or inside the embedded one). */}}
{{- define "podcost.runsWatcher" -}}
{{- if ne .Values.mode "core" -}}true{{- end -}}
{{- end -}}

{{/* "true" when the annotator runs (same rule as the watcher: modes all and agent). */}}
{{- define "podcost.runsAnnotator" -}}
{{- if ne .Values.mode "core" -}}true{{- end -}}
{{- end -}}

{{/* "true" when the rankers and the aggregator run (modes all and core). */}}
{{- define "podcost.runsCore" -}}
{{- if ne .Values.mode "agent" -}}true{{- end -}}
{{- end -}}

{{/* The Lease the watcher replicas campaign for, in the release namespace. */}}
{{- define "podcost.leaseName" -}}
{{- default (printf "%s-watcher" (include "podcost.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
The name of one component's objects (Deployment, Service, PDB): "<fullname>-<component>".
Fails, rather than truncating into a clash, when it is longer than a DNS label.
*/}}
{{- define "podcost.componentName" -}}
{{- $name := printf "%s-%s" (include "podcost.fullname" .root) .component -}}
{{- if gt (len $name) 63 -}}
{{- fail (printf "object name %q is longer than 63 characters: set a shorter fullnameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The strategies that get a ranker: the policy's, then rankers.extraStrategies, once each. */}}
{{- define "podcost.rankerStrategies" -}}
{{- $names := list -}}
{{- range .Values.policy.strategies -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- range .Values.rankers.extraStrategies -}}
{{- $names = append $names . -}}
{{- end -}}
{{- dict "names" ($names | uniq) | toJson -}}
{{- end -}}

{{/*
Every Deployment the release runs, as JSON {"items": [{"component", "role", "strategy"}]}:
services.yaml and pdb.yaml range over it so each Deployment gets its Service and PDB. With
rankers.together, the strategies without an override share one item, {"component": "rankers",
"role": "ranker", "strategies": [...]}.
*/}}
{{- define "podcost.components" -}}
{{- $items := list -}}
{{- if include "podcost.embedded" . -}}
{{- $items = append $items (dict "component" "embedded" "role" "embedded") -}}
{{- else -}}
{{- if include "podcost.runsWatcher" . -}}
{{- $items = append $items (dict "component" "watcher" "role" "watcher") -}}
{{- $items = append $items (dict "component" "annotator" "role" "annotator") -}}
{{- end -}}
{{- if include "podcost.runsCore" . -}}
{{- $items = append $items (dict "component" "aggregator" "role" "aggregator") -}}
{{- $together := list -}}
{{- range (include "podcost.rankerStrategies" . | fromJson).names -}}
{{- if and $.Values.rankers.together (not (hasKey $.Values.rankers.overrides .)) -}}
{{- $together = append $together . -}}
{{- else -}}
{{- $items = append $items (dict "component" (printf "ranker-%s" .) "role" "ranker" "strategy" .) -}}
{{- end -}}
{{- end -}}
{{- with $together -}}
{{- $items = append $items (dict "component" "rankers" "role" "ranker" "strategies" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "items" $items | toJson -}}
{{- end -}}

{{- define "podcost.image" -}}
{{- include "podcost.imageRef" (dict "image" .Values.image "root" .) -}}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}: the digest wins over the tag,
which defaults to the chart's appVersion. */}}
{{- define "podcost.imageRef" -}}
{{- $image := .image -}}
{{- $ref := printf "%s/%s" ($image.registry | default "") $image.repository | trimPrefix "/" -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $ref $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (default .root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The image of one ranker: rankers.overrides.<strategy>.image (a plugin's image, layered on
podcost's; its registry defaults to image.registry), else podcost's image. */}}
{{- define "podcost.rankerImage" -}}
{{- $override := index .root.Values.rankers.overrides .strategy | default dict -}}
{{- if $override.image -}}
{{- $image := merge (dict) $override.image (dict "registry" .root.Values.image.registry) -}}
{{- include "podcost.imageRef" (dict "image" $image "root" .root) -}}
{{- else -}}
{{- include "podcost.image" .root -}}
{{- end -}}
{{- end -}}

{{/* The strategies whose ranker runs an image of its own (rankers.overrides.<name>.image): the
other components have podcost's image, without the plugin, and know them by name only
(PODCOST_REMOTE_STRATEGIES). As JSON {"names": [...]}. */}}
{{- define "podcost.remoteStrategies" -}}
{{- $names := list -}}
{{- range $name, $override := .Values.rankers.overrides -}}
{{- if and (kindIs "map" $override) $override.image -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- end -}}
{{- dict "names" ($names | sortAlpha) | toJson -}}
{{- end -}}

{{/* Where the policy ConfigMap is mounted, and the file the services read. */}}
{{- define "podcost.policyDir" -}}/etc/podcost/policy{{- end -}}
{{- define "podcost.kafkaTlsDir" -}}/etc/podcost/kafka-tls{{- end -}}
{{- define "podcost.fleetDir" -}}/etc/podcost/fleet{{- end -}}

{{/* The Kafka TLS volume is needed when a CA or a client certificate Secret is named. */}}
{{- define "podcost.kafkaTlsFiles" -}}
{{- $tls := .Values.kafka.tls -}}
{{- if or $tls.caSecret.name $tls.clientSecret.name -}}true{{- end -}}
{{- end -}}

{{/*
Checks across values that the schema cannot express; each fails with one line naming the
values. (The services check the same at start; failing here stops a bad release before it rolls.)
*/}}
{{- define "podcost.validate" -}}
{{- if and (eq .Values.mode "agent") (not .Values.clusterName) -}}
{{- fail "clusterName is required in agent mode: each cluster's agent reads the costs topic of its own name" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range .Values.policy.strategies -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "policy.strategies: %q appears more than once" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- end -}}
{{- $rankers := (include "podcost.rankerStrategies" . | fromJson).names -}}
{{- range $name, $_ := .Values.rankers.overrides -}}
{{- if not (has $name $rankers) -}}
{{- fail (printf "rankers.overrides.%s: no ranker runs %q (not in policy.strategies or rankers.extraStrategies)" $name $name) -}}
{{- end -}}
{{- end -}}
{{- range (include "podcost.remoteStrategies" . | fromJson).names -}}
{{- $image := (index $.Values.rankers.overrides .).image -}}
{{- if not $image.repository -}}
{{- fail (printf "rankers.overrides.%s.image: needs a repository" .) -}}
{{- end -}}
{{- if include "podcost.embedded" $ -}}
{{- fail (printf "rankers.overrides.%s.image: embedded mode runs every strategy in one process of podcost's image; install the plugin in that image instead" .) -}}
{{- end -}}
{{- end -}}
{{- $a := .Values.annotator -}}
{{- if ge (float64 $a.lowWater) (float64 $a.highWater) -}}
{{- fail (printf "annotator.lowWater (%v) must be below annotator.highWater (%v)" $a.lowWater $a.highWater) -}}
{{- end -}}
{{- $le := .Values.leaderElection -}}
{{- if and $le.enabled (ge (float64 $le.renewDeadlineSeconds) (float64 $le.leaseDurationSeconds)) -}}
{{- fail (printf "leaderElection.renewDeadlineSeconds (%v) must be below leaderElection.leaseDurationSeconds (%v)" $le.renewDeadlineSeconds $le.leaseDurationSeconds) -}}
{{- end -}}
{{- end -}}
