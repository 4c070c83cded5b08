"""`rlaas datasets upload|list|delete` and the client's dataset calls against a live API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdk.cli import cli
from sdk.client import Client
from sdk.errors import ApiError
from tests.web.live import LiveApi, live_api, migrated_database


@pytest.fixture(scope="module")
def live(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    data = tmp_path_factory.mktemp("data")
    with live_api(migrated_database(postgres_url), data_dir=data) as running:
        yield running


def test_upload_list_delete_from_the_command_line(live: LiveApi, tmp_path: Path) -> None:
    key = live.tenant()
    file = tmp_path / "capitals.jsonl"
    file.write_text('{"q": "France?", "a": "Paris"}\n{"q": "Peru?", "a": "Lima"}\n')
    env = {"RLAAS_API_URL": live.url, "RLAAS_API_KEY": key}
    runner = CliRunner()
    uploaded = runner.invoke(cli, ["datasets", "upload", str(file), "--required", "q,a"], env=env)
    assert uploaded.exit_code == 0, uploaded.output
    dataset_id = uploaded.stdout.strip().splitlines()[-1]
    assert dataset_id.startswith("ds_")
    listed = runner.invoke(cli, ["datasets", "list"], env=env)
    assert f"{dataset_id}  capitals  2 rows" in listed.stdout
    deleted = runner.invoke(cli, ["datasets", "delete", dataset_id], env=env)
    assert deleted.exit_code == 0 and runner.invoke(cli, ["datasets", "list"], env=env).stdout == ""


def test_the_client_reports_a_bad_line_by_number(live: LiveApi, tmp_path: Path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_text("".join(json.dumps({"q": i}) + "\n" for i in range(3)) + "{oops\n")
    with Client(live.url, live.tenant()) as client:
        with pytest.raises(ApiError) as refused:
            client.upload_dataset(file)
        assert refused.value.status == 422 and "line 4" in str(refused.value)
        assert client.list_datasets() == []


def test_a_parquet_file_uploads_from_the_command_line(live: LiveApi, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = tmp_path / "capitals.parquet"
    pq.write_table(pa.table({"q": ["France?", "Peru?"], "a": ["Paris", None]}), file)
    env = {"RLAAS_API_URL": live.url, "RLAAS_API_KEY": live.tenant()}
    runner = CliRunner()
    uploaded = runner.invoke(cli, ["datasets", "upload", str(file), "--required", "q"], env=env)
    assert uploaded.exit_code == 0, uploaded.output
    assert "capitals: 2 rows, fields q, sha256" in uploaded.stderr
    # The content type comes from the suffix: a required field null in row 2 is named by row.
    refused = runner.invoke(cli, ["datasets", "upload", str(file), "--required", "q,a"], env=env)
    assert refused.exit_code != 0 and "row 2: field 'a' is missing" in refused.output
