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
from tests.app.conftest import Api, lease, running_api, set_quota
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


def peft_tar(
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    extra: str | None = None,
    drop: str = "",
) -> bytes:
    """A tar of a PEFT adapter folder as PEFT writes one (the tiny model's widths)."""
    import io
    import tarfile

    from safetensors.numpy import save

    tensors = {}
    for module in modules:
        key = f"base_model.model.model.layers.0.self_attn.{module}"
        tensors[f"{key}.lora_A.weight"] = np.ones((rank, 64), np.float32)
        tensors[f"{key}.lora_B.weight"] = np.ones((64, rank), np.float32)
    if extra:
        tensors[extra] = np.ones((2, 2), np.float32)
    files = {
        "adapter_config.json": json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 8}),
        "adapter_model.safetensors": save(tensors),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            if name == drop:
                continue
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(f"my-adapter/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


async def upload(api: Api, auth: dict[str, str], body: bytes) -> httpx.Response:
    return await api.client.post(
        "/v1/adapters",
        params={"name": "sft"},
        content=body,
        headers={**auth, "Content-Type": "application/x-tar"},
    )


async def test_an_uploaded_adapter_starts_its_tenants_runs_only(iapi: Api, tmp_path: Path) -> None:
    owner, other = await iapi.tenant(), await iapi.tenant()
    body = peft_tar()
    r = await upload(iapi, owner, body)
    assert r.status_code == 201, r.text
    adapter = r.json()
    assert (adapter["rank"], adapter["alpha"], adapter["targets"]) == (4, 8.0, ["q", "v"])
    listed = (await iapi.client.get("/v1/adapters", headers=owner)).json()["items"]
    assert [a["id"] for a in listed] == [adapter["id"]]
    assert (await iapi.client.get("/v1/adapters", headers=other)).json()["items"] == []
    theirs = await iapi.client.get(f"/v1/adapters/{adapter['id']}", headers=other)
    assert theirs.status_code == 404

    r = await submit(iapi, owner, f"adapter:{adapter['id']}")
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    # Another tenant naming it is told what a missing id tells.
    theirs_msg = refusal(await submit(iapi, other, f"adapter:{adapter['id']}"))
    missing = refusal(await submit(iapi, other, "adapter:ad_0123456789abcdef"))
    assert theirs_msg == missing.replace("ad_0123456789abcdef", adapter["id"])
    assert "set model.lora.rank to 4" in refusal(
        await submit(iapi, owner, f"adapter:{adapter['id']}", rank=8)
    )
    assert "trains ['v']" in refusal(
        await submit(iapi, owner, f"adapter:{adapter['id']}", targets=["q"])
    )

    # The claiming worker gets the two files as uploaded.
    claim = await iapi.internal(run_id, "claim", worker_id="w2")
    answer = await iapi.client.get(
        f"/internal/runs/{run_id}/init-adapter", headers=lease(iapi.leases[run_id])
    )
    assert answer.status_code == 200, answer.text
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=answer.content))
    adapters = HttpAdapters("http://api", "t", tmp_path / "cache", transport=transport)
    local = with_local_adapter(claim.json()["spec"], run_id, adapters)
    folder = Path(local["model"]["lora"]["init_from"].removeprefix("file:"))
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4

    # Not deleted while a run that starts from it is unfinished; one no run names is, files
    # and all.
    url = f"/v1/adapters/{adapter['id']}"
    r = await iapi.client.delete(url, headers=owner)
    assert r.status_code == 409 and run_id in r.json()["error"]["message"]
    second = (await upload(iapi, owner, body)).json()["id"]
    assert len(list((tmp_path / "adapters").glob(f"*/{second}/adapter_config.json"))) == 1
    url = f"/v1/adapters/{second}"
    assert (await iapi.client.delete(url, headers=owner)).status_code == 204
    assert list((tmp_path / "adapters").glob(f"*/{second}")) == []
    assert (await iapi.client.get(url, headers=owner)).status_code == 404


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not a tar" * 100, "not a whole tar archive"),
        (peft_tar(extra="base_model.model.lm_head.weight"), "not the 2-d lora_A/lora_B weight"),
        (peft_tar(modules=("q_proj",))[:2000], "not a whole tar archive"),
        (peft_tar(drop="adapter_model.safetensors"), "holds no adapter_model.safetensors"),
        (peft_tar(modules=()), "holds no tensors"),
        (peft_tar(rank=0), "r=0 is not a rank"),
    ],
)
async def test_what_is_not_a_peft_lora_adapter_is_refused(
    iapi: Api, body: bytes, problem: str
) -> None:
    r = await upload(iapi, await iapi.tenant(), body)
    assert r.status_code == 422, r.text
    assert problem in r.json()["error"]["message"]


async def test_stored_artifacts_count_in_the_tenants_quota(iapi: Api) -> None:
    auth = await iapi.tenant()
    run_id = await iapi.submit(auth)
    await iapi.internal(run_id, "claim", worker_id="w1")
    for step, kept in ((1, 5_000), (2, 7_000)):  # each report replaces the run's figure
        r = await iapi.internal(
            run_id, "artifacts", worker_id="w1", kind="checkpoint", step=step,
            uri=f"file:///{step}", size_bytes=4_000, stored_bytes=kept,
        )  # fmt: skip
        assert r.status_code == 200, r.text
    adapter = (await upload(iapi, auth, peft_tar())).json()
    limits = (await iapi.client.get("/v1/limits", headers=auth)).json()
    assert limits["usage"]["artifact_bytes"] == 7_000 + adapter["size_bytes"]

    await set_quota(iapi, auth, artifact_bytes=7_000 + 2 * adapter["size_bytes"] - 1)
    over = await upload(iapi, auth, peft_tar())
    assert over.status_code == 413, over.text
    error = over.json()["error"]
    used = 7_000 + adapter["size_bytes"]
    assert error["quota"] == {"name": "artifact_bytes", "limit": used + adapter["size_bytes"] - 1,
                              "used": used}  # fmt: skip
    assert "delete an adapter first" in error["message"]
    assert len((await iapi.client.get("/v1/adapters", headers=auth)).json()["items"]) == 1
