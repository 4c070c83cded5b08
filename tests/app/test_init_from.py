"""``model.lora.init_from: run:<id>[@<step>]`` through the API, on real Postgres.

Checked at submit (422 naming ``spec.model.lora.init_from``; another tenant's run answers
as a missing one does), pinned to a checkpoint's step, and fetched by the claiming worker
(worker/init_from.py, fed the API's own answer) as a local PEFT folder.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rl_core.artifacts import export_dir
from tests.app.conftest import Api, lease, running_api
from worker.init_from import AdapterUnavailable, HttpAdapters, with_local_adapter

pytestmark = pytest.mark.anyio

FIELD = "spec.model.lora.init_from"
LORA = {"rank": 4, "alpha": 8.0}


@pytest.fixture
async def iapi(app_database: str, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(app_database, data_dir=tmp_path) as running:
        yield running


async def lora_run_with_checkpoints(api: Api, auth: dict[str, str], steps: list[int]) -> str:
    """A LoRA run of the tenant's that reported checkpoints (and wrote their PEFT exports)."""
    run_id = await api.submit(auth, model={"lora": LORA})
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 200
    for step in steps:
        folder = export_dir(api.state.settings.artifacts_dir() / run_id, step, "peft")
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "step": step}))
        from safetensors.numpy import save_file

        save_file({"x.lora_A.weight": np.full((4, 2), step, np.float32)}, str(folder / "w"))
        (folder / "w").rename(folder / "adapter_model.safetensors")
        r = await api.internal(
            run_id, "artifacts", worker_id="w1", kind="checkpoint", step=step, uri=f"file:///{step}"
        )
        assert r.status_code == 200, r.text
    return run_id


async def submit(api: Api, auth: dict[str, str], init_from: str, **lora: Any) -> httpx.Response:
    spec = {
        "environment": {"name": "guess_number"},
        "model": {"lora": {**LORA, **lora, "init_from": init_from}},
    }
    return await api.client.post("/v1/runs", json={"spec": spec}, headers=auth)


def refusal(r: httpx.Response) -> str:
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == FIELD
    return str(r.json()["error"]["message"])


async def test_a_run_starts_from_the_tenants_run_pinned_and_the_worker_fetches_it(
    iapi: Api, tmp_path: Path
) -> None:
    auth = await iapi.tenant()
    source = await lora_run_with_checkpoints(iapi, auth, [2, 5])
    # No step: the newest checkpoint, pinned, so every attempt loads the same weights.
    r = await submit(iapi, auth, f"run:{source}")
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["model"]["lora"]["init_from"] == f"run:{source}@5"
    r = await submit(iapi, auth, f"run:{source}@2")
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    assert r.json()["spec"]["model"]["lora"]["init_from"] == f"run:{source}@2"

    # The worker holding the run's lease gets step 2's adapter; no one else does.
    url = f"/internal/runs/{run_id}/init-adapter"
    assert (await iapi.client.get(url, headers=lease("not-the-lease"))).status_code in (401, 403)
    claim = await iapi.internal(run_id, "claim", worker_id="w2")
    assert claim.status_code == 200
    answer = await iapi.client.get(url, headers=lease(iapi.leases[run_id]))
    assert answer.status_code == 200, answer.text

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=answer.content))
    adapters = HttpAdapters("http://api", "t", tmp_path / "cache", transport=transport)
    local = with_local_adapter(claim.json()["spec"], run_id, adapters)
    folder = Path(local["model"]["lora"]["init_from"].removeprefix("file:"))
    assert json.loads((folder / "adapter_config.json").read_text())["step"] == 2
    from safetensors.numpy import load_file

    assert load_file(str(folder / "adapter_model.safetensors"))["x.lora_A.weight"][0, 0] == 2


async def test_another_tenants_run_is_refused_as_a_missing_one_is(iapi: Api) -> None:
    owner, other = await iapi.tenant(), await iapi.tenant()
    source = await lora_run_with_checkpoints(iapi, owner, [1])
    theirs = refusal(await submit(iapi, other, f"run:{source}@1"))
    missing = refusal(await submit(iapi, other, "run:run_0123456789abcdef@1"))
    assert theirs == missing.replace("run_0123456789abcdef", source)  # nothing tells them apart

    # Nor can another tenant's run fetch it: its pin names its own tenant's runs only.
    r = await submit(iapi, other, "file:/etc")
    assert "your own machine" in refusal(r)


@pytest.mark.parametrize(
    ("init_from", "lora", "problem"),
    [
        ("@7", {}, "no checkpoint at step 7; its checkpoints are at [3]"),
        ("", {"rank": 8}, "has rank 4, model.lora.rank is 8; set model.lora.rank to 4"),
        ("", {"targets": ["q", "k"]}, "trains ['o', 'v'], which model.lora.targets leaves out"),
    ],
)
async def test_what_cannot_fit_is_refused_at_submit_naming_it(
    iapi: Api, init_from: str, lora: dict[str, Any], problem: str
) -> None:
    auth = await iapi.tenant()
    source = await lora_run_with_checkpoints(iapi, auth, [3])
    assert problem in refusal(await submit(iapi, auth, f"run:{source}{init_from}", **lora))


async def test_a_run_without_an_adapter_or_a_checkpoint_is_refused(iapi: Api) -> None:
    auth = await iapi.tenant()
    full = await iapi.submit(auth)
    assert "no adapter to start from" in refusal(await submit(iapi, auth, f"run:{full}"))
    fresh = await iapi.submit(auth, model={"lora": LORA})
    assert "has no checkpoint yet" in refusal(await submit(iapi, auth, f"run:{fresh}"))


async def test_a_worker_refuses_an_unpinned_or_file_reference(tmp_path: Path) -> None:
    adapters = HttpAdapters("http://api", "t", tmp_path)
    for value in ("file:/etc", "run:run_abc"):
        with pytest.raises(AdapterUnavailable, match="not pinned"):
            with_local_adapter({"model": {"lora": {"init_from": value}}}, "run_1", adapters)
