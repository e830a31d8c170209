{{/*
One component's Deployment; every Deployment of the chart is rendered by this template, called
with (dict "root" $ "item" <an item of podcost.components>). The item's role decides the
command, which settings (environment variables) the container gets, whether it mounts the
policy file and whether it may use the Kubernetes API:

  role        command                        kube API  policy  settings read
  watcher     podcost watcher                yes       yes     PODCOST_*, _KAFKA*, _WATCHER_*
  annotator   podcost annotator [--dry-run]  yes       no      PODCOST_*, _KAFKA*, _ANNOTATOR_*,
                                                               the watcher's scope (below)
  aggregator  podcost aggregator             no        yes     PODCOST_*, _KAFKA*, _AGGREGATOR_*
  ranker      podcost ranker --strategy S    no        yes     PODCOST_*, _KAFKA*
              (rankers.together: --strategy S for each strategy without an override)
  embedded    podcost run --strategy S...    yes       yes     all of the above but Kafka

PODCOST_CLUSTER goes to the roles with Kubernetes API access only (a cluster of their own);
the aggregator and the rankers serve every cluster and get no cluster name.
*/}}
{{- define "podcost.deployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $role := .item.role -}}
{{- $strategy := .item.strategy | default "" -}}
{{- $component := .item.component -}}
{{- $name := include "podcost.componentName" (dict "root" $root "component" $component) -}}
{{- $own := index $v (ternary "rankers" $role (eq $role "ranker")) -}}
{{- $replicas := include "podcost.replicas" . -}}
{{- $resources := $own.resources | default $v.resources -}}
{{- if and (eq $role "ranker") (hasKey $v.rankers.overrides $strategy) -}}
{{- $resources = (index $v.rankers.overrides $strategy).resources | default $resources -}}
{{- end -}}
{{- $kube := has $role (list "watcher" "annotator" "embedded") -}}
{{- $policy := ne $role "annotator" -}}
{{- $kafka := ne $role "embedded" -}}
{{- $watches := has $role (list "watcher" "embedded") -}}
{{- $annotates := has $role (list "annotator" "embedded") -}}
{{- $aggregates := has $role (list "aggregator" "embedded") -}}
{{- $fleet := and (eq $role "aggregator") $v.fleet.clusters -}}
{{- $keys := and (eq $role "aggregator") $v.fleet.keysSecret.name -}}
{{- $signs := and (eq $role "watcher") $v.fleet.signingKeySecret.name -}}
{{- $labels := dict "root" $root "component" $component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "podcost.componentLabels" $labels | nindent 4 }}
    {{- with $strategy }}
    podcost.dev/strategy: {{ . }}
    {{- end }}
spec:
  replicas: {{ $replicas | int }}
  revisionHistoryLimit: 3
  selector:
    matchLabels:
      {{- include "podcost.componentSelectorLabels" $labels | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "podcost.componentLabels" $labels | nindent 8 }}
        {{- with $strategy }}
        podcost.dev/strategy: {{ . }}
        {{- end }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $annotations := deepCopy $v.podAnnotations }}
      {{- if $policy }}
      {{- /* A policy change rolls the pods that read it. */}}
      {{- $_ := set $annotations "checksum/policy" (include (print $root.Template.BasePath "/policy-configmap.yaml") $root | sha256sum) }}
      {{- end }}
      {{- with $annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "podcost.serviceAccountName" $root }}
      automountServiceAccountToken: {{ and $kube $v.serviceAccount.automount }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with ($own.priorityClassName | default $v.priorityClassName) }}
      priorityClassName: {{ . }}
      {{- end }}
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds | int }}
      {{- with $v.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ $role }}
          image: {{ include "podcost.rankerImage" (dict "root" $root "strategy" $strategy) | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: ["podcost"]
          args:
            {{- if eq $role "embedded" }}
            - run
            {{- range (include "podcost.rankerStrategies" $root | fromJson).names }}
            - --strategy
            - {{ . | quote }}
            {{- end }}
            {{- else }}
            - {{ $role }}
            {{- end }}
            {{- if eq $role "ranker" }}
            {{- range (.item.strategies | default (list $strategy)) }}
            - --strategy
            - {{ . | quote }}
            {{- end }}
            {{- end }}
            {{- if and $v.dryRun $annotates }}
            - --dry-run
            {{- end }}
          ports:
            - name: http
              containerPort: {{ $v.http.port | int }}
              protocol: TCP
          env:
            {{- if $watches }}
            # The watcher's Lease namespace and its identity in the Lease.
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            {{- end }}
            {{- if $kube }}
            # Only what runs in a cluster has a cluster name: the core serves every cluster of
            # the fleet and takes each record's cluster from its key.
            - name: PODCOST_CLUSTER
              value: {{ $v.clusterName | default "local" | quote }}
            {{- end }}
            - name: PODCOST_HTTP_PORT
              value: {{ $v.http.port | int | quote }}
            - name: PODCOST_LOG_LEVEL
              value: {{ $v.log.level | quote }}
            - name: PODCOST_LOG_FORMAT
              value: {{ $v.log.format | quote }}
            {{- if .item.strategies }}
            # Several strategies' rankers in one process: their answers in shared records or not.
            - name: PODCOST_RANKER_COMBINE_STRATEGIES
              value: {{ $v.rankers.combineAnswers | quote }}
            {{- end }}
            {{- if $kube }}
            - name: PODCOST_ADOPT_FIELD_MANAGERS
              value: {{ join "," $v.adoptFieldManagers | quote }}
            - name: PODCOST_EVENTS
              value: {{ $v.events.enabled | quote }}
            {{- if $v.events.enabled }}
            - name: PODCOST_EVENTS_BURST
              value: {{ $v.events.burst | int | quote }}
            - name: PODCOST_EVENTS_REFILL_SECONDS
              value: {{ $v.events.refillSeconds | quote }}
            {{- end }}
            {{- end }}
            {{- if $policy }}
            - name: PODCOST_POLICY_FILE
              value: {{ printf "%s/policy.json" (include "podcost.policyDir" $root) | quote }}
            {{- with (include "podcost.remoteStrategies" $root | fromJson).names }}
            # Strategies whose ranker runs an image of its own: known here by name only.
            - name: PODCOST_REMOTE_STRATEGIES
              value: {{ join "," . | quote }}
            {{- end }}
            {{- end }}
            {{- if $fleet }}
            - name: PODCOST_FLEET_FILE
              value: {{ printf "%s/clusters.txt" (include "podcost.fleetDir" $root) | quote }}
            {{- end }}
            {{- if $keys }}
            - name: PODCOST_FLEET_KEYS_FILE
              value: "/etc/podcost/fleet-keys/keys.txt"
            {{- end }}
            {{- if $signs }}
            - name: PODCOST_WATCHER_SIGNING_KEY_FILE
              value: "/etc/podcost/signing/signing.key"
            {{- end }}
            {{- if $kafka }}
            {{- include "podcost.kafkaEnv" (dict "Values" $v "component" $component "role" $role) | trim | nindent 12 }}
            {{- end }}
            {{- if $kube }}
            {{- include "podcost.scopeEnv" $root | trim | nindent 12 }}
            {{- end }}
            {{- if $watches }}
            {{- include "podcost.watcherEnv" $root | trim | nindent 12 }}
            {{- end }}
            {{- if $annotates }}
            {{- include "podcost.annotatorEnv" $root | trim | nindent 12 }}
            {{- with $v.http.explainTokenSecret }}
            {{- if .name }}
            # /explain answers only this bearer token; /healthz, /readyz, /metrics stay open.
            - name: PODCOST_EXPLAIN_TOKEN
              valueFrom:
                secretKeyRef:
                  name: {{ .name }}
                  key: {{ .key }}
            {{- end }}
            {{- end }}
            {{- end }}
            {{- if $aggregates }}
            {{- include "podcost.aggregatorEnv" $root | trim | nindent 12 }}
            {{- end }}
            {{- if eq $role "aggregator" }}
            # How soon the group notices a crashed replica, whose partitions it then recovers.
            - name: PODCOST_KAFKA_SESSION_TIMEOUT_MS
              value: {{ mul $v.aggregator.sessionTimeoutSeconds 1000 | int | quote }}
            {{- end }}
            {{- with include "podcost.otelEnv" $root | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if $v.health.enabled }}
          {{- with $v.livenessProbe }}
          livenessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.readinessProbe }}
          readinessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.startupProbe }}
          startupProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- end }}
          {{- with $resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if $policy }}
            - name: policy
              mountPath: {{ include "podcost.policyDir" $root }}
              readOnly: true
            {{- end }}
            {{- if $fleet }}
            - name: fleet
              mountPath: {{ include "podcost.fleetDir" $root }}
              readOnly: true
            {{- end }}
            {{- if $keys }}
            - name: fleet-keys
              mountPath: /etc/podcost/fleet-keys
              readOnly: true
            {{- end }}
            {{- if $signs }}
            - name: signing-key
              mountPath: /etc/podcost/signing
              readOnly: true
            {{- end }}
            {{- if and $kafka (include "podcost.kafkaTlsFiles" $root) }}
            - name: kafka-tls
              mountPath: {{ include "podcost.kafkaTlsDir" $root }}
              readOnly: true
            {{- end }}
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        # A writable /tmp under a read-only root: Python's tempfile and faust's data directory.
        - name: tmp
          emptyDir: {}
        {{- if $policy }}
        - name: policy
          configMap:
            name: {{ include "podcost.fullname" $root }}-policy
        {{- end }}
        {{- if $fleet }}
        - name: fleet
          configMap:
            name: {{ include "podcost.fullname" $root }}-fleet
        {{- end }}
        {{- if $keys }}
        - name: fleet-keys
          secret:
            secretName: {{ $v.fleet.keysSecret.name }}
            items:
              - key: {{ $v.fleet.keysSecret.key }}
                path: keys.txt
        {{- end }}
        {{- if $signs }}
        - name: signing-key
          secret:
            secretName: {{ $v.fleet.signingKeySecret.name }}
            items:
              - key: {{ $v.fleet.signingKeySecret.key }}
                path: signing.key
        {{- end }}
        {{- if and $kafka (include "podcost.kafkaTlsFiles" $root) }}
        {{- include "podcost.kafkaTlsVolume" $root | trim | nindent 8 }}
        {{- end }}
        {{- with $v.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with ($own.nodeSelector | default $v.nodeSelector) }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with ($own.tolerations | default $v.tolerations) }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with ($own.affinity | default $v.affinity) }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "podcost.topologySpread" . }}
      topologySpreadConstraints:
        {{- . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* PODCOST_KAFKA*, PODCOST_TOPIC_*: podcost_bus.BusSettings. Secrets by reference only.
Called with (dict "Values" .Values "component" <component> "role" <role>): the client id names the
component ("<kafka.clientId>-ranker-age") in the broker's logs and quotas; the role picks the SASL
Secret (kafka.sasl.secretNames.<role>, else kafka.sasl.secretName): one principal per component. */}}
{{- define "podcost.kafkaEnv" -}}
{{- $k := .Values.kafka -}}
{{- $dir := include "podcost.kafkaTlsDir" . -}}
- name: PODCOST_KAFKA
  value: {{ $k.bootstrapServers | quote }}
