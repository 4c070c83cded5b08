"""A Parquet upload: received to a temporary file, then read back as JSONL rows.

Parquet cannot be checked as it streams (its schema and row-group index are in a
footer at the end of the file), so the body is written to a temporary file first,
counted against the same byte cap as a JSONL upload (413 as soon as it passes).
Then pyarrow reads it one row group at a time, in record batches (a row group is
the most it holds in memory; the file never is), and each row is

- checked for values JSON can hold: a column of a type JSON has no form for
  (binary, timestamp, date, decimal, map, ...) is refused at the first row that
  holds a value in it, naming the row, the field and the cast that fixes it; a
  non-finite float (NaN, infinity) likewise;
- written as one line of JSONL (the normalised form below) and put through the
  same `RowCheck` as a JSONL line (required fields, row cap, line size).

What is stored is that JSONL, so the ``dataset`` environment, the worker's fetch and
a run's pinned hash are the same for both formats: the hash is the SHA-256 of the
JSONL, equal to the hash of a JSONL upload of the same lines. A line is
``json.dumps(row, ensure_ascii=False)`` (Python's default separators) plus ``\\n``,
the columns in the file's order, top-level nulls left out (Parquet has no "absent":
a row without a field is a null there, and JSONL's ``fields`` lists the fields
every row has).

A file pyarrow cannot read (truncated, corrupt, not Parquet) is a 422 saying so.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from app.errors import Unprocessable
from app.services.upload import PARQUET_MAGIC, Caps, Checked, RowCheck, bad_line, too_large
from app.services.upload import too_many_rows as too_many

if TYPE_CHECKING:
    import pyarrow as pa

PARQUET_TYPES = ("application/vnd.apache.parquet", "application/x-parquet")
# Rows per record batch: small enough that a batch's Python rows stay a few MB.
BATCH_ROWS = 1024

# json.dumps(row, ensure_ascii=False) with NaN refused; one encoder, not one a row.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_TIME_FIX = "cast the column to a string (ISO 8601) or to an integer (seconds since the epoch)"


class ParquetReceive:
    """Fed the body's chunks like `JsonlCheck`; `finish` converts and checks the rows."""

    def __init__(self, raw: Path, out: BinaryIO, caps: Caps, required: tuple[str, ...]) -> None:
        self._raw_path = raw
        self._raw = raw.open("wb")
        self._out = out
        self._caps = caps
        self._required = required
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._size == 0 and not chunk.startswith(PARQUET_MAGIC):
            self._raw.close()
            raise not_parquet("it does not begin with the Parquet magic bytes PAR1")
        self._size += len(chunk)
        if self._size > self._caps.max_bytes:
            self._raw.close()
            raise too_large(self._size, self._caps.max_bytes)
        self._raw.write(chunk)

    def finish(self) -> Checked:
        self._raw.close()
        if self._size == 0:
            raise not_parquet("the body is empty")
        return to_jsonl(self._raw_path, self._out, self._caps, self._required)


def not_parquet(reason: str) -> Unprocessable:
    return Unprocessable(
        f"not a readable Parquet file: {reason}; nothing was stored: upload the whole file "
        "as written by a Parquet writer (pyarrow, pandas.to_parquet, polars, Spark), or JSONL",
        field="body",
    )


