"""aiokafka's zstd batch codec, with its compression contexts kept between batches.

aiokafka 0.14 compresses and decompresses zstd batches with cramjam (``aiokafka/codec.py``,
``zstd_encode`` and ``zstd_decode``), which sets up a new zstd context for every batch. A podcost
batch is small (a snapshot, a few answers, a decision: a few KB), so that set-up is most of the
cost: on this project's machines a 1.5 KB batch took ~27 µs to decompress and ~30 µs to compress
with cramjam, ~4 µs and ~6 µs with a context kept (``python -m tests.bench.bench_compression``
prints both). Every consumer pays the decompression of every batch it fetches, and several
consumers share a process (rankers together: one per strategy), so this is paid many times a
record. aiokafka upstream moves to the standard library's ``compression.zstd`` on Python 3.14
(aio-libs/aiokafka#1146); this module does the same with python-zstandard, the library that module
comes from, until then.

:func:`install` puts :func:`zstd_encode` and :func:`zstd_decode` where aiokafka's record batches
(its C extension and its pure-Python fallback) look them up. The frames are standard zstd frames,
readable by any Kafka client and broker; frames this module cannot read with a kept context
(without their content size in the header, as some other clients write them, or several frames in
one batch) are read by aiokafka's own codec. ``podcost_bus.kafka`` installs it on import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

import zstandard
from aiokafka import codec as aiokafka_codec
from aiokafka.record import default_records as python_records

try:  # aiokafka's C extension, used when it is built (it is, in the wheels)
    from aiokafka.record._crecords import default_records as c_records
except ImportError:  # pragma: no cover - a build without the extension
    c_records = None

#: aiokafka's level when the producer names none: the broker's default (KIP-390).
DEFAULT_LEVEL: Final = 3

#: aiokafka's own codec, for what a kept context does not read (see the module docstring).
_AIOKAFKA_DECODE: Final[Callable[[Any], bytes]] = aiokafka_codec.zstd_decode

#: A frame whose header says it holds more than this is read by aiokafka's codec, which grows its
#: output as it reads instead of allocating what the header claims: no batch podcost reads comes
#: near it (a fetch returns at most ``max_partition_fetch_bytes``, 1 MiB by default).
MAX_SIZED_FRAME: Final = 64 * 2**20


class _Contexts(threading.local):
    """One decompressor and one compressor per level, per thread: a zstd context serves one call
    at a time, and faust's consumer runs in a thread of its own."""

    def __init__(self) -> None:
        self.decompressor = zstandard.ZstdDecompressor()
        self.compressors: dict[int, zstandard.ZstdCompressor] = {}


_contexts = _Contexts()


def zstd_encode(payload: Any, level: int | None = None) -> bytes:
    """``payload`` as one zstd frame that records its content size (aiokafka's signature)."""
    level = DEFAULT_LEVEL if level is None else level
    compressor = _contexts.compressors.get(level)
    if compressor is None:
        compressor = _contexts.compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(payload)


def zstd_decode(payload: Any) -> bytes:
    """The bytes of the zstd frame(s) ``payload`` (aiokafka's signature): with the kept context
    when ``payload`` is one frame that records its content size, else with aiokafka's codec."""
    try:
        if 0 <= zstandard.frame_content_size(payload) <= MAX_SIZED_FRAME:
            out: bytes = _contexts.decompressor.decompress(payload, allow_extra_data=False)
            return out
    except zstandard.ZstdError:
        pass
    return _AIOKAFKA_DECODE(payload)


def install() -> None:
    """Make aiokafka's record batches use :func:`zstd_encode` and :func:`zstd_decode`
    (idempotent). aiokafka's record modules bind the codec's functions by name when imported, so
    it is their names that are replaced."""
    modules = [aiokafka_codec, python_records]
    if c_records is not None:
        modules.append(c_records)
    for module in modules:
        module.zstd_encode = zstd_encode
        module.zstd_decode = zstd_decode


def installed() -> bool:
    """Whether aiokafka's record batches use this module's codec."""
    modules = [python_records] + ([c_records] if c_records is not None else [])
    return all(
        getattr(module, "zstd_decode", None) is zstd_decode
        and getattr(module, "zstd_encode", None) is zstd_encode
        for module in modules
    )