- name: PODCOST_KAFKA_CLIENT_ID
  value: {{ printf "%s-%s" $k.clientId .component | quote }}
- name: PODCOST_KAFKA_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if $k.tls.caSecret.name }}
- name: PODCOST_KAFKA_SSL_CAFILE
  value: {{ printf "%s/ca.crt" $dir | quote }}
{{- end }}
{{- if $k.tls.clientSecret.name }}
- name: PODCOST_KAFKA_SSL_CERTFILE
  value: {{ printf "%s/tls.crt" $dir | quote }}
- name: PODCOST_KAFKA_SSL_KEYFILE
  value: {{ printf "%s/tls.key" $dir | quote }}
{{- end }}
{{- if $k.tls.keyPasswordSecret.name }}
- name: PODCOST_KAFKA_SSL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $k.tls.keyPasswordSecret.name }}
      key: {{ $k.tls.keyPasswordSecret.key }}
{{- end }}
{{- if $k.sasl.mechanism }}
{{- $secret := index $k.sasl.secretNames .role | default $k.sasl.secretName }}
{{- $secret = required (printf "kafka.sasl.mechanism is set: kafka.sasl.secretNames.%s or kafka.sasl.secretName must name the %s's Secret" .role .role) $secret }}
- name: PODCOST_KAFKA_SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: PODCOST_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $k.sasl.usernameKey }}
- name: PODCOST_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $k.sasl.passwordKey }}
{{- end }}
{{- $compression := ternary $k.aggregatorCompression $k.compression (eq .role "aggregator") }}
{{- if $compression }}
- name: PODCOST_KAFKA_COMPRESSION
  value: {{ $compression | quote }}
{{- end }}
- name: PODCOST_KAFKA_PARTITIONS
  value: {{ $k.partitions | int | quote }}
{{- with index $k.fetch .role }}
- name: PODCOST_KAFKA_FETCH_MIN_BYTES
  value: {{ .minBytes | int | quote }}
{{- if not (kindIs "invalid" .maxWaitMs) }}
- name: PODCOST_KAFKA_FETCH_MAX_WAIT_MS
  value: {{ .maxWaitMs | int | quote }}
{{- end }}
{{- end }}
- name: PODCOST_KAFKA_REPLICATION_FACTOR
  value: {{ $k.replicationFactor | int | quote }}
