"""Parquet uploads on real Postgres, through the same API fixture as the JSONL ones: read
row group by row group, stored as the JSONL of the same rows, refusals naming the row and
the field, nothing stored after any refusal. Files written by pyarrow here."""

from __future__ import annotations

import datetime
import hashlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.app.conftest import Api, running_api
from tests.app.test_datasets import chunked, rows, stored

pytestmark = pytest.mark.anyio

PARQUET = {"Content-Type": "application/vnd.apache.parquet"}


@pytest.fixture
async def dapi(app_database: str, tmp_path: Path) -> AsyncIterator[Api]:
    """The JSONL tests' settings: a 2 MB cap on one upload."""
    async with running_api(
        app_database, data_dir=tmp_path, dataset_max_bytes=2_000_000, dataset_max_rows=100_000
    ) as running:
        yield running


def parquet(table: pa.Table, *, row_group_size: int = 100) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=row_group_size)
    return out.getvalue()


async def upload(
    api: Api, auth: dict[str, str], data: bytes, *, headers: dict[str, str] = PARQUET, **params: Any
) -> httpx.Response:
    return await api.client.post(
        "/v1/datasets",
        params={"name": "sums", **params},
        content=chunked(data),
        headers={**auth, **headers},
    )


async def nothing_stored(api: Api, auth: dict[str, str], tmp_path: Path) -> None:
    assert stored(tmp_path) == []  # neither the Parquet as received nor the JSONL begun
    assert (await api.client.get("/v1/datasets", headers=auth)).json() == {"items": []}


async def test_a_parquet_file_is_stored_as_the_jsonl_of_its_rows(dapi: Api, tmp_path: Path) -> None:
    auth = await dapi.tenant()
    items = [
        {**r, "n": i, "tags": ["x", "y"][: i % 3], "meta": {"level": i % 4}}
        for i, r in enumerate(rows(1000))
    ]
    items[5]["note"] = "only here"  # a column null elsewhere: not a field every row has
    data = parquet(pa.Table.from_pylist(items), row_group_size=300)  # four row groups
    r = await upload(dapi, auth, data, required="question,answer")
    assert r.status_code == 201, r.text
    ds = r.json()
    assert (ds["format"], ds["rows"]) == ("parquet", 1000)
    assert ds["fields"] == ["answer", "meta", "n", "question", "tags"]
    # Stored as JSONL: the same bytes, hash and size as an upload of these lines.
    expected = b"".join(
        json.dumps({k: v for k, v in row.items() if v is not None}).encode() + b"\n"
        for row in pa.Table.from_pylist(items).to_pylist()
    )
    assert ds["sha256"] == hashlib.sha256(expected).hexdigest()
    assert ds["size_bytes"] == len(expected)
    [content] = stored(tmp_path)
    assert content.name == f"{ds['sha256']}.jsonl" and content.read_bytes() == expected
    # The same rows uploaded as JSONL: the same content, so a run pins the same hash.
    as_jsonl = await upload(
        dapi, auth, expected, headers={"Content-Type": "application/x-ndjson"}, name="again"
    )
    assert as_jsonl.json()["sha256"] == ds["sha256"] and as_jsonl.json()["format"] == "jsonl"
    # Known by its magic bytes with no Parquet content type, too.
    untyped = await upload(dapi, auth, data, headers={}, name="untyped")
    assert untyped.status_code == 201 and untyped.json()["sha256"] == ds["sha256"]


async def test_a_missing_field_in_the_second_row_group_names_row_and_field(
    dapi: Api, tmp_path: Path
) -> None:
    auth = await dapi.tenant()
    items = rows(250)
    items[142]["answer"] = None  # row 143, in the second row group of 100
    r = await upload(dapi, auth, parquet(pa.Table.from_pylist(items)), required="question,answer")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert (error["row"], error["field"]) == (143, "answer"), error
    assert error["message"].startswith("row 143: field 'answer' is missing (or null)")
    await nothing_stored(dapi, auth, tmp_path)


