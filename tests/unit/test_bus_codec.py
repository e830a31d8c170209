"""aiokafka's zstd batches with kept contexts (``podcost_bus.codec``): what aiokafka's record
batches (its C extension, as the installed wheel runs them) write and read once the codec is
installed, and that its frames and aiokafka's own are read either way."""

from __future__ import annotations

import threading

import cramjam
import pytest
import zstandard
from aiokafka.record import default_records as python_records
from aiokafka.record._crecords import default_records as c_records
from aiokafka.record.memory_records import MemoryRecords

import podcost_bus.kafka  # noqa: F401  (installs the codec, as every Kafka process does)
from podcost_bus import codec

ZSTD = 4  # the record batch attribute of zstd (KIP-110)


def batch(values: list[bytes], builder: type = c_records.DefaultRecordBatchBuilder) -> bytes:
    """A record batch of ``values`` compressed with zstd, as aiokafka's producer builds it."""
    built = builder(
        magic=2,
        compression_type=ZSTD,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, value in enumerate(values):
        built.append(offset, timestamp=None, key=b"key", value=value, headers=[])
    return bytes(built.build())


def read(raw: bytes) -> list[bytes]:
    records = MemoryRecords(raw)
    out: list[bytes] = []
    while (next_batch := records.next_batch()) is not None:
        out.extend(bytes(record.value) for record in next_batch)
    return out


VALUES = [b'{"pod":"web-%d","node":"node-%d"}' % (i, i % 3) * 40 for i in range(25)]


def test_aiokafka_record_batches_use_the_kept_contexts() -> None:
    assert codec.installed()
    assert c_records.zstd_encode is codec.zstd_encode
    assert c_records.zstd_decode is codec.zstd_decode
    assert python_records.zstd_decode is codec.zstd_decode
    codec.install()  # again: nothing changes
    assert codec.installed()


@pytest.mark.parametrize("builder", [c_records.DefaultRecordBatchBuilder,
                                     python_records.DefaultRecordBatchBuilder])  # fmt: skip
def test_a_batch_written_and_read_back(builder: type) -> None:
    raw = batch(VALUES, builder)
    assert len(raw) < sum(map(len, VALUES)) // 4  # compressed
    assert read(raw) == VALUES


def test_frames_are_read_whoever_wrote_them() -> None:
    body = b"".join(VALUES)
    # aiokafka's own frames (cramjam), ours, and frames some clients write without their
    # content size, or several in one payload: all read the same.
    theirs = bytes(cramjam.zstd.compress(body, level=3))
    ours = codec.zstd_encode(body)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(body)
    two = codec.zstd_encode(body[:100]) + codec.zstd_encode(body[100:])
    for frame in (theirs, ours, unsized, two, memoryview(ours)):
        assert codec.zstd_decode(frame) == body
    # Ours are plain zstd frames that record their size: any reader reads them.
    assert bytes(cramjam.zstd.decompress(ours)) == body
    assert zstandard.frame_content_size(ours) == len(body)
    assert codec.zstd_encode(body, level=1) != codec.zstd_encode(body, level=19)


def test_a_frame_that_claims_much_is_left_to_aiokafkas_codec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # aiokafka's codec grows its output as it reads; a kept context allocates what the header
    # claims, so a header claiming more than any batch holds is not taken at its word.
    read_by_aiokafka: list[int] = []

    def aiokafka_decode(payload: bytes) -> bytes:
        read_by_aiokafka.append(len(payload))
        return bytes(cramjam.zstd.decompress(payload))

    monkeypatch.setattr(codec, "_AIOKAFKA_DECODE", aiokafka_decode)
    monkeypatch.setattr(codec, "MAX_SIZED_FRAME", 1000)
    assert codec.zstd_decode(codec.zstd_encode(b"x" * 1000)) == b"x" * 1000
    assert read_by_aiokafka == []
    big = codec.zstd_encode(b"y" * 1001)
    assert codec.zstd_decode(big) == b"y" * 1001
    assert read_by_aiokafka == [len(big)]
    with pytest.raises(cramjam.DecompressionError):  # a bad frame: aiokafka's error, as before
        codec.zstd_decode(b"\x28\xb5\x2f\xfd" + b"\x00" * 8)


def test_threads_each_have_their_own_contexts() -> None:
    bodies = [bytes([i]) * 5000 + b"".join(VALUES) for i in range(8)]
    frames = [codec.zstd_encode(body) for body in bodies]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for _ in range(200):
                assert codec.zstd_decode(frames[index]) == bodies[index]
                assert codec.zstd_decode(codec.zstd_encode(bodies[index])) == bodies[index]
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