- name: PODCOST_TOPIC_WORKLOADS
  value: {{ $k.topics.workloads | quote }}
- name: PODCOST_TOPIC_RANKS
  value: {{ $k.topics.ranks | quote }}
- name: PODCOST_TOPIC_COSTS
  value: {{ $k.topics.costs | quote }}
- name: PODCOST_TOPIC_DEADLETTER
  value: {{ $k.topics.deadletter | quote }}
{{- end -}}

{{/* The CA and client certificate Secrets, projected into one directory. */}}
{{- define "podcost.kafkaTlsVolume" -}}
{{- $tls := .Values.kafka.tls -}}
- name: kafka-tls
  projected:
    defaultMode: 0440
    sources:
      {{- if $tls.caSecret.name }}
      - secret:
          name: {{ $tls.caSecret.name }}
          items:
            - key: {{ $tls.caSecret.key }}
              path: ca.crt
      {{- end }}
      {{- if $tls.clientSecret.name }}
      - secret:
          name: {{ $tls.clientSecret.name }}
          items:
            - key: {{ $tls.clientSecret.certKey }}
              path: tls.crt
            - key: {{ $tls.clientSecret.keyKey }}
              path: tls.key
      {{- end }}
{{- end -}}

{{/* The scope and opt-in rules (values `watch`), which the watcher ranks by and the annotator
verifies every decision against before it writes: both read the same variables. */}}
{{- define "podcost.scopeEnv" -}}
{{- $w := .Values.watch -}}
{{- with $w.namespace }}
- name: PODCOST_WATCHER_NAMESPACE
  value: {{ . | quote }}
{{- end }}
{{- with $w.namespaceSelector }}
- name: PODCOST_WATCHER_NAMESPACE_SELECTOR
  value: {{ . | quote }}
{{- end }}
- name: PODCOST_WATCHER_DEFAULT_ENABLED
  value: {{ $w.defaultEnabled | quote }}
{{- end -}}

