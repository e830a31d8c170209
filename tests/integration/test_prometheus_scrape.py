"""A real Prometheus scrapes real podcost processes as the chart's ServiceMonitor would, evaluates
the chart's alert rules over what it scraped, and pages on a real fault.

The ranker of the chart's core mode runs as a process over the real broker (``chart_specs``;
the aggregator's Deployment is left out, for time: ``test_prometheus_alerts.py`` runs more); a
real Prometheus (``podcost_localinfra.prometheus``) scrapes them every
second with the targets and labels the rendered ServiceMonitor gives them
(``tests/support/scrape.py``) and evaluates the rendered PrometheusRule, unchanged, every second.

- Every target is up, every podcost series carries the ``component`` label, every rule evaluates
  without error, and a healthy run fires no alert.
- A record that is not a message, published to the workloads topic, is dead-lettered by the
  ranker, and ``PodcostDeadLetters`` fires (the rule has no ``for:``): the first dead letter of a
  process pages, not only the second (its series is scraped at 0 before it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from tests.support.pipeline import fresh_kafka_settings
from tests.support.scrape import (
    alert_rule_groups,
    alert_states,
    monitor_targets,
    running_prometheus,
    wait_for,
)
from tests.support.services import assert_alive, chart_specs, processes
from tests.support.tools import require_helm

pytestmark = pytest.mark.integration

STRATEGY = "age"


async def test_prometheus_scrapes_the_chart_s_targets_and_pages_on_a_dead_letter(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    helm = require_helm()
    bus = fresh_kafka_settings(kafka_bootstrap, "prom")
    values = {"mode": "core", "kafka": {"bootstrapServers": kafka_bootstrap},
              "policy": {"strategies": [{"name": STRATEGY}]}}  # fmt: skip
    specs = [spec for spec in chart_specs(helm, values) if spec.name == f"ranker-{STRATEGY}"]
    env = {
        "PODCOST_TOPIC_WORKLOADS": bus.topic_workloads, "PODCOST_TOPIC_RANKS": bus.topic_ranks,
        "PODCOST_TOPIC_COSTS": bus.topic_costs, "PODCOST_TOPIC_DEADLETTER": bus.topic_deadletter,
        "PODCOST_AGGREGATOR_APP_ID": f"{bus.topic_workloads}-aggregator",
    }  # fmt: skip
    groups = alert_rule_groups(helm, values)
    async with processes(specs, env=env, log_dir=tmp_path / "logs") as running:
        targets, path = monitor_targets(helm, values, running)
        jobs = {target.labels["job"] for target in targets}
        assert jobs == {f"ranker-{STRATEGY}"}, targets
        with running_prometheus(tmp_path / "prometheus", targets, groups,
                                metrics_path=path) as server:  # fmt: skip

            def all_up() -> bool:
                up = server.query("up == 1")
                return {sample["metric"]["job"] for sample in up} == jobs

            await wait_for(all_up, "every target up", timeout=30)

            def rules_evaluated() -> bool:
                return all(rule.get("lastEvaluation", "").startswith("2")
                           and rule["evaluationTime"] > 0 for rule in server.rules())  # fmt: skip

            await wait_for(rules_evaluated, "every rule evaluated", timeout=30)
            for target in server.targets():
                assert target["health"] == "up", target
                assert set(target["labels"]) >= {"job", "namespace", "service", "pod",
                                                  "container", "endpoint"}, target  # fmt: skip
            unlabelled = server.query(
                '{__name__=~"podcost_.+", __name__!="podcost_build_info", component=""}'
            )
            assert unlabelled == [], unlabelled
            by_job = server.query('count by (job, component) ({__name__=~"podcost_.+"})')
            assert {(s["metric"]["job"], s["metric"].get("component")) for s in by_job} >= {
                (job, job) for job in jobs
            }, by_job
            for rule in server.rules():
                assert rule["health"] == "ok", rule
                assert rule["state"] == "inactive", rule  # a healthy run pages nobody
            # The alert's input, at 0 before any dead letter, with the labels it groups by.
            dead = server.query('podcost_messages_consumed_total{outcome="dead_letter"}')
            assert [(s["metric"]["job"], s["metric"]["topic"], s["value"][1]) for s in dead] == [
                (f"ranker-{STRATEGY}", bus.topic_workloads, "0")
            ], dead

            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait(bus.topic_workloads, b"not a message", key=b"x/y")
            finally:
                await producer.stop()
            poisoned = time.monotonic()

            def paged() -> bool:
                assert_alive(running)
                firing = {
                    (alert["labels"]["job"], alert["labels"]["topic"])
                    for alert in alert_states(server, "PodcostDeadLetters")
                    if alert["state"] == "firing"
                }
                return firing == {(job, bus.topic_workloads) for job in jobs}

            await wait_for(paged, "PodcostDeadLetters firing", timeout=30)
            print(f"PodcostDeadLetters fired {time.monotonic() - poisoned:.1f}s after the record")
            [alert, *_] = alert_states(server, "PodcostDeadLetters")
            assert alert["labels"]["severity"] == "warning"
            assert alert["annotations"]["runbook_url"].endswith("#podcostdeadletters")
