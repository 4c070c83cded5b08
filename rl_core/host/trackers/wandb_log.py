"""Read a W&B run's transaction log (``run-<id>.wandb``), the file ``wandb sync`` uploads.

The file is LevelDB's log format: a 7-byte header (``:W&B``, a version), then 32 KiB
blocks of chunks, each a 7-byte header (CRC-32C, length, type) and its bytes; a record
is one FULL chunk or a FIRST, MIDDLE..., LAST run of them, and a block's tail too
short for a header is padding. Each record is one `wandb_internal_pb2.Record`.

wandb 0.31 has no reader of its own in Python (its core, in Go, writes and syncs the
file): this one is for knowing when the file is complete (`WandbOffline.close`) and for
tests. CRCs are not checked: a torn tail reads as the end of the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAGIC = b":W&B"
FILE_HEADER = 7
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def record_bytes(raw: bytes) -> Iterator[bytes]:
    """Each whole record's bytes in ``raw`` (a transaction log), in order; a record
    whose last chunk is not written yet is not answered."""
    if raw[: len(MAGIC)] != MAGIC:
        return
    pending, pos = b"", FILE_HEADER
    while pos + CHUNK_HEADER <= len(raw):
        if (left := BLOCK - pos % BLOCK) < CHUNK_HEADER:
            pos += left  # the block's padding
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + CHUNK_HEADER])
        end = pos + CHUNK_HEADER + length
        if kind == 0 or end > len(raw):
            return  # zeroed space, or a chunk still being written
        pending += raw[pos + CHUNK_HEADER : end]
        pos = end
        if kind in (FULL, LAST):
            yield pending
            pending = b""


def records(path: Path) -> Iterator[Any]:
    """The records of the transaction log at ``path``, as W&B's protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    for data in record_bytes(path.read_bytes()):
        # The module re-exports the message classes of its protobuf version's module
        # with `import *`, which mypy does not follow.
        yield pb.Record.FromString(data)  # type: ignore[attr-defined]


def has_exit(path: Path) -> bool:
    """Whether the log at ``path`` holds the run's exit record (what ``finish`` sends
    last): then every record logged before it is in the file too."""
    if not path.exists():
        return False
    return any(r.WhichOneof("record_type") == "exit" for r in records(path))


__all__ = ["has_exit", "record_bytes", "records"]
