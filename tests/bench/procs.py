"""What the benchmarks need to run podcost's services as real OS processes and watch them from
outside: the core (rankers and aggregator) as the Helm chart's core mode starts it, the bench's
agent processes next to it, the processes' counters over their ``/metrics`` endpoints, and each
process's CPU time and memory from ``/proc``.

Used by ``bench_pipeline`` (its mode "Kafka, one process per service"), ``bench_fleet`` and
``bench_soak``.
The processes are started with the shared harness ``tests.support.services``; the bench's own
agent processes (``tests.bench.bench_agent``, which feed synthetic watch streams into the real
watcher and annotator) are specs whose ``module`` is not ``podcost``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.services import ServiceSpec, chart_specs, sample

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


# --- the core, as the chart starts it ----------------------------------------------------------


def chart_core_specs(
    helm: Path,
    brokers: str,
    run: str,
    *,
    partitions: int | None = None,
    aggregator: Mapping[str, Any] | None = None,
    shared_rankers: bool = False,
    combine_answers: bool = False,
    replicas: int | None = None,
) -> list[ServiceSpec]:
    """One spec per process of the chart in core mode (a ranker per strategy of the default
    policy, and the aggregator; ``chart_specs``: the arguments and environment ``helm template``
    renders), over topics of their own (``bench-<run>.*``), of ``partitions`` partitions if
    given, with ``aggregator`` as the chart's ``aggregator`` values if given (``replicaCount``,
    ``deadlineSeconds`` ...). One variable is added: a faust app id of this run's own (the
    chart's default would share a consumer group and changelog topics with earlier runs on the
    same broker). ``shared_rankers``: the chart's ``rankers.together``, every strategy's ranker
    in ONE process (``rankers``: ``podcost ranker --strategy A --strategy B ...``, each strategy
    still in its own consumer group); ``combine_answers``: the chart's ``rankers.combineAnswers``
    (their answers in shared ``ranks-batch`` records). ``replicas``: the ``replicaCount`` of the
    aggregator and of the rankers (``n`` processes of each Deployment, named ``#1`` … ``#n``;
    default one)."""
    kafka: dict[str, Any] = {
        "bootstrapServers": brokers,
        "topics": {kind: f"bench-{run}.{kind}"
                   for kind in ("workloads", "ranks", "costs", "deadletter")},
    }  # fmt: skip
    if partitions is not None:
        kafka["partitions"] = partitions
    values: dict[str, Any] = {
        "mode": "core",
        "kafka": kafka,
        "log": {"format": "text", "level": "WARNING"},
        "aggregator": dict(aggregator or {}),
        "rankers": {"together": shared_rankers},
    }
    if combine_answers:
        values["rankers"]["combineAnswers"] = True
    if replicas is not None:
        values["aggregator"].setdefault("replicaCount", replicas)
        values["rankers"]["replicaCount"] = replicas
    specs = []
    for spec in chart_specs(helm, values):
        if spec.args[0] == "aggregator":
            env = {**spec.env, "PODCOST_AGGREGATOR_APP_ID": f"bench-{run}-aggregator"}
            spec = ServiceSpec(spec.name, spec.args, env, spec.files, spec.scratch)
        specs.append(spec)
    return specs


def strategies_in(spec: ServiceSpec) -> int:
    """How many strategies' rankers a ranker process runs (its ``--strategy`` options)."""
    return spec.args.count("--strategy") if spec.args and spec.args[0] == "ranker" else 0


def strategy_names(spec: ServiceSpec) -> list[str]:
    """The strategies whose rankers a ranker process runs (the values of its ``--strategy``)."""
    args = spec.args if spec.args and spec.args[0] == "ranker" else ()
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--strategy"]


def agent_spec(
    name: str, args: Sequence[str], env: Mapping[str, str], core: ServiceSpec
) -> ServiceSpec:
    """A bench agent process (``python -m tests.bench.bench_agent <args>``) with the bus
    settings the core was given (so it reads and writes the same topics; not its fetch
    settings) and ``env``."""
    bus = {
        k: v
        for k, v in core.env.items()
        if k.startswith(("PODCOST_KAFKA", "PODCOST_TOPIC_"))
        and not k.startswith("PODCOST_KAFKA_FETCH_")  # the chart's agent mode sets its own
    }
    bus["PODCOST_KAFKA_CLIENT_ID"] = f"bench-{name}"
    return ServiceSpec(
        name, tuple(args),
        {**bus, "PODCOST_LOG_FORMAT": "text", "PODCOST_LOG_LEVEL": "WARNING", **env},
        module="tests.bench.bench_agent",
    )  # fmt: skip


