"""One message of every kind, encoded or decoded by whichever podcost runs this file.

Run as a script by an interpreter of some release of podcost (``tests/support/previous.py``
runs it with the previous release's and with this checkout's), so it imports nothing of the
tests and uses only what every release since the batch of ranks has: the message models,
``encode``, ``decode`` and the per-topic ``decode_*_record`` readers.

- ``contract_samples.py encode INPUTS``: each payload of ``INPUTS`` (kind → the message's
  fields as JSON) built into its model and encoded as this release's producers do, printed as
  JSON: kind → ``key``, ``headers`` and ``value`` (the JSON text) or ``value_base64`` (gzip).
- ``contract_samples.py decode ENCODED INPUTS``: each record of ``ENCODED`` read as this
  release's consumer of its topic reads it; kind → ``ok`` when it decodes to the model built
  from its payload in ``INPUTS``, else what went wrong.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

from podcost_contracts import messages
from podcost_contracts.messages import (
    DeadLetter,
    DesiredCostsMessage,
    ReleaseCostsMessage,
    StrategyRanksBatchMessage,
    StrategyRanksMessage,
    WorkloadGoneMessage,
    WorkloadSnapshotMessage,
)

KINDS: dict[str, type[messages.Message]] = {
    kind.KIND: kind
    for kind in (WorkloadSnapshotMessage, WorkloadGoneMessage, StrategyRanksMessage,
                 StrategyRanksBatchMessage, DesiredCostsMessage, ReleaseCostsMessage, DeadLetter)
}  # fmt: skip

#: The trace context every sample carries (a W3C version-00 traceparent).
TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "podcost=sample",
}


def read(kind: str, record: dict[str, Any]) -> messages.Message:
    """``record`` as the consumer of its topic reads it."""
    headers = {name: value.encode() for name, value in record["headers"].items()}
    if "value_base64" in record:
        value = base64.b64decode(record["value_base64"])
    else:
        value = record["value"].encode()
    key = record["key"]
    if kind in (WorkloadSnapshotMessage.KIND, WorkloadGoneMessage.KIND):
        return messages.decode_workload_record(value, headers, key=key)
    if kind in (StrategyRanksMessage.KIND, StrategyRanksBatchMessage.KIND):
        return messages.decode_ranks_record(value, headers, key=key)
    if kind in (DesiredCostsMessage.KIND, ReleaseCostsMessage.KIND):
        return messages.decode_costs_record(value, headers, key=key)
    return messages.decode(KINDS[kind], value, headers, key=key)


def encode_all(inputs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, payload in inputs.items():
        encoded = messages.encode(KINDS[kind].model_validate(payload), trace=TRACE)
        record: dict[str, Any] = {
            "key": None if encoded.key is None else encoded.key.decode(),
            "headers": {name: value.decode() for name, value in encoded.headers.items()},
        }
        if encoded.compressed:
            record["value_base64"] = base64.b64encode(encoded.value).decode()
        else:
            record["value"] = encoded.value.decode()
        out[kind] = record
    return out


def decode_all(encoded: dict[str, Any], inputs: dict[str, Any]) -> dict[str, str]:
    verdicts: dict[str, str] = {}
    for kind, record in encoded.items():
        if kind not in KINDS:  # not a record (the fixture's commit)
            continue
        try:
            message = read(kind, record)
        except messages.DecodeError as error:
            verdicts[kind] = f"refused: {error.reason}"
            continue
        expected = KINDS[kind].model_validate(inputs[kind])
        verdicts[kind] = "ok" if message == expected else f"read as {message!r}"
    return verdicts


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "encode":
        with open(argv[1]) as inputs:
            print(json.dumps(encode_all(json.load(inputs)), indent=1, sort_keys=True))
    elif len(argv) == 3 and argv[0] == "decode":
        with open(argv[1]) as encoded, open(argv[2]) as inputs:
            print(json.dumps(decode_all(json.load(encoded), json.load(inputs)), indent=1))
    else:
        raise SystemExit("usage: contract_samples.py encode INPUTS | decode ENCODED INPUTS")


if __name__ == "__main__":
    main(sys.argv[1:])