@pytest.mark.parametrize(
    ("column", "path", "row", "fix"),
    [
        # Null through the first row group and a half: named at its first value.
        (pa.array([None] * 150 + [datetime.datetime(2026, 1, 1)] * 50), "at", 151, "ISO 8601"),
        (pa.array([b"\x00\x01"] * 200), "at", 1, "base64"),
        (pa.array([{"when": datetime.date(2026, 1, 1)}] * 200), "at.when", 1, "ISO 8601"),
        (
            pa.array([[{"k": 1}]] * 200, type=pa.list_(pa.map_(pa.string(), pa.int64()))),
            "at[]",
            1,
            "struct",
        ),
    ],
    ids=["timestamp", "binary", "nested-date", "map-in-list"],
)
async def test_a_column_json_cannot_hold_is_refused_naming_row_field_and_fix(
    dapi: Api, tmp_path: Path, column: pa.Array, path: str, row: int, fix: str
) -> None:
    auth = await dapi.tenant()
    table = pa.Table.from_pylist(rows(200)).append_column("at", column)
    r = await upload(dapi, auth, parquet(table))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert (error["row"], error["field"]) == (row, "at"), error
    assert f"field {path!r} holds" in error["message"] and fix in error["message"], error
    await nothing_stored(dapi, auth, tmp_path)


async def test_nan_is_refused_and_a_null_only_column_of_any_type_is_left_out(
    dapi: Api, tmp_path: Path
) -> None:
    auth = await dapi.tenant()
    table = pa.Table.from_pylist(rows(20)).append_column(
        "score", pa.array([1.5] * 19 + [float("nan")])
    )
    r = await upload(dapi, auth, parquet(table))
    assert r.status_code == 422 and (r.json()["error"]["row"], r.json()["error"]["field"]) == (
        20,
        "score",
    ), r.text
    await nothing_stored(dapi, auth, tmp_path)
    empty_times = pa.Table.from_pylist(rows(20)).append_column(
        "at", pa.array([None] * 20, type=pa.timestamp("us"))
    )
    ok = await upload(dapi, auth, parquet(empty_times))
    assert ok.status_code == 201 and ok.json()["fields"] == ["answer", "question"], ok.text


@pytest.mark.parametrize("cut", ["truncated", "garbled"])
async def test_a_corrupt_file_is_422_and_nothing_is_stored(
    dapi: Api, tmp_path: Path, cut: str
) -> None:
    auth = await dapi.tenant()
    data = parquet(pa.Table.from_pylist(rows(500)))
    # Truncated: no footer. Garbled: the footer intact, a data page overwritten.
    body = data[: len(data) // 2] if cut == "truncated" else data[:200] + b"\xff" * 200 + data[400:]
    r = await upload(dapi, auth, body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "body"
    assert error["message"].startswith("not a readable Parquet file: "), error
    await nothing_stored(dapi, auth, tmp_path)
    # Declared Parquet, but not: refused the same way.
    r = await upload(dapi, auth, b'{"question": "1+1?"}\n')
    assert r.status_code == 422 and "PAR1" in r.json()["error"]["message"]
    await nothing_stored(dapi, auth, tmp_path)


async def test_over_the_byte_cap_is_413_naming_it_and_nothing_is_stored(
    dapi: Api, tmp_path: Path
) -> None:
    auth = await dapi.tenant()
    # Uncompressed: the file itself passes the 2 MB cap (and streams in 4 KiB chunks).
    noise = [hashlib.sha256(str(i).encode()).hexdigest() * 4 for i in range(10_000)]
    out = io.BytesIO()
    pq.write_table(pa.table({"question": noise}), out, compression="none", use_dictionary=False)
    data = out.getvalue()
    assert len(data) > 2_000_000
    r = await upload(dapi, auth, data)
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["limit_bytes"] == 2_000_000 and "dataset_max_bytes" in error["message"]
    await nothing_stored(dapi, auth, tmp_path)
    # Under the cap as Parquet, over it as the JSONL it becomes: the same 413.
    repeated = parquet(pa.table({"question": ["the same long question " * 20] * 5000}))
    assert len(repeated) < 500_000
    r = await upload(dapi, auth, repeated)
    assert r.status_code == 413 and r.json()["error"]["limit"] == "dataset_max_bytes", r.text
    await nothing_stored(dapi, auth, tmp_path)
