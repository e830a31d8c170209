"""Benchmark of the producers' batch compression over the records podcost sends: what each codec
aiokafka offers costs per record, and what it saves.

A script, not a test (``python -m tests.bench.bench_compression [--workloads N]``). It builds
``bench_aggregator``'s workloads, of 25 pods and of 5, encodes their snapshots as the watcher
does and every ranked strategy's answers as the rankers do (batches of 100 answers a record, and
one answer a record), then, per kind of record, times in this process (best of ``--repeat``
passes, CPU time):

- the value as it is encoded (``podcost_contracts.messages.encode``: gzip at level 1 above 8 KB
  of JSON), and its JSON before that;
- aiokafka's own batch codecs (``aiokafka.codec.gzip_encode`` at its level 9, ``zstd_encode``
  at its level 3, cramjam's), and the zstd codec podcost's Kafka clients use instead
  (``podcost_bus.codec``: the same frames at the same level, with contexts kept between
  batches), each over the encoded value, which is what a producer with that batch compression
  spends per record, and the size that comes out;
- decoding them again (``gzip_decode`` / ``zstd_decode``), which every consumer of the topic
  spends per record.

One record a batch here; a producer's batch holds several records, which compress a little
better together, at about the same cost per byte.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# aiokafka's own codecs, bound before podcost_bus.kafka (imported below) puts podcost_bus.codec's
# zstd in their place.
from aiokafka.codec import gzip_decode, gzip_encode, zstd_decode, zstd_encode
from tests.bench.bench_aggregator import answers, batched, workloads
from tests.bench.record import record

from podcost_bus import codec
from podcost_contracts.messages import Encoded, Message, WorkloadSnapshotMessage, encode

Codec = Callable[[bytes], bytes]


def best_us(codec: Codec, values: Sequence[bytes], repeat: int) -> tuple[float, list[bytes]]:
    """The least CPU time ``codec`` took per value over ``repeat`` passes, and its outputs."""
    best = float("inf")
    out: list[bytes] = []
    for _ in range(repeat):
        started = time.process_time()
        out = [codec(value) for value in values]
        best = min(best, time.process_time() - started)
    return best / len(values) * 1e6, out


def mean_size(values: Sequence[bytes]) -> float:
    return sum(map(len, values)) / len(values)


def compare(kind: str, records: Sequence[Encoded], repeat: int) -> str:
    """Print what each batch codec costs over ``records``; return it as one line."""
    encoded = [record.value for record in records]
    json_bytes = sum(record.json_size for record in records) / len(records)
    print(f"\n{kind}: {len(encoded)} records, {json_bytes:,.0f} B of JSON, "
          f"{mean_size(encoded):,.0f} B encoded")  # fmt: skip
    print(f"  {'batch codec over the encoded value':<40} {'encode µs':>10} {'bytes':>8} "
          f"{'decode µs':>10}")  # fmt: skip
    summary = []
    for name, compress, inflate in (
        ("gzip (aiokafka, level 9)", gzip_encode, gzip_decode),
        ("zstd (aiokafka, level 3)", zstd_encode, zstd_decode),
        ("zstd (podcost_bus.codec, level 3)", codec.zstd_encode, codec.zstd_decode),
    ):
        cost, out = best_us(compress, encoded, repeat)
        back, _ = best_us(inflate, out, repeat)
        print(f"  {name:<40} {cost:>10.1f} {mean_size(out):>8,.0f} {back:>10.1f}")
        label = name.split()[0] + (" kept" if "podcost" in name else "")
        summary.append(f"{label} {cost:,.1f} / {back:,.1f} µs, {mean_size(out):,.0f} B")
    print(f"  {'none':<40} {0:>10.1f} {mean_size(encoded):>8,.0f} {0:>10.1f}")
    return f"{kind} ({mean_size(encoded):,.0f} B encoded): " + "; ".join(summary)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    assert zstd_decode is not codec.zstd_decode, "aiokafka's own zstd codec, not podcost's"
    figures = []
    for pods in (25, 5):
        snapshots = workloads(args.workloads, pods)
        ranks = answers(snapshots)
        kinds: list[tuple[str, Sequence[Message]]] = [
            (f"{pods}-pod snapshots", [WorkloadSnapshotMessage.of(item, emitted_at=time.time(),
                                                                  changed_at=time.time())
                                       for item in snapshots]),
            (f"{pods}-pod answers, 100 a record", batched(ranks, 100, 1)),
            (f"{pods}-pod answers, one a record", ranks[: args.workloads]),
        ]  # fmt: skip
        for kind, messages in kinds:
            figures.append(compare(kind, [encode(message) for message in messages], args.repeat))
    record(
        "bench_compression",
        f"CPU per record of each batch codec, encode / decode (best of {args.repeat} passes), and "
        f"bytes, over the records podcost sends for {args.workloads} workloads",
        figures,
        argv=None if argv is None else ["bench_compression", *argv],
    )


if __name__ == "__main__":
    main()