def to_jsonl(source: Path, out: BinaryIO, caps: Caps, required: tuple[str, ...]) -> Checked:
    """The rows of the Parquet file ``source`` written to ``out`` as JSONL, checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = RowCheck(caps, required, "row")
    digest = hashlib.sha256()
    size = 0
    number = 0
    try:
        with source.open("rb") as raw:
            parquet = pq.ParquetFile(raw)
            if parquet.metadata.num_rows > caps.max_rows:  # refused before a row is read
                raise too_many(caps)
            schema = parquet.schema_arrow
            _no_duplicates(schema.names)
            problems = {
                field.name: problem
                for field in schema
                if (problem := _json_problem(field.type, field.name)) is not None
            }
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                _refuse_values(batch, problems, number)
                for row in batch.to_pylist():
                    number += 1
                    kept = {k: v for k, v in row.items() if v is not None}
                    line = _line(kept, number)
                    if len(line) > caps.max_line_bytes:
                        raise rows.too_long(number)
                    rows.accept(number, kept)
                    size += len(line)
                    if size > caps.max_bytes:
                        raise too_large(size, caps.max_bytes)
                    digest.update(line)
                    out.write(line)
    except (pa.ArrowException, OSError) as exc:  # ArrowIOError is an OSError
        raise not_parquet(_reason(exc)) from None
    return rows.checked(digest.hexdigest(), size)


def _no_duplicates(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise Unprocessable(
                f"the Parquet file has two columns named {name!r}; a JSON object has one value "
                "per key: rename one and upload again",
                field=name,
            )
        seen.add(name)


def _json_problem(kind: pa.DataType, path: str) -> tuple[str, str] | None:
    """None when every value of type ``kind`` has a JSON form, else (the field's path,
    what to change). Lists become arrays, structs objects, dictionary columns their
    values."""
    import pyarrow.types as t

    if (
        t.is_null(kind)
        or t.is_boolean(kind)
        or t.is_integer(kind)
        or t.is_floating(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_string_view(kind)
    ):
        return None
    if t.is_dictionary(kind):
        return _json_problem(kind.value_type, path)
    lists = (t.is_list, t.is_large_list, t.is_fixed_size_list, t.is_list_view, t.is_large_list_view)
    if any(test(kind) for test in lists):
        return _json_problem(kind.value_type, f"{path}[]")
    if t.is_struct(kind):
        for i in range(kind.num_fields):
            child = kind.field(i)
            found = _json_problem(child.type, f"{path}.{child.name}")
            if found is not None:
                return found
        return None
    binary = (t.is_binary, t.is_large_binary, t.is_fixed_size_binary, t.is_binary_view)
    if any(test(kind) for test in binary):
        fix = "decode it to text (a string column), or base64-encode it into one"
    elif t.is_timestamp(kind) or t.is_date(kind) or t.is_time(kind):
        fix = _TIME_FIX
    elif t.is_duration(kind) or t.is_interval(kind):
        fix = "cast the column to a number (seconds)"
    elif t.is_decimal(kind):
        fix = "cast the column to float64, or to a string to keep every digit"
    elif t.is_map(kind):
        fix = "write it as a struct, or as a list of {key, value} structs"
    else:
        fix = "cast it to a string, a number, a bool, a list or a struct"
    return path, f"holds {kind} values, which JSON has no form for: {fix}"


def _refuse_values(
    batch: pa.RecordBatch, problems: dict[str, tuple[str, str]], before: int
) -> None:
    """A 422 at the first row of ``batch`` with a value in a column JSON cannot hold (a
    column of such a type that is null throughout is left out like any null)."""
    for name, (path, what) in problems.items():
        column = batch.column(name)
        if column.null_count == len(column):
            continue
        first = next(i for i, valid in enumerate(column.is_valid().to_pylist()) if valid)
        raise bad_line(before + first + 1, f"field {path!r} {what}", field=name, unit="row")


def _line(row: dict[str, Any], number: int) -> bytes:
    try:
        return _ENCODER.encode(row).encode() + b"\n"
    except ValueError:  # NaN or an infinity somewhere in the row: find the field
        name = next(k for k, v in row.items() if not _finite(v))
        raise bad_line(
            number,
            f"field {name!r} holds NaN or an infinity, which JSON has no form for: write null "
            "(or leave the value out) or a finite number",
            field=name,
            unit="row",
        ) from None


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _reason(exc: Exception) -> str:
    # pyarrow's message, first line (thrift errors add a second saying the same).
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = ["BATCH_ROWS", "PARQUET_TYPES", "ParquetReceive", "not_parquet", "to_jsonl"]
