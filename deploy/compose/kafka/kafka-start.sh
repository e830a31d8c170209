#!/bin/sh
# Starts one Kafka broker (KRaft) from the environment, as the apache/kafka image does: every
# KAFKA_<NAME> variable is the property <name> ("_" is ".", "__" is "_", "___" is "-"), the
# storage is formatted once with CLUSTER_ID, and the JVM replaces this shell.
set -eu
CONFIG=/var/lib/kafka/server.properties
# Variables that configure the JVM, not the broker.
NOT_PROPERTIES="KAFKA_HEAP_OPTS KAFKA_OPTS KAFKA_JVM_PERFORMANCE_OPTS"

if [ -z "$(ls /opt/kafka/libs/*.jar 2>/dev/null)" ]; then
    echo "kafka-start: no jars in /opt/kafka/libs (mount the ones 'make tools-kafka' builds)" >&2
    exit 1
fi

: > "$CONFIG"
env | sort | while IFS='=' read -r name value; do
    case "$name" in KAFKA_*) ;; *) continue ;; esac
    case " $NOT_PROPERTIES " in *" $name "*) continue ;; esac
    key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' \
        | sed -e 's/___/-/g' -e 's/__/\x01/g' -e 's/_/./g' -e 's/\x01/_/g')
    printf '%s=%s\n' "$key" "$value" >> "$CONFIG"
done

CLASSPATH='/opt/kafka/libs/*'
LOG4J="-Dlog4j.configuration=file:/opt/kafka/config/log4j.properties"
java $LOG4J -cp "$CLASSPATH" kafka.tools.StorageTool format \
    -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$CONFIG" --ignore-formatted
# shellcheck disable=SC2086  # the options are words
exec java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m} ${KAFKA_OPTS:-} $LOG4J -cp "$CLASSPATH" \
    kafka.Kafka "$CONFIG"
