"""Checking an uploaded dataset as it streams in, without holding it whole.

`RowCheck` holds the checks every row passes, whichever file it came in: a JSON
object, the required fields present and not null, within the row cap; it keeps
the fields every row has. `JsonlCheck` is fed a JSONL body's chunks in order: it
writes each to the open temporary file, hashes it, and checks every complete
line. A Parquet body takes another path (`app.services.upload_parquet`), which
ends in the same `RowCheck` and stores the rows as JSONL. The first bad row stops
the upload with an error naming its number and, where there is one, the field;
the caller then removes the temporary files, so nothing is stored.

Blank lines are skipped (a trailing newline is usual); line numbers count them,
so "line 1001" is what an editor shows as line 1001.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, BinaryIO, Literal

from app.errors import PayloadTooLarge, Unprocessable

PARQUET_MAGIC = b"PAR1"

# What a refusal calls a row: a JSONL file's "line" (blank ones counted), a Parquet "row".
Unit = Literal["line", "row"]


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


def too_large(size: int, limit: int) -> PayloadTooLarge:
    error = PayloadTooLarge(
        f"the dataset is over {size} bytes; the limit is {limit} bytes (the operator's "
        "RLAAS_DATASET_MAX_BYTES); nothing was stored: split it, or upload fewer rows",
        limit_bytes=limit,
    )
    error.extra["limit"] = "dataset_max_bytes"
    return error


def bad_line(
    number: int, reason: str, *, field: str | None = None, unit: Unit = "line"
) -> Unprocessable:
    error = Unprocessable(
        f"{unit} {number}: {reason}; nothing was stored: fix the {unit} and upload again",
        field=field or "body",
    )
    error.extra = {unit: number}
    return error


class RowCheck:
    """The checks of one row, in order; the count and the fields every row has."""

    def __init__(self, caps: Caps, required: tuple[str, ...], unit: Unit) -> None:
        self.caps = caps
        self.required = required
        self.unit = unit
        self.rows = 0
        self._fields: set[str] | None = None

    def accept(self, number: int, row: object) -> None:
        if not isinstance(row, dict):
            kind = type(row).__name__
            raise bad_line(number, f"a row must be a JSON object, not a {kind}", unit=self.unit)
        for name in self.required:
            if row.get(name) is None:
                raise bad_line(
                    number, f"field {name!r} is missing (or null)", field=name, unit=self.unit
                )
        self.rows += 1
        if self.rows > self.caps.max_rows:
            raise too_many_rows(self.caps)
        keys = set(row)
        self._fields = keys if self._fields is None else self._fields & keys

    def too_long(self, number: int) -> Unprocessable:
        what = "line is" if self.unit == "line" else "row is, as a line of JSON,"
        return bad_line(
            number,
            f"the {what} over {self.caps.max_line_bytes} bytes (the operator's "
            "RLAAS_DATASET_MAX_LINE_BYTES)",
            unit=self.unit,
        )

    def checked(self, sha256: str, size: int) -> Checked:
        if self.rows == 0:
            raise Unprocessable(
                "the file has no rows; upload JSONL (one JSON object a line) or Parquet",
                field="body",
            )
        return Checked(sha256=sha256, size_bytes=size, rows=self.rows, fields=self.fields())

    def fields(self) -> list[str]:
        return sorted(self._fields or ())


def too_many_rows(caps: Caps) -> PayloadTooLarge:
    error = PayloadTooLarge(
        f"the dataset has over {caps.max_rows} rows, the limit (the operator's "
        "RLAAS_DATASET_MAX_ROWS); nothing was stored: upload fewer rows",
        limit_bytes=caps.max_bytes,
    )
    error.extra |= {"limit": "dataset_max_rows", "limit_rows": caps.max_rows}
    return error


class JsonlCheck:
    def __init__(self, out: BinaryIO, caps: Caps, required: tuple[str, ...] = ()) -> None:
        self._out = out
        self._caps = caps
        self._rows = RowCheck(caps, required, "line")
        self._hash = hashlib.sha256()
        self._size = 0
        self._pending = bytearray()  # the line begun in an earlier chunk
        self._line_no = 0

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
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
            raise self._rows.too_long(self._line_no + 1)

    def finish(self) -> Checked:
        if self._pending:
            self._line(bytes(self._pending))
            self._pending.clear()
        return self._rows.checked(self._hash.hexdigest(), self._size)

    def _line(self, raw: bytes) -> None:
        self._line_no += 1
        if len(raw) > self._caps.max_line_bytes:
            raise self._rows.too_long(self._line_no)
        if not raw.strip():
            return
        try:
            row: Any = json.loads(raw)
        except UnicodeDecodeError:
            raise bad_line(self._line_no, "not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise bad_line(
                self._line_no, f"not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        self._rows.accept(self._line_no, row)


__all__ = [
    "PARQUET_MAGIC",
    "Caps",
    "Checked",
    "JsonlCheck",
    "RowCheck",
    "bad_line",
    "too_large",
    "too_many_rows",
]