{{/* PODCOST_WATCHER_*: podcost.watcher.service.WatcherSettings (the Lease's namespace and this
replica's identity come from POD_NAMESPACE and POD_NAME). */}}
{{- define "podcost.watcherEnv" -}}
{{- $le := .Values.leaderElection -}}
- name: PODCOST_WATCHER_DEBOUNCE_SECONDS
  value: {{ .Values.watcher.debounceSeconds | quote }}
- name: PODCOST_WATCHER_MAX_DELAY_SECONDS
  value: {{ .Values.watcher.maxDelaySeconds | quote }}
- name: PODCOST_WATCHER_LEADER_ELECTION
  value: {{ $le.enabled | quote }}
{{- if $le.enabled }}
- name: PODCOST_WATCHER_LEASE_NAME
  value: {{ include "podcost.leaseName" . | quote }}
- name: PODCOST_WATCHER_LEASE_DURATION_SECONDS
  value: {{ $le.leaseDurationSeconds | quote }}
- name: PODCOST_WATCHER_RENEW_DEADLINE_SECONDS
  value: {{ $le.renewDeadlineSeconds | quote }}
- name: PODCOST_WATCHER_RETRY_PERIOD_SECONDS
  value: {{ $le.retryPeriodSeconds | quote }}
{{- end }}
{{- end -}}

{{/* PODCOST_ANNOTATOR_*: podcost.annotator.settings.AnnotatorSettings. */}}
{{- define "podcost.annotatorEnv" -}}
{{- $a := .Values.annotator -}}
- name: PODCOST_ANNOTATOR_QPS
  value: {{ $a.qps | quote }}
- name: PODCOST_ANNOTATOR_BURST
  value: {{ $a.burst | int | quote }}
- name: PODCOST_ANNOTATOR_MAX_IN_FLIGHT
  value: {{ $a.maxInFlight | int | quote }}
- name: PODCOST_ANNOTATOR_HIGH_WATER
  value: {{ $a.highWater | int | quote }}
- name: PODCOST_ANNOTATOR_LOW_WATER
  value: {{ $a.lowWater | int | quote }}
- name: PODCOST_ANNOTATOR_OVERWRITE_FOREIGN
  value: {{ $a.overwriteForeign | quote }}
{{- end -}}

{{/* PODCOST_AGGREGATOR_*: podcost.aggregator.settings.AggregatorSettings. */}}
{{- define "podcost.aggregatorEnv" -}}
{{- $a := .Values.aggregator -}}
- name: PODCOST_AGGREGATOR_ENGINE
  value: {{ $a.engine | quote }}
- name: PODCOST_AGGREGATOR_DEADLINE_SECONDS
  value: {{ $a.deadlineSeconds | quote }}
- name: PODCOST_AGGREGATOR_STANDBY_REPLICAS
  value: {{ $a.standbyReplicas | int | quote }}
- name: PODCOST_AGGREGATOR_OVERWRITE_FOREIGN
  value: {{ $a.overwriteForeign | quote }}
{{- end -}}

{{/* The standard OTEL_* variables the OpenTelemetry SDK reads (podcost.runtime.telemetry). */}}
{{- define "podcost.otelEnv" -}}
{{- $o := .Values.opentelemetry -}}
{{- with $o.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- if $o.headersSecret.name }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ $o.headersSecret.name }}
      key: {{ $o.headersSecret.key }}
{{- end }}
{{- with $o.resourceAttributes }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "podcost.otelAttributes" . | quote }}
{{- end }}
{{- with $o.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with $o.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "podcost.otelAttributes" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%v" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
