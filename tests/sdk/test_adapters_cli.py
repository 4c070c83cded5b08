"""`rlaas adapters upload|list|delete` and a run naming the upload, against a live API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sdk.cli import cli
from sdk.client import Client
from sdk.errors import ApiError, RlaasError
from tests.web.live import LiveApi, live_api, migrated_database


@pytest.fixture(scope="module")
def live(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    data = tmp_path_factory.mktemp("data")
    with live_api(migrated_database(postgres_url), data_dir=data) as running:
        yield running


def peft_folder(folder: Path, rank: int = 4) -> Path:
    """A PEFT adapter folder as PEFT's save_pretrained leaves one (q and v of one layer)."""
    from safetensors.numpy import save_file

    folder.mkdir()
    key = "base_model.model.model.layers.0.self_attn"
    tensors = {
        f"{key}.{m}.lora_{p}.weight": np.zeros((rank, 64) if p == "A" else (64, rank), np.float32)
        for m in ("q_proj", "v_proj")
        for p in "AB"
    }
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_upload_start_a_run_from_it_list_delete(live: LiveApi, tmp_path: Path) -> None:
    env = {"RLAAS_API_URL": live.url, "RLAAS_API_KEY": live.tenant()}
    runner = CliRunner()
    folder = peft_folder(tmp_path / "sft-v1")
    uploaded = runner.invoke(cli, ["adapters", "upload", str(folder)], env=env)
    assert uploaded.exit_code == 0, uploaded.output
    adapter_id = uploaded.stdout.strip().splitlines()[-1]
    assert adapter_id.startswith("ad_")
    listed = runner.invoke(cli, ["adapters", "list"], env=env).stdout
    assert f"{adapter_id}  sft-v1  r=4  alpha=16  q,v" in listed

    spec = {
        "environment": {"name": "guess_number"},
        "model": {"lora": {"rank": 4, "targets": ["q", "v"], "init_from": f"adapter:{adapter_id}"}},
    }
    with Client(live.url, env["RLAAS_API_KEY"]) as client:
        run = client.create_run(spec)
        assert run.raw["spec"]["model"]["lora"]["init_from"] == f"adapter:{adapter_id}"
        with pytest.raises(ApiError) as refused:
            client.delete_adapter(adapter_id)
        assert refused.value.status == 409
        with pytest.raises(RlaasError, match=r"no adapter_model\.safetensors"):
            client.upload_adapter(tmp_path)
    other = {**env, "RLAAS_API_KEY": live.tenant()}
    assert runner.invoke(cli, ["adapters", "delete", adapter_id], env=other).exit_code != 0
