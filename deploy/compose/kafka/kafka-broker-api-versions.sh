#!/bin/sh
# Kafka's own kafka-broker-api-versions.sh, for the health check: succeeds once the broker
# answers an ApiVersions request. A small, quickly started JVM: it runs every few seconds.
exec java -Xmx64m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dlog4j.configuration=file:/opt/kafka/config/log4j.properties \
    -cp '/opt/kafka/libs/*' kafka.admin.BrokerApiVersionsCommand "$@"
