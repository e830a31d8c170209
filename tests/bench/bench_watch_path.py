"""Benchmark of what an informer does with each pod watch line, without a cluster: CPU per event.

A script, not a test (``python -m tests.bench.bench_watch_path [--pods N --rounds R]``); it
prints numbers and asserts nothing. ``N`` pods as the API server serves a Deployment's pods that
kwok runs (``bench_store_memory.served``: managedFields, volumes, conditions and all; a third with a
cost podcost wrote), each ADDED then MODIFIED twice, as watch lines; each line goes through
``decode_event`` and ``apply_event`` into a fresh ``Store``, as the informer takes it in (the
handlers after that are not counted). Process CPU time per event, the best of ``R`` rounds
(interleaved):

- ``watcher``: whole pods, the watcher's informer (``WORKLOAD_RESOURCES``);
- ``annotator view, metadata only``: the lines the API server sends a metadata-only watch
  (``PartialObjectMetadata``), the annotator's own view (``ClusterView.resources``);
- ``annotator view, whole pods``: the same view fed whole pods, what it listed and watched
  before it asked for metadata only.

Each case's lines are taken in inside ``functools.reduce``, so that callgrind can count that
alone, steadier than CPU time on a shared machine: ``valgrind --tool=callgrind
--collect-atstart=no --toggle-collect=functools_reduce python -m tests.bench.bench_watch_path
--pods 300 --rounds 1`` (the three cases together; ``callgrind_annotate`` splits nothing by case).
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from dataclasses import replace
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_store_memory import served
from tests.bench.record import record

from podcost.annotator.plan import Scope
from podcost.annotator.view import ClusterView
from podcost_core.projection import SharedParts
from podcost_kube.informer import POD, Resource, apply_event, decode_event
from podcost_kube.store import Store


def watch_lines(pods: int, *, metadata_only: bool) -> list[bytes]:
    """Every pod ADDED, then MODIFIED twice, as watch lines: ``bench_store_memory``'s pods, of
    40 Deployments."""
    pods_served = [orjson.loads(line) for line in served(pods, 40)]
    lines = []
    for event in ("ADDED", "MODIFIED", "MODIFIED"):
        for pod in pods_served:
            pod["metadata"]["resourceVersion"] = str(len(lines) + 1)
            obj = pod
            if metadata_only:
                obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": pod["metadata"]}  # fmt: skip
            lines.append(orjson.dumps({"type": event, "object": obj}))
    return lines


def per_event(lines: list[bytes], resource: Resource) -> float:
    """Process CPU seconds per line, taken into a fresh store."""
    store, shared = Store(), SharedParts()

    def take(count: int, line: bytes) -> int:
        apply_event(store, resource, decode_event(line, resource=resource), shared)
        return count + 1

    gc.collect()
    started = time.process_time()
    functools.reduce(take, lines, 0)  # what callgrind counts (module docstring)
    return (time.process_time() - started) / len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    [view_pods] = [r for r in ClusterView(Scope()).resources() if r.kind == POD.kind]
    whole = watch_lines(args.pods, metadata_only=False)
    cases = [
        ("watcher", whole, POD),
        ("annotator view, metadata only", watch_lines(args.pods, metadata_only=True), view_pods),
        ("annotator view, whole pods", whole, replace(view_pods, metadata_only=False)),
    ]
    print(
        f"{args.pods} pods, each ADDED then MODIFIED twice ({len(whole)} watch lines, "
        f"{len(whole[0]):,} bytes a whole pod); CPU per event, best of {args.rounds} rounds:"
    )
    best = [float("inf")] * len(cases)
    for _ in range(args.rounds):  # interleaved, so that a busy moment touches every case
        for index, (_, lines, resource) in enumerate(cases):
            best[index] = min(best[index], per_event(lines, resource))
    for (name, _, _), seconds in zip(cases, best, strict=True):
        print(f"  {name:32} {seconds * 1e6:6.1f} µs")
    record(
        "bench_watch_path",
        f"CPU per pod watch event taken into an informer's store, {args.pods:,} kwok-like pods "
        f"each added then modified twice, best of {args.rounds} interleaved rounds",
        [
            f"{name}: {seconds * 1e6:.1f} µs per event"
            for (name, _, _), seconds in zip(cases, best, strict=True)
        ],
    )


if __name__ == "__main__":
    main()
