"""Checking an uploaded JSONL file as it streams in, line by line, without holding it whole.

`JsonlCheck` is fed the body's chunks in order: it writes each to the open
temporary file, hashes it, and checks every complete line (a JSON object, the
required fields present, within the caps). The first bad line stops the upload
with an error naming its line number and, where there is one, the field; the
caller then removes the temporary file, so nothing is stored.

Blank lines are skipped (a trailing newline is usual); line numbers count them,
so "line 1001" is what an editor shows as line 1001.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import BinaryIO

from app.errors import PayloadTooLarge, Unprocessable, UnsupportedMediaType

PARQUET_MAGIC = b"PAR1"


@dataclasses.dataclass(frozen=True)
class Caps:
    max_bytes: int
    max_rows: int
    max_line_bytes: int


@dataclasses.dataclass(frozen=True)
class Checked:
    sha256: str
    size_bytes: int
    rows: int
    fields: list[str]


def parquet_refused() -> UnsupportedMediaType:
    return UnsupportedMediaType(
        "Parquet uploads are not taken yet; convert the file to JSONL (one JSON object a "
        "line), e.g. pandas.read_parquet(f).to_json(out, orient='records', lines=True)",
        field="format",
    )


def too_large(size: int, limit: int) -> PayloadTooLarge:
    error = PayloadTooLarge(
        f"the dataset is over {size} bytes; the limit is {limit} bytes (the operator's "
        "RLAAS_DATASET_MAX_BYTES); nothing was stored: split it, or upload fewer rows",
        limit_bytes=limit,
    )
    error.extra["limit"] = "dataset_max_bytes"
    return error


def bad_line(line_no: int, reason: str, *, field: str | None = None) -> Unprocessable:
    error = Unprocessable(
        f"line {line_no}: {reason}; nothing was stored: fix the line and upload again",
        field=field or "body",
    )
    error.extra = {"line": line_no}
    return error


class JsonlCheck:
    def __init__(self, out: BinaryIO, caps: Caps, required: tuple[str, ...] = ()) -> None:
        self._out = out
        self._caps = caps
        self._required = required
        self._hash = hashlib.sha256()
        self._size = 0
        self._pending = bytearray()  # the line begun in an earlier chunk
        self._line_no = 0
        self._rows = 0
        self._fields: set[str] | None = None

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._size == 0 and chunk.startswith(PARQUET_MAGIC):
            raise parquet_refused()
        self._size += len(chunk)
        if self._size > self._caps.max_bytes:
            raise too_large(self._size, self._caps.max_bytes)
        self._hash.update(chunk)
        self._out.write(chunk)
        if b"\n" not in chunk:
            self._pending += chunk
        else:
            lines = chunk.split(b"\n")
            if self._pending:
                lines[0] = bytes(self._pending) + lines[0]
                self._pending.clear()
            self._pending += lines.pop()
            for line in lines:
                self._line(line)
        if len(self._pending) > self._caps.max_line_bytes:
            self._too_long(self._line_no + 1)

    def finish(self) -> Checked:
        if self._pending:
            self._line(bytes(self._pending))
            self._pending.clear()
        if self._rows == 0:
            raise Unprocessable(
                "the file has no rows; upload JSONL, one JSON object a line", field="body"
            )
        return Checked(
            sha256=self._hash.hexdigest(),
            size_bytes=self._size,
            rows=self._rows,
            fields=sorted(self._fields or ()),
        )

    def _too_long(self, line_no: int) -> None:
        raise bad_line(
            line_no,
            f"the line is over {self._caps.max_line_bytes} bytes (the operator's "
            "RLAAS_DATASET_MAX_LINE_BYTES)",
        )

    def _line(self, raw: bytes) -> None:
        self._line_no += 1
        if len(raw) > self._caps.max_line_bytes:
            self._too_long(self._line_no)
        if not raw.strip():
            return
        try:
            row = json.loads(raw)
        except UnicodeDecodeError:
            raise bad_line(self._line_no, "not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise bad_line(
                self._line_no, f"not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(row, dict):
            kind = type(row).__name__
            raise bad_line(self._line_no, f"a row must be a JSON object, not a {kind}")
        for name in self._required:
            if row.get(name) is None:
                raise bad_line(self._line_no, f"field {name!r} is missing (or null)", field=name)
        self._rows += 1
        if self._rows > self._caps.max_rows:
            error = PayloadTooLarge(
                f"the dataset has over {self._caps.max_rows} rows, the limit (the operator's "
                "RLAAS_DATASET_MAX_ROWS); nothing was stored: upload fewer rows",
                limit_bytes=self._caps.max_bytes,
            )
            error.extra |= {"limit": "dataset_max_rows", "limit_rows": self._caps.max_rows}
            raise error
        keys = set(row)
        self._fields = keys if self._fields is None else self._fields & keys


__all__ = ["Caps", "Checked", "JsonlCheck", "bad_line", "parquet_refused", "too_large"]
