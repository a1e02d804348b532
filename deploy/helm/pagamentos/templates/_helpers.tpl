{{/* The release's name prefix, at most 40 characters so every derived name fits 63. */}}
{{- define "pagamentos.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pagamentos.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pagamentos.labels" -}}
{{ include "pagamentos.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pagamentos
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pagamentos.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "pagamentos.kafkaBootstrap" -}}
{{- if .Values.kafka.bootstrapServers -}}
{{ .Values.kafka.bootstrapServers }}
{{- else -}}
{{ .Values.strimzi.clusterName }}-kafka-bootstrap:9093
{{- end -}}
{{- end -}}

{{- define "pagamentos.kafkaCaSecret" -}}
{{ .Values.kafka.caSecret.name | default (printf "%s-cluster-ca-cert" .Values.strimzi.clusterName) }}
{{- end -}}

{{- define "pagamentos.postgresHost" -}}
{{ .Values.postgres.host | default (printf "%s-rw" .Values.cnpg.clusterName) }}
{{- end -}}

{{- define "pagamentos.postgresCaSecret" -}}
{{ .Values.postgres.caSecret.name | default (printf "%s-ca" .Values.cnpg.clusterName) }}
{{- end -}}

{{/* A PostgreSQL URL whose password is the environment variable named by .passwordVar (the
kubelet expands $(VAR) from an earlier env entry, so the password never appears in the
object). Arguments: root, role (the user name variable), db, passwordVar. */}}
{{- define "pagamentos.postgresUrl" -}}
{{- $v := .root.Values.postgres -}}
postgres://$({{ .userVar }}):$({{ .passwordVar }})@{{ include "pagamentos.postgresHost" .root }}:{{ $v.port }}/{{ .db }}?sslmode={{ $v.sslmode }}&sslrootcert=/etc/pagamentos/postgres-ca/ca.crt
{{- end -}}

{{/* env entries reading a basic-auth Secret's username and password into two variables */}}
{{- define "pagamentos.postgresCredentials" -}}
- name: {{ .prefix }}_USER
  valueFrom:
    secretKeyRef: {name: {{ .secret }}, key: username}
- name: {{ .prefix }}_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .secret }}, key: password}
{{- end -}}

{{/* Kafka settings shared by every Kafka client of a service (user: the kafka.users entry) */}}
{{- define "pagamentos.kafkaEnv" -}}
{{- $k := .root.Values.kafka -}}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ include "pagamentos.kafkaBootstrap" .root | quote }}
- name: KAFKA_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
- name: KAFKA_GROUP_PROTOCOL
  value: {{ $k.groupProtocol | quote }}
- name: APP_KAFKA_PARTITIONS
  value: {{ $k.partitions | quote }}
- name: APP_KAFKA_REPLICAS
  value: {{ $k.replicas | quote }}
- name: PAGAMENTOS_ALLOW_UNDER_REPLICATED
  value: {{ $k.allowUnderReplicated | quote }}
{{- if or (eq $k.securityProtocol "sasl_ssl") (eq $k.securityProtocol "sasl_plaintext") }}
- name: KAFKA_SASL_MECHANISM
  value: {{ $k.saslMechanism | quote }}
- name: KAFKA_SASL_USERNAME
  value: {{ .user.username | quote }}
- name: KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .user.existingSecret }}, key: {{ .user.passwordKey }}}
{{- end }}
{{- if or (eq $k.securityProtocol "sasl_ssl") (eq $k.securityProtocol "ssl") }}
- name: KAFKA_SSL_CA_LOCATION
  value: /etc/pagamentos/kafka-ca/ca.crt
{{- end }}
{{- end -}}

{{/* The container's security context: non-root 65532, nothing writable but /tmp */}}
{{- define "pagamentos.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "pagamentos.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* volumes every pod mounts: /tmp, the CA certificates (db: whether it reaches PostgreSQL) */}}
{{- define "pagamentos.volumes" -}}
{{- $root := .root -}}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- if .db }}
- name: postgres-ca
  secret:
    secretName: {{ include "pagamentos.postgresCaSecret" $root }}
    items: [{key: {{ $root.Values.postgres.caSecret.key }}, path: ca.crt}]
{{- end }}
{{- if and .kafka (or (eq $root.Values.kafka.securityProtocol "sasl_ssl") (eq $root.Values.kafka.securityProtocol "ssl")) }}
- name: kafka-ca
  secret:
    secretName: {{ include "pagamentos.kafkaCaSecret" $root }}
    items: [{key: {{ $root.Values.kafka.caSecret.key }}, path: ca.crt}]
{{- end }}
{{- end -}}

{{- define "pagamentos.volumeMounts" -}}
{{- $root := .root -}}
- {name: tmp, mountPath: /tmp}
{{- if .db }}
- {name: postgres-ca, mountPath: /etc/pagamentos/postgres-ca, readOnly: true}
{{- end }}
{{- if and .kafka (or (eq $root.Values.kafka.securityProtocol "sasl_ssl") (eq $root.Values.kafka.securityProtocol "ssl")) }}
- {name: kafka-ca, mountPath: /etc/pagamentos/kafka-ca, readOnly: true}
{{- end }}
{{- end -}}