# --- counters over /metrics ---------------------------------------------------------------------


def consumed(metrics: Mapping[str, float], topic: str) -> float:
    """Records of ``topic`` a process consumed, whatever became of them."""
    return sample(metrics, "podcost_messages_consumed_total", topic=topic)


def produced(metrics: Mapping[str, float], topic: str) -> float:
    return sample(metrics, "podcost_messages_produced_total", topic=topic)


# --- CPU and memory from /proc ------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """One process at one instant, from ``/proc/<pid>/stat``."""

    cpu_seconds: float
    """User and system time so far."""
    rss_bytes: int


def usage(pid: int) -> Usage | None:
    """``None`` once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    # Fields 14, 15 (utime, stime) and 24 (rss), counted from 1 with pid and comm first.
    return Usage((int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[21]) * PAGE_BYTES)


@dataclass(frozen=True)
class MachineShare:
    """What the whole machine's cores did over an interval (``/proc/stat``): whether the
    processes measured had the cores to themselves, or the machine was full."""

    busy: float
    """Share of all cores running anything (user, nice, system, irq, softirq)."""
    idle: float
    """Share of all cores idle (idle and iowait)."""
    steal: float
    """Share of all cores the hypervisor gave to other guests (time this machine wanted and
    did not get)."""
    cores: int


def cpu_times() -> list[int]:
    """The first line of ``/proc/stat``: all cores' user, nice, system, idle, iowait, irq,
    softirq and steal time (clock ticks)."""
    first = Path("/proc/stat").read_text().split("\n", 1)[0]
    return [int(value) for value in first.split()[1:9]]


def machine_share(before: Sequence[int], after: Sequence[int]) -> MachineShare:
    user, nice, system, idle, iowait, irq, softirq, steal = (
        later - earlier for earlier, later in zip(before, after, strict=True)
    )
    total = max(1, user + nice + system + idle + iowait + irq + softirq + steal)
    busy = user + nice + system + irq + softirq
    return MachineShare(busy / total, (idle + iowait) / total, steal / total, os.cpu_count() or 1)


def describe_machine(share: MachineShare, *, indent: str = "    ") -> str:
    return (f"{indent}the machine's {share.cores} cores: {share.busy:.0%} busy, {share.idle:.0%} "
            f"idle, {share.steal:.0%} stolen by the host")  # fmt: skip


@dataclass
class CpuWatch:
    """CPU time of named processes over an interval: ``start()``, then ``stop()``; and what
    the whole machine did meanwhile (:attr:`machine`, once stopped)."""

    pids: Mapping[str, int]
    _before: dict[str, Usage] | None = None
    _machine_before: list[int] | None = None
    machine: MachineShare | None = None

    def start(self) -> None:
        self._before = {name: u for name, pid in self.pids.items() if (u := usage(pid))}
        self._machine_before = cpu_times()

    def stop(self, seconds: float) -> dict[str, tuple[float, int]]:
        """Per process: the fraction of one core it used over ``seconds``, and its RSS now."""
        assert self._before is not None, "started"
        assert self._machine_before is not None, "started"
        self.machine = machine_share(self._machine_before, cpu_times())
        out = {}
        for name, pid in self.pids.items():
            now, before = usage(pid), self._before.get(name)
            if now is not None and before is not None:
                out[name] = ((now.cpu_seconds - before.cpu_seconds) / seconds, now.rss_bytes)
        return out


def describe_usage(used: Mapping[str, tuple[float, int]], *, indent: str = "    ") -> str:
    """``name cpu% rss`` per process, busiest first, wrapped."""
    parts = [f"{name} {cpu:.0%} {rss / 2**20:.0f}MiB"
             for name, (cpu, rss) in sorted(used.items(), key=lambda kv: -kv[1][0])]  # fmt: skip
    lines, line = [], ""
    for part in parts:
        if line and len(line) + len(part) > 92:
            lines.append(line)
            line = ""
        line = f"{line}, {part}" if line else part
    lines.append(line)
    return "\n".join(indent + text for text in lines)
